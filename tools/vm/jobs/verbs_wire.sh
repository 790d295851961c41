#!/bin/bash
# Two-VM job of tests/suites/vm_verbs_wire.sh: tests/helpers/rnic_verbs_demo runs every operation the verbs
# provider puts on the wire (RC SEND, RDMA WRITE, RDMA READ; UD SEND and Write-Record datagrams), server on VM a
# (198.18.0.1), client on VM b, while VM a captures eth0 to RS_VM_OUT/a.verbs.pcap for the host to decode.
# Result files carry the role in front (a.server.log, b.client.txt, ...).

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1
demo=$RS_BUILD/tests/helpers/rnic_verbs_demo
port=${RS_VERBS_DEMO_PORT:-7471}

if [[ "$RS_VM_ROLE" == a ]]; then
    rs_vm_capture_start "$(rs_vm_out_file verbs.pcap)" udp port 4791 ||
        echo 1 > "$(rs_vm_out_file capture.rc)"
fi
rs_vm_wait_peer_ready 120 || exit 1

if [[ "$RS_VM_ROLE" == a ]]; then
    rs_vm_bg server timeout 150 "$demo" server "$RS_VM_ADDR" "$port"
    # The client is told to connect only once the rdma_cm listener exists.
    rs_vm_wait_listen "$port" 60 && rs_vm_signal server
    rs_vm_wait server 160
    echo $? > "$(rs_vm_out_file server.rc)"
    [[ -n "${RS_VERBS_DEBUG:-}" ]] && rdma resource show cm_id > "$(rs_vm_out_file cm_ids.txt)" 2>&1
else
    rs_vm_wait_for server 90 || exit 1
    rs_vm_step client timeout 150 "$demo" client "$RS_VM_ADDR" "$RS_VM_PEER" "$port"
    [[ -n "${RS_VERBS_DEBUG:-}" ]] && rdma resource show cm_id > "$(rs_vm_out_file cm_ids.txt)" 2>&1
fi
rs_vm_barrier done 170 || exit 1

if [[ "$RS_VM_ROLE" == a ]]; then
    rs_vm_capture_stop
    echo $? > "$(rs_vm_out_file capture.rc)"
fi
exit 0
