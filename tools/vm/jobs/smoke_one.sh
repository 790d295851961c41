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

# serve NAME PORT SERVER_CMD... -- CLIENT_CMD...: start the server, wait for its
# rdma_cm listener, run the client as step NAME, then collect the server.
serve() {
    local name=$1 port=$2; shift 2
    local -a server=()
    while [[ $1 != -- ]]; do server+=("$1"); shift; done
    shift
    rs_vm_bg "${name}_server" timeout 90 "${server[@]}"
    if rs_vm_wait_listen "$port" 30; then
        rs_vm_step "$name" timeout 60 "$@"
    else
        echo "no rdma_cm listener on port $port" > "$RS_VM_OUT/$name.txt"
        echo 1 > "$RS_VM_OUT/$name.rc"
    fi
    rs_vm_wait "${name}_server" 30
    echo $? > "$RS_VM_OUT/${name}_server.rc"
}

rs_vm_step rdma_link rdma link show
rs_vm_step devinfo ibv_devinfo -d "$dev"

# rping: the client (-v) prints each buffer it got back after the RDMA
# READ/WRITE round trip and (-V) checks it itself; -C 10 makes ten of them.
serve rping 7174 rping -s -a "$addr" -C 10 -v -- rping -c -a "$addr" -C 10 -v -V

# perftest over rdma_cm (-R), so the RoCE GID needs no index guessing.
serve send_lat 18515 ib_send_lat -d "$dev" -R -n 1000 -p 18515 -- \
    ib_send_lat -d "$dev" -R -n 1000 -p 18515 "$addr"
serve write_bw 18516 ib_write_bw -d "$dev" -R -n 1000 -p 18516 -- \
    ib_write_bw -d "$dev" -R -n 1000 -p 18516 "$addr"
exit 0
