#!/usr/bin/env bash
# One lease's work as a queue (docs/real-gpu.md, "A lease as a queue"): after `bench/gpu/landscape.sh stage`, one
# detached command runs the named jobs in order until DEADLINE, each in OUT/<job>/, and `landscape.sh collect OUT
# SECONDS $OUT` brings all of it back in the following calls.
#
#   DEADLINE=<epoch s> setsid nohup bash bench/gpu/queue.sh OUT JOB [JOB ...] > /dev/null 2>&1 < /dev/null &
#
# Jobs (each skips what the checked-in results already hold, and stops before DEADLINE less its own step's time):
#   confirm    `tunectl confirm` of the end-to-end study (bench/gpu/e2e.sh CONFIRM_ONLY=1, KEEP = its results;
#              LAUNCHES, default 3: a later lease with a larger LAUNCHES extends the pairs, on one machine only)
#   dense      the dense landscape's next configs (docs/real-gpu/landscapes/llama8b-h100, CONFIG_S 290)
#   relaunch   the dense landscape's relaunches only (RELAUNCH, default "c02 c05 c11": each as -r2, -r3)
#   moe        the MoE landscape's next configs (docs/real-gpu/landscapes/qwen3moe30b-h100, CONFIG_S 300)
# -> OUT/<job>/ (that script's OUT), OUT/steps.log (a line per job start and end), OUT/DONE
set -uo pipefail
out=${1:?usage: $0 OUT JOB [JOB ...]}; shift
[ $# -gt 0 ] || { sed -n 2,16p "$0"; exit 2; }
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here" || exit 1
mkdir -p "$out"
step() { echo "$(date +%s) $(date -u +%T) $*" | tee -a "$out/steps.log"; }
dense=docs/real-gpu/landscapes/llama8b-h100/design.yaml
moe=docs/real-gpu/landscapes/qwen3moe30b-h100/design.yaml
for job in "$@"; do
  case $job in confirm|dense|relaunch|moe) ;; *) step "unknown job $job: one of confirm, dense, relaunch, moe"
    continue ;; esac
  if [ -n "${DEADLINE:-}" ] && [ $(( $(date +%s) + 120 )) -gt "$DEADLINE" ]; then step "stop before $job: deadline"
    break; fi
  step "job $job start"
  case $job in
    confirm) KEEP=docs/real-gpu/e2e/llama8b-h100/results CONFIRM_ONLY=1 LAUNCHES=${LAUNCHES:-3} \
               bash bench/gpu/e2e.sh "$out/confirm" profiles/real-llama8b-h100.yaml e2e-llama8b ;;
    dense) CONFIG_S=290 bash bench/gpu/landscape.sh run "$dense" "$out/dense" ;;
    relaunch) r=${RELAUNCH:-c02 c05 c11}; CONFIG_S=290 ONLY=$r RELAUNCH=$r bash bench/gpu/landscape.sh run "$dense" \
                "$out/relaunch" ;;
    moe) CONFIG_S=300 bash bench/gpu/landscape.sh run "$moe" "$out/moe" ;;
  esac
  step "job $job end exit $?"
done
touch "$out/DONE"
