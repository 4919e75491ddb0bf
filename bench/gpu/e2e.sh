#!/usr/bin/env bash
# One real search end to end on the GPU (docs/real-gpu.md, "The end-to-end real search"): run from the repository
# root on the GPU machine after bench/gpu/landscape.sh stage; run it detached.
# Usage: bench/gpu/e2e.sh OUT [PROFILE] [STUDY]     env: TRIALS (12), DEADLINE (epoch s: no launch starts after
#        DEADLINE - LAUNCH_S), LAUNCH_S (150), KEEP (a folder of an earlier lease's results/, copied in first),
#        CONFIRM_ONLY=1 (a lease too short for both: no search; the confirmation of the config `tunectl best` names
#        now, the race's leader when the race has not finished), LAUNCHES (3: of each side, `tunectl confirm`),
#        ORDER ("default winner": instead, the launches one `sweep` each, in this order, as leases 2 and 3 ran them),
#        SEARCH_ONLY=1 (no confirmation: the lease goes on to other work once the search and its race are done)
#   1. `tunectl search` (the same command resumes: the study's results from KEEP continue where they stopped;
#      with DEADLINE it is stopped by SIGTERM at DEADLINE, as Ctrl-C stops it);
#   2. once it has a winner: `tunectl confirm`: the winner and SGLang's own choice (the profile's base flags, no
#      searched flag set) on LAUNCHES fresh launches each, interleaved W D D W W D so that a drift of the machine
#      hits both, each level measured by the real sglang.bench_serving with 8 x c requests, judged in pairs.
#   -> OUT/results/<study>/ (the search), OUT/results/<study>-confirm/ (confirm.json; with ORDER:
#      OUT/results/<study>-confirm-{winner,default}-<n>/, bench/gpu/e2e_gain.py), OUT/confirm.out, OUT/steps.log,
#      OUT/DONE
set -uo pipefail
out=${1:?usage: $0 OUT [PROFILE] [STUDY]}; prof=${2:-profiles/real-llama8b-h100.yaml}; study=${3:-e2e-llama8b}
mkdir -p "$out/results"
[ -n "${KEEP:-}" ] && [ -d "$KEEP" ] && cp -rn "$KEEP"/. "$out/results/"
export PYTHONPATH=/tmp/tunectl-site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 COLUMNS=200
tl() { python3 -c "from tunectl.cli import app; app()" "$@"; }
step() { echo "$(date +%s) $(date -u +%T) $*" | tee -a "$out/steps.log"; }
late() { [ -n "${DEADLINE:-}" ] && [ $(( $(date +%s) + ${LAUNCH_S:-150} )) -gt "$DEADLINE" ]; }
. "$(dirname "$0")/machine.sh"; machine_facts "$out"; machine_trace "$out"
step "e2e $study on $prof, gpu $(cat "$out/gpu.txt")"

if [ -n "${CONFIRM_ONLY:-}" ]; then step "search skipped (CONFIRM_ONLY)"; else
step "search start"
# A lease ends at DEADLINE: the search gets SIGTERM before it (handled as Ctrl-C: the trial's server torn down, its
# files saved), and the same command resumes in the next lease.
lim=(); [ -n "${DEADLINE:-}" ] && lim=(timeout -s TERM -k 60 $(( DEADLINE - $(date +%s) )))
"${lim[@]}" python3 -c "from tunectl.cli import app; app()" search -p "$prof" --study "$study" --trials "${TRIALS:-12}" --results "$out/results" --json \
  > "$out/search.json" 2> "$out/search.err"
rc=$?; step "search end exit $rc"
if [ $rc -ne 0 ] || [ -n "${SEARCH_ONLY:-}" ]; then touch "$out/DONE"; exit 0; fi
fi

# The confirmation's levels: 8 x c requests for the real client (the search measured 4 x c).
cprof=/tmp/e2e-confirm.yaml
python3 - "$prof" "$cprof" <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
d["bench"]["workloads"][0]["prompts_per_level"] = 8
yaml.safe_dump(d, open(sys.argv[2], "w"))
PY
mapfile -t win < <(tl best --study "$study" --results "$out/results" --format json | python3 -c "
import json, sys
for k, v in json.load(sys.stdin)['params'].items(): print('--set'); print(f'{k}={str(v).lower() if isinstance(v, bool) else v}')")
step "winner ${win[*]}"
if [ -z "${ORDER:-}" ]; then
  # `tunectl confirm`: the winner and SGLang's own choice, W D D W W D on fresh launches, judged in pairs
  # (results/<study>-confirm/confirm.json); stopped by SIGTERM at DEADLINE (the launch under way recorded
  # interrupted), and the same command continues in the next lease.
  lim=(); [ -n "${DEADLINE:-}" ] && lim=(timeout -s TERM -k 60 $(( DEADLINE - $(date +%s) )))
  step "confirm start: ${LAUNCHES:-3} launches each"
  "${lim[@]}" python3 -c "from tunectl.cli import app; app()" confirm -p "$cprof" --study "$study" \
    --client bench_serving --launches "${LAUNCHES:-3}" --results "$out/results" > "$out/confirm.out" 2> "$out/confirm.err"
  step "confirm end exit $? gpu $(nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>&1)"
  touch "$out/DONE"; exit 0
fi
# ORDER given: the launches one `sweep` each, named <study>-confirm-<who>-<n> (leases 2 and 3; bench/gpu/e2e_gain.py)
n=0
for who in $ORDER; do
  n=$((n + 1)); name="$study-confirm-$who-$n"
  [ -d "$out/results/$name" ] && { step "skip $name (measured)"; continue; }
  late && { step "stop before $name: deadline"; break; }
  args=(); [ "$who" = winner ] && args=("${win[@]}")
  step "start $name ${args[*]}"
  tl sweep -p "$cprof" --client bench_serving "${args[@]}" --study "$name" --results "$out/results" --json \
    > "$out/$name.json" 2> "$out/$name.err"
  step "end $name exit $? gpu $(nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>&1)"
done
touch "$out/DONE"
