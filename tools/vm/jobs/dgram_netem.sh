#!/bin/bash
# Two-VM job of bench/dgram_netem.sh (Grant 2012 figures 6.6 and 6.7 on a lossy link): iperf3 -u from VM b to VM a
# (198.18.0.1) over kernel UDP, datagram-iWARP send/recv and Write-Record (rdmasock over verbs on rxe0), with
# `tc netem loss` on b's eth0 for every point. VM a runs one iperf3 server per path; b runs the clients. Each point
# writes one CSV row to RS_VM_OUT/b.netem.csv; a records the servers' RDMA receive counters (a.<path>.stat.jsonl).
#   RS_NETEM_SIZES (1024 8192 65000)  RS_NETEM_LOSS (0 0.1 0.5 1 5)  RS_NETEM_RATE (8M)  RS_NETEM_SECONDS (3)
#   Datagrams above 8 KiB go at 3 x the rate for 3 x the time, so each point still counts a few hundred of them.

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1
tool=$RS_BUILD/bin/rdmasock
sizes=${RS_NETEM_SIZES:-1024 8192 65000}
losses=${RS_NETEM_LOSS:-0 0.1 0.5 1 5}
rate=${RS_NETEM_RATE:-8M}
seconds=${RS_NETEM_SECONDS:-3}
declare -A port=([kernel]=7501 [sendrecv]=7502 [wrecord]=7503)
conf() {    # conf PATH: the rule file of a path; iperf3's control connection stays on kernel TCP
    local f=/tmp/netem.$1.conf
    { echo "use kernel tcp any *"
      echo "use both udp any 198.18.0.1:${port[$1]} dgram=$1"; } > "$f"
    echo "$f"
}
# run PATH CMD...: CMD under rdmasock for the RDMA paths, plain for kernel
run() {
    local path=$1; shift
    if [[ $path == kernel ]]; then "$@"; else "$tool" run -c "$(conf "$path")" --transport verbs -- "$@"; fi
}

# iperf3 -w insists on getting the buffer it asks for; the guest's default maximum is 208 KiB.
sysctl -q -w net.core.rmem_max=8388608 net.core.wmem_max=8388608
rs_vm_wait_peer_ready 120 || exit 1
if [[ "$RS_VM_ROLE" == a ]]; then
    for path in kernel sendrecv wrecord; do
        rs_vm_bg "server-$path" run "$path" iperf3 -s -B "$RS_VM_ADDR" -p "${port[$path]}"
    done
    sleep 2
    rs_vm_signal servers
    rs_vm_wait_for clients-done 1500
    for path in sendrecv wrecord; do
        pid=$(pgrep -f "iperf3 -s -B $RS_VM_ADDR -p ${port[$path]}" | head -n 1)
        [[ -n $pid ]] && "$tool" stat --json "$pid" > "$(rs_vm_out_file "$path.stat.json")" 2>&1
    done
    for path in kernel sendrecv wrecord; do rs_vm_stop "server-$path" TERM; done
else
    rs_vm_wait_for servers 60 || exit 1
    out=$(rs_vm_out_file netem.csv)
    echo "path,size,loss_pct,offered_mbps,sent_packets,lost_packets,lost_pct,goodput_mbps" > "$out"
    attempt=0         # numbers every run's JSON and stderr, so a point measured twice keeps both
    for size in $sizes; do
        for loss in $losses; do
            for path in kernel sendrecv wrecord; do
                r=$rate t=$seconds
                if (( size > 8192 )); then r=$(( ${rate%M} * 3 ))M; t=$(( seconds * 3 )); fi
                # iperf3's UDP set-up is one datagram each way with no retry: when netem drops either, the client
                # fails before sending any data ("unable to read from stream socket"), whatever the path. That is
                # not the transfer being measured, so such a run is repeated (twice at most); netem-retries.txt lists them.
                local_try=0
                while :; do
                    tc qdisc del dev "$RS_VM_NETDEV" root 2>/dev/null
                    [[ $loss != 0 ]] && tc qdisc add dev "$RS_VM_NETDEV" root netem loss "$loss%"
                    attempt=$((attempt + 1)) local_try=$((local_try + 1))
                    json=/tmp/netem.$path.$size.$loss.$attempt.json
                    run "$path" timeout $((t + 30)) iperf3 -c 198.18.0.1 -p "${port[$path]}" -u -b "$r" \
                        -l "$size" -t "$t" -w 2M -J > "$json" 2> "$json.err"
                    tc qdisc del dev "$RS_VM_NETDEV" root 2>/dev/null
                    jq -e '(.intervals // []) | length == 0' "$json" > /dev/null 2>&1 &&
                        jq -e '.error // "" | test("stream socket")' "$json" > /dev/null 2>&1 && (( local_try < 3 )) ||
                        break
                    echo "\"$path\",$size,$loss,set-up lost (attempt $attempt)" >> "$(rs_vm_out_file netem-retries.txt)"
                done
                jq -r --arg p "$path" --arg s "$size" --arg l "$loss" '
                    .end.sum as $e | [$p, $s, $l, (($e.bits_per_second // 0) / 1e6), ($e.packets // 0),
                     ($e.lost_packets // 0), ($e.lost_percent // 100),
                     (($e.bits_per_second // 0) / 1e6 * (1 - ($e.lost_percent // 100) / 100))] | @csv' \
                    "$json" >> "$out" 2>> "$(rs_vm_out_file jq.err)" || echo "\"$path\",$size,$loss,0,0,0,100,0" >> "$out"
            done
        done
    done
    cp /tmp/netem.*.json /tmp/netem.*.json.err "$RS_VM_OUT/" 2>/dev/null
    rs_vm_signal clients-done
fi
rs_vm_barrier done 120 || exit 1
exit 0
