#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian/Ubuntu machine (system packages included), then runs
# it. Works as root or not (sudo when it needs no password; else the services' tests skip), in a virtual
# environment or not: the active one ($VIRTUAL_ENV), else $TUNECTL_VENV, else .venv when it exists (the README's
# first command makes it), else the system Python when it may be installed into, else a new .venv (PEP 668
# "externally managed", no pip, or not writable). Nothing but Python is assumed.
# The tests start their own services (OpenSSH sshd, PostgreSQL, headless Chromium, a one-node Slurm) on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=()
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo=(sudo -n); fi
if command -v apt-get >/dev/null && { [ "$(id -u)" = 0 ] || [ ${#sudo[@]} -gt 0 ]; }; then
  need=()
  [ -x /usr/sbin/sshd ] || need+=(openssh-server openssh-client)
  command -v ps >/dev/null || need+=(procps)
  command -v curl >/dev/null || need+=(curl)
  command -v patch >/dev/null || need+=(patch)
  command -v ip >/dev/null || need+=(iproute2)
  command -v chromium >/dev/null || need+=(chromium)
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
  [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v sbatch >/dev/null \
    || need+=(slurmctld slurmd slurm-client)
  python3 -c "import ensurepip, venv" 2>/dev/null || need+=(python3-venv)
  if [ ${#need[@]} -gt 0 ]; then
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi

# May this interpreter be installed into? Not when it is externally managed (PEP 668), has no pip, or its
# site-packages is not writable (a system Python as a normal user).
installable() {
  "$1" - <<'PY' 2>/dev/null
import os, subprocess, sys, sysconfig
in_venv = sys.prefix != sys.base_prefix
managed = os.path.isfile(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
has_pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
writable = os.access(sysconfig.get_path("purelib"), os.W_OK)
sys.exit(0 if has_pip and writable and (in_venv or not managed) else 1)
PY
}

py=python3
if [ -n "${VIRTUAL_ENV:-}" ]; then
  py="$VIRTUAL_ENV/bin/python"
elif [ -n "${TUNECTL_VENV:-}" ] || [ -x .venv/bin/python ] || ! installable python3; then
  venv="${TUNECTL_VENV:-.venv}"     # .venv: the one the README's first command made, else a new one
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  py="$venv/bin/python"
fi
echo "tests/run.sh: installing into and testing with $py"

# pip's output is shown when it fails. When it succeeds, its notes that an installed package "requires X, which
# is not installed" (or "..., which is incompatible") are expected here and not failures: sglang goes in without
# its GPU serving stack (--no-deps) on purpose. They are counted in one line instead of printed.
pip_quiet() {
  local log notes
  log="$(mktemp)"
  if ! "$py" -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    cat "$log"; rm -f "$log"; return 1
  fi
  notes="$(grep -cE 'requires .*, which is (not installed|incompatible)' "$log" || true)"
  grep -vE "requires .*, which is (not installed|incompatible)|dependency resolver does not currently take|^$" \
    "$log" || true
  [ "$notes" = 0 ] || echo "tests/run.sh: pip install $*: ok ($notes notes that a package's own dependencies are" \
    "missing or other versions: expected, sglang is installed without its GPU serving stack)"
  rm -f "$log"
}
pip_quiet -e ".[test]"
# The real SGLang client (sglang.bench_serving) runs against the stand-in in the tests: the package without its
# GPU serving stack, plus what the client imports.
pip_quiet --no-deps "sglang==0.5.9"
pip_quiet pybase64 transformers datasets requests IPython
# Serial by default. TUNECTL_TEST_WORKERS=2 runs two pytest-xdist workers (about half the time on two cores; the
# Slurm tests in one worker).
"$py" -m pytest -q -n "${TUNECTL_TEST_WORKERS:-0}" --dist loadgroup "$@"
