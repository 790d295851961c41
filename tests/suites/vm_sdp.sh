#!/usr/bin/env bash
# SDP over the verbs provider in ONE soft-RoCE VM (rxe0 on dummy0, 198.18.0.1), issue 5 item 5: the SDP test
# binaries, written against sdp.h for any RNIC, run with RS_RNIC_KIND=verbs through tools/vm/jobs/sdp_verbs.sh:
#   test_sdp        TCP semantics: half-close, graceful/abortive close, SO_LINGER, credit exhaustion with a slow
#                   reader, the peer killed with SIGKILL mid-transfer, ...
#   test_sdp_zcopy  SrcAvail / SinkAvail, bcopy/zcopy switch-over, cancels and their races
#   test_sdp_stress random sizes 1 B..16 MiB both ways at once, every byte and a CRC32c per stream checked
#   test_sdp_spin   a fixed RDMASOCK_SPIN_US: integrity, the spin catches the replies, and is bounded
#   test_sdp_spin_auto  the default adaptive spin: on for a quick peer, off for a slow one, back on
#   test_sdp_fast   the short path for steady-state send/recv: integrity, and what it leaves to the general path
# Every test case becomes one TAP line "sdp-verbs: BINARY: TEST"; then the suite checks that the stress runs moved
# at least RS_SDP_VM_MIN_MIB (256) MiB with checksums over verbs, and that rxe0's packet counters grew accordingly
# (the bytes went through the kernel's RDMA stack, not some fallback). The plan comes last: it is the number of
# cases the binaries have. A binary that stops early (crash, timeout) fails with its exit status and the cases it
# missed.
#
# Knobs: RS_SDP_VM_STRESS_BYTES (stress volume, default 256M), RS_SDP_VM_TIMEOUT (whole VM run, s, default 600),
# RS_SDP_VM_TEST_TIMEOUT (per binary, s, default 240). Results stay in $RS_BUILD/test-logs/vm_sdp/.
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
export RS_TOP RS_BUILD
source "$RS_TOP/tests/lib/tap.sh"
source "$RS_TOP/tests/lib/vm_relay.sh"

VM_TOOL=$RS_TOP/tools/vm/vm
OUT=$RS_BUILD/test-logs/vm_sdp
BINARIES=(test_sdp test_sdp_zcopy test_sdp_stress test_sdp_handback test_sdp_spin test_sdp_spin_auto test_sdp_fast)
STRESS_BYTES=${RS_SDP_VM_STRESS_BYTES:-256M}
MIN_MIB=${RS_SDP_VM_MIN_MIB:-256}
started=$SECONDS

finish() {
    tap_diag "vm_sdp: $((SECONDS - started)) s in all; results in $OUT"
    tap_done_plan
    exit $?
}

# Host side first: the VM runs the host's binaries.
for name in "${BINARIES[@]}"; do
    [[ -x $RS_BUILD/tests/unit/$name ]] || tap_fail "sdp-verbs: $name is built" "missing: $RS_BUILD/tests/unit/$name (make tests)"
done
vm_image_ready "$VM_TOOL" sdp-verbs "soft-RoCE VM" || finish

rm -rf "$OUT"
mkdir -p "$OUT"
"$VM_TOOL" run --timeout "${RS_SDP_VM_TIMEOUT:-600}" --out "$OUT" --env "RS_SDP_STRESS_BYTES=$STRESS_BYTES" \
    --env "RS_SDP_VM_TIMEOUT=${RS_SDP_VM_TEST_TIMEOUT:-240}" -- "$RS_TOP/tools/vm/jobs/sdp_verbs.sh" \
    > "$OUT/job.stdout" 2> "$OUT/job.stderr"
status=$?
case $status in
    0) tap_ok "sdp-verbs: the VM booted, rxe0 came up and the job ran" ;;
    124) tap_fail "sdp-verbs: the VM booted, rxe0 came up and the job ran # timeout" \
             "vm run exceeded ${RS_SDP_VM_TIMEOUT:-600} s" "$(tail -n 10 "$OUT/job.stdout")"
         finish ;;
    *) tap_fail "sdp-verbs: the VM booted, rxe0 came up and the job ran" "vm run exited $status" \
           "$(tail -n 25 "$OUT/job.stderr")" "$(tail -n 10 "$OUT/job.stdout")"
       finish ;;
esac
if grep -Eq '^link [^ ]+ state ACTIVE' "$OUT/rdma_link.txt" 2>/dev/null; then
    tap_ok "sdp-verbs: an rxe link is ACTIVE in the guest"
else
    tap_fail "sdp-verbs: an rxe link is ACTIVE in the guest" "$(cat "$OUT/rdma_link.txt" 2>/dev/null)"
fi

for name in "${BINARIES[@]}"; do
    tap=$OUT/$name.tap
    if [[ ! -s $tap ]]; then
        tap_fail "sdp-verbs: $name ran in the VM" "no output at $tap"
        continue
    fi
    vm_relay_cmocka sdp-verbs "${name#test_}" "$tap" "$(cat "$OUT/$name.rc" 2>/dev/null || echo missing)"
    tap_diag "$name: $(cat "$OUT/$name.secs" 2>/dev/null || echo '?') s in the VM"
    grep -E '^# [a-z].*(MiB|ms|bytes)' "$tap" | sed 's/^# //' | while IFS= read -r line; do tap_diag "  $line"; done
done

# Volume: each passing stress run prints "# WHAT: N MiB in T ms ..." (N counts both directions).
stress_tap=$OUT/test_sdp_stress.tap
mib=0
if [[ $(cat "$OUT/test_sdp_stress.rc" 2>/dev/null) == 0 ]]; then
    mib=$(awk '/^# .*: [0-9]+ MiB in [0-9]+ ms/ { for (i = 1; i < NF; i++) if ($(i + 1) == "MiB") s += $i } END { print s + 0 }' \
          "$stress_tap")
fi
if (( mib >= MIN_MIB )); then
    tap_ok "sdp-verbs: the stress runs moved $mib MiB over verbs, every byte and each stream's CRC32c checked"
else
    tap_fail "sdp-verbs: the stress runs moved at least $MIN_MIB MiB over verbs" \
        "$mib MiB in passing runs (exit status $(cat "$OUT/test_sdp_stress.rc" 2>/dev/null || echo missing))"
fi

# rxe0 counted the packets: at least one per MTU of what the stress runs alone moved.
counter() { grep -Eo "$1 [0-9]+" "$2" 2>/dev/null | awk '{ print $2 }'; }
before=$(counter sent_pkts "$OUT/rxe_stats_before.txt")
after=$(counter sent_pkts "$OUT/rxe_stats_after.txt")
mtu=$(grep -Eo 'active_mtu:[[:space:]]*[0-9]+' "$OUT/devinfo.txt" 2>/dev/null | grep -Eo '[0-9]+$')
if [[ -n $before && -n $after && -n $mtu ]] && (( (after - before) * mtu >= mib * 1048576 && mib > 0 )); then
    tap_ok "sdp-verbs: rxe0 sent $((after - before)) packets of up to $mtu bytes during the run"
else
    tap_fail "sdp-verbs: rxe0's packet counters cover the stress volume" \
        "sent_pkts before '${before}' after '${after}', active_mtu '${mtu}', stress $mib MiB" \
        "$(cat "$OUT/rxe_stats_after.txt" 2>/dev/null)"
fi
finish
