#!/usr/bin/env bash
# The verbs provider in ONE soft-RoCE VM (rxe0 on dummy0, 198.18.0.1): runs the rnic conformance binaries
# (test_rnic_core, test_rnic_rc, test_rnic_ud, written against rnic.h for both providers) and the verbs-only
# checks (test_rnic_verbs_only) with RS_RNIC_KIND=verbs through tools/vm/jobs/verbs_one.sh, and relays every
# test case as one TAP line named "verbs: BINARY: TEST". The plan comes last: it is the number of cases the
# binaries have. A binary that stops early (crash, timeout) fails with its exit status and the cases it missed.
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
export RS_TOP RS_BUILD
source "$RS_TOP/tests/lib/tap.sh"
source "$RS_TOP/tests/lib/vm_relay.sh"

VM_TOOL=$RS_TOP/tools/vm/vm
OUT=$RS_BUILD/test-logs/vm_verbs
BINARIES=(test_rnic_core test_rnic_rc test_rnic_ud test_rnic_verbs_only test_dgram_load)
started=$SECONDS

finish() {
    tap_diag "vm_verbs: $((SECONDS - started)) s in all; results in $OUT"
    tap_done_plan
    exit $?
}

# Host side first: the VM runs the host's binaries.
for name in "${BINARIES[@]}"; do
    [[ -x $RS_BUILD/tests/unit/$name ]] || tap_fail "verbs: $name is built" "missing: $RS_BUILD/tests/unit/$name (make tests)"
done
vm_image_ready "$VM_TOOL" verbs "soft-RoCE VM" || finish

rm -rf "$OUT"
mkdir -p "$OUT"
"$VM_TOOL" run --timeout "${RS_VM_VERBS_TIMEOUT:-420}" --out "$OUT" -- "$RS_TOP/tools/vm/jobs/verbs_one.sh" \
    > "$OUT/job.stdout" 2> "$OUT/job.stderr"
status=$?
case $status in
    0) tap_ok "verbs: the VM booted, rxe0 came up and the job ran" ;;
    *) tap_fail "verbs: the VM booted, rxe0 came up and the job ran" "vm run exited $status" \
           "$(tail -n 25 "$OUT/job.stderr")" "$(tail -n 10 "$OUT/job.stdout")"
       finish ;;
esac
if grep -Eq '^link [^ ]+ state ACTIVE' "$OUT/rdma_link.txt" 2>/dev/null; then
    tap_ok "verbs: an rxe link is ACTIVE in the guest"
else
    tap_fail "verbs: an rxe link is ACTIVE in the guest" "$(cat "$OUT/rdma_link.txt" 2>/dev/null)"
fi

for name in "${BINARIES[@]}"; do
    tap=$OUT/$name.tap
    if [[ ! -s $tap ]]; then
        tap_fail "verbs: $name ran in the VM" "no output at $tap"
        continue
    fi
    vm_relay_cmocka verbs "${name#test_}" "$tap" "$(cat "$OUT/$name.rc" 2>/dev/null || echo missing)"
done
finish
