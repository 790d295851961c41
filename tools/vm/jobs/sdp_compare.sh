#!/bin/bash
# One-VM job of bench/sdp_verbs.sh (issue 5's verbs targets): SDP over the verbs provider measured beside raw
# verbs and beside rsockets on the same rxe device, in one boot, so the ratios compare stacks on one machine state.
#   1. bandwidth by size (64 KiB..1 MiB) in interleaved rounds: perftest's ib_write_bw (raw RDMA WRITE) vs
#      sdp_bench --kind verbs (SDP stream sockets, one direction, blocking, as an application would use them);
#   2. rsockets vs SDP with ONE program: rstream (librdmacm's rsockets benchmark) natively, and `rstream -T s`
#      (plain socket calls) under rdmasock's preload, where its TCP sockets become SDP on rxe0. Same flags, same
#      measure: 64 B ping-pong (-C 1) and bulk transfers (-C 100) of 64 KiB and 1 MiB, default (nonblocking,
#      spinning) and blocking (-T b) calls; blocking once more with RDMASOCK_SPIN_US=$RS_SDP_SPIN_US for SDP
#      (default 0: no spin, the default before the adaptive one; rsockets spins 10 us by default); the default
#      calls' latency and bandwidth again in interleaved rounds, which give their verdicts (2b, 2c);
#   3. the 64 B ping-pong again with rxe0 recreated on the generic crc32 (see there).
# Writes compare.csv (test,variant,size,metric,value) and every tool's raw output into RS_VM_OUT.

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1
dev=$RS_VM_RDMA_DEV
addr=$RS_VM_ADDR
bench=${RS_SDP_BENCH:-$RS_BUILD/bench/sdp_bench}
lib=${RS_LIB:-$RS_BUILD/librdmasock.so}
sizes=${RS_SDP_SIZES:-65536 262144 1048576}
reps=${RS_SDP_REPS:-3}
out=$RS_VM_OUT/compare.csv
echo "test,variant,size,metric,value" > "$out"
conf=$RS_VM_OUT/rdmasock.conf
printf 'use rdma tcp any %s:*\n' "$addr" > "$conf"

# 1. Bandwidth in interleaved rounds (RS_SDP_BW_ROUNDS, default 6): every round runs, at each size, perftest's
#    ib_write_bw once, sdp_bench --kind verbs once with the default (adaptive) zero-copy threshold and once with zero
#    copy off (buffered copy only), which goes first rotating. This machine drifts within a boot (other tenants of
#    the host); run side by side, a round's ratio compares the stacks under one state of it, and the report takes
#    the median of the rounds' ratios (the three repetitions of each one after another moved 0.79-0.95 by boot).
#    perftest reports MB/s (2^20), converted to 10^6 bytes per second; sdp_bench's CSV is test,size,tcp,sdp,ratio.
port=18700
bw_variants=(perftest sdp sdp-bcopy)
for round in $(seq 1 "${RS_SDP_BW_ROUNDS:-6}"); do
    for size in $sizes; do
        k=$(( (round - 1) % ${#bw_variants[@]} ))
        for variant in "${bw_variants[@]:k}" "${bw_variants[@]:0:k}"; do
            name=write_bw_${size}_${variant}_$round
            if [[ $variant == perftest ]]; then
                iters=$(( (64 << 20) / size )); (( iters < 50 )) && iters=50
                rs_vm_serve "$name" "$port" ib_write_bw -d "$dev" -R -s "$size" -n "$iters" -p "$port" -- \
                    ib_write_bw -d "$dev" -R -s "$size" -n "$iters" -p "$port" "$addr" > /dev/null
                port=$((port + 1))
                awk -v s="$size" -v r="$round" '$1 == s && NF >= 4 && $2 ~ /^[0-9]+$/ { v = $4 }
                    END { if (v != "") printf "write_bw,perftest-round-%s,%s,MBps,%.2f\n", r, s, v * 1.048576 }' \
                    "$RS_VM_OUT/$name.txt" >> "$out"
            else
                timeout 300 "$bench" --kind verbs --addr "$addr" --modes bw --sizes "$size" --seconds 2 --reps 1 \
                    --zcopy "$([[ $variant == sdp-bcopy ]] && echo 0 || echo -1)" > "$RS_VM_OUT/$name.txt" 2>&1 ||
                    echo "sdp_bench ($name): exit $?"
                awk -F, -v v="$variant-round-$round" '$1 ~ /^bw/ && $2 ~ /^[0-9]+$/ {
                    printf "write_bw,%s,%s,MBps,%s\n", v, $2, $4 }' "$RS_VM_OUT/$name.txt" >> "$out"
            fi
        done
    done
done

# 2. rstream natively (rsockets) and with -T s under rdmasock (SDP). rstream prints
#    name bytes xfers iters total time Gb/sec usec/xfer (both directions counted).
spin=${RS_SDP_SPIN_US:-0}
# rxe's packets sent so far: each run records how many it made, the evidence that it went over RDMA at all (a
# socket left on the kernel would make none).
rxe_sent() { rdma statistic show link "$dev/1" 2>/dev/null | grep -Eo 'sent_pkts [0-9]+' | awk '{ print $2 }'; }
rstream_run() {     # NAME VARIANT SIZE COUNT ITERS FLAGS...
    local name=$1 variant=$2 size=$3 count=$4 iters=$5; shift 5
    local p=$((20000 + RANDOM % 20000))
    local -a pre=()
    [[ $variant == sdp* ]] && pre=(env LD_PRELOAD="$lib" RDMASOCK_CONF="$conf" RDMASOCK_TRANSPORT=verbs)
    [[ $variant == *spin ]] && pre+=(RDMASOCK_SPIN_US="$spin")
    [[ $variant == sdp-full* ]] && pre+=(RDMASOCK_SDP_COMPACT=off)
    "${pre[@]}" timeout 120 rstream "$@" -b "$addr" -p "$p" -S "$size" -C "$count" -I "$iters" \
        > "$RS_VM_OUT/$name.server.txt" 2>&1 &
    local server=$! waited=0
    # The server's listener: a TCP listen (SDP in 'rdma' mode keeps a kernel listener too) or an rsocket's rdma_cm.
    until ss -Hltn "sport = :$p" 2>/dev/null | grep -q . ||
          rdma resource show cm_id 2>/dev/null | grep -Eq "state LISTEN .*:$p( |\$)"; do
        (( waited++ >= 100 )) && break
        sleep 0.1
    done
    local pkts0 pkts1
    pkts0=$(rxe_sent)
    "${pre[@]}" timeout 120 rstream "$@" -s "$addr" -p "$p" -S "$size" -C "$count" -I "$iters" \
        > "$RS_VM_OUT/$name.txt" 2>&1
    wait "$server"
    pkts1=$(rxe_sent)
    awk -v n="$name" -v v="$variant" -v s="$size" -v c="$count" -v pk="$(( ${pkts1:-0} - ${pkts0:-0} ))" '
        $1 == "custom" { gb = $7; us = $8 }
        END { if (gb != "") { t = c == 1 ? "rstream_lat" : "rstream_bw"
                              # rstream prints Gb/s to two decimals (0.15-0.20 here, steps of 3-7%): the same
                              # figure from its microseconds per transfer keeps four.
                              if (us > 0) gb = sprintf("%.4f", s * 8 / (us * 1000))
                              printf "%s,%s,%s,Gbps,%s\n%s,%s,%s,us_per_xfer,%s\n", t, v, s, gb, t, v, s, us
                              printf "%s,%s,%s,rxe_pkts,%s\n", t, v, s, pk } }' \
        "$RS_VM_OUT/$name.txt" >> "$out"
}
for calls in default blocking; do
    flags=()
    [[ $calls == blocking ]] && flags=(-T b)
    variants=(rsockets sdp)
    [[ $calls == blocking ]] && variants+=(sdp-spin)
    for rep in $(seq 1 "$reps"); do
        for variant in "${variants[@]}"; do
            f=("${flags[@]}")
            [[ $variant == sdp* ]] && f+=(-T s)
            v=$variant-$calls
            [[ $variant == sdp-spin ]] && v=sdp-$calls-spin
            rstream_run "rstream_${calls}_lat_${variant}_$rep" "$v" 64 1 2000 "${f[@]}"
            # The header's share: SDP's 64 B message goes compact (its BSDH in the immediate data, docs/sdp.md
            # "Compact Data"), as rsockets' header rides in its WRITE's immediate. With compact Data off, the 16-byte
            # BSDH makes it 80 bytes on the wire; rsockets at 80 B is that many bytes without a header.
            if [[ $calls == default ]]; then
                [[ $variant == rsockets ]] &&
                    rstream_run "rstream_${calls}_lat80_${variant}_$rep" "$v" 80 1 2000 "${f[@]}"
                [[ $variant == sdp ]] &&
                    rstream_run "rstream_${calls}_lat_sdp-full_$rep" "sdp-full-$calls" 64 1 2000 "${f[@]}"
            fi
            # Busy-polled bandwidth has interleaved rounds of its own (2c).
            [[ $calls == default ]] && continue
            rstream_run "rstream_${calls}_bw64k_${variant}_$rep" "$v" 65536 100 10 "${f[@]}"
            rstream_run "rstream_${calls}_bw1m_${variant}_$rep" "$v" 1048576 10 10 "${f[@]}"
        done
    done
done

# 2b. The busy-polled 64 B ping-pong again in interleaved rounds (RS_SDP_LAT_ROUNDS, default 40, of
#     RS_SDP_LAT_ITERS round trips, default 2000): one rsockets run and one SDP run per round, which goes first
#     alternating. This machine's noise is per run (both ends busy-poll on the VM's two vCPUs and rxe's kernel work
#     must preempt one of them), so the report takes each round's ratio and their median (bench/sdp_verbs.sh); 12
#     rounds' medians moved by 0.1-0.2 between boots, 50 rounds' (bench/sdp_ab.sh) by 0.02-0.08.
# interleaved ROUNDS CMD...: runs CMD ROUND VARIANT FLAGS... for rsockets and for sdp in every round, which goes
# first alternating.
interleaved() {
    local rounds=$1 round variant
    shift
    for round in $(seq 1 "$rounds"); do
        local order=(rsockets sdp) f
        (( round % 2 == 0 )) && order=(sdp rsockets)
        for variant in "${order[@]}"; do
            f=()
            [[ $variant == sdp ]] && f=(-T s)
            "$@" "$round" "$variant" "${f[@]}"
        done
    done
}
lat_iters=${RS_SDP_LAT_ITERS:-2000}
lat_round() { rstream_run "rstream_round${1}_lat_$2" "$2-round-$1" 64 1 "$lat_iters" "${@:3}"; }
interleaved "${RS_SDP_LAT_ROUNDS:-40}" lat_round

# 2c. rstream's bulk bandwidth with busy-polled calls in interleaved rounds (RS_SDP_BW_ROUNDS, default 6) at 64 KiB
#     and 1 MiB, for the same reason: one rsockets run and one SDP run per size and round, the order alternating.
bw_round() {
    rstream_run "rstream_round${1}_bw64k_$2" "$2-round-$1" 65536 100 10 "${@:3}"
    rstream_run "rstream_round${1}_bw1m_$2" "$2-round-$1" 1048576 10 10 "${@:3}"
}
interleaved "${RS_SDP_BW_ROUNDS:-6}" bw_round

# 3. The same 64 B ping-pong with rxe's ICRC on the generic crc32. With crc32-pclmul loaded (tools/vm/init), rxe
#    checksums a payload of 79 bytes or more on the PCLMUL path, whose FPU save and restore is costly under TCG (on
#    hardware the NIC computes the ICRC): it charges a 16-byte header on a 64 B message (80 on the wire) far more
#    than its share. Recreating rxe0 without crc32-pclmul takes that out: SDP with compact Data off (80 bytes) and
#    on (64) against rsockets at 64 B show the header's own cost.
if rdma link delete "$dev" 2>/dev/null && rmmod crc32_pclmul 2>/dev/null &&
   rdma link add "$dev" type rxe netdev "$RS_VM_NETDEV"; then
    waited=0
    until rdma link show "$dev/1" 2>/dev/null | grep -q 'state ACTIVE'; do
        (( waited++ >= 100 )) && break
        sleep 0.1
    done
    for rep in $(seq 1 "$reps"); do
        for run in rsockets@64 rsockets@80 sdp@64 sdp-full@64; do
            variant=${run%@*} size=${run#*@}
            f=()
            [[ $variant == sdp* ]] && f=(-T s)
            rstream_run "rstream_gcrc_lat${size}_${variant}_$rep" "$variant-generic-crc" "$size" 1 2000 "${f[@]}"
        done
    done
else
    echo "sdp_compare: could not recreate $dev without crc32-pclmul; the generic-crc rows are missing"
fi
exit 0
