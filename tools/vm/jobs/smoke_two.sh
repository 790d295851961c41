#!/bin/bash
# Two-VM smoke job (tests/suites/vm_two.sh judges the results on the host).
# rping runs once each way over the virtio-net link: first a serves and b
# connects, then the other way round. VM a captures eth0 for the whole time
# to RS_VM_OUT/roce.pcap, so the host can check the RoCEv2 frames.
# Result files carry the role in front (b.rping_client1.txt, ...).

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1

capturing=0
if [[ "$RS_VM_ROLE" == a ]]; then
    if rs_vm_capture_start "$RS_VM_OUT/roce.pcap" udp port 4791; then
        capturing=1
    else
        echo 1 > "$(rs_vm_out_file capture.rc)"
    fi
fi
rs_vm_wait_peer_ready 120 || exit 1

# exchange 1: a serves, b connects; exchange 2: b serves, a connects.
for exchange in 1 2; do
    if [[ ( $exchange == 1 && "$RS_VM_ROLE" == a ) || ( $exchange == 2 && "$RS_VM_ROLE" == b ) ]]; then
        rs_vm_bg "rping_server$exchange" timeout 90 rping -s -a "$RS_VM_ADDR" -C 10 -v
        # The peer is told to connect only once the listener exists.
        rs_vm_wait_listen 7174 30 && rs_vm_signal "server$exchange"
        rs_vm_wait "rping_server$exchange" 90
        echo $? > "$(rs_vm_out_file "rping_server$exchange.rc")"
    else
        rs_vm_wait_for "server$exchange" 60 || exit 1
        rs_vm_step "rping_client$exchange" timeout 60 rping -c -a "$RS_VM_PEER" -C 10 -v -V
    fi
    rs_vm_barrier "done$exchange" 90 || exit 1
done

if [[ $capturing == 1 ]]; then
    rs_vm_capture_stop
    echo $? > "$(rs_vm_out_file capture.rc)"
fi
exit 0
