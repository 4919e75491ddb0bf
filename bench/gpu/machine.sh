#!/usr/bin/env bash
# The GPU machine a lease got, for comparing leases (docs/real-gpu.md, "The end-to-end real search"): the same config
# read 20% apart at 256 streams on two H100 machines while 16 and 64 streams agreed, so each run now says which
# machine it had and what the GPU's clocks and power did while it ran.
#   source bench/gpu/machine.sh; machine_facts OUT     -> OUT/gpu.txt (the GPU: name, memory, driver, power limits,
#                                                         max clocks, bus id, serial), OUT/cpu.txt (the CPU model, cores)
#   machine_trace OUT                                   -> OUT/gpu-trace.csv every 2 s until the calling script exits
#                                                         (SM clock, power draw, temperature, active clock-event reasons;
#                                                         appended, so a second run in one lease keeps the first's)
machine_facts() {
  local out=${1:?}
  nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version,power.limit,power.max_limit,clocks.max.sm,pci.bus_id,serial \
    --format=csv,noheader > "$out/gpu.txt" 2>&1
  { lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\)|Thread|Socket|CPU max MHz)' ; nproc; } > "$out/cpu.txt" 2>&1
}

machine_trace() {
  local out=${1:?}
  local fmt=csv,nounits
  [ -s "$out/gpu-trace.csv" ] && fmt=csv,nounits,noheader
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
    --format=$fmt -l 2 >> "$out/gpu-trace.csv" 2>&1 &
  trace_pid=$!
  trap 'kill $trace_pid 2>/dev/null' EXIT
}
