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
source "$RS_TOP/tests/lib/vm_relay.sh"

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
vm_image_ready "$VM_TOOL" verbs "UDP compatibility matrix in the soft-RoCE VM" || finish

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
if ! vm_relay_tap verbs "$OUT/compat_udp.tap"; then
    tap_fail "verbs: the UDP matrix wrote its results" "no $OUT/compat_udp.tap" "$(tail -n 15 "$OUT/job.stdout")"
fi
finish
