#!/usr/bin/env bash
# Soft-RoCE on the wire between TWO qemu VMs (a = 198.18.0.1, b = 198.18.0.2,
# rxe0 on eth0, linked by a qemu socket netdev on 127.0.0.1). Runs
# tools/vm/jobs/smoke_two.sh in both: rping once each way while VM a captures
# eth0; tshark then decodes the capture here and the checks look at the
# decoded RoCEv2 fields (BTH opcode, CM attribute, IP addresses), not at text.
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
export RS_TOP RS_BUILD
source "$RS_TOP/tests/lib/tap.sh"
source "$RS_TOP/tools/vm/suite.sh"

a=198.18.0.1
b=198.18.0.2

vm_suite_begin vm_two \
    "two VMs boot, linked over 127.0.0.1, and both jobs finish" \
    "rping a serves, b connects: exit 0 and 10 verified data lines" \
    "rping b serves, a connects: exit 0 and 10 verified data lines" \
    "tcpdump on eth0 of VM a captured the exchange and tshark decodes it" \
    "every captured RoCEv2 frame (UDP 4791) has a BTH and is between $a and $b" \
    "CM ConnectRequest, ConnectReply and ReadyToUse (QP1 MADs) both ways" \
    "RC Send Only and RC Acknowledge both ways" \
    "RC RDMA Read Request and Read Response both ways, 10 reads each way" \
    "RC RDMA Write both ways, 10 writes each way"

vm_suite_need_tools ibv_devinfo=ibverbs-utils rping=rdmacm-utils tcpdump=tcpdump \
    tshark=tshark || exit 0
vm_suite_run --pair --timeout 360 -- "$RS_TOP/tools/vm/jobs/smoke_two.sh" ||
    { vm_suite_end; exit 1; }

results=$VM_OUT
pcap=$results/roce.pcap
fields=$results/roce.fields

steps_exited_zero() {
    local step
    for step; do
        [[ "$(cat "$results/$step.rc" 2>/dev/null)" == 0 ]] ||
            { echo "$step.rc: $(cat "$results/$step.rc" 2>/dev/null || echo missing)"; return 1; }
    done
}
rping_exchange() {
    local server=$1 client=$2 exchange=$3
    steps_exited_zero "$server.rping_server$exchange" "$client.rping_client$exchange" &&
        rs_vm_rping_verified "$results/$client.rping_client$exchange.txt"
}

# One line per frame: src dst udp-port bth-opcode mad-class mad-attribute.
decode_capture() {
    steps_exited_zero a.capture || return 1
    [[ -s "$pcap" ]] || { echo "no capture at $pcap"; return 1; }
    # tcpdump's own account. Frames received but not yet written when it is
    # stopped are not counted as lost (a late CM retransmission may land
    # there); whether the exchange is complete is what the checks below count.
    awk '/packets captured/ { c = $1 } /dropped by kernel/ { d = $1 }
         END { if (c == "" || d != 0) { print "tcpdump: " c " captured, " d " dropped by kernel"; exit 1 } }' \
        "$pcap.log" || return 1
    tshark -r "$pcap" -T fields -E separator=' ' -E occurrence=f \
        -e ip.src -e ip.dst -e udp.dstport -e infiniband.bth.opcode \
        -e infiniband.mad.mgmtclass -e infiniband.mad.attributeid > "$fields" 2> "$fields.err" ||
        { cat "$fields.err"; return 1; }
    [[ -s "$fields" ]] || { echo "tshark decoded no frame"; return 1; }
    echo "$(wc -l < "$fields") frames decoded"
}

all_roce_between_pair() {
    awk -v a="$a" -v b="$b" '
        { n++ }
        !(($1 == a && $2 == b) || ($1 == b && $2 == a)) || $3 != 4791 || $4 == "" {
            print "frame " NR ": " $0; bad++ }
        END { if (bad || n == 0) exit 1 }' "$fields"
}

# count SRC DST OPCODE-REGEX [MAD-ATTRIBUTE]: frames SRC -> DST whose BTH opcode
# matches (and, for MADs, whose CM attribute id is the one given).
count() {
    awk -v s="$1" -v d="$2" -v op="$3" -v attr="${4:-}" '
        $1 == s && $2 == d && $4 ~ ("^(" op ")$") && (attr == "" || ($5 == "0x07" && $6 == attr)) { n++ }
        END { print n + 0 }' "$fields"
}

# expect_both_ways MIN NAME OPCODE-REGEX [ATTR]: at least MIN such frames each way.
expect_both_ways() {
    local min=$1 name=$2 op=$3 attr=${4:-} n status=0
    for dir in "$a $b" "$b $a"; do
        # shellcheck disable=SC2086
        n=$(count $dir "$op" "$attr")
        if (( n < min )); then
            echo "$name ${dir/ / -> }: $n frames, at least $min expected"
            status=1
        fi
    done
    return $status
}

# BTH opcodes (IBA vol. 1, 9.2): UD Send Only 100 carries the CM MADs on QP1;
# RC Send Only 4, RDMA Write First..Only-with-immediate 6-11, RDMA Read
# Request 12, Read Response First/Middle/Last/Only 13-16, Acknowledge 17.
cm_both_ways() {
    expect_both_ways 1 ConnectRequest 100 0x0010 &&
    expect_both_ways 1 ConnectReply 100 0x0013 &&
    expect_both_ways 1 ReadyToUse 100 0x0014
}
send_ack_both_ways() {
    expect_both_ways 1 "RC Send Only" 4 && expect_both_ways 1 "RC Acknowledge" 17
}
read_both_ways() {
    expect_both_ways 10 "RDMA Read Request" 12 &&
    expect_both_ways 10 "RDMA Read Response" '13|14|15|16'
}
write_both_ways() {
    expect_both_ways 10 "RDMA Write" '6|7|8|9|10|11'
}

vm_check "$VM_STDERR" test "$VM_STATUS" -eq 0
vm_check "$results/b.rping_client1.txt" rping_exchange a b 1
vm_check "$results/a.rping_client2.txt" rping_exchange b a 2
vm_check "$pcap.log" decode_capture
vm_check "$fields" all_roce_between_pair
vm_check "$fields" cm_both_ways
vm_check "$fields" send_ack_both_ways
vm_check "$fields" read_both_ways
vm_check "$fields" write_both_ways
vm_suite_end
