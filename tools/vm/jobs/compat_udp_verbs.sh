#!/bin/bash
# One-VM job of tests/suites/vm_compat_udp.sh: the UDP compatibility matrix (tests/lib/compat_udp.sh: sipp,
# iperf3 -u and socat, the main ones, first; then ffmpeg and sockperf) with every program under
# `rdmasock run --transport verbs`, on rxe0 (198.18.0.1, soft-RoCE: verbs UD QPs, rdma_cm's UDP port space), in
# both datagram methods, with sizes made for emulated CPUs. Writes the TAP of the checks to
# RS_VM_OUT/compat_udp.tap (the host relays it) and the logs, rule file and rdmasock stat samples to
# RS_VM_OUT/compat_udp/. The programs are the host's (its root is shared).
#   RS_VM_COMPAT_UDP_ONLY   programs to run (default below); sizes as in tests/lib/compat_udp.sh (COMPAT_UDP_*)

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1

export COMPAT_MODE=${COMPAT_MODE:-preload}
export COMPAT_TRANSPORT=verbs COMPAT_ADDR=$RS_VM_ADDR COMPAT_DIR=$RS_VM_OUT/compat_udp COMPAT_INSTALL=0
export COMPAT_DATA_ROOT=/tmp
export COMPAT_UDP_IPERF_MB=${COMPAT_UDP_IPERF_MB:-2} COMPAT_UDP_IPERF_RATE=${COMPAT_UDP_IPERF_RATE:-5M}
export COMPAT_UDP_SOCAT_MB=${COMPAT_UDP_SOCAT_MB:-1} COMPAT_UDP_SIPP_CALLS=${COMPAT_UDP_SIPP_CALLS:-30}
export COMPAT_UDP_SIPP_RATE=${COMPAT_UDP_SIPP_RATE:-10} COMPAT_UDP_FFMPEG_S=${COMPAT_UDP_FFMPEG_S:-2}
export COMPAT_UDP_SOCKPERF_S=${COMPAT_UDP_SOCKPERF_S:-1} COMPAT_UDP_SOCKPERF_MPS=${COMPAT_UDP_SOCKPERF_MPS:-1000}
# The receiving ffmpeg's input timeout runs from its start: the sending ffmpeg took over 8 s to start in a slow boot.
export COMPAT_UDP_FFMPEG_IDLE_S=${COMPAT_UDP_FFMPEG_IDLE_S:-20}
export COMPAT_CLIENT_TIMEOUT=${COMPAT_CLIENT_TIMEOUT:-90}
# The guest's UD QPs pin their receive slots: let the programs lock what SO_RCVBUF pays for.
ulimit -l unlimited 2>/dev/null
# SO_RCVBUF as the programs ask for it. The guest's net.core.rmem_max (208 KiB) capped socat's 2 MiB to 416 KiB, for
# the kernel and for rdmasock alike (dgram_sock.c follows the sysctl), and a receiver the loaded CI machine stalled for
# ~25 ms then lost one datagram of the 1 MiB file, as UDP may: the check wants every byte (seen once, 7f5f483's CI).
# With the caps raised the whole file fits in the receive buffer, so a loss is rdmasock's and the check stays exact.
for sysctl in rmem_max wmem_max; do
    echo 4194304 > "/proc/sys/net/core/$sysctl" 2>/dev/null || echo "compat_udp_verbs: cannot raise net.core.$sysctl" >&2
done

programs=${RS_VM_COMPAT_UDP_ONLY:-sipp iperf3-udp socat-udp ffmpeg sockperf-udp}

rdma link show > "$RS_VM_OUT/rdma_link.txt" 2>&1

# shellcheck source=../../../tests/lib/tap.sh
source "$RS_TOP/tests/lib/tap.sh"
# shellcheck source=../../../tests/lib/compat.sh
source "$RS_TOP/tests/lib/compat.sh"
# shellcheck source=../../../tests/lib/compat_udp.sh
source "$RS_TOP/tests/lib/compat_udp.sh"
{
    compat_udp_begin compat_udp_verbs
    # shellcheck disable=SC2086
    compat_udp_run_matrix $programs
    compat_table | while IFS= read -r row; do tap_diag "$row"; done
    tap_done_plan
} > "$RS_VM_OUT/compat_udp.tap" 2>&1
status=$?
echo "compat_udp_verbs: $(grep -c '^ok' "$RS_VM_OUT/compat_udp.tap") ok, $(grep -c '^not ok' "$RS_VM_OUT/compat_udp.tap") not ok"
exit $status
