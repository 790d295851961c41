#!/usr/bin/env bash
# The verbs provider on the wire between TWO soft-RoCE VMs (a = 198.18.0.1 server, b = 198.18.0.2 client, rxe0
# on eth0). tests/helpers/rnic_verbs_demo does, through rnic.h only, RC SEND / RDMA WRITE / RDMA READ on a
# connection whose QPs carry DSCP 46, and UD SEND / Write-Record datagrams on UD QPs carrying DSCP 26, checking
# every byte; VM a captures eth0 (tools/vm/jobs/verbs_wire.sh). tshark then decodes the RoCEv2 frames here and
# the checks look at decoded fields: BTH opcode and destination QP, CM attribute, ip.dsfield.dscp, and the
# first bytes of each UD payload (the provider's datagram header, docs/verbs.md).
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
export RS_TOP RS_BUILD
source "$RS_TOP/tests/lib/tap.sh"
source "$RS_TOP/tools/vm/suite.sh"

a=198.18.0.1
b=198.18.0.2
count=4             # operations of each kind the demo does (DEMO_COUNT)
rc_dscp=46
rc_dscp2=34         # the client's QP after rs_rnic_qp_set_qos mid-connection
ud_dscp=26

vm_suite_begin vm_verbs_wire \
    "two VMs boot, linked over 127.0.0.1, and both jobs finish" \
    "demo server (a): RC SENDs, RDMA WRITEs, UD SENDs and the Write-Record arrived intact" \
    "demo client (b): RDMA READs and UD replies arrived intact, orderly disconnect" \
    "tcpdump on eth0 of VM a captured the exchange and tshark decodes it" \
    "every captured frame is RoCEv2 (UDP 4791, BTH) between $a and $b" \
    "rdma_cm set the connection up: ConnectRequest b->a, ConnectReply a->b, ReadyToUse b->a" \
    "RC SEND Only b->a, at least $count" \
    "RDMA WRITE b->a, at least $count" \
    "RDMA READ Request b->a and Read Response a->b, at least $count each" \
    "RC frames carry their QP's DSCP: a->b all $rc_dscp; b->a $rc_dscp, then $rc_dscp2 after rs_rnic_qp_set_qos" \
    "UD SEND datagrams of the provider both ways (header d5 01 01), at least $count each way, all DSCP $ud_dscp" \
    "Write-Record datagrams b->a (header d5 01 02), the 3000-byte record in several, all DSCP $ud_dscp" \
    "UD peers resolved through rdma_cm SIDR both ways (SIDR REQ and REP MADs)" \
    "orderly close on the wire: DisconnectRequest b->a, DisconnectReply a->b"

[[ -x $RS_BUILD/tests/helpers/rnic_verbs_demo ]] || {
    vm_suite_fail_rest "not built" "missing $RS_BUILD/tests/helpers/rnic_verbs_demo (make tests)"
    vm_suite_end
    exit 1
}
vm_suite_need_tools tcpdump=tcpdump tshark=tshark || exit 0
vm_suite_run --pair --timeout 360 -- "$RS_TOP/tools/vm/jobs/verbs_wire.sh" || { vm_suite_end; exit 1; }

results=$VM_OUT
pcap=$results/a.verbs.pcap
fields=$results/verbs.fields

demo_ok() {
    local file=$1 rc=$2 who=$3
    [[ "$(cat "$rc" 2>/dev/null)" == 0 ]] || { echo "exit status $(cat "$rc" 2>/dev/null || echo missing)"; return 1; }
    grep -q "^$who: OK\$" "$file" || { echo "no '$who: OK' line"; return 1; }
}

# One line per frame: src dst udp-port bth-opcode dest-qp dscp mad-class mad-attribute first-4-payload-bytes.
decode_capture() {
    [[ "$(cat "$results/a.capture.rc" 2>/dev/null)" == 0 ]] || { echo "capture exit status: $(cat "$results/a.capture.rc" 2>/dev/null)"; return 1; }
    [[ -s "$pcap" ]] || { echo "no capture at $pcap"; return 1; }
    # '|' keeps empty fields in place (a frame without a MAD has none); every empty one becomes "-".
    tshark -r "$pcap" --disable-heuristic rpcrdma_infiniband -T fields -E separator='|' -E occurrence=f \
        -e ip.src -e ip.dst -e udp.dstport -e infiniband.bth.opcode -e infiniband.bth.destqp -e ip.dsfield.dscp \
        -e infiniband.mad.mgmtclass -e infiniband.mad.attributeid -e data.data 2> "$fields.err" |
        awk -F'|' '{ $9 = substr($9, 1, 8); for (i = 1; i <= 9; i++) if ($i == "") $i = "-"
                     printf "%s %s %s %s %s %s %s %s %s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }' > "$fields" ||
        { cat "$fields.err"; return 1; }
    [[ -s "$fields" ]] || { echo "tshark decoded no frame"; cat "$fields.err"; return 1; }
    echo "$(wc -l < "$fields") frames decoded"
}

all_roce_between_pair() {
    awk -v a="$a" -v b="$b" '
        { n++ }
        !(($1 == a && $2 == b) || ($1 == b && $2 == a)) || $3 != 4791 || $4 == "-" { print "frame " NR ": " $0; bad++ }
        END { if (bad || n == 0) exit 1 }' "$fields"
}

# count SRC DST OPCODE-REGEX [MAD-ATTRIBUTE]: frames SRC -> DST with a matching BTH opcode (and CM attribute).
count() {
    awk -v s="$1" -v d="$2" -v op="$3" -v attr="${4:-}" '
        $1 == s && $2 == d && $4 ~ ("^(" op ")$") && (attr == "" || ($7 == "0x07" && $8 == attr)) { n++ }
        END { print n + 0 }' "$fields"
}

expect() {
    local min=$1 name=$2 src=$3 dst=$4 op=$5 attr=${6:-} n
    n=$(count "$src" "$dst" "$op" "$attr")
    (( n >= min )) || { echo "$name $src -> $dst: $n frames, at least $min expected"; return 1; }
}

# BTH opcodes (IBA vol. 1, 9.2): RC SEND Only 4, RDMA WRITE 6-11, READ Request 12, Read Response 13-16,
# Acknowledge 17; UD SEND Only 100 (QP 1 carries the CM MADs).
cm_setup() {
    expect 1 ConnectRequest "$b" "$a" 100 0x0010 && expect 1 ConnectReply "$a" "$b" 100 0x0013 &&
        expect 1 ReadyToUse "$b" "$a" 100 0x0014
}
rc_send() { expect "$count" "RC SEND Only" "$b" "$a" 4; }
rc_write() { expect "$count" "RDMA WRITE" "$b" "$a" '6|7|8|9|10|11'; }
rc_read() { expect "$count" "READ Request" "$b" "$a" 12 && expect "$count" "Read Response" "$a" "$b" '13|14|15|16'; }
# a -> b (data, READ responses, ACKs): always the server QP's DSCP. b -> a: the client QP's first DSCP up to the
# change, the new one from then on (never back): its first SEND has the old one, its last SEND the new one.
rc_dscp() {
    awk -v a="$a" -v b="$b" -v d1="$rc_dscp" -v d2="$rc_dscp2" '
        $4 == "-" || $4 + 0 >= 32 { next }
        $1 == a { na++; if ($6 != d1) { print "frame " NR ": DSCP " $6 ", " d1 " expected: " $0; bad++ } next }
        { nb++
          if ($6 != d1 && $6 != d2) { print "frame " NR ": DSCP " $6 ": " $0; bad++ }
          if ($6 == d2) changed = 1; else if (changed) { print "frame " NR ": DSCP back to " $6 ": " $0; bad++ }
          if ($4 == 4) { if (!first) first = $6; last = $6 } }
        END {
          if (!na || !nb) { print "RC frames: " na + 0 " a->b, " nb + 0 " b->a"; bad++ }
          if (first != d1 || last != d2) { print "first RC SEND b->a DSCP " first ", last " last; bad++ }
          exit bad ? 1 : 0 }' "$fields"
}
# UD data frames: opcode 100 to a QP other than 1, payload starting with our header magic/version/opcode.
ud_frames() {
    awk -v s="$1" -v d="$2" -v hdr="$3" -v want="$ud_dscp" '
        $1 == s && $2 == d && $4 == 100 && $5 != "0x000001" && substr($9, 1, 6) == hdr {
            n++; if ($6 != want) { print "frame " NR ": DSCP " $6 ": " $0; bad++ } }
        END { print n + 0; exit bad ? 1 : 0 }' "$fields"
}
ud_send() {
    local n status=0
    for dir in "$b $a" "$a $b"; do
        # shellcheck disable=SC2086
        n=$(ud_frames $dir d50101) || { echo "$n"; status=1; continue; }
        n=$(tail -n 1 <<< "$n")
        (( n >= count )) || { echo "UD SEND ${dir/ / -> }: $n frames, at least $count expected"; status=1; }
    done
    return $status
}
write_record() {
    local n
    n=$(ud_frames "$b" "$a" d50102) || { echo "$n"; return 1; }
    n=$(tail -n 1 <<< "$n")
    (( n >= 2 )) || { echo "Write-Record b -> a: $n datagrams, at least 2 expected"; return 1; }
}
sidr() {
    expect 1 "SIDR REQ" "$b" "$a" 100 0x0017 && expect 1 "SIDR REP" "$a" "$b" 100 0x0018 &&
        expect 1 "SIDR REQ" "$a" "$b" 100 0x0017 && expect 1 "SIDR REP" "$b" "$a" 100 0x0018
}
disconnect() { expect 1 DisconnectRequest "$b" "$a" 100 0x0015 && expect 1 DisconnectReply "$a" "$b" 100 0x0016; }

vm_check "$VM_STDERR" test "$VM_STATUS" -eq 0
vm_check "$results/a.server.log" demo_ok "$results/a.server.log" "$results/a.server.rc" server
vm_check "$results/b.client.txt" demo_ok "$results/b.client.txt" "$results/b.client.rc" client
vm_check "$pcap.log" decode_capture
vm_check "$fields" all_roce_between_pair
vm_check "$fields" cm_setup
vm_check "$fields" rc_send
vm_check "$fields" rc_write
vm_check "$fields" rc_read
vm_check "$fields" rc_dscp
vm_check "$fields" ud_send
vm_check "$fields" write_record
vm_check "$fields" sidr
vm_check "$fields" disconnect
vm_suite_end
