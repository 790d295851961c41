#!/bin/bash
# One-VM job of bench/sdp_ab.sh: interleaved rounds of the busy-polled 64 B rstream ping-pong (-C 1), each round
# running every variant once in RS_AB_VARIANTS order. A variant is "rsockets" (rstream natively) or a NAME whose
# library is RS_AB_LIB_NAME (rstream -T s under that librdmasock.so over verbs), with extra environment
# RS_AB_ENV_NAME ("VAR=value ..."). RS_AB_ROUNDS rounds (default 20) of RS_AB_ITERS round trips (default 2000).
# Appends "round variant us-per-transfer" (FAIL when a run failed) to RS_VM_OUT/ab.txt.

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1
addr=$RS_VM_ADDR
conf=/tmp/rdmasock.conf
printf 'use rdma tcp any %s:*\n' "$addr" > "$conf"
iters=${RS_AB_ITERS:-2000}
out=$RS_VM_OUT/ab.txt
: > "$out"
for round in $(seq 1 "${RS_AB_ROUNDS:-20}"); do
    for v in ${RS_AB_VARIANTS:-rsockets}; do
        p=$((20000 + RANDOM % 20000))
        pre=(env) flags=()
        if [[ $v != rsockets ]]; then
            libv=RS_AB_LIB_$v envv=RS_AB_ENV_$v
            # shellcheck disable=SC2206  # the extra environment is a list of words on purpose
            pre=(env LD_PRELOAD="${!libv}" RDMASOCK_CONF="$conf" RDMASOCK_TRANSPORT=verbs ${!envv:-})
            flags=(-T s)
        fi
        "${pre[@]}" timeout 300 rstream "${flags[@]}" -b "$addr" -p "$p" -S 64 -C 1 -I "$iters" > /dev/null 2>&1 &
        server=$! waited=0
        until ss -Hltn "sport = :$p" 2> /dev/null | grep -q . ||
            rdma resource show cm_id 2> /dev/null | grep -Eq "state LISTEN .*:$p( |\$)"; do
            ((waited++ >= 100)) && break
            sleep 0.1
        done
        "${pre[@]}" timeout 300 rstream "${flags[@]}" -s "$addr" -p "$p" -S 64 -C 1 -I "$iters" > /tmp/ab_run.txt 2>&1
        wait "$server"
        us=$(awk '$1 == "custom" { print $8 }' /tmp/ab_run.txt)
        echo "$round $v ${us:-FAIL}" >> "$out"
    done
done
exit 0
