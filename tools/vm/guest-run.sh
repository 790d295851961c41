#!/bin/bash
# Runs inside the guest, chrooted into the host's root, as root; called by the
# guest /init with: ROLE CTL_DIR. It brings up the soft-RoCE device, then runs
# the job with its output going to CTL_DIR/ROLE/output (the host streams that
# file), and records the job's exit status in CTL_DIR/ROLE/rc.
# Anything that goes wrong before the job starts is a harness failure and is
# written to CTL_DIR/ROLE/harness instead, so the host can tell them apart.

role=$1
ctl=$2
state="$ctl/$role"

harness_fail() {
    printf '%s\n' "$*" >> "$state/harness"
    exit 1
}

# shellcheck source=/dev/null
. "$state/env" || harness_fail "cannot read $state/env"

hostname "rdmasock-$role" 2>/dev/null
ip link set lo up || harness_fail "cannot bring lo up"

# rxe cannot sit on lo, so a single VM gets a dummy link; a pair uses the
# virtio-net link between the two VMs.
if [[ "$RS_VM_ROLE" == single ]]; then
    netdev=dummy0
    if ! ip link show dev "$netdev" >/dev/null 2>&1; then
        ip link add "$netdev" type dummy || harness_fail "cannot create $netdev"
    fi
else
    netdev=
    for dev in /sys/class/net/*; do
        [[ -e "$dev/device" ]] && { netdev=$(basename "$dev"); break; }
    done
    [[ -n "$netdev" ]] || harness_fail "no virtio-net device in the guest"
fi
ip addr add "$RS_VM_ADDR/24" dev "$netdev" || harness_fail "cannot address $netdev"
ip link set "$netdev" up || harness_fail "cannot bring $netdev up"

rdma link add "$RS_VM_RDMA_DEV" type rxe netdev "$netdev" 2> "$state/rdma-link.err" ||
    harness_fail "rdma link add $RS_VM_RDMA_DEV on $netdev failed: $(cat "$state/rdma-link.err")"

# The port turns ACTIVE and the uverbs/rdma_cm nodes appear asynchronously.
ready=0
for _ in $(seq 1 100); do
    if rdma link show "$RS_VM_RDMA_DEV/1" 2>/dev/null | grep -q 'state ACTIVE' &&
       [[ -c /dev/infiniband/rdma_cm ]] && ls /dev/infiniband/uverbs* >/dev/null 2>&1; then
        ready=1
        break
    fi
    sleep 0.1
done
[[ $ready == 1 ]] || harness_fail "$RS_VM_RDMA_DEV did not become ACTIVE: $(rdma link show 2>&1)"

export RS_VM_NETDEV=$netdev
mkdir -p "$HOME" "$RS_VM_SYNC"
cd "$RS_VM_JOB_CWD" 2>/dev/null || cd "$RS_VM_OUT" || harness_fail "no working folder"

awk '{ print $1 }' /proc/uptime > "$state/started"
"${RS_VM_JOB[@]}" >> "$state/output" 2>&1 < /dev/null
status=$?
awk '{ print $1 }' /proc/uptime > "$state/finished"
printf '%s\n' "$status" > "$state/rc.tmp" && mv "$state/rc.tmp" "$state/rc"
exit 0
