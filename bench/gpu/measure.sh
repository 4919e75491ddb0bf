#!/usr/bin/env bash
# Measurement trust and MoE runners on real SGLang 0.5.17 (docs/real-gpu.md, "Measurements on fresh launches"):
# run from the repository root on the GPU machine after bench/gpu/stage-ssh.sh (overlay, wheels, sshd, alias h200).
# Usage: bench/gpu/measure.sh OUTDIR [STEPS]   (STEPS: a comma list of winner,default,moe,glm5,local; default all)
#   1. the SSH MoE search's winner on 3 fresh launches at 128 and 512, each level measured by the built-in client
#      (steady window, 95% interval) and then by the real sglang.bench_serving (8 x c requests) on the same server;
#   2. SGLang's default config (the profile's base flags) on 3 fresh launches at 128 and 512 (the gain's baseline);
#   3. each MoE runner backend the search did not draw, flashinfer_cutlass with its autotune on and off
#      (RUNNERS="a b:noautotune ..." picks some);
#   4. the GLM-5-shaped model with the seeds' flags, then with chunks of 128 tokens so that a 256-token prompt's
#      second chunk runs the FP8 MHA prefill with a cached prefix (patch 0004 logs it when it does), then with
#      the MLA prefill only (SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=0: the MHA one needs FA3);
#   5. (local) the winner on one launch at 128 and 512 with the built-in client run on the GPU host itself (no SSH
#      port forward between client and server), then the real sglang.bench_serving on the same server.
#   Each step leaves OUTDIR/DONE-<step>; nvidia-smi after each.
set -uo pipefail
out=${1:?usage: $0 OUTDIR [STEPS]}; steps=${2:-winner,default,moe,glm5,local}
mkdir -p "$out"
want() { [[ ",$steps," == *",$1,"* ]]; }
export PYTHONPATH=/tmp/tunectl-site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 COLUMNS=200
tl() { python3 -c "from tunectl.cli import app; app()" "$@"; }
res=$out/results
step() { echo "$(date +%T) $*" | tee -a "$out/steps.log"; }
gpu() { nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader > "$out/gpu-$1.csv" 2>&1
        step "gpu after $1: $(cat "$out/gpu-$1.csv")"; }

# Longer levels than the search's: 8 x c requests for the real client, steady levels to a 3% interval (40 s cap).
prof=/tmp/measure.yaml
python3 - profiles/tiny-moe-h200-ssh.yaml "$prof" <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
w = d["bench"]["workloads"][0]
w["prompts_per_level"] = 8
d["bench"].update({"precision": 0.03, "min_level_s": 10, "max_level_s": 40})
yaml.safe_dump(d, open(sys.argv[2], "w"))
PY
mapfile -t win < <(tl best --study ssh-moe-search --results docs/real-gpu/ssh-moe/results --format json | python3 -c "
import json, sys
for k, v in json.load(sys.stdin)['params'].items(): print('--set'); print(f'{k}={str(v).lower() if isinstance(v, bool) else v}')")
step "winner ${win[*]}"

if want winner; then
step winner-x3
tl sweep -p "$prof" -c 128,512 --client builtin,bench_serving --launches 3 "${win[@]}" --study h200-winner-x3 \
   --results "$res" --json > "$out/winner-x3.json" 2> "$out/winner-x3.err"; step "exit $?"; gpu winner-x3
touch "$out/DONE-winner"
fi

if want default; then
step default-x3
tl sweep -p "$prof" -c 128,512 --client builtin --launches 3 --study h200-default-x3 --results "$res" --json \
   > "$out/default-x3.json" 2> "$out/default-x3.err"; step "exit $?"; gpu default-x3
touch "$out/DONE-default"
fi

if want moe; then
for r in ${RUNNERS:-triton triton_kernel flashinfer_trtllm flashinfer_cutlass flashinfer_cutlass:noautotune}; do
  sets=(--set "moe-runner-backend=${r%%:*}")
  [ "$r" = flashinfer_cutlass:noautotune ] && sets+=(--set disable-flashinfer-autotune=true)
  tag=${r//[:_]/-}
  step "moe $r"
  tl sweep -p profiles/tiny-moe-h200-ssh.yaml -c 64,256 "${sets[@]}" --study "h200-moe-$tag" --results "$res" \
     --json > "$out/moe-$tag.json" 2> "$out/moe-$tag.err"; step "exit $?"; gpu "moe-$tag"
done
touch "$out/DONE-moe"
fi

if want glm5; then
step glm5
tl sweep -p profiles/tiny-glm5-h200-ssh.yaml -c 16,64 --study h200-glm5 --results "$res" --json \
   > "$out/glm5.json" 2> "$out/glm5.err"; step "exit $?"; gpu glm5
step glm5-prefix
tl sweep -p profiles/tiny-glm5-h200-ssh.yaml -c 16,64 --set chunked-prefill-size=128 --study h200-glm5-prefix \
   --results "$res" --json > "$out/glm5-prefix.json" 2> "$out/glm5-prefix.err"; step "exit $?"; gpu glm5-prefix
# every prefill through DSA's sparse MLA kernels: the dense MHA prefill needs FA3, which the overlay leaves out
python3 - <<'PY'
import yaml
d = yaml.safe_load(open("profiles/tiny-glm5-h200-ssh.yaml"))
d["server"]["env"]["SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD"] = "0"
yaml.safe_dump(d, open("/tmp/glm5-mla.yaml", "w"))
PY
step glm5-mla
tl sweep -p /tmp/glm5-mla.yaml -c 16,64 --study h200-glm5-mla --results "$res" --json > "$out/glm5-mla.json" \
   2> "$out/glm5-mla.err"; step "exit $?"; gpu glm5-mla
touch "$out/DONE-glm5"
fi

if want local; then
# The same profile with the host reached directly: tunectl, its built-in client and the server on one machine.
python3 - "$prof" /tmp/measure-local.yaml <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
d["host"] = {"kind": "local", "workdir": "/tmp/tunectl-local", "gpus": [0]}
yaml.safe_dump(d, open(sys.argv[2], "w"))
PY
step local
tl sweep -p /tmp/measure-local.yaml -c 128,512 --client builtin,bench_serving "${win[@]}" --study h200-local \
   --results "$res" --json > "$out/local.json" 2> "$out/local.err"; step "exit $?"; gpu local
touch "$out/DONE-local"
fi
