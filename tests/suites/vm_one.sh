#!/usr/bin/env bash
# Soft-RoCE smoke test in ONE qemu VM (rxe0 on dummy0, 198.18.0.1): proves that
# the host's RDMA userland drives a real kernel RDMA stack through the VM
# harness. Runs tools/vm/jobs/smoke_one.sh in the guest and judges its result
# files here. Traffic stays inside rxe (loopback), so this is about function,
# not the wire; tests/suites/vm_two.sh looks at the wire.
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
export RS_TOP RS_BUILD
source "$RS_TOP/tests/lib/tap.sh"
source "$RS_TOP/tools/vm/suite.sh"

vm_suite_begin vm_one \
    "one VM boots under TCG and runs the smoke job" \
    "rdma link: rxe0 is ACTIVE on dummy0" \
    "ibv_devinfo lists rxe0 with PORT_ACTIVE on an Ethernet link" \
    "rping over rdma_cm (RC): client and server exit 0" \
    "rping client got 10 verified data lines" \
    "ib_send_lat on rxe0 (loopback) prints a latency result" \
    "ib_write_bw on rxe0 (loopback) prints a bandwidth result" \
    "vm run hands back the job's own exit status and its result files"

vm_suite_need_tools ibv_devinfo=ibverbs-utils rping=rdmacm-utils \
    ib_send_lat=perftest ib_write_bw=perftest || exit 0
vm_suite_run --timeout 240 -- "$RS_TOP/tools/vm/jobs/smoke_one.sh" || { vm_suite_end; exit 1; }

results=$VM_OUT

# Each step of the job left NAME.txt (its output) and NAME.rc (its status).
steps_exited_zero() {
    local step
    for step; do
        [[ "$(cat "$results/$step.rc" 2>/dev/null)" == 0 ]] ||
            { echo "$step.rc: $(cat "$results/$step.rc" 2>/dev/null || echo missing)"; return 1; }
    done
}
link_active_on_dummy0() {
    grep -Eq '^link rxe0/1 state ACTIVE .*netdev dummy0' "$results/rdma_link.txt"
}
devinfo_port_active() {
    awk '/hca_id:/ { dev = $2 } /state:/ && /PORT_ACTIVE/ { active = 1 }
         /link_layer:/ && /Ethernet/ { eth = 1 }
         END { exit !(dev == "rxe0" && active && eth) }' "$results/devinfo.txt"
}
# Result row of ib_send_lat: bytes, iterations, t_min, t_max, t_typical (> 0)
# and the average and percentiles.
send_lat_result() {
    steps_exited_zero send_lat send_lat_server &&
        awk '$1 == 2 && $2 == 1000 && $5 > 0 && NF >= 8 { found = 1 } END { exit !found }' \
            "$results/send_lat.txt"
}
# Result row of ib_write_bw: bytes, iterations, peak MB/s, average MB/s > 0.
write_bw_result() {
    steps_exited_zero write_bw write_bw_server &&
        awk '$1 == 65536 && $2 == 1000 && $4 > 0 { found = 1 } END { exit !found }' \
            "$results/write_bw.txt"
}

vm_check "$VM_STDERR" test "$VM_STATUS" -eq 0
vm_check "$results/rdma_link.txt" link_active_on_dummy0
vm_check "$results/devinfo.txt" devinfo_port_active
vm_check "$results/rping.txt" steps_exited_zero rping rping_server
vm_check "$results/rping.txt" rs_vm_rping_verified "$results/rping.txt"
vm_check "$results/send_lat.txt" send_lat_result
vm_check "$results/write_bw.txt" write_bw_result

# The suites tell a library failure from a harness failure by vm's exit
# status, so the pass-through itself is checked: a job exiting 7 after
# writing a result file (second boot, a few seconds).
status_through() {
    local dir="$VM_OUT/status" status
    mkdir -p "$dir"
    TMPDIR="$dir" "$VM_TOOL" run --quiet --timeout 180 --out "$dir" -- \
        /bin/bash -c 'echo "$RS_VM_ROLE $RS_VM_ADDR" > "$RS_VM_OUT/seen"; exit 7' \
        > "$dir/stdout" 2> "$dir/stderr"
    status=$?
    [[ $status == 7 ]] || { echo "vm run exited $status, 7 expected"; cat "$dir/stderr"; return 1; }
    [[ "$(cat "$dir/seen" 2>/dev/null)" == "single 198.18.0.1" ]] ||
        { echo "result file: $(cat "$dir/seen" 2>&1)"; return 1; }
}
vm_check "$VM_OUT/status/stderr" status_through
vm_suite_end
