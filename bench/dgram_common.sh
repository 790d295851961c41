# bench/dgram_common.sh: what the datagram benchmark scripts share (sourced by dgram_figures.sh, dgram_loss.sh,
# dgram_stream_overhead.sh, sipp_memory.sh). Sets RS_TOP, RS_BUILD and OUT (the results folder, $1 of the script).
# Every script fails loudly: set -euo pipefail, and `dg_die` for what the shell cannot see.
set -euo pipefail
RS_TOP=${RS_TOP:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
export RS_TOP RS_BUILD
OUT=${1:-$RS_BUILD/bench-results}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LAST_CPU=$(( $(nproc) - 1 ))

dg_die() { echo "$DG_NAME: FAILED: $*" >&2; exit 1; }
dg_load() { cut -d' ' -f1-3 /proc/loadavg; }
dg_log() { echo "$DG_NAME: $*"; }
dg_need() {     # dg_need EXECUTABLE WHAT-BUILDS-IT
  [ -x "$1" ] || dg_die "$1 is missing ($2)"
}
dg_need_cmd() { # dg_need_cmd COMMAND DEBIAN-PACKAGE
  command -v "$1" >/dev/null 2>&1 || dg_die "$1 is not installed (apt-get install -y --no-install-recommends $2)"
}
# A free UDP/TCP port (neither bound nor listening), from a range the kernel does not hand out on its own.
dg_free_port() {
  local p
  for _ in $(seq 200); do
    p=$(( 20000 + RANDOM % 10000 ))
    if ! ss -Hanu "sport = :$p" 2>/dev/null | grep -q . && ! ss -Hant "sport = :$p" 2>/dev/null | grep -q .; then
      echo "$p"
      return 0
    fi
  done
  dg_die "no free port found"
}
# awk functions for medians over space-separated lists, included in the scripts' awk programs.
DG_AWK_LIB='
function median(list,    n, a, i, j, t) {
    n = split(list, a, " ")
    if (n == 0) return ""
    for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function lo(list,    n, a, i, m) { n = split(list, a, " "); m = a[1] + 0; for (i = 2; i <= n; i++) if (a[i] + 0 < m) m = a[i] + 0; return m }
function hi(list,    n, a, i, m) { n = split(list, a, " "); m = a[1] + 0; for (i = 2; i <= n; i++) if (a[i] + 0 > m) m = a[i] + 0; return m }
function human(s) { return s >= 1048576 && s % 1048576 == 0 ? s / 1048576 "M" : s >= 1024 && s % 1024 == 0 ? s / 1024 "K" : s }
'
dg_plot() {     # dg_plot GP-FILE OUT-PNG gnuplot-assignments...
  local gp=$1 png=$2; shift 2
  if ! command -v gnuplot >/dev/null 2>&1; then
    echo "$DG_NAME: gnuplot is not installed, no plot $png (apt-get install -y --no-install-recommends gnuplot-nox)"
    return 0
  fi
  (cd "$RS_TOP" && gnuplot -e "out='$png'; $*" "$gp") || dg_die "gnuplot $gp failed"
}
# Real-time round robin (priority 1) for the measured processes, when root: the VM's 2 CPUs are shared with other
# jobs (a qemu VM at times), and under the default scheduler a point could lose most of its CPU to them (the same
# datagram stream measured 7 and 150 MB/s a second apart). Every path gets the same treatment; DGRAM_RT=0 turns it
# off. A blocked thread still yields its CPU, so nothing spins at real-time priority. Only for programs with flow
# control (dgram_sweep's windowed stream, ping-pong): threads of one priority do not preempt each other for a
# 100 ms round-robin slice, so the soft RNIC's thread can fill a 5,184-entry CQ before rdmasock-perf's receiver
# runs (an unflow-controlled Write-Record stream then overflows it); rdmasock-perf runs under the default scheduler.
DG_RT=()
if [ "${DGRAM_RT:-1}" != 0 ] && [ "$(id -u)" -eq 0 ] && command -v chrt >/dev/null 2>&1; then
  DG_RT=(chrt -r 1)
fi
