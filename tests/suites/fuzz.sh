#!/usr/bin/env bash
# Runs every libFuzzer target for FUZZ_SECONDS (make check: 60, make fuzz: 600) from its committed seed corpus.
# A crash, a sanitizer report or a leak fails the check; the reproducer is kept under $RS_BUILD/fuzz-artifacts.
# Targets run as many at once as there are CPUs (FUZZ_JOBS overrides): each still gets its full FUZZ_SECONDS of one
# CPU, while make check waits half as long on a two-CPU machine.
source "$RS_TOP/tests/lib/tap.sh"
secs=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
shopt -s nullglob
targets=("$RS_BUILD"/fuzz/fuzz_*)
if [ ${#targets[@]} -eq 0 ]; then tap_plan 1; tap_fail "fuzz targets built" "none in $RS_BUILD/fuzz"; exit 1; fi
tap_plan ${#targets[@]}
status=$(mktemp -d)

fuzz_one() {
  local bin=$1 name=${1##*/fuzz_} work arts log
  work=$(mktemp -d); arts=$RS_BUILD/fuzz-artifacts/$name; mkdir -p "$arts"
  # The fuzzer grows its corpus in a scratch copy: the committed seeds stay small and reviewed.
  [ -d "$RS_TOP/tests/fuzz/corpus/$name" ] && cp -r "$RS_TOP/tests/fuzz/corpus/$name/." "$work/"
  log=$RS_BUILD/test-logs/fuzz_$name.log
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$arts/" "$work" >"$log" 2>&1
  echo $? >"$status/$name"
  rm -rf "$work"
}

running=0
for bin in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
  fuzz_one "$bin" &
  running=$((running + 1))
done
wait

# Reported in the targets' order once all have finished, so the TAP stream does not depend on which ended first.
for bin in "${targets[@]}"; do
  name=${bin##*/fuzz_}; log=$RS_BUILD/test-logs/fuzz_$name.log
  if [ "$(cat "$status/$name" 2>/dev/null)" = 0 ]; then
    runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$')
    tap_ok "fuzz_$name: ${secs}s, ${runs:-?} inputs, no crash or sanitizer report"
  else
    tap_fail "fuzz_$name found a failure" "$(grep -E 'ERROR|SUMMARY|Test unit written|runtime error' "$log" | head -n 12)"
  fi
done
rm -rf "$status"
tap_done_plan >/dev/null
