#!/usr/bin/env bash
# Prepares the GPU machine for bench/gpu/ssh-moe.sh, from the repository root: the SGLang 0.5.17 overlay made
# importable by the host's python3 (a .pth file, as an install would), tunectl's wheels, the tiny MoE model folder,
# an OpenSSH sshd on loopback (port 2222, alias h200) and its host key trusted with `tunectl hosts trust`.
# Usage: bench/gpu/stage-ssh.sh BUNDLE   (BUNDLE: site.tgz, tiny-llama/, whl/, tools/, extra/ as bench/gpu/bundle.sh
# packs)
set -euo pipefail
b=$(cd "${1:?usage: $0 BUNDLE}" && pwd)
mkdir -p /tmp/sgl-overlay /tmp/sgl-stage/tiny-qwen3moe /tmp/sgl-stage/tiny-glm5
[ -d /tmp/sgl-overlay/site/sglang ] || tar xzf "$b/site.tgz" -C /tmp/sgl-overlay
cp -r "$b/tiny-llama" /tmp/sgl-stage/
for m in tiny-qwen3moe tiny-glm5; do cp bench/gpu/$m/config.json /tmp/sgl-stage/tiny-llama/tokenizer*.json /tmp/sgl-stage/$m/; done
# DeepGEMM for the GLM-5-shaped model only (profiles/tiny-glm5-h200-ssh.yaml puts it on the server's PYTHONPATH)
ls "$b"/extra/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
  --target /tmp/deep-gemm-site "$b"/extra/*.whl
site=$(python3 -c "import site; print(site.getsitepackages()[0])")
echo "import sys; sys.path.insert(0, '/tmp/sgl-overlay/site')" > "$site/zz-sgl-overlay.pth"
bash "$b/whl/install.sh"
command -v patch >/dev/null || cp "$b/tools/bin/patch" /usr/local/bin/
if ! command -v sshd >/dev/null; then export PATH=$PATH:$b/tools/bin SSHD_LIB_PATH=$b/tools/lib; fi
id sshd >/dev/null 2>&1 || useradd --system --no-create-home --home-dir /run/sshd --shell /usr/sbin/nologin sshd \
  || echo "sshd:x:74:65534::/run/sshd:/usr/sbin/nologin" >> /etc/passwd
env -u PYTHONPATH python3 -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)"
export PYTHONPATH=/tmp/tunectl-site:$PWD
python3 bench/gpu/ssh_host.py start /tmp/ssh-h200 h200 2222
python3 -c "from tunectl.cli import app; app()" hosts trust h200 --yes
