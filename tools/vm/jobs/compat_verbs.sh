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
# Each JVM on one vCPU: QEMU's multi-threaded TCG does not make code patched on one vCPU visible atomically to
# another, and HotSpot patches compiled methods while other threads run them (docs/compatibility.md, F7).
export COMPAT_JAVA_CPUS=${COMPAT_JAVA_CPUS-0}

programs=${RS_VM_COMPAT_ONLY:-iperf3 sockperf redis memcached nginx socat apache2-prefork apache2-event mariadb curl java}

rdma link show > "$RS_VM_OUT/rdma_link.txt" 2>&1

# shellcheck source=../../../tests/lib/tap.sh
source "$RS_TOP/tests/lib/tap.sh"
# shellcheck source=../../../tests/lib/compat.sh
source "$RS_TOP/tests/lib/compat.sh"

# idle_client NAME PORT: an RDMA client that connects and never writes (as ab's surplus connection does); its pid
# in IDLE_PID.
idle_client() {
    RDMASOCK_LOG="$COMPAT_LOG,file:$COMPAT_DIR/$1.rdmasock.log" "${COMPAT_WRAP[@]}" /usr/bin/python3 -c \
        "import socket,time; s=socket.create_connection(('$COMPAT_ADDR',$2)); print(s.getsockname()[1], flush=True); time.sleep(30)" \
        > "$COMPAT_DIR/$1.out" 2> "$COMPAT_DIR/$1.err" &
    IDLE_PID=$!
}

# Verbs only: the prefork family shares one RDMA listener (docs/interception.md, "Processes"). Two clients that
# connect and never write are accepted by two different children, and a request that comes while one of them idles
# is served at once by another child, not after Apache's Timeout (5 s) behind the idle connection.
check_prefork_family() {
    local name=apache2-prefork-family port a b
    export RDMASOCK_LOG="$COMPAT_LOG,file:$COMPAT_DIR/$name.rdmasock.log"
    COMPAT_LOG_FILE=$COMPAT_DIR/$name.rdmasock.log
    compat_port port
    compat_apache_start "$name" prefork "$port"
    if ! compat_wait_listen "$name" "$port" 30; then
        tap_fail "apache2 prefork family: two idle clients land in two children" "apache2 did not listen on port $port"
        tap_fail "apache2 prefork family: a request is served while a client idles (no head-of-line blocking)" "not run"
        compat_stop_all
        return
    fi
    sleep 3     # the children reach accept
    idle_client family-idle-1 "$port"; a=$IDLE_PID
    idle_client family-idle-2 "$port"; b=$IDLE_PID
    local p1= p2= pids= tries=0
    # Each prints its port once connected; then the children take them (Apache drops them after Timeout, 5 s).
    while (( tries++ < 100 )) && [[ -z $p1 || -z $p2 ]]; do
        sleep 0.1
        p1=$(head -n 1 "$COMPAT_DIR/family-idle-1.out"); p2=$(head -n 1 "$COMPAT_DIR/family-idle-2.out")
    done
    tries=0
    while (( tries++ < 10 )); do
        "$RS_TOOL" stat --all-users --json > "$COMPAT_DIR/$name.stat-idle.json" 2>&1
        # The apache processes holding an accepted RDMA connection from either idle client.
        pids=$(jq -r --arg p1 ":$p1" --arg p2 ":$p2" '.[] | select(.program == "apache2") | . as $p | .sockets[]
                | select(.role == "accepted" and .path == "rdma" and ((.peer | endswith($p1)) or (.peer | endswith($p2))))
                | $p.pid' "$COMPAT_DIR/$name.stat-idle.json" 2>/dev/null | sort -u | tr '\n' ' ')
        [[ $(wc -w <<< "$pids") == 2 ]] && break
        sleep 0.3
    done
    [[ -n $p1 && -n $p2 && $(wc -w <<< "$pids") == 2 ]]
    compat_verdict_plain $? "apache2 prefork family: two idle clients land in two children" \
        "idle clients' ports: ${p1:-?} ${p2:-?}; apache pids holding them: ${pids:-none}" \
        "$(jq -c '.[] | {pid, program, s: [.sockets[] | {role, path, local, peer}]}' "$COMPAT_DIR/$name.stat-idle.json" 2>/dev/null)"
    kill "$a" "$b" 2>/dev/null; wait "$a" "$b" 2>/dev/null
    sleep 1
    idle_client family-idle-3 "$port"; a=$IDLE_PID
    sleep 1
    # Without the family the idle connection holds the one RDMA child for Timeout (5 s): curl would time out.
    local out status took
    out=$(RDMASOCK_LOG="$COMPAT_LOG,file:$COMPAT_DIR/family-curl.rdmasock.log" timeout 20 "${COMPAT_WRAP[@]}" \
          curl -sS -o /dev/null --max-time 3.5 -w '%{http_code} %{time_total}' "http://$COMPAT_ADDR:$port/page.html" \
          2> "$COMPAT_DIR/family-curl.err")
    status=$?
    took=${out#* }
    kill "$a" 2>/dev/null; wait "$a" 2>/dev/null
    [[ $status == 0 && ${out%% *} == 200 ]]
    compat_verdict_plain $? "apache2 prefork family: a request is served while a client idles (no head-of-line blocking)" \
        "curl exit $status, http ${out%% *}, ${took:-?} s (at most 3.5 s; Apache's Timeout is 5 s)" "$(tail -n 3 "$COMPAT_DIR/family-curl.err")"
    tap_diag "apache2 prefork family: curl served in ${took:-?} s while a client idled; idle clients in pids ${pids:-?}"
    compat_stop_all
}

compat_verdict_plain() {
    local status=$1 desc=$2; shift 2
    if [[ $status == 0 ]]; then tap_ok "$desc"; else tap_fail "$desc" "$@"; fi
}

{
    compat_begin compat_verbs
    # shellcheck disable=SC2086
    compat_run_matrix $programs
    if [[ " $programs " == *" apache2-prefork "* ]]; then check_prefork_family; fi
    compat_table | while IFS= read -r row; do tap_diag "$row"; done
    tap_done_plan
} > "$RS_VM_OUT/compat.tap" 2>&1
status=$?
echo "compat_verbs: $(grep -c '^ok' "$RS_VM_OUT/compat.tap") ok, $(grep -c '^not ok' "$RS_VM_OUT/compat.tap") not ok"
exit $status
