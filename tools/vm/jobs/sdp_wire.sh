#!/bin/bash
# Two-VM job of tests/suites/vm_sdp_wire.sh: an unmodified socat pair under `rdmasock run --transport verbs` moves
# a random file from VM b (client) to VM a (server, 198.18.0.1) over SDP, so VM a's capture of eth0 (RoCEv2, UDP
# 4791) holds a whole SDP connection for the host to decode with tshark: HelloAck, Data (many writes of several
# sizes), zero-copy advertisements for the large ones, DisConn both ways.
# Result files carry the role in front (a.server.log, b.client.txt, a.received.sha256, b.sent.sha256, ...).

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1
port=${RS_SDP_WIRE_PORT:-7480}
mib=${RS_SDP_WIRE_MIB:-1}
tool=$RS_BUILD/bin/rdmasock
conf=/tmp/sdp_wire.conf
# The rule names the server's address and port for both ends: rdma (no fallback), so a connection that did not
# become SDP fails the job instead of passing over kernel TCP.
echo "use rdma tcp any 198.18.0.1:$port" > "$conf"
# Every message with its BSDH in the payload, where Wireshark's SDP dissector reads it: no compact Data (docs/sdp.md
# "Compact Data" puts a small message's BSDH in the immediate data, which the dissector does not look at).
export RDMASOCK_SDP_COMPACT=off

if [[ "$RS_VM_ROLE" == a ]]; then
    # The checks need every message. tcpdump on an emulated CPU drops frames when it cannot keep up, so: a buffer
    # that holds the whole transfer (64 MiB for under 2 MB of frames) and the file in the guest's RAM (/tmp, copied
    # out afterwards) rather than on the 9p share. (Truncated frames do not help: the InfiniBand dissector then
    # hands no payload to the SDP one.)
    rs_vm_capture_start /tmp/sdp.pcap -B 65536 udp port 4791 ||
        echo 1 > "$(rs_vm_out_file capture.rc)"
fi
rs_vm_wait_peer_ready 120 || exit 1

if [[ "$RS_VM_ROLE" == a ]]; then
    rs_vm_bg server timeout 150 "$tool" run -c "$conf" --transport verbs -- \
        socat -u "TCP-LISTEN:$port,bind=$RS_VM_ADDR,reuseaddr" "OPEN:/tmp/received,creat,trunc"
    rs_vm_wait_listen "$port" 60 && rs_vm_signal server
    rs_vm_wait server 160
    echo $? > "$(rs_vm_out_file server.rc)"
    sha256sum < /tmp/received | cut -d' ' -f1 > "$(rs_vm_out_file received.sha256)"
    stat -c %s /tmp/received > "$(rs_vm_out_file received.bytes)"
else
    # Writes of 1 MiB (zero-copy sized) and a tail of small ones (copied): socat -b sets its block size.
    head -c "$((mib * 1048576))" /dev/urandom > /tmp/sent
    head -c 1000 /dev/urandom >> /tmp/sent
    sha256sum < /tmp/sent | cut -d' ' -f1 > "$(rs_vm_out_file sent.sha256)"
    stat -c %s /tmp/sent > "$(rs_vm_out_file sent.bytes)"
    rs_vm_wait_for server 90 || exit 1
    rs_vm_step client timeout 150 "$tool" run -c "$conf" --transport verbs -- \
        socat -u -b 1048576 OPEN:/tmp/sent "TCP:198.18.0.1:$port"
fi
rs_vm_barrier done 170 || exit 1

if [[ "$RS_VM_ROLE" == a ]]; then
    rs_vm_capture_stop
    echo $? > "$(rs_vm_out_file capture.rc)"
    cp /tmp/sdp.pcap "$(rs_vm_out_file sdp.pcap)"
    cp /tmp/sdp.pcap.log "$(rs_vm_out_file sdp.pcap.log)"
fi
exit 0
