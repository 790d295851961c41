#!/usr/bin/env bash
# bench/verbs/run.sh [OUTDIR]: the verbs provider against raw verbs on the same soft-RoCE device, in one VM boot
# (tools/vm/jobs/verbs_bench.sh): perftest (ib_send_lat, ib_send_bw, ib_write_bw, ib_read_bw, UD and UC modes)
# and rdmasock-perf --kind verbs, busy polling and blocking. Writes verbs-perftest.csv, verbs-rdmasock-poll.csv,
# verbs-rdmasock-block.csv and verbs-summary.md (the ratios) into OUTDIR (default $RS_BUILD/bench-results).
#
# Under TCG the absolute numbers say nothing about hardware; only ratios measured in one boot mean something,
# and even those move by tens of percent from run to run (2 vCPUs shared by both sides and rxe's kernel work):
# RS_BENCH_ROUNDS rounds (default 3) alternate the two stacks and the summary compares their medians.
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
"$RS_TOP/tools/vm/vm" run --timeout 2400 --out "$run" --env "RS_PERF=$perf" --env "RS_BENCH_ROUNDS=${RS_BENCH_ROUNDS:-3}" -- \
    "$RS_TOP/tools/vm/jobs/verbs_bench.sh" >&2
cp "$run/perftest.csv" "$out/verbs-perftest.csv"
cp "$run/rdmasock-poll.csv" "$out/verbs-rdmasock-poll.csv"
cp "$run/rdmasock-block.csv" "$out/verbs-rdmasock-block.csv"

# pt NAME: perftest's values (one per round); rs FILE TEST TRANSPORT MODE SIZE COLUMN: rdmasock-perf's.
# A value that is not a number (perftest once printed t_typical "inf") stays as "-", keeping the rounds aligned.
pt() { awk -F, -v n="$1" '$1 == n { print ($4 ~ /^[0-9.]+$/ ? $4 : "-") }' "$out/verbs-perftest.csv"; }
rs() {
    awk -F, -v t="$2" -v tr="$3" -v m="$4" -v s="$5" -v c="$6" '
        /^#/ || $1 == "test" { next }
        $1 == t && $2 == tr && $3 == m && $4 == s { print ($c ~ /^[0-9.]+$/ ? $c : "-") }' "$1"
}
median() {
    grep -E '^[0-9.]+$' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN {
        if (a !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/ || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'
}
poll=$out/verbs-rdmasock-poll.csv
block=$out/verbs-rdmasock-block.csv
# perftest reports MB/s in 2^20 bytes; rdmasock-perf in 10^6: both are converted to 10^6 here.
mb() { awk '{ if ($1 ~ /^[0-9.]+$/) printf "%.2f\n", $1 * 1.048576; else print "-" }'; }
# row WHAT UNIT BETTER: the values of both stacks on stdin's two lines (space separated, one per round, in round
# order): medians, the ratio of the medians, and each round's own ratio.
row() {
    local what=$1 unit=$2 better=$3 mine theirs m t r each="" i
    read -r -a mine
    read -r -a theirs
    m=$(printf '%s\n' "${mine[@]}" | median)
    t=$(printf '%s\n' "${theirs[@]}" | median)
    for ((i = 0; i < ${#mine[@]} && i < ${#theirs[@]}; i++)); do
        if [[ $better == lower ]]; then r=$(ratio "${theirs[i]}" "${mine[i]}"); else r=$(ratio "${mine[i]}" "${theirs[i]}"); fi
        each+="${each:+ }$r"
    done
    if [[ $better == lower ]]; then r=$(ratio "$t" "$m"); else r=$(ratio "$m" "$t"); fi
    printf '| %s | %s | %s | %s | %s | %s |\n' "$what" "${m:-n/a}" "${t:-n/a}" "$unit" "$r" "${each:-n/a}"
}
line() { tr '\n' ' '; echo; }
{
    echo "# Verbs provider vs raw verbs (perftest), one soft-RoCE VM boot"
    echo
    echo "Device rxe0 under TCG; rdmasock-perf --kind verbs, busy polling (as perftest), rounds alternating the two"
    echo "stacks. Ratio: rdmasock relative to perftest, 1.00 = as fast (for latency: perftest/rdmasock), of the"
    echo "medians over the rounds, then each round's own. Latency: median (rdmasock) vs t_typical (perftest),"
    echo "microseconds. Bandwidth: MB/s (10^6 bytes)."
    echo
    echo "| operation | rdmasock | perftest | unit | ratio | per round |"
    echo "|---|---|---|---|---|---|"
    { rs "$poll" send rc lat 64 7 | line; pt rc_send_lat | line; } | row "RC SEND latency, 64 B" us lower
    { rs "$poll" send ud lat 64 7 | line; pt ud_send_lat | line; } | row "UD SEND latency, 64 B" us lower
    { rs "$poll" send rc bw 65536 9 | line; pt rc_send_bw | mb | line; } | row "RC SEND bandwidth, 64 KiB" MB/s higher
    { rs "$poll" write rc bw 65536 9 | line; pt rc_write_bw | mb | line; } | row "RDMA WRITE bandwidth, 64 KiB" MB/s higher
    { rs "$poll" read rc bw 65536 9 | line; pt rc_read_bw | mb | line; } | row "RDMA READ bandwidth, 64 KiB" MB/s higher
    { rs "$poll" send ud bw 1024 9 | line; pt ud_send_bw | mb | line; } | row "UD SEND bandwidth, 1 KiB" MB/s higher
    { rs "$poll" wrecord ud bw 65536 9 | line; pt uc_write_bw | mb | line; } |
        row "Write-Record (UD) vs UC RDMA WRITE, 64 KiB" MB/s higher
    { rs "$poll" wrecord ud bw 1024 9 | line; pt uc_write1k_bw | mb | line; } |
        row "Write-Record (UD) vs UC RDMA WRITE, 1 KiB" MB/s higher
    echo
    echo "Blocking on the CQ fd instead of polling (rdmasock only, one round; perftest polls):"
    echo
    echo "| operation | poll (median) | block | unit |"
    echo "|---|---|---|---|"
    for t in "send rc lat 64 7 us" "send ud lat 64 7 us" "write rc bw 65536 9 MB/s" "send ud bw 1024 9 MB/s" \
             "wrecord ud bw 65536 9 MB/s"; do
        # shellcheck disable=SC2086
        set -- $t
        printf '| %s %s %s %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" "$(rs "$poll" "$1" "$2" "$3" "$4" "$5" | median)" \
            "$(rs "$block" "$1" "$2" "$3" "$4" "$5" | median)" "$6"
    done
} > "$out/verbs-summary.md"
cat "$out/verbs-summary.md"
