#!/bin/bash
# One-VM job of tests/suites/vm_compat.sh: a subset of the compatibility matrix (tests/lib/compat.sh) with every
# server and client under `rdmasock run --transport verbs`, on rxe0 (198.18.0.1, soft-RoCE), with sizes made for
# emulated CPUs. Writes the TAP of the checks to RS_VM_OUT/compat.tap (the host relays it) and the logs, rule
# file and rdmasock stat snapshots to RS_VM_OUT/compat/. The programs are the host's (its root is shared).
#   RS_VM_COMPAT_ONLY   programs to run (default below); sizes as in tests/lib/compat.sh (COMPAT_*)

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1

export COMPAT_MODE=${COMPAT_MODE:-preload}
export COMPAT_TRANSPORT=verbs COMPAT_ADDR=$RS_VM_ADDR COMPAT_DIR=$RS_VM_OUT/compat COMPAT_INSTALL=0
# Payloads live in the guest's /tmp (RAM); the VM run gets --mem 2048 from the suite.
export COMPAT_DATA_ROOT=/tmp
export COMPAT_IPERF_MB=${COMPAT_IPERF_MB:-16} COMPAT_SOCAT_MB=${COMPAT_SOCAT_MB:-16} COMPAT_HTTP_MB=${COMPAT_HTTP_MB:-4}
export COMPAT_REDIS_N=${COMPAT_REDIS_N:-2000} COMPAT_MEMC_N=${COMPAT_MEMC_N:-1000} COMPAT_AB_N=${COMPAT_AB_N:-200}
export COMPAT_SLAP_N=${COMPAT_SLAP_N:-400} COMPAT_JAVA_MB=${COMPAT_JAVA_MB:-2} COMPAT_SOCKPERF_S=${COMPAT_SOCKPERF_S:-1}
export COMPAT_CLIENT_TIMEOUT=${COMPAT_CLIENT_TIMEOUT:-90}
# One sockperf variant (epoll) here: the wait layer is the same whatever the transport, and the host runs all three.
export COMPAT_SOCKPERF_VARIANTS=${COMPAT_SOCKPERF_VARIANTS:-e}
# Compiled on the host by the suite: the guest sees the build folder read-only.
export COMPAT_JAVA_CLASSES=${COMPAT_JAVA_CLASSES:-$RS_BUILD/java}

programs=${RS_VM_COMPAT_ONLY:-iperf3 sockperf redis memcached nginx socat apache2-prefork mariadb}

rdma link show > "$RS_VM_OUT/rdma_link.txt" 2>&1

# shellcheck source=../../../tests/lib/tap.sh
source "$RS_TOP/tests/lib/tap.sh"
# shellcheck source=../../../tests/lib/compat.sh
source "$RS_TOP/tests/lib/compat.sh"
{
    compat_begin compat_verbs
    # shellcheck disable=SC2086
    compat_run_matrix $programs
    compat_table | while IFS= read -r row; do tap_diag "$row"; done
    tap_done_plan
} > "$RS_VM_OUT/compat.tap" 2>&1
status=$?
echo "compat_verbs: $(grep -c '^ok' "$RS_VM_OUT/compat.tap") ok, $(grep -c '^not ok' "$RS_VM_OUT/compat.tap") not ok"
exit $status
