#!/usr/bin/env bash
# SDP on the wire between TWO soft-RoCE VMs (a = 198.18.0.1 server, b = 198.18.0.2 client, rxe0 on eth0): an
# unmodified socat pair under `rdmasock run --transport verbs` moves a random file b -> a over SDP while VM a
# captures eth0 (tools/vm/jobs/sdp_wire.sh). tshark decodes the RoCEv2 frames here with Wireshark's SDP dissector
# (Decode As infiniband_sdp, docs/wire-formats.md: the connection runs on rdma_cm's TCP port space, whose service
# ID the dissector's heuristic does not claim) and the checks read the decoded BSDH fields of the first packet of
# every message (RC SEND First / Only): message ids, sequence numbers, lengths.
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
export RS_TOP RS_BUILD
source "$RS_TOP/tests/lib/tap.sh"
source "$RS_TOP/tools/vm/suite.sh"

a=198.18.0.1
b=198.18.0.2

vm_suite_begin vm_sdp_wire \
    "two VMs boot, linked over 127.0.0.1, and both jobs finish" \
    "socat over SDP: the server (a) received the client's file (b) intact (sha256), under a rule with no fallback" \
    "tcpdump on eth0 of VM a captured the whole connection (no frame dropped) and tshark decodes its SEND messages as SDP" \
    "every SDP message b->a and a->b is numbered: BSDH mseq counts up by one per message, each side acknowledges the other's (mseq_ack never ahead)" \
    "the file's bytes, exactly: the payload of Data messages b->a (BSDH len - 16) plus what a RDMA-READ after b's SrcAvail (answered by RdmaRdCompl)" \
    "credit updates flow back: Data messages a->b with no payload (len 16) advertise buffers" \
    "orderly close: DisConn (mid 0x02) in both directions, no data after a side's DisConn (credit updates only)"

[[ -x $RS_BUILD/bin/rdmasock && -f $RS_BUILD/librdmasock.so ]] || {
    vm_suite_fail_rest "not built" "missing $RS_BUILD/bin/rdmasock or librdmasock.so (make all)"
    vm_suite_end
    exit 1
}
vm_suite_need_tools tcpdump=tcpdump tshark=tshark socat=socat || exit 0
vm_suite_run --pair --timeout 360 -- "$RS_TOP/tools/vm/jobs/sdp_wire.sh" || { vm_suite_end; exit 1; }

results=$VM_OUT
pcap=$results/a.sdp.pcap
msgs=$results/sdp.messages

transfer_ok() {
    [[ "$(cat "$results/a.server.rc" 2>/dev/null)" == 0 ]] || { echo "server exit status $(cat "$results/a.server.rc" 2>/dev/null || echo missing)"; return 1; }
    [[ "$(cat "$results/b.client.rc" 2>/dev/null)" == 0 ]] || { echo "client exit status $(cat "$results/b.client.rc" 2>/dev/null || echo missing)"; return 1; }
    local sent got
    sent=$(cat "$results/b.sent.sha256" 2>/dev/null)
    got=$(cat "$results/a.received.sha256" 2>/dev/null)
    [[ -n $sent && $sent == "$got" ]] || { echo "sha256 sent $sent, received $got ($(cat "$results/a.received.bytes" 2>/dev/null) of $(cat "$results/b.sent.bytes" 2>/dev/null) bytes)"; return 1; }
}

# One line per SDP message: src dst mid len mseq mseq_ack psn (the BSDH of RC SEND First (0) / Only (4) frames).
# rxe retransmits under TCG: a frame whose sender and PSN were already seen is the same message again, dropped.
decode_messages() {
    [[ "$(cat "$results/a.capture.rc" 2>/dev/null)" == 0 ]] || { echo "capture exit status: $(cat "$results/a.capture.rc" 2>/dev/null)"; return 1; }
    [[ -s "$pcap" ]] || { echo "no capture at $pcap"; return 1; }
    local dropped
    dropped=$(sed -n 's/^\([0-9]*\) packets dropped by kernel.*/\1/p' "$pcap.log")
    [[ $dropped == 0 ]] || { echo "tcpdump lost ${dropped:-?} frames (the checks need every message)"; cat "$pcap.log"; return 1; }
    tshark -r "$pcap" -d 'infiniband,infiniband_sdp' --disable-heuristic rpcrdma_infiniband \
        -Y 'infiniband.bth.opcode == 0 || infiniband.bth.opcode == 4' -T fields -E separator=' ' -E occurrence=f \
        -e ip.src -e ip.dst -e infiniband_sdp.bsdh.mid -e infiniband_sdp.bsdh.len -e infiniband_sdp.bsdh.mseq \
        -e infiniband_sdp.bsdh.mseqack -e infiniband.bth.psn > "$msgs.all" 2> "$msgs.err" || { cat "$msgs.err"; return 1; }
    awk 'NF != 7 { print "frame without a BSDH: " $0; bad++ } END { exit bad ? 1 : 0 }' "$msgs.all" || return 1
    awk '!seen[$1 " " $7]++' "$msgs.all" > "$msgs"
    echo "retransmitted SENDs dropped: $(( $(wc -l < "$msgs.all") - $(wc -l < "$msgs") ))" 
    [[ -s "$msgs" ]] || { echo "no SEND message decoded"; cat "$msgs.err"; return 1; }
    echo "$(wc -l < "$msgs") SDP messages: $(awk '{ print $3 }' "$msgs" | sort | uniq -c | tr '\n' ' ')"
}

# mseq starts anywhere but counts up by one per message in each direction; a side's mseq_ack is at most the
# last mseq it has received from the other.
numbered() {
    awk -v a="$a" -v b="$b" '
        function num(x,   i, v) { v = 0; x = tolower(x); sub(/^0x/, "", x)     # mawk has no strtonum
            for (i = 1; i <= length(x); i++) v = v * 16 + index("0123456789abcdef", substr(x, i, 1)) - 1
            return v }
        { dir = ($1 == b) ? "ba" : "ab"; other = (dir == "ba") ? "ab" : "ba"
          m = num($5); k = num($6)
          if (dir in last && m != last[dir] + 1) { print dir " mseq " m " after " last[dir]; bad++ }
          last[dir] = m; n[dir]++
          if ((other in last) && k > last[other]) { print dir " acknowledges " k " before " last[other] " was sent"; bad++ } }
        END { if (n["ba"] < 2 || n["ab"] < 2) { print "messages b->a " n["ba"] + 0 ", a->b " n["ab"] + 0; bad++ }
              exit bad ? 1 : 0 }' "$msgs"
}

# Copied bytes (Data payload b->a) plus zero-copy bytes (the payload of RDMA READ responses b->a, opcodes 13-16:
# UDP length less UDP 8, BTH 12, ICRC 4 and, but for Middle, AETH 4; retransmissions dropped) must be the file.
data_carries_file() {
    local size read_bytes
    size=$(cat "$results/b.sent.bytes" 2>/dev/null) || { echo "no b.sent.bytes"; return 1; }
    read_bytes=$(tshark -r "$pcap" -Y "ip.src == $b && infiniband.bth.opcode >= 13 && infiniband.bth.opcode <= 16" \
        -T fields -e infiniband.bth.opcode -e infiniband.bth.psn -e udp.length 2>/dev/null |
        awk '!seen[$2]++ { s += $3 - 8 - 12 - 4 - ($1 != 14 ? 4 : 0) } END { print s + 0 }')
    awk -v a="$a" -v b="$b" -v size="$size" -v zc="$read_bytes" '
        $1 == b && $3 == "0xff" { data += $4 - 16; nd++ }
        $1 == b && $3 == "0xfe" { src++ }
        $1 == a && $3 == "0x06" { rdcompl++ }
        END { printf "%d Data messages with %d bytes, %d SrcAvail, %d RdmaRdCompl, %d bytes RDMA-read; file %d bytes\n", nd, data, src, rdcompl, zc, size
              if (nd == 0 || data + zc != size) exit 1
              if (zc > 0 && (src == 0 || rdcompl == 0)) exit 1 }' "$msgs"
}

credit_updates() {
    awk -v a="$a" '$1 == a && $3 == "0xff" && $4 == 16 { n++ } END { print n + 0 " credit updates a->b"; exit n ? 0 : 1 }' "$msgs"
}

disconn_both() {
    awk -v a="$a" -v b="$b" '
        $3 == "0x02" { d[$1]++; next }
        d[$1] && ($3 != "0xff" || $4 != 16) { print "after its DisConn " $1 " sent: " $0; bad++ }
        END { if (!d[a] || !d[b]) { print "DisConn a->b " d[a] + 0 ", b->a " d[b] + 0; bad++ }
              exit bad ? 1 : 0 }' "$msgs"
}

vm_check "$VM_STDERR" test "$VM_STATUS" -eq 0
vm_check "$results/a.server.log" transfer_ok
vm_check "$pcap.log" decode_messages
vm_check "$msgs" numbered
vm_check "$msgs" data_carries_file
vm_check "$msgs" credit_updates
vm_check "$msgs" disconn_both
[[ -s $msgs ]] && tap_diag "SDP messages by direction and mid: $(awk '{ print ($1 == "'"$b"'" ? "b->a" : "a->b") " " $3 }' "$msgs" |
    sort | uniq -c | awk '{ printf "%s%s %s x%d", sep, $2, $3, $1; sep = ", " }')"
vm_suite_end
