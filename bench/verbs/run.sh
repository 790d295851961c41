#!/usr/bin/env bash
# bench/verbs/run.sh [OUTDIR]: the verbs provider against raw verbs on the same soft-RoCE device, in one VM boot
# (tools/vm/jobs/verbs_bench.sh): perftest (ib_send_lat, ib_send_bw, ib_write_bw, ib_read_bw, UD and UC modes)
# and rdmasock-perf --kind verbs, busy polling and blocking. Writes verbs-perftest.csv, verbs-rdmasock-poll.csv,
# verbs-rdmasock-block.csv and verbs-summary.md (the ratios) into OUTDIR (default $RS_BUILD/bench-results).
#
# Under TCG the absolute numbers say nothing about hardware; only ratios measured in one boot mean something,
# and even those move by tens of percent from run to run (2 vCPUs shared by both sides and rxe's kernel work).
set -euo pipefail
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
export RS_TOP RS_BUILD
out=${1:-$RS_BUILD/bench-results}
perf=${RS_PERF:-$RS_BUILD/bin/rdmasock-perf}
[[ -x $perf ]] || { echo "bench/verbs: $perf is missing (make all builds it)" >&2; exit 1; }
mkdir -p "$out"
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
echo "bench/verbs: one VM boot, perftest then rdmasock-perf on rxe0 (a few minutes under TCG)"
"$RS_TOP/tools/vm/vm" run --timeout 1200 --out "$run" --env "RS_PERF=$perf" -- \
    "$RS_TOP/tools/vm/jobs/verbs_bench.sh" >&2
cp "$run/perftest.csv" "$out/verbs-perftest.csv"
cp "$run/rdmasock-poll.csv" "$out/verbs-rdmasock-poll.csv"
cp "$run/rdmasock-block.csv" "$out/verbs-rdmasock-block.csv"

# pt NAME: perftest's value; rs FILE TEST TRANSPORT MODE SIZE COLUMN: rdmasock-perf's.
pt() { awk -F, -v n="$1" '$1 == n { print $4 }' "$out/verbs-perftest.csv"; }
rs() {
    awk -F, -v t="$2" -v tr="$3" -v m="$4" -v s="$5" -v c="$6" '
        /^#/ || $1 == "test" { next }
        $1 == t && $2 == tr && $3 == m && $4 == s { print $c }' "$1"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'; }
poll=$out/verbs-rdmasock-poll.csv
block=$out/verbs-rdmasock-block.csv
# perftest reports MB/s in 2^20 bytes; rdmasock-perf in 10^6: both are converted to 10^6 here.
mb() { awk -v v="$1" 'BEGIN { if (v == "") print ""; else printf "%.2f", v * 1.048576 }'; }
row() {     # what rdmasock perftest unit higher-is-better
    local what=$1 mine=$2 theirs=$3 unit=$4 better=$5 r
    if [[ $better == lower ]]; then r=$(ratio "$theirs" "$mine"); else r=$(ratio "$mine" "$theirs"); fi
    printf '| %s | %s | %s | %s | %s |\n' "$what" "${mine:-n/a}" "${theirs:-n/a}" "$unit" "$r"
}
{
    echo "# Verbs provider vs raw verbs (perftest), one soft-RoCE VM boot"
    echo
    echo "Device rxe0 under TCG; rdmasock-perf --kind verbs, busy polling (as perftest). Ratio: rdmasock relative"
    echo "to perftest, 1.00 = as fast (for latency: perftest/rdmasock). Latency: median (rdmasock) vs t_typical"
    echo "(perftest), microseconds. Bandwidth: MB/s (10^6 bytes)."
    echo
    echo "| operation | rdmasock | perftest | unit | ratio |"
    echo "|---|---|---|---|---|"
    row "RC SEND latency, 64 B" "$(rs "$poll" send rc lat 64 7)" "$(pt rc_send_lat)" us lower
    row "UD SEND latency, 64 B" "$(rs "$poll" send ud lat 64 7)" "$(pt ud_send_lat)" us lower
    row "RC SEND bandwidth, 64 KiB" "$(rs "$poll" send rc bw 65536 9)" "$(mb "$(pt rc_send_bw)")" MB/s higher
    row "RDMA WRITE bandwidth, 64 KiB" "$(rs "$poll" write rc bw 65536 9)" "$(mb "$(pt rc_write_bw)")" MB/s higher
    row "RDMA READ bandwidth, 64 KiB" "$(rs "$poll" read rc bw 65536 9)" "$(mb "$(pt rc_read_bw)")" MB/s higher
    row "UD SEND bandwidth, 1 KiB" "$(rs "$poll" send ud bw 1024 9)" "$(mb "$(pt ud_send_bw)")" MB/s higher
    row "Write-Record (UD) vs UC RDMA WRITE, 64 KiB" "$(rs "$poll" wrecord ud bw 65536 9)" \
        "$(mb "$(pt uc_write_bw)")" MB/s higher
    row "Write-Record (UD) vs UC RDMA WRITE, 1 KiB" "$(rs "$poll" wrecord ud bw 1024 9)" \
        "$(mb "$(pt uc_write1k_bw)")" MB/s higher
    echo
    echo "Blocking on the CQ fd instead of polling (rdmasock only; perftest polls):"
    echo
    echo "| operation | poll | block | unit |"
    echo "|---|---|---|---|"
    for t in "send rc lat 64 7 us" "send ud lat 64 7 us" "write rc bw 65536 9 MB/s" "send ud bw 1024 9 MB/s" \
             "wrecord ud bw 65536 9 MB/s"; do
        # shellcheck disable=SC2086
        set -- $t
        printf '| %s %s %s %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" "$(rs "$poll" "$1" "$2" "$3" "$4" "$5")" \
            "$(rs "$block" "$1" "$2" "$3" "$4" "$5")" "$6"
    done
} > "$out/verbs-summary.md"
cat "$out/verbs-summary.md"
