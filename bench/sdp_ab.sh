#!/usr/bin/env bash
# bench/sdp_ab.sh OUTDIR NAME=LIB... : librdmasock builds side by side against rsockets in one soft-RoCE VM boot,
# the busy-polled 64 B rstream ping-pong in interleaved rounds (tools/vm/jobs/sdp_ab.sh). Copy each build's
# librdmasock.so somewhere first (rebuilding build/ during the run changes what the VM loads). Prints per variant
# the runs' minimum, lower quartile and median (us per transfer), and the median of its per-round ratios to rsockets,
# the figure that survives this machine's noise best (docs/results/sdp-verbs.md). RS_AB_ROUNDS (default 20) and
# RS_AB_ITERS (default 2000) as in the job; RS_AB_ENV_NAME passes extra environment to variant NAME.
# Not part of `make bench`: it is the yardstick for one change at a time.
set -euo pipefail
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
export RS_TOP RS_BUILD
[[ $# -ge 2 ]] || { echo "usage: bench/sdp_ab.sh OUTDIR NAME=path/to/librdmasock.so..." >&2; exit 2; }
command -v rstream > /dev/null || { echo "bench/sdp_ab: rstream is missing (apt-get install rdmacm-utils)" >&2; exit 1; }
out=$1
shift
mkdir -p "$out"
names=(rsockets) envs=()
for arg in "$@"; do
    name=${arg%%=*} lib=${arg#*=}
    [[ $name =~ ^[A-Za-z0-9_]+$ && $arg == *=* && -f $lib ]] ||
        { echo "bench/sdp_ab: '$arg' is not NAME=existing-library (NAME: letters, digits, _)" >&2; exit 2; }
    names+=("$name")
    envs+=(--env "RS_AB_LIB_$name=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")")
    envv=RS_AB_ENV_$name
    [[ -n ${!envv:-} ]] && envs+=(--env "$envv=${!envv}")
done
rounds=${RS_AB_ROUNDS:-20} iters=${RS_AB_ITERS:-2000}
"$RS_TOP/tools/vm/vm" run --timeout $((600 + rounds * ${#names[@]} * (5 + iters / 500))) --out "$out" \
    --env RS_AB_ROUNDS="$rounds" --env RS_AB_ITERS="$iters" --env RS_AB_VARIANTS="${names[*]}" "${envs[@]}" \
    -- "$RS_TOP/tools/vm/jobs/sdp_ab.sh" >&2
awk '$3 != "FAIL" { us[$1 "," $2] = $3; all[$2] = all[$2] " " $3; seen[$2] = 1; round[$1] = 1 }
     function median(a, n) { return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
     END {
         printf "%-12s %5s %8s %8s %8s %12s\n", "variant", "runs", "min", "q1", "median", "ratio (med)"
         for (v in seen) {
             n = split(substr(all[v], 2), x, " "); asort(x)
             m = 0
             if (v != "rsockets")
                 for (r in round)
                     if ((r "," v) in us && (r ",rsockets") in us && us[r ",rsockets"] > 0)
                         q[++m] = us[r "," v] / us[r ",rsockets"]
             if (m) asort(q)
             printf "%-12s %5d %8.2f %8.2f %8.2f %12s\n", v, n, x[1], x[int(n / 4) + 1], median(x, n),
                 m ? sprintf("%.3f", median(q, m)) : "-"
             delete x; delete q
         }
     }' "$out/ab.txt"
