# shellcheck shell=bash
# Relaying what ran in a soft-RoCE VM as this suite's own TAP lines. Sourced after tests/lib/tap.sh by the vm_*
# suites (vm_verbs, vm_sdp: cmocka binaries; vm_compat, vm_compat_udp: compatibility checks).

# vm_relay_cmocka PREFIX NAME TAP RC: one line per cmocka case of a binary's TAP output (TAP file, exit status RC),
# each described "PREFIX: NAME: case". cmocka 1.1.5 prints a skipped case as "not ok N # SKIP name": relayed as a
# skip with the reason the test printed ("skipped: ..."), if any. A failed case keeps the lines cmocka printed after
# it as diagnostics. A binary that stopped before its plan, or failed without a failed case, is a failure too.
vm_relay_cmocka() {
    local prefix=$1 name=$2 tap=$3 rc=$4
    local kind desc reason planned=0 seen=0
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
            OK) flush; seen=$((seen + 1)); tap_ok "$prefix: $name: $desc" ;;
            SKIP) flush; seen=$((seen + 1)); tap_skip "$prefix: $name: $desc" "$reason" ;;
            FAIL) flush; seen=$((seen + 1)); pending="$prefix: $name: $desc" ;;
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
        tap_fail "$prefix: $name ran all its cases" "exit status $rc; $seen of $planned cases reported" \
            "$(tail -n 15 "$tap")"
    elif [[ $rc != 0 ]] && ! grep -q '^not ok [0-9]* - ' "$tap"; then
        tap_fail "$prefix: $name exited cleanly" "exit status $rc" "$(tail -n 15 "$tap")"
    fi
}

# vm_relay_tap PREFIX TAP: a TAP file written in the VM (a compatibility matrix) relayed line by line: each check
# keeps its verdict, skip reason and diagnostics ("#   " lines after a failure), "PREFIX: " goes in front, and the
# numbering is ours. Returns 1 when TAP is missing or empty.
vm_relay_tap() {
    local prefix=$1 tap=$2 line desc
    [[ -s $tap ]] || return 1
    local pending=""
    local -a diag=()
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
                tap_skip "$prefix: ${desc%% # SKIP *}" "${desc#* # SKIP }" ;;
            "ok "*) flush; tap_ok "$prefix: ${line#ok * - }" ;;
            "not ok "*) flush; pending="$prefix: ${line#not ok * - }" ;;
            "#   "*) [[ -n $pending ]] && diag+=("${line#\#   }") ;;
            "# "*) flush; tap_diag "${line#\# }" ;;
            1..*) flush ;;
        esac
    done < "$tap"
    flush
}

# vm_image_ready VM_TOOL PREFIX WHAT: builds (or finds) the soft-RoCE VM image. 0 when it is ready; otherwise reports
# why as a skip (host packages missing, the Debian kernel package out of reach) or a failure, and returns 1 so the
# suite can finish.
vm_image_ready() {
    local vm_tool=$1 prefix=$2 what=$3 build_log status
    build_log=$(mktemp)
    "$vm_tool" build 2> "$build_log"
    status=$?
    case $status in
        0) ;;
        2) tap_skip "$prefix: $what" "VM harness needs host packages: $(grep '^apt-get' "$build_log")" ;;
        3) tap_skip "$prefix: $what" "the Debian kernel package cannot be fetched: $(tail -n 1 "$build_log")" ;;
        *) tap_fail "$prefix: soft-RoCE VM image" "vm build exited $status" "$(tail -n 20 "$build_log")" ;;
    esac
    rm -f "$build_log"
    return $(( status != 0 ))
}
