#!/usr/bin/env bash
# poll, select and epoll over rdmasock sockets. tests/helpers/waitcheck checks readiness on real TCP sockets
# (POLLIN/POLLOUT/POLLRDHUP, listeners, EPOLLET, EPOLLONESHOT, one socket in two epoll sets, nested epoll, epoll in
# poll, kernel fds mixed in, timeouts, signals, idle CPU, fork). It runs twice:
#   plain     on the kernel alone: the checks themselves are right;
#   rdmasock  under LD_PRELOAD with a rule that moves its port onto SDP on the software RNIC, so every check goes
#             through the wait layer; the program's own probe (getsockopt at level RS_SOL_SDP) insists that every
#             socket converted, and `rdmasock stat PID` confirms it from outside while the program holds a pair.
# Each check of each run is one TAP line.
source "$RS_TOP/tests/lib/tap.sh"
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
RS_LIB=${RS_LIB:-$RS_BUILD/librdmasock.so}
RS_TOOL=${RS_TOOL:-$RS_BUILD/bin/rdmasock}
bin=$RS_BUILD/tests/helpers/waitcheck
scratch=$(mktemp -d)
holder=
cleanup() { [ -n "$holder" ] && kill "$holder" 2>/dev/null; rm -rf "$scratch"; }
trap cleanup EXIT

for need in "$bin" "$RS_LIB" "$RS_TOOL"; do
    if [ ! -e "$need" ]; then
        tap_fail "built: $need" "run make tests first"
        tap_done_plan
        exit 1
    fi
done

# The software RNIC listens on PORT + this offset (docs/rnic-rc.md); both must be free.
offset=${RDMASOCK_SOFT_PORT_OFFSET:-16384}
port_busy() { ss -Htan "( sport = :$1 or dport = :$1 )" 2>/dev/null | grep -q .; }
pick_port() {
    local p
    for _ in $(seq 50); do
        p=$((10000 + RANDOM % 6000))   # image P + 16384 below the ephemeral range
        if ! port_busy "$p" && ! port_busy $((p + offset)) && ! port_busy $((p + 1)) && ! port_busy $((p + 1 + offset)); then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# report LABEL FILE STATUS: one TAP line per check line of a waitcheck run, plus a failure for a run that died
# before every planned check reported or that exited non-zero without saying why.
report() {
    local label=$1 file=$2 status=$3 planned seen=0 failed=0 line name
    planned=$(awk '/^PLAN /{print $2; exit}' "$file")
    while IFS= read -r line; do
        case $line in
            PASS\ *) tap_ok "$label: ${line#PASS }"; seen=$((seen + 1)) ;;
            FAIL\ *)
                name=${line#FAIL }
                seen=$((seen + 1))
                tap_fail "$label: ${name%%:*}" "${name#*: }"
                failed=$((failed + 1)) ;;
            \#*) tap_diag "$label: ${line#\# }" ;;
        esac
    done < "$file"
    if [ -z "$planned" ] || [ "$seen" -lt "$planned" ]; then
        tap_fail "$label: every planned check reported (${seen} of ${planned:-?})" "exit status $status" \
            "$(grep -v '^\(PASS\|FAIL\|#\|PLAN\|HOLD\)' "$file" | tail -n 20)"
    elif [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
        tap_fail "$label: exit status" "waitcheck exited with $status" "$(tail -n 20 "$file")"
    fi
}

# A plain program: the Makefile links helpers with librdmasock.a, and a statically linked interposer would make
# the plain run a run with rdmasock (waitcheck references those functions weakly so the archive stays out).
embedded=$(nm "$bin" 2>/dev/null | awk '$2 ~ /^[TW]$/ && $3 ~ /^(poll|ppoll|select|pselect|epoll_ctl|epoll_wait|socket|connect|accept|close)$/ {print $3}')
if [ -z "$embedded" ]; then
    tap_ok "waitcheck does not embed rdmasock's interposers"
else
    tap_fail "waitcheck does not embed rdmasock's interposers" "defined in the binary: $embedded"
fi

if ! port=$(pick_port); then
    tap_fail "free TCP ports" "no free port pair found"
    tap_done_plan
    exit 1
fi

# 1. The plain kernel.
timeout 300 "$bin" --port "$port" --expect kernel > "$scratch/plain.out" 2>&1
report plain "$scratch/plain.out" $?

# 2. The same checks with rdmasock preloaded and the port on SDP over the software RNIC.
sdp_port=$((port + 1))
printf 'use rdma tcp any 127.0.0.1:%d\n' "$sdp_port" > "$scratch/wait.conf"
coproc WAITCHECK {
    RDMASOCK_CONF="$scratch/wait.conf" RDMASOCK_TRANSPORT=soft exec timeout 300 \
        env LD_PRELOAD="$RS_LIB" "$bin" --port "$sdp_port" --expect sdp --hold 2>&1
}
holder=$WAITCHECK_PID
held_pid=
: > "$scratch/sdp.out"
while IFS= read -r line <&"${WAITCHECK[0]}"; do
    printf '%s\n' "$line" >> "$scratch/sdp.out"
    case $line in
        HOLD\ *)
            held_pid=${line#HOLD }
            "$RS_TOOL" stat "$held_pid" > "$scratch/stat.out" 2>&1
            exec {WAITCHECK[1]}>&-     # closing its stdin lets waitcheck finish
            ;;
    esac
done
wait "$holder"
status=$?
holder=
report rdmasock "$scratch/sdp.out" "$status"

# 3. From outside: the statistics area of the held process shows the listener and both ends of the held
# connection on RDMA, and no socket of the run on the kernel.
if [ -z "$held_pid" ]; then
    tap_fail "rdmasock stat: sockets converted" "waitcheck never reached its hold point"
else
    listeners=$(awk '$2 == "tcp" && $3 == "listener" && $5 == "rdma"' "$scratch/stat.out" | wc -l)
    connected=$(awk '$2 == "tcp" && ($3 == "client" || $3 == "accepted") && $4 == "connected" && $5 == "rdma"' \
                    "$scratch/stat.out" | wc -l)
    on_kernel=$(awk '$2 == "tcp" && $5 != "rdma" && $1 ~ /^[0-9]+$/' "$scratch/stat.out" | wc -l)
    if [ "$listeners" -ge 1 ] && [ "$connected" -ge 2 ] && [ "$on_kernel" -eq 0 ]; then
        tap_ok "rdmasock stat: listener and held connection on RDMA, nothing on the kernel"
    else
        tap_fail "rdmasock stat: sockets converted" \
            "listeners on rdma: $listeners, connected on rdma: $connected, not on rdma: $on_kernel" \
            "$(cat "$scratch/stat.out")"
    fi
fi

tap_done_plan
