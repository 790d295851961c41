#!/bin/bash
# One-VM job of bench/sdp_calltime.sh: a busy-polled rstream ping-pong (-C 1, the nonblocking default of rstream),
# rsockets natively and SDP (-T s under rdmasock), each run with bench/calltime/calltime.so preloaded in front, so
# every send and receive is timed (see that file). RS_CALLTIME_RUNS lists the runs as KIND@BYTES (KIND rsockets
# or sdp), in the order they run; RS_CALLTIME_ITERS the round trips of each. Writes calltime.txt into RS_VM_OUT:
# per run rstream's line and one calltime line per process.

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1
addr=$RS_VM_ADDR
lib=$RS_BUILD/librdmasock.so
iters=${RS_CALLTIME_ITERS:-20000}
runs=${RS_CALLTIME_RUNS:-rsockets@64 rsockets@80 sdp@48 sdp@64 rsockets@64 rsockets@80 sdp@48 sdp@64}
shim=/tmp/calltime.so
out=$RS_VM_OUT/calltime.txt
cc -O2 -shared -fPIC -o "$shim" "$RS_TOP/bench/calltime/calltime.c" -ldl || exit 1
conf=/tmp/rdmasock.conf
printf 'use rdma tcp any %s:*\n' "$addr" > "$conf"
: > "$out"
for run in $runs; do
    kind=${run%@*} size=${run#*@}
    p=$((20000 + RANDOM % 20000))
    lines=/tmp/calltime.$p
    pre=(env LD_PRELOAD="$shim" CALLTIME_OUT="$lines")
    flags=()
    if [[ $kind == sdp ]]; then
        pre=(env LD_PRELOAD="$shim $lib" CALLTIME_OUT="$lines" RDMASOCK_CONF="$conf" RDMASOCK_TRANSPORT=verbs)
        flags=(-T s)
    fi
    "${pre[@]}" timeout 300 rstream "${flags[@]}" -b "$addr" -p "$p" -S "$size" -C 1 -I "$iters" > /dev/null 2>&1 &
    server=$!
    sleep 1.5
    result=$("${pre[@]}" timeout 300 rstream "${flags[@]}" -s "$addr" -p "$p" -S "$size" -C 1 -I "$iters" 2>&1 |
             grep custom)
    wait "$server"
    { echo "== $run: $result"; cat "$lines" 2>/dev/null; } >> "$out"
    rm -f "$lines"
done
exit 0
