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

VM_TOOL=$RS_TOP/tools/vm/vm
OUT=$RS_BUILD/test-logs/vm_verbs
BINARIES=(test_rnic_core test_rnic_rc test_rnic_ud test_rnic_verbs_only)
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
build_log=$(mktemp)
"$VM_TOOL" build 2> "$build_log"
status=$?
case $status in
    0) ;;
    2) tap_skip "verbs: soft-RoCE VM" "VM harness needs host packages: $(grep '^apt-get' "$build_log")"; rm -f "$build_log"; finish ;;
    3) tap_skip "verbs: soft-RoCE VM" "the Debian kernel package cannot be fetched: $(tail -n 1 "$build_log")"
       rm -f "$build_log"; finish ;;
    *) tap_fail "verbs: soft-RoCE VM image" "vm build exited $status" "$(tail -n 20 "$build_log")"; rm -f "$build_log"; finish ;;
esac
rm -f "$build_log"

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

# cmocka 1.1.5 prints a skipped case as "not ok N # SKIP name": relay it as a skip with the reason the test
# printed ("skipped: ..."), if any. A failed case keeps the lines cmocka printed after it as diagnostics.
relay() {
    local name=$1 tap=$2 rc=$3
    local kind desc reason text planned=0 seen=0
    local -a diag=()
    local pending=""
    flush() {
        [[ -n $pending ]] || return 0
        tap_fail "$pending" "${diag[@]}"
        pending=""
        diag=()
    }
    while IFS=$'\t' read -r kind desc reason; do
        case $kind in
            PLAN) planned=$desc ;;
            OK) flush; seen=$((seen + 1)); tap_ok "verbs: $name: $desc" ;;
            SKIP) flush; seen=$((seen + 1)); tap_skip "verbs: $name: $desc" "$reason" ;;
            FAIL) flush; seen=$((seen + 1)); pending="verbs: $name: $desc" ;;
            DIAG) [[ -n $pending && ${#diag[@]} -lt 12 ]] && diag+=("$desc") ;;
        esac
    done < <(awk '
        /^1\.\.[0-9]+/ { sub(/^1\.\./, ""); print "PLAN\t" $0; next }
        /^skipped: / { reason = substr($0, 10); next }
        /^ok [0-9]+ - / { sub(/^ok [0-9]+ - /, ""); print "OK\t" $0; reason = ""; next }
        /^not ok [0-9]+ # SKIP/ { sub(/^not ok [0-9]+ # SKIP */, "");
            print "SKIP\t" $0 "\t" (reason != "" ? reason : "the test skips itself on the verbs provider"); reason = ""; next }
        /^not ok [0-9]+ - / { sub(/^not ok [0-9]+ - /, ""); split($0, w, " "); print "FAIL\t" w[1];
            rest = substr($0, length(w[1]) + 2); if (rest != "") print "DIAG\t" rest; next }
        /^# (not )?ok - / { next }
        { gsub(/\t/, " "); print "DIAG\t" $0 }' "$tap")
    flush
    if (( planned == 0 || seen < planned )); then
        tap_fail "verbs: $name ran all its cases" "exit status $rc; $seen of $planned cases reported" \
            "$(tail -n 15 "$tap")"
    elif [[ $rc != 0 ]] && ! grep -q '^not ok [0-9]* - ' "$tap"; then
        tap_fail "verbs: $name exited cleanly" "exit status $rc" "$(tail -n 15 "$tap")"
    fi
}

for name in "${BINARIES[@]}"; do
    tap=$OUT/$name.tap
    if [[ ! -s $tap ]]; then
        tap_fail "verbs: $name ran in the VM" "no output at $tap"
        continue
    fi
    relay "${name#test_}" "$tap" "$(cat "$OUT/$name.rc" 2>/dev/null || echo missing)"
done
finish
