#!/usr/bin/env bash
# Measures a landscape (docs/real-gpu.md, "Measured landscapes"): every config of a design.yaml, in its order, one
# launch each, each level measured by the built-in client and then by the real sglang.bench_serving on that launch.
# Configs whose study is already in the landscape's checked-in results/ (or in OUT) are skipped, so the next lease
# continues where the last one stopped.
#
#   bench/gpu/landscape.sh pack OVERLAY_DIR WHEELS_DIR OUTDIR N   (here) the SGLang overlay's parts
#       (the overlay build script of docs/real-gpu.md), tunectl's wheels (bench/gpu/pack.sh) and the small tokenizer,
#       as N folders OUTDIR/p1..pN of equal size (each carried by one device call)
#   bench/gpu/landscape.sh stage PARTDIR N                        (GPU machine) collects a part under /tmp/ls-stage;
#       after the N-th: overlay importable by python3, tunectl's wheels, the model folders /tmp/sgl-stage/llama8b
#       and /tmp/sgl-stage/qwen3moe30b (the MoE landscape's)
#   bench/gpu/landscape.sh run DESIGN OUT                         (GPU machine, repository root; run it detached)
#       env: DEADLINE (epoch s: no config starts after DEADLINE - CONFIG_S), CONFIG_S (default 150),
#       RELAUNCH ("c02 c05": after the design, each of these again as <name>-<id>-r2, -r3), ONLY ("c03 c07"),
#       PRESSURE_AFTER=c05 (then one level at 256 with a small KV pool, mem-fraction PRESSURE_MFS: OUT/facts/)
#   -> OUT/results/<name>-<id>/ (tunectl's layout), OUT/sweeps/<id>.json|.err, OUT/steps.log, OUT/gpu.txt, OUT/DONE
#   bench/gpu/landscape.sh collect OUT SECONDS DEST                 (GPU machine) waits until OUT/DONE or SECONDS,
#       printing the steps as they come, then packs OUT as DEST/landscape.tgz (a device call's way back)
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)

pack() {
  local overlay=${1:?} wheels=${2:?} out=${3:?} n=${4:?} work
  work=$(mktemp -d); trap 'rm -rf "$work"' RETURN
  cat "$overlay"/part-*/site.tgz.part* > "$work/site.tgz"
  cp -r "$overlay/part-1/tiny-llama" "$work/"; cp -r "$wheels" "$work/whl"
  tar -C "$work" -cf "$work/bundle.tar" site.tgz tiny-llama whl
  local size per; size=$(stat -c %s "$work/bundle.tar"); per=$(( (size + n - 1) / n ))
  split -b "$per" -d -a 1 "$work/bundle.tar" "$work/bundle.part"
  rm -rf "$out"; local i=1
  for p in "$work"/bundle.part*; do mkdir -p "$out/p$i"; mv "$p" "$out/p$i/"; i=$((i+1)); done
  du -sh "$out"/p*
}

stage() {
  local part=${1:?} n=${2:?} b=/tmp/ls-stage
  mkdir -p "$b"; cp "$part"/bundle.part* "$b/"
  [ "$(ls "$b"/bundle.part* | wc -l)" -ge "$n" ] || { echo "staged $(ls "$b"/bundle.part* | wc -l) of $n"; return 0; }
  cat "$b"/bundle.part* | tar x -C "$b"
  # unpacked aside and moved in whole: a stage killed mid-unpack (its call ended) leaves no half overlay that the
  # next stage would take for a whole one
  if [ ! -d /tmp/sgl-overlay/site/sglang ]; then
    rm -rf /tmp/sgl-overlay /tmp/sgl-overlay.part; mkdir -p /tmp/sgl-overlay.part
    tar xzf "$b/site.tgz" -C /tmp/sgl-overlay.part && mv /tmp/sgl-overlay.part /tmp/sgl-overlay
  fi
  local m
  for m in llama8b qwen3moe30b; do        # the landscapes' models: a config.json each, the small tokenizer
    mkdir -p /tmp/sgl-stage/$m; cp "$here"/bench/gpu/$m/config.json "$b"/tiny-llama/tokenizer*.json /tmp/sgl-stage/$m/
  done
  local site; site=$(python3 -c "import site; print(site.getsitepackages()[0])")
  echo "import sys; sys.path.insert(0, '/tmp/sgl-overlay/site')" > "$site/zz-sgl-overlay.pth"
  bash "$b/whl/install.sh"
  python3 -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)"
}

# one `--set` argument per line for config ID of DESIGN
sets() {
  python3 - "$1" "$2" <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
[c] = [c for c in d["configs"] if c["id"] == sys.argv[2]]
for k, v in c["set"].items():
    print("--set"); print(f"{k}={str(v).lower() if isinstance(v, bool) else v}")
PY
}

field() { python3 -c "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); v = d[sys.argv[2]]; \
print(' '.join(c['id'] for c in v) if sys.argv[2] == 'configs' else ','.join(map(str, v)) if isinstance(v, list) \
else v)" "$1" "$2"; }

# A KV pool too small for the load (the log lines the search acts on: pool full, retraction, queue), one level,
# outside the landscape: OUT/facts/
pressure() {
  local prof=$1 out=$2
  [ -n "${DEADLINE:-}" ] && [ $(( $(date +%s) + 90 )) -gt "$DEADLINE" ] && return 0
  step "start kvpressure mem-fraction-static=${PRESSURE_MFS:-0.3}"
  python3 -c "from tunectl.cli import app; app()" sweep -p "$prof" -c 256 --client builtin \
    --set mem-fraction-static="${PRESSURE_MFS:-0.3}" --set max-running-requests=512 --study kvpressure \
    --results "$out/facts" --json > "$out/facts-kvpressure.json" 2> "$out/facts-kvpressure.err"
  step "end kvpressure exit $?"
}

run() {
  local design=${1:?} out=${2:?}
  mkdir -p "$out/sweeps" "$out/results"
  export PYTHONPATH=/tmp/tunectl-site:$here HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 COLUMNS=200
  local name prof levels ids done_dir
  name=$(field "$design" name); prof=$(field "$design" profile); levels=$(field "$design" levels)
  ids=$(field "$design" configs); done_dir=$(dirname "$design")/results
  [ -z "${ONLY:-}" ] || ids=$ONLY
  step() { echo "$(date +%s) $(date -u +%T) $*" | tee -a "$out/steps.log"; }
  . "$here/bench/gpu/machine.sh"; machine_facts "$out"; machine_trace "$out"
  step "design $design: $name, profile $prof, levels $levels, gpu $(cat "$out/gpu.txt")"
  local jobs=() r id
  for id in $ids; do jobs+=("$id:$name-$id"); [ "$id" = "${PRESSURE_AFTER:-}" ] && jobs+=("kvpressure:"); done
  for id in ${RELAUNCH:-}; do for r in 2 3; do jobs+=("$id:$name-$id-r$r"); done; done
  for job in "${jobs[@]}"; do
    id=${job%%:*}; local study=${job#*:}
    if [ "$id" = kvpressure ]; then pressure "$prof" "$out"; continue; fi
    if [ -d "$done_dir/$study" ] || [ -d "$out/results/$study" ]; then step "skip $study (measured)"; continue; fi
    if [ -n "${DEADLINE:-}" ] && [ $(( $(date +%s) + ${CONFIG_S:-150} )) -gt "$DEADLINE" ]; then
      step "stop before $study: deadline"; break; fi
    mapfile -t s < <(sets "$design" "$id")
    step "start $study ${s[*]}"
    python3 -c "from tunectl.cli import app; app()" sweep -p "$prof" -c "$levels" --client builtin,bench_serving \
      "${s[@]}" --study "$study" --results "$out/results" --json > "$out/sweeps/${study#"$name"-}.json" \
      2> "$out/sweeps/${study#"$name"-}.err"
    step "end $study exit $? gpu $(nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>&1)"
  done
  touch "$out/DONE"
}

collect() {
  local out=${1:?} secs=${2:?} dest=${3:?} t0 seen=0
  t0=$(date +%s)
  while [ ! -e "$out/DONE" ] && [ $(( $(date +%s) - t0 )) -lt "$secs" ]; do
    local n; n=$(wc -l < "$out/steps.log" 2>/dev/null || echo 0)
    [ "$n" -gt "$seen" ] && { tail -n $((n - seen)) "$out/steps.log"; seen=$n; }
    sleep 5
  done
  tail -n +$((seen + 1)) "$out/steps.log" 2>/dev/null
  tar czf "$dest/landscape.tgz" -C "$(dirname "$out")" "$(basename "$out")"; ls -la "$dest"
}

cmd=${1:-}; shift || true
case $cmd in
  pack) pack "$@" ;;
  stage) stage "$@" ;;
  run) run "$@" ;;
  collect) collect "$@" ;;
  *) sed -n 2,19p "$0"; exit 2 ;;
esac
