#!/usr/bin/env bash
# Speculative decoding and GPU power on real SGLang (docs/real-gpu.md, "Speculative decoding on the real GPU"), on the
# GPU machine after `bench/gpu/landscape.sh stage` (the model in /tmp/sgl-stage/llama8b), from the repository root:
#   bench/gpu/spec.sh OUT        env: DEADLINE (epoch s: no sweep starts after DEADLINE - SWEEP_S, default 240)
# Three sweeps of profiles/real-llama8b-h100-spec.yaml on fresh launches (speculative decoding off, NGRAM, EAGLE with
# a one-layer dummy draft and SGLANG_SIMULATE_ACC_LEN), while nvidia-smi samples the board power every 0.5 s beside
# tunectl's own reader (the power check of docs/energy.md).
#   -> OUT/spec/{off,ngram,eagle}.json|.err, OUT/spec/results (tunectl's layout), OUT/spec/smi.csv, OUT/steps.log
set -uo pipefail
out=${1:?usage: $0 OUT}; d=$out/spec
mkdir -p "$d/results" /tmp/sgl-stage/llama8b-eagle-draft
export PYTHONPATH=/tmp/tunectl-site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 COLUMNS=200
cp bench/gpu/llama8b-eagle-draft/config.json /tmp/sgl-stage/llama8b-eagle-draft/
cp /tmp/sgl-stage/llama8b/tokenizer* /tmp/sgl-stage/llama8b-eagle-draft/ 2>/dev/null || true
step() { echo "$(date +%s) $(date -u +%T) $*" | tee -a "$out/steps.log"; }
nvidia-smi --query-gpu=timestamp,index,power.draw,utilization.gpu --format=csv,noheader,nounits -lms 500 \
  > "$d/smi.csv" 2>&1 &
smi=$!
trap 'kill "$smi" 2>/dev/null' EXIT
P=profiles/real-llama8b-h100-spec.yaml
sweep() {
  local name=$1; shift
  if [ -n "${DEADLINE:-}" ] && [ $(( $(date +%s) + ${SWEEP_S:-240} )) -gt "$DEADLINE" ]; then
    step "stop before spec-$name: deadline"; return 0; fi
  step "start spec-$name $*"
  python3 -c "from tunectl.cli import app; app()" sweep -p "$P" --client builtin --study "spec-$name" \
    --results "$d/results" --json "$@" > "$d/$name.json" 2> "$d/$name.err"
  step "end spec-$name exit $? gpu $(nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>&1)"
}
sweep off
sweep ngram --set speculative-algorithm=NGRAM --set speculative-num-draft-tokens=4
sweep eagle --set speculative-algorithm=EAGLE --set speculative-draft-model-path=/tmp/sgl-stage/llama8b-eagle-draft \
  --set speculative-num-steps=3 --set speculative-eagle-topk=1 --set speculative-num-draft-tokens=4
