#!/usr/bin/env bash
# bench/sdp_calltime.sh [OUTDIR]: where a 64 B ping-pong's time goes, SDP (rstream -T s under rdmasock) vs rsockets,
# call by call, in one soft-RoCE VM boot (tools/vm/jobs/sdp_calltime.sh, bench/calltime/calltime.c). Prints and
# writes calltime.txt into OUTDIR (default $RS_BUILD/bench-results). RS_CALLTIME_RUNS and RS_CALLTIME_ITERS pass
# through to the job. Under TCG only comparisons within one run mean something.
set -euo pipefail
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
export RS_TOP RS_BUILD
out=${1:-$RS_BUILD/bench-results}
command -v rstream > /dev/null || { echo "bench/sdp_calltime: rstream is missing (apt-get install rdmacm-utils)" >&2; exit 1; }
mkdir -p "$out"
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
env_args=()
for name in RS_CALLTIME_RUNS RS_CALLTIME_ITERS; do
    [[ -n ${!name+x} ]] && env_args+=(--env "$name=${!name}")
done
"$RS_TOP/tools/vm/vm" run --timeout 1200 --out "$run" "${env_args[@]}" -- "$RS_TOP/tools/vm/jobs/sdp_calltime.sh" >&2
cp "$run/calltime.txt" "$out/calltime.txt"
cat "$out/calltime.txt"
