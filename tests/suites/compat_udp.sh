#!/usr/bin/env bash
# The UDP compatibility matrix on the software RNIC (issue 7 item 4): unmodified iperf3 -u, sockperf (UDP),
# socat (UDP), sipp (uac against uas) and ffmpeg (MPEG-TS over udp://) on 127.0.0.1, every program under
# `rdmasock run --transport soft` with rules that put its UDP ports on the datagram layer, once per datagram
# method (dgram=sendrecv, dgram=wrecord). Each program checks what arrived (checksums, counts from both ends,
# decoded frames), then the evidence that its datagrams went over RDMA (`rdmasock stat`). The checks are in
# tests/lib/compat_udp.sh (on top of tests/lib/compat.sh).
#
#   COMPAT_MODE=kernel tests/run tests/suites/compat_udp.sh     the control: the same commands, no preload
#   COMPAT_UDP_ONLY="sipp socat-udp" ...  a subset;  COMPAT_UDP_MODES=wrecord ...  one method;  COMPAT_LOG=debug
# Logs, the rule file, rdmasock stat snapshots and results.tsv: $RS_BUILD/test-logs/compat_udp/.
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
RS_TOOL=${RS_TOOL:-$RS_BUILD/bin/rdmasock}
RS_LIB=${RS_LIB:-$RS_BUILD/librdmasock.so}
export RS_TOP RS_BUILD RS_TOOL RS_LIB
source "$RS_TOP/tests/lib/tap.sh"
source "$RS_TOP/tests/lib/compat.sh"
source "$RS_TOP/tests/lib/compat_udp.sh"

COMPAT_TRANSPORT=soft
COMPAT_ADDR=127.0.0.1
started=$SECONDS

compat_udp_begin compat_udp || { tap_fail "compat_udp: scratch folders" "cannot create them"; tap_done_plan; exit 1; }
if [[ $COMPAT_MODE == preload && ( ! -x $RS_TOOL || ! -f $RS_LIB ) ]]; then
    tap_fail "compat_udp: rdmasock is built" "missing $RS_TOOL or $RS_LIB (make all)"
    tap_done_plan
    exit 1
fi
for tool in jq ss timeout perl; do
    if ! command -v "$tool" >/dev/null; then
        tap_fail "compat_udp: $tool is installed" "apt-get install jq iproute2 coreutils perl-base (tools/deps.sh compat)"
        tap_done_plan
        exit 1
    fi
done
compat_udp_install_missing

compat_udp_run_matrix

tap_diag "compat_udp: $((SECONDS - started)) s in all"
compat_table | while IFS= read -r row; do tap_diag "$row"; done
tap_done_plan
