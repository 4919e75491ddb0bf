#!/usr/bin/env bash
# tunectl over SSH to real SGLang 0.5.17 on the GPU machine (docs/real-gpu.md, "Over SSH: a tiny MoE"): run from
# the repository root after bench/gpu/stage-ssh.sh (overlay, wheels, sshd on loopback, alias h200).
# Usage: bench/gpu/ssh-moe.sh OUTDIR [SSHD_DIR]
#   check -> sweep with the link cut mid-ladder (patch 0003 on) -> search -> SGLang default vs the winner, both
#   measured by the real sglang.bench_serving at 8 x c requests per level; nvidia-smi after each step;
#   the patched file's sha256 before, during and after; then the GLM-5-shaped model with the seeds' flags.
#   Each step leaves OUTDIR/DONE-<step>.
set -uo pipefail
out=${1:?usage: $0 OUTDIR [SSHD_DIR]}; sshd_dir=${2:-/tmp/ssh-h200}
mkdir -p "$out"
export PYTHONPATH=/tmp/tunectl-site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 COLUMNS=200
tl() { python3 -c "from tunectl.cli import app; app()" "$@"; }
prof=${PROFILE:-profiles/tiny-moe-h200-ssh.yaml}; sweep_set=${SWEEP_SET:-log-moe-runner=true}
res=$out/results
step() { echo "$(date +%T) $*" | tee -a "$out/steps.log"; }
gpu() { nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader > "$out/gpu-$1.csv" 2>&1
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader > "$out/apps-$1.csv" 2>&1
        step "gpu after $1: $(cat "$out/gpu-$1.csv") apps: $(wc -l < "$out/apps-$1.csv")"; }
moe=$(python3 -c "import sglang, os; print(os.path.dirname(sglang.__file__))" 2>/dev/null)/srt/layers/moe/utils.py
moehash() { step "sha256 $1: $(sha256sum "$moe" | cut -c1-64)"; }

step check; moehash before-anything
tl check -p "$prof" > "$out/check.txt" 2>&1; step "check exit $?"; touch "$out/DONE-check"

# One launch with the patch on; every SSH session is killed once the first level is on disk.
step sweep-cut
tl sweep -p "$prof" -c 16,64,256 --set "$sweep_set" --study ssh-sweep --results "$res" --json \
   > "$out/sweep-cut.json" 2> "$out/sweep-cut.err" &
sw=$!
for _ in $(seq 1 600); do
  ls "$res"/ssh-sweep/trials/0/levels/*.json >/dev/null 2>&1 && { grep -h "tunectl patch 0003" \
     "$res"/ssh-sweep/trials/0/server.log > "$out/patch-line-live.txt" 2>/dev/null; moehash while-serving;
     python3 bench/gpu/ssh_host.py cut "$sshd_dir" >> "$out/steps.log" 2>&1; break; }
  kill -0 $sw 2>/dev/null || break; sleep 0.5
done
wait $sw; step "sweep exit $?"; gpu sweep; touch "$out/DONE-sweep"

step search
tl search -p "$prof" --study ssh-moe-search --results "$res" --json > "$out/search.json" 2> "$out/search.err"
step "search exit $?"; gpu search; moehash after-search
tl trials --study ssh-moe-search --results "$res" > "$out/trials.txt" 2>&1; touch "$out/DONE-search"

# SGLang's default config (the profile's base flags only) against the search's winner, real client, 8 x c.
python3 - "$prof" /tmp/compare.yaml <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
d["bench"]["workloads"][0]["prompts_per_level"] = 8
d["bench"]["client"] = "bench_serving"
yaml.safe_dump(d, open(sys.argv[2], "w"))
PY
step compare-default
tl sweep -p /tmp/compare.yaml -c 16,64,256 --client bench_serving --study ssh-default-bs --results "$res" --json \
   > "$out/default-bs.json" 2> "$out/default-bs.err"; step "default exit $?"; gpu default; moehash after-default
mapfile -t sets < <(tl best --study ssh-moe-search --results "$res" --format json 2>/dev/null | python3 -c "
import json, sys
for k, v in json.load(sys.stdin)['params'].items(): print('--set'); print(f'{k}={str(v).lower() if isinstance(v, bool) else v}')")
step "compare-winner ${sets[*]}"
tl sweep -p /tmp/compare.yaml -c 16,64,256 --client bench_serving "${sets[@]}" --study ssh-winner-bs --results "$res" \
   --json > "$out/winner-bs.json" 2> "$out/winner-bs.err"; step "winner exit $?"; gpu winner; moehash after-winner
touch "$out/DONE-compare"

# The GLM-5-shaped model with the seeds' flags (FP8 KV, radix off, max-running 512): starts, or the real crash.
step glm5
tl sweep -p profiles/tiny-glm5-h200-ssh.yaml -c 16,64 --study ssh-glm5 --results "$res" --json \
   > "$out/glm5.json" 2> "$out/glm5.err"; step "glm5 exit $?"; gpu glm5; touch "$out/DONE-glm5"
