#!/usr/bin/env bash
# bench/sdp_footprint.sh [OUTDIR]: the code a busy-polled 64 B ping-pong runs per round trip, rsockets vs SDP
# (rstream -T s under rdmasock), in one soft-RoCE VM boot (tools/vm/jobs/sdp_footprint.sh: the client under
# callgrind; run again four times as long, for the instructions and calls per round trip with start-up
# subtracted). Prints bench/footprint/callgrind_footprint.py's summary of each and keeps the profiles in OUTDIR
# (default $RS_BUILD/bench-results/footprint). Not part of `make bench`: it measures code, not speed, and is the
# yardstick for the busy-polled latency work (docs/results/sdp-verbs.md, "The short path" and "Fewer atomics, calls and instructions per call").
set -euo pipefail
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
export RS_TOP RS_BUILD
out=${1:-$RS_BUILD/bench-results/footprint}
iters=${RS_FOOTPRINT_ITERS:-1000}
command -v rstream > /dev/null || { echo "bench/sdp_footprint: rstream is missing (apt-get install rdmacm-utils)" >&2; exit 1; }
command -v valgrind > /dev/null || { echo "bench/sdp_footprint: valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
mkdir -p "$out"
# Two boots' worth of runs: ITERS round trips, and 4 x ITERS for the per-round-trip difference.
"$RS_TOP/tools/vm/vm" run --timeout 1200 --out "$out" --env RS_FOOTPRINT_ITERS="$iters" \
    -- "$RS_TOP/tools/vm/jobs/sdp_footprint.sh" >&2
mkdir -p "$out/long"
"$RS_TOP/tools/vm/vm" run --timeout 1200 --out "$out/long" --env RS_FOOTPRINT_ITERS="$((iters * 4))" \
    -- "$RS_TOP/tools/vm/jobs/sdp_footprint.sh" >&2
for kind in ${RS_FOOTPRINT_KINDS:-rsockets sdp}; do
    echo "== $kind: $(grep -h custom "$out/cg-$kind.txt" || true)"
    python3 "$RS_TOP/bench/footprint/callgrind_footprint.py" "$out/cg-$kind.out" "$iters" "${RS_FOOTPRINT_TOP:-25}"
    echo "-- $kind, start-up subtracted ($iters and $((iters * 4)) round trips):"
    python3 "$RS_TOP/bench/footprint/callgrind_footprint.py" --per-trip "$out/cg-$kind.out" \
        "$out/long/cg-$kind.out" "$((iters * 3))" "${RS_FOOTPRINT_TOP:-25}"
done
