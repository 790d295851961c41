#!/bin/bash
# One-VM smoke job (tests/suites/vm_one.sh judges its results on the host):
# the rxe link, the verbs device, an rdma_cm RC exchange with rping and two
# perftest runs over rxe's internal loopback. Each step leaves NAME.txt and
# NAME.rc in RS_VM_OUT; the job itself only fails when it cannot run at all.
# Every client is bounded by `timeout` so one hung step costs a minute, not
# the whole VM timeout.

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1
dev=$RS_VM_RDMA_DEV
addr=$RS_VM_ADDR

rs_vm_step rdma_link rdma link show
rs_vm_step devinfo ibv_devinfo -d "$dev"

# rping: the client (-v) prints each buffer it got back after the RDMA
# READ/WRITE round trip and (-V) checks it itself; -C 10 makes ten of them.
rs_vm_serve rping 7174 rping -s -a "$addr" -C 10 -v -- rping -c -a "$addr" -C 10 -v -V

# perftest over rdma_cm (-R), so the RoCE GID needs no index guessing.
rs_vm_serve send_lat 18515 ib_send_lat -d "$dev" -R -n 1000 -p 18515 -- \
    ib_send_lat -d "$dev" -R -n 1000 -p 18515 "$addr"
rs_vm_serve write_bw 18516 ib_write_bw -d "$dev" -R -n 1000 -p 18516 -- \
    ib_write_bw -d "$dev" -R -n 1000 -p 18516 "$addr"
exit 0
