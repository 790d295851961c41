#!/bin/bash
# One-VM job of tests/suites/vm_sdp.sh: the SDP test binaries (test_sdp, test_sdp_zcopy, test_sdp_stress), written
# against sdp.h for any RNIC, run over the verbs provider on rxe0 (RS_RNIC_KIND=verbs, 198.18.0.1) with the stress
# volume scaled for TCG (RS_SDP_STRESS_BYTES, 256 MiB by default). Each binary leaves NAME.tap (its TAP output),
# NAME.rc (its exit status) and NAME.secs (its wall time) in RS_VM_OUT; the host relays them. Every binary is
# bounded by a timeout, so one hung case costs at most that, never the whole VM run. rxe0's packet counters before
# and after (rxe_stats_{before,after}.txt) show that the traffic went through the kernel's RDMA stack.
#
# RS_SDP_VM_TESTS picks the binaries, RS_SDP_VM_TIMEOUT the per-binary limit (s); SDP_TEST_FILTER / SDP_TEST_SKIP
# (glob patterns, passed with vm run --env) pick cases.

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1

export RS_RNIC_KIND=verbs RS_RNIC_ADDR=$RS_VM_ADDR RS_TEST_ADDR=$RS_VM_ADDR CMOCKA_MESSAGE_OUTPUT=TAP
export RS_SDP_STRESS_BYTES=${RS_SDP_STRESS_BYTES:-256M}

rdma link show > "$RS_VM_OUT/rdma_link.txt" 2>&1
ibv_devinfo -d "$RS_VM_RDMA_DEV" > "$RS_VM_OUT/devinfo.txt" 2>&1
rdma statistic show link "$RS_VM_RDMA_DEV/1" > "$RS_VM_OUT/rxe_stats_before.txt" 2>&1

for name in ${RS_SDP_VM_TESTS:-test_sdp test_sdp_zcopy test_sdp_stress test_sdp_handback test_sdp_spin test_sdp_spin_auto test_sdp_fast}; do
    bin=$RS_BUILD/tests/unit/$name
    if [[ ! -x $bin ]]; then
        echo "not built: $bin" > "$RS_VM_OUT/$name.tap"
        echo 127 > "$RS_VM_OUT/$name.rc"
        continue
    fi
    started=$SECONDS
    timeout -k 5 "${RS_SDP_VM_TIMEOUT:-240}" "$bin" > "$RS_VM_OUT/$name.tap" 2>&1 < /dev/null
    echo $? > "$RS_VM_OUT/$name.rc"
    echo $((SECONDS - started)) > "$RS_VM_OUT/$name.secs"
    echo "$name: exit $(cat "$RS_VM_OUT/$name.rc") after $((SECONDS - started)) s"
done

rdma statistic show link "$RS_VM_RDMA_DEV/1" > "$RS_VM_OUT/rxe_stats_after.txt" 2>&1
exit 0
