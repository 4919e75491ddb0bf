#!/usr/bin/env bash
# The real-GPU campaign (docs/real-gpu.md), run on the GPU machine from the repository root after staging
# the SGLang overlay (/tmp/sgl-overlay/site) and tunectl's packed wheels (/tmp/tunectl-site).
# Usage: bench/gpu/run.sh OUTDIR [sweep|search|clients|all|ssh]
#   -> OUTDIR/{sweep.json,search.json,clients-*.json,results/,*.txt}, OUTDIR/DONE-*
#   ssh: tunectl over SSH to the same machine (tiny MoE, patch 0003, GLM-5-shaped): bench/gpu/ssh-moe.sh, after
#   bench/gpu/stage-ssh.sh (docs/real-gpu.md, "Over SSH")
set -uo pipefail
out=${1:?usage: $0 OUTDIR [sweep|search|clients|all]}; what=${2:-all}
mkdir -p "$out"
[ "$what" = ssh ] && exec bash "$(dirname "$0")/ssh-moe.sh" "$out"
export PYTHONPATH=/tmp/tunectl-site:/tmp/sgl-overlay/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
tl() { python3 -c "from tunectl.cli import app; app()" "$@"; }
prof=profiles/tiny-llama-h200.yaml
if [ "$what" = sweep ] || [ "$what" = all ]; then
  tl check -p "$prof" > "$out/check.txt" 2>&1
  tl sweep -p "$prof" -c 1,4,16,64,256,512 --client builtin,bench_serving --study h200-sweep \
     --results "$out/results" --json > "$out/sweep.json" 2> "$out/sweep.err"
  tl sweep -p "$prof" -c 16 --set mem-fraction-static=0.999 --study h200-oom --results "$out/results" --json \
     > "$out/sweep-oom.json" 2> "$out/sweep-oom.err"
  touch "$out/DONE-sweep"
fi
if [ "$what" = search ] || [ "$what" = all ]; then
  tl search -p "$prof" --trials 8 --study h200-search --results "$out/results" --json \
     > "$out/search.json" 2> "$out/search.err"
  for s in h200-sweep h200-search; do
    [ -d "$out/results/$s" ] || continue
    tl report --study "$s" --results "$out/results" --out "$out/results/$s/report.html" >> "$out/report.txt" 2>&1
  done
  touch "$out/DONE-search"
fi
if [ "$what" = clients ] || [ "$what" = all ]; then
  # The built-in client against the real sglang.bench_serving, order swapped between two launches: each level is
  # measured by both clients on one server, first by one, then by the other.
  for order in bench_serving,builtin builtin,bench_serving; do
    tag=${order%%,*}-first
    tl sweep -p "$prof" -c 1,16,64,256,512 --client "$order" --study "h200-clients-$tag" --results "$out/results" \
       --json > "$out/clients-$tag.json" 2> "$out/clients-$tag.err"
  done
  tl report --study h200-clients-builtin-first --results "$out/results" \
     --out "$out/results/h200-clients-builtin-first/report.html" >> "$out/report.txt" 2>&1
  touch "$out/DONE-clients"
fi
