# shellcheck shell=bash
# Shared part of the VM suites (tests/suites/vm_*.sh), sourced after
# tests/lib/tap.sh. A suite declares its checks up front so that whatever
# happens (skip, harness failure, timeout) it prints exactly its plan:
#
#   vm_suite_begin NAME "check 1" "check 2" ...      (prints the plan)
#   vm_suite_need_tools TOOL=PACKAGE ... || exit 0   (skips all when missing)
#   vm_suite_run [vm run options] -- JOB || exit 1   (reports all on failure)
#   vm_check_ok / vm_check_fail [DIAG...]            (next check, in order)
#   vm_suite_end                                     (timing; exit status)
#
# Harness failures (vm run exit 125) and timeouts (124) are told apart from
# test failures: every check is reported "not ok ... # harness failure" (or
# "# timeout"), with the harness' message and the guest console tail as TAP
# diagnostics on the first one.

# shellcheck source=lib.sh
source "$RS_TOP/tools/vm/lib.sh"

vm_suite_name=
vm_suite_checks=()
vm_suite_next=0
vm_suite_started=$SECONDS
vm_suite_failed=0
VM_TOOL="$RS_TOP/tools/vm/vm"

vm_suite_begin() {
    vm_suite_name=$1; shift
    vm_suite_checks=("$@")
    vm_suite_next=0
    vm_suite_started=$SECONDS
    VM_OUT="$RS_BUILD/test-logs/$vm_suite_name"
    tap_plan "${#vm_suite_checks[@]}"
}

vm_suite_current() { printf '%s\n' "${vm_suite_checks[vm_suite_next]}"; }

vm_check_ok() {
    tap_ok "$(vm_suite_current)"
    vm_suite_next=$((vm_suite_next + 1))
}

vm_check_fail() {
    tap_fail "$(vm_suite_current)" "$@"
    vm_suite_next=$((vm_suite_next + 1))
    vm_suite_failed=1
}

# vm_check DIAG_FILE CMD...: ok when CMD succeeds; on failure CMD's own
# output and the tail of DIAG_FILE (the step's output) are the diagnostics.
vm_check() {
    local diag_file=$1 check_output; shift
    if check_output=$("$@" 2>&1); then
        vm_check_ok
    else
        vm_check_fail ${check_output:+"$check_output"} "${diag_file##*/}:" \
            "$(tail -n 15 "$diag_file" 2>/dev/null || echo "(missing)")"
    fi
}

# Reports every remaining check the same way (skip, harness failure, timeout).
vm_suite_skip_rest() {
    local reason=$1
    while (( vm_suite_next < ${#vm_suite_checks[@]} )); do
        tap_skip "$(vm_suite_current)" "$reason"
        vm_suite_next=$((vm_suite_next + 1))
    done
}

vm_suite_fail_rest() {
    local tag=$1; shift
    local first=1
    while (( vm_suite_next < ${#vm_suite_checks[@]} )); do
        if [[ $first == 1 ]]; then
            tap_fail "$(vm_suite_current) # $tag" "$@"
            first=0
        else
            tap_fail "$(vm_suite_current) # $tag"
        fi
        vm_suite_next=$((vm_suite_next + 1))
    done
    vm_suite_failed=1
}

# vm_suite_need_tools TOOL=PACKAGE...: the guest runs the host's binaries, so
# the test tools must be installed on the host. Missing ones skip the suite
# with the exact apt-get line, as does a host that cannot build the VM.
vm_suite_need_tools() {
    local pair missing=()
    for pair in "$@"; do
        command -v "${pair%%=*}" >/dev/null 2>&1 || missing+=("${pair#*=}")
    done
    if (( ${#missing[@]} )); then
        vm_suite_skip_rest "host lacks tools: apt-get install -y ${missing[*]}"
        return 1
    fi
    local build_log status
    build_log=$(mktemp)
    "$VM_TOOL" build 2> "$build_log"
    status=$?
    case $status in
        0) rm -f "$build_log"; return 0 ;;
        2) vm_suite_skip_rest "VM harness needs host packages: $(grep '^apt-get' "$build_log")" ;;
        3) vm_suite_skip_rest "the Debian kernel package cannot be fetched: $(tail -n 1 "$build_log" | sed "s/^vm: //")" ;;
        *) vm_suite_fail_rest "harness failure" "vm build exited $status:" "$(tail -n 20 "$build_log")" ;;
    esac
    rm -f "$build_log"
    return 1
}

# vm_suite_run [vm run options] -- JOB [ARGS]: runs the job with its results
# in $VM_OUT (kept under the build folder for inspection, with the run
# folder of a failed run: console logs, job output). Returns non-zero
# after reporting every check when the harness failed or timed out; a job's
# own non-zero exit is left to the checks, which look at its result files.
vm_suite_run() {
    rm -rf "$VM_OUT"
    mkdir -p "$VM_OUT"
    VM_STDOUT="$VM_OUT/job.stdout"
    VM_STDERR="$VM_OUT/job.stderr"
    local started=$SECONDS
    # TMPDIR: a run folder kept on failure lands next to the results.
    TMPDIR="$VM_OUT" "$VM_TOOL" run --out "$VM_OUT" "$@" > "$VM_STDOUT" 2> "$VM_STDERR"
    VM_STATUS=$?
    VM_SECONDS=$((SECONDS - started))
    case $VM_STATUS in
        125) vm_suite_fail_rest "harness failure" "$(cat "$VM_STDERR")"; return 1 ;;
        124) vm_suite_fail_rest "timeout" "$(tail -n 20 "$VM_STDERR")" \
                 "job output:" "$(tail -n 20 "$VM_STDOUT")"; return 1 ;;
    esac
    return 0
}

vm_suite_end() {
    tap_diag "$vm_suite_name: $((SECONDS - vm_suite_started)) s in all (vm run ${VM_SECONDS:-0} s); results in $VM_OUT"
    return $vm_suite_failed
}

# --- checks shared by the suites ------------------------------------------
