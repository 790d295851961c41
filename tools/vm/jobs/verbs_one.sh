#!/bin/bash
# One-VM job of tests/suites/vm_verbs.sh: the rnic conformance binaries (and the verbs-only checks) run against
# rxe0 through the verbs provider (RS_RNIC_KIND=verbs), and test_dgram_load for its multicast case (the others
# need loopback and skip). Each leaves NAME.tap (its TAP output) and NAME.rc (its
# exit status) in RS_VM_OUT; the host relays them. Every binary is bounded by a timeout so one hung test costs
# at most that, never the whole VM run.

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1

export RS_RNIC_KIND=verbs RS_RNIC_ADDR=$RS_VM_ADDR RS_TEST_ADDR=$RS_VM_ADDR CMOCKA_MESSAGE_OUTPUT=TAP

rdma link show > "$RS_VM_OUT/rdma_link.txt" 2>&1
ibv_devinfo -d "$RS_VM_RDMA_DEV" > "$RS_VM_OUT/devinfo.txt" 2>&1

for name in ${RS_VERBS_TESTS:-test_rnic_core test_rnic_rc test_rnic_ud test_rnic_verbs_only test_dgram_load}; do
    bin=$RS_BUILD/tests/unit/$name
    if [[ ! -x $bin ]]; then
        echo "not built: $bin" > "$RS_VM_OUT/$name.tap"
        echo 127 > "$RS_VM_OUT/$name.rc"
        continue
    fi
    started=$SECONDS
    timeout -k 5 "${RS_VERBS_TEST_TIMEOUT:-90}" "$bin" > "$RS_VM_OUT/$name.tap" 2>&1 < /dev/null
    echo $? > "$RS_VM_OUT/$name.rc"
    echo "$name: exit $(cat "$RS_VM_OUT/$name.rc") after $((SECONDS - started)) s"
done
exit 0
