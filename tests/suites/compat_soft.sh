#!/usr/bin/env bash
# The compatibility matrix on the software RNIC (issue 6 item 8): unmodified iperf3, sockperf (select, poll,
# epoll), redis, memcached, nginx with wrk, curl, apache2 (prefork and event MPM), mariadb, socat and a Java
# client/server (blocking and NIO) on 127.0.0.1, every server and client under `rdmasock run --transport soft`
# with rules that put their ports on RDMA. Each program checks its data (checksums, counts from both ends) and
# then the evidence that its connections went over RDMA (`rdmasock stat`). The checks are in tests/lib/compat.sh.
#
#   COMPAT_MODE=kernel tests/run tests/suites/compat_soft.sh    the control: the same commands, no preload
#   COMPAT_ONLY="redis socat" ...                               a subset; COMPAT_LOG=debug for the library's log
# Logs, the rule file, rdmasock stat snapshots and results.tsv: $RS_BUILD/test-logs/compat_soft/.
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
RS_TOOL=${RS_TOOL:-$RS_BUILD/bin/rdmasock}
RS_LIB=${RS_LIB:-$RS_BUILD/librdmasock.so}
export RS_TOP RS_BUILD RS_TOOL RS_LIB
source "$RS_TOP/tests/lib/tap.sh"
source "$RS_TOP/tests/lib/compat.sh"

COMPAT_TRANSPORT=soft
COMPAT_ADDR=127.0.0.1
started=$SECONDS

compat_begin compat_soft || { tap_fail "compat: scratch folders" "cannot create them"; tap_done_plan; exit 1; }
if [[ $COMPAT_MODE == preload ]]; then
    if [[ ! -x $RS_TOOL || ! -f $RS_LIB ]]; then
        tap_fail "compat: rdmasock is built" "missing $RS_TOOL or $RS_LIB (make all)"
        tap_done_plan
        exit 1
    fi
fi
# The evidence and iperf3's results are read with jq; ss finds free ports and listeners.
for tool in jq ss timeout; do
    if ! command -v "$tool" >/dev/null; then
        tap_fail "compat: $tool is installed" "apt-get install jq iproute2 coreutils (tools/deps.sh compat)"
        tap_done_plan
        exit 1
    fi
done
compat_install_missing

compat_run_matrix

tap_diag "compat_soft: $((SECONDS - started)) s in all"
compat_table | while IFS= read -r row; do tap_diag "$row"; done
tap_done_plan
