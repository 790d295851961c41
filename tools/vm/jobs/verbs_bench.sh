#!/bin/bash
# One-VM job of bench/verbs/run.sh: the same rxe device measured by perftest (raw verbs) and by rdmasock-perf
# through the verbs provider, back to back in one boot, so their ratios compare stacks on one machine state.
# Writes perftest.csv (test,size,metric,value; a row per round) and rdmasock-poll.csv / rdmasock-block.csv
# (rdmasock-perf's CSV, the rounds appended) into RS_VM_OUT.

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1
dev=$RS_VM_RDMA_DEV
addr=$RS_VM_ADDR
perf=${RS_PERF:-$RS_BUILD/bin/rdmasock-perf}
iters=${RS_BENCH_ITERS:-1000}
out=$RS_VM_OUT/perftest.csv
echo "test,size,metric,value" > "$out"

# The RoCE v2 GID of our IPv4 address (perftest without rdma_cm needs its index).
gid_index=
for t in /sys/class/infiniband/"$dev"/ports/1/gid_attrs/types/*; do
    i=${t##*/}
    [[ "$(cat "$t" 2>/dev/null)" == "RoCE v2" ]] || continue
    [[ "$(cat "/sys/class/infiniband/$dev/ports/1/gids/$i")" == *"$(printf '%02x%02x:%02x%02x' ${addr//./ })" ]] &&
        { gid_index=$i; break; }
done

# pt NAME METRIC-COLUMN PORT CMD...: server and client of one perftest run; the result row's column goes to the CSV.
pt() {
    local name=$1 col=$2 port=$3; shift 3
    local size
    size=$(awk '{ for (i = 1; i < NF; i++) if ($i == "-s") print $(i + 1) }' <<< "$*")
    timeout 120 "$@" -p "$port" > "$RS_VM_OUT/$name.server.txt" 2>&1 &
    local server=$!
    if [[ " $* " == *" -R "* ]]; then
        rs_vm_wait_listen "$port" 30
    else
        sleep 1     # a TCP exchange; the client retries its connect
    fi
    timeout 120 "$@" -p "$port" "$addr" > "$RS_VM_OUT/$name.txt" 2>&1
    wait "$server"
    # The result row starts with the message size; lat: t_typical is column 5, bw: BW average column 4.
    awk -v n="$name" -v s="$size" -v c="$col" -v m="${name##*_}" '
        $1 == s && NF >= c && $2 ~ /^[0-9]+$/ { v = $c } END { if (v != "") print n "," s "," m "," v }' \
        "$RS_VM_OUT/$name.txt" >> "$out"
    echo "perftest $name: $(tail -n 1 "$out")"
}

# Rounds alternate the two stacks (perftest, then rdmasock-perf busy polling), so a slow phase of the machine
# (TCG, 2 vCPUs shared with rxe's kernel work) hits both; the summary takes each one's median over the rounds.
rounds=${RS_BENCH_ROUNDS:-3}
seconds=${RS_BENCH_SECONDS:-1}
rdmasock() {    # WAIT(poll|block) ROUND
    local wait=$1 round=$2
    timeout 600 "$perf" --loopback --bind "$addr" --kind verbs --tests rc:send,rc:write,rc:read,ud:send,ud:wrecord \
        --modes lat,bw --sizes 64,1K,64K --seconds "$seconds" $([[ $wait == poll ]] && echo --poll) \
        --csv "$RS_VM_OUT/rdmasock-$wait.$round.csv" > "$RS_VM_OUT/rdmasock-$wait.$round.txt" 2>&1
    echo "rdmasock-perf ($wait, round $round): exit $?"
    cat "$RS_VM_OUT/rdmasock-$wait.$round.csv" >> "$RS_VM_OUT/rdmasock-$wait.csv"
}
for ((round = 1; round <= rounds; round++)); do
    port=$((18600 + 10 * round))
    pt rc_send_lat 5 $((port + 0)) ib_send_lat -d "$dev" -R -s 64 -n "$((iters * 5))"
    pt rc_send_bw 4 $((port + 1)) ib_send_bw -d "$dev" -R -s 65536 -n "$iters"
    pt rc_write_bw 4 $((port + 2)) ib_write_bw -d "$dev" -R -s 65536 -n "$iters"
    pt rc_read_bw 4 $((port + 3)) ib_read_bw -d "$dev" -R -s 65536 -n "$iters"
    pt ud_send_lat 5 $((port + 4)) ib_send_lat -d "$dev" -R -c UD -s 64 -n "$((iters * 5))"
    pt ud_send_bw 4 $((port + 5)) ib_send_bw -d "$dev" -R -c UD -s 1024 -n "$((iters * 4))"
    if [[ -n $gid_index ]]; then
        pt uc_write_bw 4 $((port + 6)) ib_write_bw -d "$dev" -c UC -x "$gid_index" -s 65536 -n "$iters"
        pt uc_write1k_bw 4 $((port + 7)) ib_write_bw -d "$dev" -c UC -x "$gid_index" -s 1024 -n "$((iters * 4))"
    fi
    # rdmasock-perf through the verbs provider, server forked on the same address, busy polling as perftest does.
    rdmasock poll "$round"
done
# Blocking on the CQ fd, the way an application would wait: once, for the summary's second table.
rdmasock block 1
exit 0
