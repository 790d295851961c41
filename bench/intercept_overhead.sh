#!/usr/bin/env bash
# Issue 6 item 9: what rdmasock costs sockets the rules leave on the kernel. sockperf TCP ping-pong (64 B) on
# loopback, plain vs with librdmasock.so preloaded in client and server and a rule keeping TCP on the kernel,
# alternated run by run (ROUNDS rounds of SECONDS each) so machine noise hits both alike; reports the median of the
# per-run median latencies and their ratio. usage: bench/intercept_overhead.sh [OUTDIR]
set -euo pipefail
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
out=${1:-$RS_BUILD/bench-results}; mkdir -p "$out"
rounds=${ROUNDS:-5} secs=${SECONDS_PER_RUN:-3}
command -v sockperf >/dev/null || { echo "sockperf not installed: skipped"; exit 0; }
conf=$(mktemp); trap 'rm -f "$conf"; kill $(jobs -p) 2>/dev/null || true' EXIT
echo 'use kernel tcp any *:*' > "$conf"
port=$(( 30000 + RANDOM % 20000 ))

one_run() {     # one_run plain|preload -> median latency (us)
    local env=()
    [ "$1" = preload ] && env=(env LD_PRELOAD="$RS_BUILD/librdmasock.so" RDMASOCK_CONF="$conf")
    "${env[@]}" sockperf server --tcp -i 127.0.0.1 -p "$port" >/dev/null 2>&1 &
    local srv=$!
    sleep 0.3
    "${env[@]}" sockperf ping-pong --tcp -i 127.0.0.1 -p "$port" -t "$secs" -m 64 2>&1 |
        sed -n 's/.*percentile 50.000 = *\([0-9.]*\).*/\1/p'
    kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null || true
    port=$((port + 1))
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

echo "run,mode,p50_us" > "$out/intercept_overhead.csv"
plain=() pre=()
for r in $(seq "$rounds"); do
    p=$(one_run plain); q=$(one_run preload)
    plain+=("$p"); pre+=("$q")
    echo "$r,plain,$p" >> "$out/intercept_overhead.csv"; echo "$r,preload,$q" >> "$out/intercept_overhead.csv"
done
mp=$(printf '%s\n' "${plain[@]}" | median); mq=$(printf '%s\n' "${pre[@]}" | median)
ratio=$(awk -v a="$mq" -v b="$mp" 'BEGIN {printf "%.3f", a / b}')
echo "sockperf TCP ping-pong 64 B, p50 latency: plain ${mp} us, rdmasock preloaded (kernel rule) ${mq} us, ratio ${ratio}" |
    tee "$out/intercept_overhead.txt"
