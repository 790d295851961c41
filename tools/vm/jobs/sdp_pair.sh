#!/bin/bash
# One-VM job of bench/sdp_pair.sh: SDP and rsockets side by side in the same two processes
# (bench/pair/pingpong_pair.c): bursts of busy-polled 64 B ping-pongs alternating between an SDP connection (a TCP
# socket under rdmasock's preload) and an rsocket. RS_PAIR_VARIANTS lists NAME=LIBRARY pairs (default: the build's
# librdmasock.so as "sdp"), each run RS_PAIR_RUNS times (default 3) in turn; RS_PAIR_BURSTS, RS_PAIR_PINGS and
# RS_PAIR_SIZE pass to the program. Writes pair.txt into RS_VM_OUT: "run variant key value" per summary line.

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1
addr=$RS_VM_ADDR
prog=${RS_PAIR_PROG:?RS_PAIR_PROG names the pingpong_pair binary}
variants=${RS_PAIR_VARIANTS:-sdp=$RS_BUILD/librdmasock.so}
conf=/tmp/rdmasock.conf
printf 'use rdma tcp any %s:*\n' "$addr" > "$conf"
out=$RS_VM_OUT/pair.txt
: > "$out"
args=(-n "${RS_PAIR_BURSTS:-4000}" -k "${RS_PAIR_PINGS:-8}" -S "${RS_PAIR_SIZE:-64}" -w 20)
for run in $(seq 1 "${RS_PAIR_RUNS:-3}"); do
    for v in $variants; do
        name=${v%%=*} lib=${v#*=}
        p=$((20000 + RANDOM % 20000))
        pre=(env LD_PRELOAD="$lib" RDMASOCK_CONF="$conf" RDMASOCK_TRANSPORT=verbs)
        "${pre[@]}" timeout 600 "$prog" -s "$addr" -p "$p" "${args[@]}" > "$RS_VM_OUT/pair_${name}_$run.server.txt" 2>&1 &
        server=$! waited=0
        until ss -Hltn "sport = :$p" 2> /dev/null | grep -q . &&
              rdma resource show cm_id 2> /dev/null | grep -Eq "state LISTEN .*:$((p + 1))( |\$)"; do
            ((waited++ >= 200)) && break
            sleep 0.1
        done
        "${pre[@]}" timeout 600 "$prog" -c "$addr" -p "$p" "${args[@]}" -v > "$RS_VM_OUT/pair_${name}_$run.txt" 2>&1
        rc=$?
        wait "$server"
        src=$?
        awk -v r="$run" -v n="$name" 'NF == 2 { print r, n, $1, $2 }' "$RS_VM_OUT/pair_${name}_$run.txt" >> "$out"
        echo "$run $name exit $rc/$src" >> "$out"
    done
done
exit 0
