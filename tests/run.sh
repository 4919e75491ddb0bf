#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (system packages included), then runs it.
# The tests start their own services (OpenSSH sshd, PostgreSQL, headless Chromium) on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  [ -x /usr/sbin/sshd ] || need+=(openssh-server openssh-client)
  command -v ps >/dev/null || need+=(procps)
  command -v curl >/dev/null || need+=(curl)
  command -v patch >/dev/null || need+=(patch)
  command -v chromium >/dev/null || need+=(chromium)
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi
python3 -m pip install -q --disable-pip-version-check -e ".[test]"
# The real SGLang client (sglang.bench_serving) runs against the stand-in in the tests: the package without its
# GPU serving stack, plus what the client imports.
python3 -m pip install -q --disable-pip-version-check --no-deps "sglang==0.5.9"
python3 -m pip install -q --disable-pip-version-check pybase64 transformers datasets
python3 -m pytest -q "$@"
