#!/usr/bin/env bash
# The UDP compatibility matrix over verbs: the programs of tests/suites/compat_udp.sh (sipp, iperf3 -u and socat
# first, then ffmpeg and sockperf; tests/lib/compat_udp.sh) run in ONE soft-RoCE VM (rxe0 on dummy0, 198.18.0.1) by
# tools/vm/jobs/compat_udp_verbs.sh, every program under `rdmasock run --transport verbs`, in both datagram
# methods. Each of the job's checks is relayed as one TAP line prefixed "verbs: "; the plan comes last.
# Results: $RS_BUILD/test-logs/vm_compat_udp/ (compat_udp.tap, compat_udp/ with every log).
#   RS_VM_COMPAT_UDP_ONLY="sipp socat-udp ffmpeg" for another set; RS_VM_COMPAT_UDP_TIMEOUT (s, default 420) bounds
#   the VM run.
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
RS_TOOL=${RS_TOOL:-$RS_BUILD/bin/rdmasock}
RS_LIB=${RS_LIB:-$RS_BUILD/librdmasock.so}
export RS_TOP RS_BUILD RS_TOOL RS_LIB
source "$RS_TOP/tests/lib/tap.sh"

VM_TOOL=$RS_TOP/tools/vm/vm
OUT=$RS_BUILD/test-logs/vm_compat_udp
started=$SECONDS

finish() {
    tap_diag "vm_compat_udp: $((SECONDS - started)) s in all; results in $OUT"
    tap_done_plan
    exit $?
}

if [[ ! -x $RS_TOOL || ! -f $RS_LIB ]]; then
    tap_fail "verbs: rdmasock is built" "missing $RS_TOOL or $RS_LIB (make all)"
    finish
fi
for tool in jq ss perl; do
    if ! command -v "$tool" >/dev/null; then
        tap_fail "verbs: $tool is installed" "apt-get install jq iproute2 perl-base (tools/deps.sh compat)"
        finish
    fi
done
build_log=$(mktemp)
"$VM_TOOL" build 2> "$build_log"
status=$?
case $status in
    0) ;;
    2) tap_skip "verbs: UDP compatibility matrix in the soft-RoCE VM" "VM harness needs host packages: $(grep '^apt-get' "$build_log")"
       rm -f "$build_log"; finish ;;
    3) tap_skip "verbs: UDP compatibility matrix in the soft-RoCE VM" "the Debian kernel package cannot be fetched: $(tail -n 1 "$build_log")"
       rm -f "$build_log"; finish ;;
    *) tap_fail "verbs: soft-RoCE VM image" "vm build exited $status" "$(tail -n 20 "$build_log")"; rm -f "$build_log"; finish ;;
esac
rm -f "$build_log"

rm -rf "$OUT"
mkdir -p "$OUT"
env_args=()
for name in ${!COMPAT_*} RS_VM_COMPAT_UDP_ONLY; do
    [[ -n ${!name+x} ]] && env_args+=(--env "$name=${!name}")
done
"$VM_TOOL" run --timeout "${RS_VM_COMPAT_UDP_TIMEOUT:-420}" --mem 2048 --out "$OUT" "${env_args[@]}" \
    -- "$RS_TOP/tools/vm/jobs/compat_udp_verbs.sh" > "$OUT/job.stdout" 2> "$OUT/job.stderr"
status=$?
case $status in
    124|125)
        tap_fail "verbs: the VM booted, rxe0 came up and the UDP matrix ran" "vm run exited $status ($([[ $status == 124 ]] && echo timeout || echo harness failure))" \
            "$(tail -n 25 "$OUT/job.stderr")" "checks reported before it stopped:" "$(grep -E '^(not )?ok' "$OUT/compat_udp.tap" 2>/dev/null | tail -n 10)"
        ;;
    *) tap_ok "verbs: the VM booted, rxe0 came up and the UDP matrix ran (job exit $status)" ;;
esac

# Relay: each check keeps its verdict, skip reason and diagnostics; numbering is ours.
if [[ -s $OUT/compat_udp.tap ]]; then
    pending=""
    diag=()
    flush() {
        [[ -n $pending ]] || return 0
        tap_fail "$pending" "${diag[@]}"
        pending=""
        diag=()
    }
    while IFS= read -r line; do
        case $line in
            "ok "*"# SKIP "*)
                flush
                desc=${line#ok * - }
                tap_skip "verbs: ${desc%% # SKIP *}" "${desc#* # SKIP }" ;;
            "ok "*) flush; tap_ok "verbs: ${line#ok * - }" ;;
            "not ok "*) flush; pending="verbs: ${line#not ok * - }" ;;
            "#   "*) [[ -n $pending ]] && diag+=("${line#\#   }") ;;
            "# "*) flush; tap_diag "${line#\# }" ;;
            1..*) flush ;;
        esac
    done < "$OUT/compat_udp.tap"
    flush
else
    tap_fail "verbs: the UDP matrix wrote its results" "no $OUT/compat_udp.tap" "$(tail -n 15 "$OUT/job.stdout")"
fi
finish
