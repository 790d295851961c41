#!/bin/bash
# One-VM job of bench/sdp_cpu.sh: where the CPU goes when a bulk stream crosses rxe0, for raw RDMA WRITE and for
# SDP's methods, in interleaved rounds (RS_CPU_ROUNDS, default 6) at each size (RS_CPU_SIZES, default 64 KiB, 256 KiB,
# 1 MiB); which variant goes first rotates. Variants:
#   perftest   ib_write_bw -R (its client posts the WRITEs; its server busy-polls for the end)
#   sdp        sdp_bench --kind verbs, the default adaptive zero copy (on rxe: the send ring lent by SrcAvail, the
#              reader's RDMA READ moves the bytes)
#   sdp-bcopy  the same with zero copy off (the writer's SENDs move the bytes)
#   sdp-spin   the default with RDMASOCK_SPIN_US=1000 (every wait polls up to 1 ms before it sleeps)
# For each run: the VM's CPU time from /proc/stat (user with nice, system, softirq, idle), its wall time and the
# payload bytes moved, appended to RS_VM_OUT/cpu.txt as "round size variant MBps bytes user sys softirq idle wall
# vcpus". The VM runs nothing else, so the whole machine's time is the transfer's (set-up included on both sides:
# ib_write_bw's connection and registration, sdp_bench's fork, connect and first registrations).

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1
dev=$RS_VM_RDMA_DEV
addr=$RS_VM_ADDR
bench=${RS_SDP_BENCH:-$RS_BUILD/bench/sdp_bench}
out=$RS_VM_OUT/cpu.txt
: > "$out"
vcpus=$(nproc)
hz=$(getconf CLK_TCK)
# user+nice, system, softirq, idle+iowait, in clock ticks
ticks() { awk '$1 == "cpu" { print $2 + $3, $4, $8, $5 + $6 }' /proc/stat; }
port=18900
variants=(perftest sdp sdp-bcopy sdp-spin)
for round in $(seq 1 "${RS_CPU_ROUNDS:-6}"); do
    for size in ${RS_CPU_SIZES:-65536 262144 1048576}; do
        k=$(( (round - 1) % ${#variants[@]} ))
        for variant in "${variants[@]:k}" "${variants[@]:0:k}"; do
            name=cpu_${size}_${variant}_$round
            read -r u0 s0 q0 i0 < <(ticks)
            t0=$(date +%s.%N)
            if [[ $variant == perftest ]]; then
                iters=$(( (48 << 20) / size ))
                rs_vm_serve "$name" "$port" ib_write_bw -d "$dev" -R -s "$size" -n "$iters" -p "$port" -- \
                    ib_write_bw -d "$dev" -R -s "$size" -n "$iters" -p "$port" "$addr" > /dev/null
                port=$((port + 1))
                mbps=$(awk -v s="$size" '$1 == s && NF >= 4 && $2 ~ /^[0-9]+$/ { v = $4 }
                    END { if (v != "") printf "%.2f", v * 1.048576 }' "$RS_VM_OUT/$name.txt")
                bytes=$(( iters * size ))
            else
                env=(SDP_BENCH_STATS=1)
                [[ $variant == sdp-spin ]] && env+=(RDMASOCK_SPIN_US=1000)
                env "${env[@]}" timeout 300 "$bench" --kind verbs --addr "$addr" --modes bw --sizes "$size" \
                    --seconds 3 --reps 1 --only-sdp --zcopy "$([[ $variant == sdp-bcopy ]] && echo 0 || echo -1)" \
                    > "$RS_VM_OUT/$name.txt" 2>&1 || echo "sdp_bench ($name): exit $?"
                mbps=$(awk -F, '$1 ~ /^bw/ && $2 ~ /^[0-9]+$/ { print $4 }' "$RS_VM_OUT/$name.txt")
                bytes=$(grep -Eo '[0-9]+ bytes;' "$RS_VM_OUT/$name.txt" | head -n 1 | grep -Eo '^[0-9]+')
            fi
            read -r u1 s1 q1 i1 < <(ticks)
            t1=$(date +%s.%N)
            echo "$round $size $variant ${mbps:-FAIL} ${bytes:-0}" \
                "$(awk -v hz="$hz" -v a="$u0 $s0 $q0 $i0" -v b="$u1 $s1 $q1 $i1" -v t0="$t0" -v t1="$t1" 'BEGIN {
                    split(a, x, " "); split(b, y, " ")
                    printf "%.2f %.2f %.2f %.2f %.2f", (y[1] - x[1]) / hz, (y[2] - x[2]) / hz, (y[3] - x[3]) / hz,
                        (y[4] - x[4]) / hz, t1 - t0 }')" "$vcpus" >> "$out"
        done
    done
done
exit 0
