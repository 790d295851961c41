#!/bin/bash
# One-VM job of bench/sdp_footprint.sh: the client of a busy-polled 64 B rstream ping-pong (-C 1) runs under
# valgrind's callgrind, rsockets natively and SDP (-T s under rdmasock), the server natively beside it. Writes
# cg-KIND.out (callgrind, per instruction) and cg-KIND.txt (rstream's output) into RS_VM_OUT for each kind in
# RS_FOOTPRINT_KINDS (default "rsockets sdp"); RS_FOOTPRINT_ITERS round trips (default 1000). Valgrind slows the
# client a hundredfold: the times mean nothing, the code the steady state runs is what this is for.

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1
addr=$RS_VM_ADDR
lib=$RS_BUILD/librdmasock.so
iters=${RS_FOOTPRINT_ITERS:-1000}
conf=/tmp/rdmasock.conf
printf 'use rdma tcp any %s:*\n' "$addr" > "$conf"
command -v valgrind > /dev/null || { echo "sdp_footprint: valgrind is missing" >&2; exit 1; }
for kind in ${RS_FOOTPRINT_KINDS:-rsockets sdp}; do
    p=$((20000 + RANDOM % 20000))
    pre=(env)
    flags=()
    if [[ $kind == sdp ]]; then
        pre=(env LD_PRELOAD="$lib" RDMASOCK_CONF="$conf" RDMASOCK_TRANSPORT=verbs)
        flags=(-T s)
    fi
    "${pre[@]}" timeout 600 rstream "${flags[@]}" -b "$addr" -p "$p" -S 64 -C 1 -I "$iters" > /dev/null 2>&1 &
    server=$!
    sleep 1.5
    "${pre[@]}" timeout 600 valgrind --tool=callgrind --dump-instr=yes --compress-pos=no --compress-strings=no \
        --callgrind-out-file="$RS_VM_OUT/cg-$kind.out" rstream "${flags[@]}" -s "$addr" -p "$p" -S 64 -C 1 \
        -I "$iters" > "$RS_VM_OUT/cg-$kind.txt" 2>&1
    rc=$?
    wait "$server"
    [[ $rc == 0 ]] || { echo "sdp_footprint: the $kind client failed ($rc)" >&2; exit 1; }
done
exit 0
