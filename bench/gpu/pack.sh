#!/usr/bin/env bash
# Packs tunectl and the Python 3.12 wheels that an offline GPU machine's image lacks into OUTDIR, so that
# `tunectl sweep` and `tunectl search` run there as they do here (real SGLang comes from its own overlay:
# see docs/real-gpu.md).
# Usage: bench/gpu/pack.sh OUTDIR        -> OUTDIR/whl/*.whl, OUTDIR/install.sh (one folder, well under 60 MiB)
# On the GPU machine: bash OUTDIR/install.sh && export PYTHONPATH=/tmp/tunectl-site:<checkout>:$PYTHONPATH
set -euo pipefail
out=${1:?usage: $0 OUTDIR}
here=$(cd "$(dirname "$0")/../.." && pwd)
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --platform any
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_34_x86_64)
# What tunectl needs beyond that image (it has aiohttp, pandas, numpy, rich, typer, pyyaml, pyarrow, tqdm;
# the SGLang overlay brings pydantic).
pkgs=(optuna alembic colorlog sqlalchemy greenlet mako paramiko bcrypt pynacl cryptography cffi pycparser
      invoke plotly tenacity)
rm -rf "$out"; mkdir -p "$out/whl"
pip download -q --no-deps "${plat[@]}" -d "$out/whl" "${pkgs[@]}"
# tunectl itself runs from the repository checkout (PYTHONPATH=<checkout>), or add: pip wheel --no-deps "$here" -w "$out/whl"
cat > "$out/install.sh" <<'SH'
#!/usr/bin/env bash
# Installs the packed wheels into /tmp/tunectl-site (no network needed).
set -eu
d=$(cd "$(dirname "$0")" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tunectl-site "$d"/whl/*.whl
PYTHONPATH=/tmp/tunectl-site:${PYTHONPATH:-} python3 -c "import optuna, paramiko, plotly; print('optuna', optuna.__version__)"
SH
du -sh "$out"
