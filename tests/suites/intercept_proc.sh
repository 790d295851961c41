#!/usr/bin/env bash
# Processes and signals over rdmasock (issue 6 item 6): tests/helpers/proccheck checks SA_RESTART and EINTR in a
# blocked recv/accept, a prefork server (the parent listens, children accept and serve checksummed data), exec of
# every exec function with close-on-exec and inherited sockets, daemon() with a listener made before it, and
# connections that cross into another process: a fork-per-connection server, one connection used by a parent and
# its child in turn, and a connection that survives exec (under the preload each starts on RDMA and continues on
# kernel TCP once it crossed over, docs/interception.md "Processes").
#
# Every check runs twice:
#   kernel   without the preload: the control, which must pass on any Linux (evidence: kernel TCP connections on
#            the port exist);
#   preload  LD_PRELOAD=$RS_LIB, RDMASOCK_TRANSPORT=soft and a rule file putting the suite's ports on RDMA
#            (`use rdma tcp any 127.0.0.1:PORTS`: a socket that cannot convert fails instead of falling back), and
#            the evidence that no kernel TCP connection on the port carried the data.
# PROC_MODES="kernel" or "preload" runs one of them. Logs: $RS_BUILD/test-logs/intercept_proc/.
set -uo pipefail
RS_TOP=${RS_TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
RS_BUILD=${RS_BUILD:-$RS_TOP/build}
RS_LIB=${RS_LIB:-$RS_BUILD/librdmasock.so}
source "$RS_TOP/tests/lib/tap.sh"

helper=$RS_BUILD/tests/helpers/proccheck
logdir=$RS_BUILD/test-logs/intercept_proc
mkdir -p "$logdir"
read -r -a modes <<< "${PROC_MODES:-kernel preload}"
soft_offset=${RDMASOCK_SOFT_PORT_OFFSET:-16384}

# The checks: "name|proccheck arguments" with @N standing for the N-th port of the run.
checks=(
    "recv keeps waiting through SA_RESTART handlers, then gets the data|signal recv restart @0"
    "recv returns EINTR when the handler has no SA_RESTART|signal recv interrupt @1"
    "accept keeps waiting through SA_RESTART handlers|signal accept restart @2"
    "accept returns EINTR when the handler has no SA_RESTART|signal accept interrupt @3"
    "recv with SO_RCVTIMEO returns EINTR even with SA_RESTART|signal recv-timeo restart @4"
    "prefork: 4 children accept on the parent's listener, 16 clients check 1 MiB each|prefork @5 4 16 1048576"
    "exec: 9 exec functions, close-on-exec sockets closed, inherited listener kept, failed execs harmless|exec @6"
    "forkconn: a child forked per accepted connection serves it after the parent closed its copy, 8 clients x 4 MiB each way, half with unread data at the fork|forkconn @8 8 4194304"
    "shared: one connection used by a forked child (reads what came before the fork, 2 MiB each way), then by the parent (2 MiB each way), stream intact|shared @9 2097152"
    "execconn: a connection without close-on-exec survives exec: the new image reads the 4 MiB sent before the exec, then 4 MiB more each way|execconn @10 4194304"
)
nports=11   # the checks above use @0..@6 and @8..@10, daemon uses @7

port_busy() { ss -Htan 2>/dev/null | awk '{print $4}' | grep -qE "[:.]$1\$"; }

# A base port with nports free ports, and free soft RNIC ports (port + offset) too.
pick_base() {
    local base p ok
    for _ in $(seq 1 50); do
        base=$((10000 + RANDOM % 6000))   # image P + 16384 below the ephemeral range
        ok=1
        for ((p = base; p < base + nports; p++)); do
            if port_busy "$p" || port_busy $((p + soft_offset)); then ok=0; break; fi
        done
        if ((ok)); then echo "$base"; return 0; fi
    done
    return 1
}

# run_check MODE NAME ARGS...: one TAP line; the helper's stderr becomes the diagnostics on failure.
run_check() {
    local mode=$1 name=$2; shift 2
    local log
    log=$logdir/$mode.$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_' | cut -c1-40).log
    local -a env=(PROCCHECK_EXPECT=kernel)
    if [[ $mode == preload ]]; then
        env=(PROCCHECK_EXPECT=rdma LD_PRELOAD="$RS_LIB" RDMASOCK_CONF="$conf" RDMASOCK_TRANSPORT=soft
             RDMASOCK_LOG=warn)
    fi
    # Only the helper is preloaded, not timeout(1).
    if timeout --kill-after=5 90 env "${env[@]}" "$helper" "$@" >"$log" 2>&1; then
        tap_ok "$mode: $name"
    else
        local rc=$?
        mapfile -t diag < <(tail -n 20 "$log")
        tap_fail "$mode: $name" "exit status $rc: proccheck $*" "${diag[@]}"
    fi
}

# The daemon check: the foreground process returns at once, a client is served by the daemon, which writes
# its verdict into a file.
run_daemon_check() {
    local mode=$1 port=$2
    local name="daemon(): new session, cwd /, fds 0-2 on /dev/null, the listener made before it serves a client"
    local status=$logdir/$mode.daemon.status log=$logdir/$mode.daemon.log
    rm -f "$status" "$status.pid"
    local -a env=(PROCCHECK_EXPECT=kernel)
    if [[ $mode == preload ]]; then
        env=(PROCCHECK_EXPECT=rdma LD_PRELOAD="$RS_LIB" RDMASOCK_CONF="$conf" RDMASOCK_TRANSPORT=soft
             RDMASOCK_LOG=warn)
    fi
    local problems=()
    if ! timeout 10 env "${env[@]}" "$helper" daemon "$port" "$status" >"$log" 2>&1; then
        problems+=("the foreground process of daemon() failed (exit status $?)")
    elif ! timeout 60 env "${env[@]}" "$helper" client "$port" 2097152 99 >>"$log" 2>&1; then
        problems+=("the client was not served correctly")
    fi
    # The daemon gives up on its client after 30 s and then writes its verdict.
    for _ in $(seq 1 200); do [[ -s $status ]] && break; sleep 0.2; done
    if [[ ! -s $status ]]; then
        problems+=("the daemon wrote no verdict within 40 s")
        [[ -s $status.pid ]] && kill "$(cat "$status.pid")" 2>/dev/null     # our daemon, by the pid it wrote
    elif [[ $(cat "$status") != ok ]]; then
        problems+=("daemon's verdict: $(cat "$status")")
    fi
    if ((${#problems[@]} == 0)); then
        tap_ok "$mode: $name"
    else
        mapfile -t diag < <(tail -n 20 "$log")
        tap_fail "$mode: $name" "${problems[@]}" "${diag[@]}"
    fi
}

if [[ ! -x $helper ]]; then
    tap_fail "proccheck is built" "missing $helper (make tests)"
    tap_done_plan
    exit 1
fi
# The helper must reach libc (or the preloaded library) for its socket calls, not a static copy of rdmasock.
if nm "$helper" 2>/dev/null | grep -qE ' [TtDdBb] rs_'; then
    tap_fail "proccheck has no static copy of rdmasock" "$(nm "$helper" | grep -E ' [TtDdBb] rs_' | head -5)"
else
    tap_ok "proccheck has no static copy of rdmasock (its socket calls go to libc or the preload)"
fi

if ! base=$(pick_base); then
    tap_fail "free ports" "no run of $nports free ports found"
    tap_done_plan
    exit 1
fi
conf=$logdir/rdmasock.conf
printf 'use rdma tcp any 127.0.0.1:%d-%d\n' "$base" $((base + nports - 1)) > "$conf"
tap_diag "ports $base-$((base + nports - 1)); rule file $conf; logs in $logdir"

for mode in "${modes[@]}"; do
    if [[ $mode == preload && ! -f $RS_LIB ]]; then
        for check in "${checks[@]}" daemon; do tap_fail "preload: ${check%%|*}" "missing $RS_LIB (make all)"; done
        continue
    fi
    for check in "${checks[@]}"; do
        name=${check%%|*}
        read -r -a args <<< "${check#*|}"
        for i in "${!args[@]}"; do
            [[ ${args[i]} == @* ]] && args[i]=$((base + ${args[i]#@}))
        done
        run_check "$mode" "$name" "${args[@]}"
    done
    run_daemon_check "$mode" $((base + 7))
done
tap_done_plan
