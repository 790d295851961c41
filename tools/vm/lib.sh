# shellcheck shell=bash
# Helpers for jobs run by `tools/vm/vm run`; source with: . "$RS_VM_LIB"
#
# Synchronisation of a pair goes through RS_VM_SYNC, a folder of the host
# that both guests mount (9p without caching, so a file one guest creates is
# seen by the other at its next look). A signal is an empty file
# NAME.<role>; waiting gives up early when the peer's job has already ended,
# so a failed peer never leaves the other job hanging until the timeout.

declare -gA rs_vm_bg_pids=()

rs_vm_peer_role() {
    case "${RS_VM_ROLE:-}" in
        a) echo b ;;
        b) echo a ;;
        *) echo "${RS_VM_ROLE:-single}" ;;
    esac
}

# rs_vm_signal NAME: tell the peer that this side reached NAME.
rs_vm_signal() {
    : > "$RS_VM_SYNC/$1.$RS_VM_ROLE"
}

# rs_vm_wait_for NAME [TIMEOUT_S=120]: wait until the peer signalled NAME.
# Returns 1 on timeout or when the peer's job ended without signalling.
rs_vm_wait_for() {
    local name=$1 limit=${2:-120} peer waited=0
    peer=$(rs_vm_peer_role)
    while [[ ! -e "$RS_VM_SYNC/$name.$peer" ]]; do
        if [[ -e "$RS_VM_CTL/$peer/rc" || -e "$RS_VM_CTL/$peer/harness" ]]; then
            echo "rs_vm_wait_for $name: the peer ($peer) ended without reaching it" >&2
            return 1
        fi
        if (( waited >= limit * 10 )); then
            echo "rs_vm_wait_for $name: no signal from $peer in $limit s" >&2
            return 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

# rs_vm_barrier NAME [TIMEOUT_S]: both sides continue once both reached NAME.
rs_vm_barrier() {
    rs_vm_signal "$1"
    rs_vm_wait_for "$@"
}

# rs_vm_wait_peer_ready [TIMEOUT_S]: the peer has booted, its rxe0 is ACTIVE
# and its job is running.
rs_vm_wait_peer_ready() {
    rs_vm_barrier ready "$@"
}

# rs_vm_bg NAME CMD [ARGS...]: start CMD in the background, its output in
# $RS_VM_OUT/NAME.log (role-prefixed in a pair, whose guests share RS_VM_OUT).
rs_vm_bg() {
    local name=$1; shift
    "$@" > "$(rs_vm_out_file "$name.log")" 2>&1 < /dev/null &
    rs_vm_bg_pids[$name]=$!
}

# rs_vm_wait NAME [TIMEOUT_S=60]: wait for a background command; returns its
# exit status, or 124 after killing it when it outlives the timeout.
rs_vm_wait() {
    local name=$1 limit=${2:-60} pid waited=0
    pid=${rs_vm_bg_pids[$name]:?no background command $name}
    while kill -0 "$pid" 2>/dev/null; do
        if (( waited >= limit * 10 )); then
            kill -TERM "$pid" 2>/dev/null
            sleep 0.2
            kill -KILL "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            unset "rs_vm_bg_pids[$name]"
            return 124
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    wait "$pid"
    local status=$?
    unset "rs_vm_bg_pids[$name]"
    return $status
}

# rs_vm_stop NAME [SIGNAL=TERM]: stop a background command, return its status.
rs_vm_stop() {
    local name=$1 signal=${2:-TERM} pid
    pid=${rs_vm_bg_pids[$name]:?no background command $name}
    kill "-$signal" "$pid" 2>/dev/null
    rs_vm_wait "$name" 10
}

# rs_vm_out_file NAME: path for a result file; in a pair the role is put in
# front of the name so the two guests never write the same file.
rs_vm_out_file() {
    if [[ "$RS_VM_ROLE" == single ]]; then
        printf '%s/%s\n' "$RS_VM_OUT" "$1"
    else
        printf '%s/%s.%s\n' "$RS_VM_OUT" "$RS_VM_ROLE" "$1"
    fi
}

# rs_vm_retry TRIES DELAY_S CMD [ARGS...]: repeat a command that may fail for
# a passing reason (address resolution right after the link came up).
rs_vm_retry() {
    local tries=$1 delay=$2 attempt status=1; shift 2
    for ((attempt = 1; attempt <= tries; attempt++)); do
        "$@" && return 0
        status=$?
        (( attempt < tries )) && sleep "$delay"
    done
    return $status
}

# rs_vm_wait_listen PORT [TIMEOUT_S=30]: wait until an rdma_cm listener is
# bound to PORT on this guest. Starting a client before that is a real
# hazard: the CM rejects the request, and perftest then crashes or hangs.
rs_vm_wait_listen() {
    local port=$1 limit=${2:-30} waited=0
    until rdma resource show cm_id 2>/dev/null |
          grep -Eq "state LISTEN .*src-addr [^ ]*:$port( |\$)"; do
        if (( waited >= limit * 10 )); then
            echo "rs_vm_wait_listen: nothing listens on rdma_cm port $port after $limit s" >&2
            return 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

# rs_vm_serve NAME PORT SERVER_CMD... -- CLIENT_CMD...: start an rdma_cm
# server in the background, wait for its listener, run the client as step
# NAME (NAME.txt, NAME.rc), then collect the server (NAME_server.log/.rc).
# perftest with -R connects twice on one port (its parameter exchange, then
# the test's QP), and its server re-listens in between: a client that comes
# back in that window is REJECTED (no listener) and perftest gives up (or
# crashes). That race is perftest's own, so a REJECTED client gets a fresh
# server and up to two more tries; NAME.txt says how many it took.
rs_vm_serve() {
    local name=$1 port=$2 attempt status; shift 2
    local -a server=() client=()
    while [[ $1 != -- ]]; do server+=("$1"); shift; done
    shift
    client=("$@")
    for attempt in 1 2 3; do
        rs_vm_bg "${name}_server" timeout 90 "${server[@]}"
        if rs_vm_wait_listen "$port" 30; then
            rs_vm_step "$name" timeout 60 "${client[@]}"
            status=$?
        else
            echo "no rdma_cm listener on port $port" > "$RS_VM_OUT/$name.txt"
            echo 1 > "$RS_VM_OUT/$name.rc"
            status=1
        fi
        if (( status != 0 )) && grep -q 'RDMA_CM_EVENT_REJECTED' "$RS_VM_OUT/$name.txt" && (( attempt < 3 )); then
            cp "$RS_VM_OUT/$name.txt" "$RS_VM_OUT/$name.rejected$attempt.txt"
            rs_vm_wait "${name}_server" 5 > /dev/null
            continue
        fi
        break
    done
    echo "attempt $attempt (perftest's rdma_cm re-listen race: a REJECTED client is retried)" >> "$RS_VM_OUT/$name.txt"
    rs_vm_wait "${name}_server" 30
    echo $? > "$RS_VM_OUT/${name}_server.rc"
    return "$status"
}

# rs_vm_capture_start FILE [TCPDUMP FILTER...]: capture RS_VM_NETDEV to FILE
# and return once tcpdump is really capturing (it says so on stderr).
rs_vm_capture_start() {
    local file=$1 waited=0; shift
    # -Z root: tcpdump would otherwise drop to its own user, which may not
    # write into the results share.
    # --immediate-mode: frames reach tcpdump one by one instead of in blocks
    # the kernel hands over only when full or after a timeout.
    tcpdump -i "$RS_VM_NETDEV" --immediate-mode -U -n -Z root -w "$file" "$@" \
        > "$file.log" 2>&1 < /dev/null &
    rs_vm_bg_pids[capture]=$!
    rs_vm_capture_file=$file
    until grep -q 'listening on' "$file.log" 2>/dev/null; do
        if ! kill -0 "${rs_vm_bg_pids[capture]}" 2>/dev/null || (( waited >= 100 )); then
            echo "rs_vm_capture_start: tcpdump did not start: $(cat "$file.log")" >&2
            return 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

# rs_vm_capture_stop: end the capture and return tcpdump's status.
# tcpdump stops at SIGINT without writing what it has received but not yet
# processed, and on a busy single-vCPU guest it lags well behind the wire;
# so the file (written per packet, -U) must first stop growing for a second.
rs_vm_capture_stop() {
    local size last=-1 still=0 waited=0
    while (( still < 10 && waited < 300 )); do
        size=$(stat -c %s "$rs_vm_capture_file" 2>/dev/null || echo 0)
        if [[ "$size" == "$last" ]]; then
            still=$((still + 1))
        else
            still=0
            last=$size
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    rs_vm_stop capture INT
}

# rs_vm_step NAME CMD [ARGS...]: run a step, its output in
# rs_vm_out_file NAME.txt and its exit status in NAME.rc, so the host side
# judges each step separately. Returns the step's status.
rs_vm_step() {
    local name=$1 status; shift
    "$@" > "$(rs_vm_out_file "$name.txt")" 2>&1 < /dev/null
    status=$?
    echo "$status" > "$(rs_vm_out_file "$name.rc")"
    echo "step $name: exit $status"
    return $status
}

# rs_vm_rping_verified FILE [COUNT=10]: the lines rping -v printed are exactly
# rdma-ping-0..COUNT-1, and each payload is the previous one shifted by one
# character, i.e. what rping generates, carried through its SEND / RDMA READ /
# RDMA WRITE round trip unchanged. Usable on the host as well.
rs_vm_rping_verified() {
    awk -v want="${2:-10}" '
        /^ping data: rdma-ping-[0-9]+: / {
            seq = $3; sub(/^rdma-ping-/, "", seq); sub(/:$/, "", seq)
            payload = substr($0, index($0, $3) + length($3) + 1)
            if (seq != n + 0) { print "sequence " seq " where " n + 0 " was expected"; bad = 1 }
            if (n > 0 && substr(previous, 2) != substr(payload, 1, length(previous) - 1)) {
                print "payload of rdma-ping-" seq " is not the previous one shifted"; bad = 1
            }
            previous = payload; n++
        }
        END {
            if (n != want) { print n + 0 " verified data lines, " want " expected"; bad = 1 }
            exit bad
        }' "$1"
}
