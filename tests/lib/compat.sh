# shellcheck shell=bash
# The compatibility matrix (issue 6 item 8), shared by tests/suites/compat_soft.sh (software RNIC on the host) and
# tools/vm/jobs/compat_verbs.sh (verbs on soft-RoCE in the VM). Sourced after tests/lib/tap.sh.
#
# Every check runs an unmodified server and client on ADDR:PORT (a free port picked at run time) and verifies the
# data (checksums, byte or message counts from both ends), never just "it started". The two runs of a check
# differ only by the wrapper in front of each program:
#   COMPAT_MODE=preload  (default) every server and client runs under `rdmasock run -c CONF --transport T --`,
#                        and a last check per program asserts the evidence: `rdmasock stat` saw its TCP
#                        connections on the port with path rdma (none on the kernel) and the RDMA byte counters
#                        of the processes moved at least the payload;
#   COMPAT_MODE=kernel   the same commands without a wrapper: the control (evidence checks are skipped).
#
# Environment (all optional):
#   COMPAT_TRANSPORT soft|verbs|auto (soft)     COMPAT_ADDR   address servers bind and clients use (127.0.0.1)
#   COMPAT_LOG       RDMASOCK_LOG level (info), each program's log in COMPAT_DIR/PROGRAM.rdmasock.log
#   COMPAT_DIR       logs and results (RS_BUILD/test-logs/SUITE); COMPAT_DATA_ROOT: where payload files go (TMPDIR)
#   COMPAT_ONLY      space-separated programs to run (default: all, see compat_programs)
#   COMPAT_INSTALL   0: never run tools/deps.sh compat for missing programs (default 1 when root)
#   COMPAT_CLIENT_TIMEOUT, COMPAT_SERVER_TIMEOUT  bounds in seconds (90, 600)
#   sizes: COMPAT_IPERF_MB (64) COMPAT_SOCAT_MB (64) COMPAT_HTTP_MB (10) COMPAT_REDIS_N (20000)
#          COMPAT_MEMC_N (20000) COMPAT_AB_N (1000) COMPAT_SLAP_N (2000) COMPAT_JAVA_MB (8) COMPAT_SOCKPERF_S (2)
#          COMPAT_SOCKPERF_VARIANTS ("s p e": select, poll, epoll)
#   COMPAT_JAVA_CPUS  run each JVM under `taskset -c` on these CPUs (unset: unpinned; the VM job sets 0)
#
# Each program reports a fixed list of TAP lines (declared before it runs) so a crash, a missing program or a
# server that never came up still prints every line: skipped with the reason, or failed with diagnostics.

COMPAT_MODE=${COMPAT_MODE:-preload}
RS_TOOL=${RS_TOOL:-${RS_BUILD:-${RS_TOP:-.}/build}/bin/rdmasock}
COMPAT_TRANSPORT=${COMPAT_TRANSPORT:-soft}
COMPAT_ADDR=${COMPAT_ADDR:-127.0.0.1}
COMPAT_LOG=${COMPAT_LOG:-info}
COMPAT_CLIENT_TIMEOUT=${COMPAT_CLIENT_TIMEOUT:-90}
COMPAT_SERVER_TIMEOUT=${COMPAT_SERVER_TIMEOUT:-600}
COMPAT_IPERF_MB=${COMPAT_IPERF_MB:-64}
COMPAT_SOCAT_MB=${COMPAT_SOCAT_MB:-64}
COMPAT_HTTP_MB=${COMPAT_HTTP_MB:-10}
COMPAT_REDIS_N=${COMPAT_REDIS_N:-20000}
COMPAT_MEMC_N=${COMPAT_MEMC_N:-20000}
COMPAT_AB_N=${COMPAT_AB_N:-1000}
COMPAT_SLAP_N=${COMPAT_SLAP_N:-2000}
COMPAT_JAVA_MB=${COMPAT_JAVA_MB:-8}
COMPAT_SOCKPERF_S=${COMPAT_SOCKPERF_S:-2}
COMPAT_SOCKPERF_VARIANTS=${COMPAT_SOCKPERF_VARIANTS:-s p e}

# Program -> the binaries it needs and the Debian packages that hold them (tools/deps.sh group compat).
declare -A COMPAT_BINS=(
    [iperf3]="iperf3 jq"
    [sockperf]="sockperf"
    [redis]="redis-server redis-benchmark redis-cli"
    [memcached]="memcached memcaslap memccp memccat memcstat"
    [nginx]="nginx wrk curl"
    [apache2-prefork]="apache2 ab curl"
    [apache2-event]="apache2 ab curl"
    [mariadb]="mariadbd mariadb-install-db mariadb mysqlslap"
    [socat]="socat"
    [curl]="curl nginx"
    [java]="java javac"
)
declare -A COMPAT_PACKAGE_OF=(
    [iperf3]=iperf3 [jq]=jq [sockperf]=sockperf [redis-server]=redis-server [redis-benchmark]=redis-tools
    [redis-cli]=redis-tools [memcached]=memcached [memcaslap]=libmemcached-tools [memccp]=libmemcached-tools
    [memccat]=libmemcached-tools [memcstat]=libmemcached-tools [nginx]=nginx [wrk]=wrk [curl]=curl
    [apache2]=apache2 [ab]=apache2-utils [mariadbd]=mariadb-server [mariadb-install-db]=mariadb-server
    [mariadb]=mariadb-client [mysqlslap]=mariadb-client [socat]=socat [java]=openjdk-17-jdk-headless
    [javac]=openjdk-17-jdk-headless
)
# The package whose version docs/compatibility.md lists for each program.
declare -A COMPAT_VERSION_PACKAGE=(
    [iperf3]=iperf3 [sockperf]=sockperf [redis]=redis-server [memcached]=memcached [nginx]=nginx
    [apache2-prefork]=apache2 [apache2-event]=apache2 [mariadb]=mariadb-server [socat]=socat [curl]=curl
    [java]=openjdk-17-jdk-headless
)

compat_programs() { echo iperf3 sockperf redis memcached nginx apache2-prefork apache2-event mariadb socat curl java; }

# ----------------------------------------------------------------------------------------------- suite state

COMPAT_DIR=${COMPAT_DIR:-}
COMPAT_DATA=
COMPAT_CONF=
COMPAT_WRAP=()
COMPAT_PORTS=()
COMPAT_GROUPS=()
COMPAT_WATCH_PID=
COMPAT_WATCH_FILE=
COMPAT_RESULTS=
declare -A COMPAT_SERVER=()

# compat_begin SUITE: folders, the rule file, the wrapper, and the trap that ends every server.
compat_begin() {
    local suite=$1
    COMPAT_DIR=${COMPAT_DIR:-$RS_BUILD/test-logs/$suite}
    rm -rf "$COMPAT_DIR"
    mkdir -p "$COMPAT_DIR"
    # Servers that drop privileges (apache's children run as www-data) read the payloads and write logs here.
    chmod 0755 "$COMPAT_DIR"
    COMPAT_DATA=$(mktemp -d "${COMPAT_DATA_ROOT:-${TMPDIR:-/tmp}}/rdmasock-compat.XXXXXX") || return 1
    chmod 0755 "$COMPAT_DATA"
    COMPAT_RESULTS=$COMPAT_DIR/results.tsv
    : > "$COMPAT_RESULTS"
    COMPAT_CONF=$COMPAT_DIR/rdmasock.conf
    {
        echo "# written by tests/lib/compat.sh for $suite: one pair of rules per port the matrix uses."
        echo "# Servers listen in 'both' mode (so a readiness probe sees a kernel listener); clients insist on RDMA,"
        echo "# so a connection that cannot use it fails loudly instead of falling back."
    } > "$COMPAT_CONF"
    trap compat_cleanup EXIT
    trap 'exit 130' INT TERM
    if [[ $COMPAT_MODE == preload ]]; then
        # --log: per program (compat_program sets COMPAT_LOG_FILE); the variable is read when the wrapper runs.
        COMPAT_WRAP=("$RS_TOOL" run -c "$COMPAT_CONF" --transport "$COMPAT_TRANSPORT" --)
    else
        COMPAT_WRAP=()
    fi
    tap_diag "compat: mode $COMPAT_MODE, transport $COMPAT_TRANSPORT, address $COMPAT_ADDR, logs in $COMPAT_DIR"
}

compat_cleanup() {
    compat_watch_stop
    local group
    for group in "${COMPAT_GROUPS[@]}"; do kill -TERM -- "-$group" 2>/dev/null; done
    for group in "${COMPAT_GROUPS[@]}"; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$group" 2>/dev/null || break; sleep 0.2; done
        kill -KILL -- "-$group" 2>/dev/null
    done
    wait 2>/dev/null
    [[ -n $COMPAT_DATA && -d $COMPAT_DATA ]] && rm -rf "$COMPAT_DATA"
}

# compat_install_missing: installs the compat packages once when something is missing and we may (root, not in
# the VM, COMPAT_INSTALL not 0). Whatever stays missing is reported per program as a skip.
compat_install_missing() {
    local program bin missing=0
    for program in $(compat_programs); do
        for bin in ${COMPAT_BINS[$program]}; do compat_have "$bin" || missing=1; done
    done
    (( missing )) || return 0
    if [[ ${COMPAT_INSTALL:-1} == 0 || $(id -u) != 0 ]]; then return 0; fi
    tap_diag "compat: installing the missing programs (tools/deps.sh compat)"
    "$RS_TOP/tools/deps.sh" compat > "$COMPAT_DIR/deps.log" 2>&1 ||
        tap_diag "compat: tools/deps.sh compat failed: $(tail -n 3 "$COMPAT_DIR/deps.log")"
}

compat_have() { command -v "$1" >/dev/null 2>&1 || [[ -x /usr/sbin/$1 ]]; }

compat_bin() { command -v "$1" 2>/dev/null || echo "/usr/sbin/$1"; }

compat_wanted() {
    [[ -z ${COMPAT_ONLY:-} ]] && return 0
    [[ " $COMPAT_ONLY " == *" $1 "* ]]
}

# compat_port VAR: a TCP port free on this machine right now and not yet used by the suite; adds its rules.
compat_port() {
    # The nameref and its helpers carry a prefix: a caller's variable named like one of them would be shadowed.
    local -n _compat_port_out=$1
    local _compat_port _compat_tries=0
    while (( _compat_tries++ < 200 )); do
        # 10000-16383: the software RNIC's image of the port (P + 16384) then lies below the kernel's ephemeral
        # range (32768-60999), where no outgoing connection's local port can be sitting on it.
        _compat_port=$((10000 + (RANDOM * 32768 + RANDOM) % 6384))
        [[ " ${COMPAT_PORTS[*]} " == *" $_compat_port "* ]] && continue
        [[ -n $(ss -Htan "( sport = :$_compat_port or dport = :$_compat_port or sport = :$((_compat_port + 16384)) )" 2>/dev/null) ]] && continue
        COMPAT_PORTS+=("$_compat_port")
        printf 'use both tcp server *:%s\nuse rdma tcp client %s:%s\n' "$_compat_port" "$COMPAT_ADDR" "$_compat_port" \
            >> "$COMPAT_CONF"
        _compat_port_out=$_compat_port
        return 0
    done
    return 1
}

# ----------------------------------------------------------------------------------------------- TAP lines

COMPAT_PROGRAM=
COMPAT_LINES=()
COMPAT_NEXT=0
COMPAT_PROGRAM_FAILED=0
COMPAT_PROGRAM_SKIPPED=
COMPAT_PROGRAM_STARTED=0

# compat_program NAME DESC...: declares NAME's checks. Returns 1 (after skipping them all) when NAME is not
# wanted or a binary it needs is missing.
compat_program() {
    COMPAT_PROGRAM=$1; shift
    COMPAT_LINES=("$@")
    COMPAT_NEXT=0
    COMPAT_PROGRAM_FAILED=0
    COMPAT_PROGRAM_SKIPPED=
    COMPAT_PROGRAM_STARTED=$SECONDS
    COMPAT_LOG_FILE=$COMPAT_DIR/$COMPAT_PROGRAM.rdmasock.log
    export RDMASOCK_LOG="$COMPAT_LOG,file:$COMPAT_LOG_FILE"
    if ! compat_wanted "$COMPAT_PROGRAM"; then
        compat_skip_rest "not selected (COMPAT_ONLY=$COMPAT_ONLY)"
        return 1
    fi
    local bin missing=() packages=()
    for bin in ${COMPAT_BINS[$COMPAT_PROGRAM]}; do
        if ! compat_have "$bin"; then
            missing+=("$bin")
            [[ " ${packages[*]} " == *" ${COMPAT_PACKAGE_OF[$bin]} "* ]] || packages+=("${COMPAT_PACKAGE_OF[$bin]}")
        fi
    done
    if (( ${#missing[@]} )); then
        compat_skip_rest "not installed: ${missing[*]} (apt-get install ${packages[*]}, or tools/deps.sh compat)"
        return 1
    fi
    return 0
}

compat_line() { printf '%s\n' "${COMPAT_LINES[COMPAT_NEXT]:-$COMPAT_PROGRAM: (undeclared check $COMPAT_NEXT)}"; }

compat_pass() {
    tap_ok "$(compat_line)"
    COMPAT_NEXT=$((COMPAT_NEXT + 1))
}

# compat_fail DIAG...: the next check failed; DIAG lines are printed as TAP diagnostics.
compat_fail() {
    tap_fail "$(compat_line)" "$@"
    COMPAT_NEXT=$((COMPAT_NEXT + 1))
    COMPAT_PROGRAM_FAILED=1
}

# compat_verdict CONDITION_STATUS DIAG...: pass when the status is 0.
compat_verdict() {
    local status=$1; shift
    if [[ $status == 0 ]]; then compat_pass; else compat_fail "$@"; fi
}

# compat_skip_one REASON: the next check cannot pass here for a known, documented reason (shown by the runner).
compat_skip_one() {
    tap_skip "$(compat_line)" "$1"
    COMPAT_NEXT=$((COMPAT_NEXT + 1))
}

compat_skip_rest() {
    COMPAT_PROGRAM_SKIPPED=$1
    while (( COMPAT_NEXT < ${#COMPAT_LINES[@]} )); do
        tap_skip "$(compat_line)" "$1"
        COMPAT_NEXT=$((COMPAT_NEXT + 1))
    done
}

compat_fail_rest() {
    local first=1
    while (( COMPAT_NEXT < ${#COMPAT_LINES[@]} )); do
        if (( first )); then compat_fail "$@"; first=0; else compat_fail "(not run: see the first failure)"; fi
    done
}

# compat_program_end: reports lines the check forgot (a bug in the check, never silently passing), stops the
# program's servers and records the outcome for docs/compatibility.md.
compat_program_end() {
    while (( COMPAT_NEXT < ${#COMPAT_LINES[@]} )); do compat_fail "the check ended without reporting this line"; done
    compat_watch_stop
    compat_stop_all
    local result version package=${COMPAT_VERSION_PACKAGE[$COMPAT_PROGRAM]:-}
    if [[ -n $COMPAT_PROGRAM_SKIPPED ]]; then result="skipped: $COMPAT_PROGRAM_SKIPPED"
    elif (( COMPAT_PROGRAM_FAILED )); then result=FAIL
    else result=PASS; fi
    version=$(dpkg-query -W -f='${Version}' "$package" 2>/dev/null || echo "?")
    local transport=kernel
    [[ $COMPAT_MODE == preload ]] && transport="rdmasock $COMPAT_TRANSPORT"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$COMPAT_PROGRAM" "$package" "$version" "$transport" "$result" \
        "$((SECONDS - COMPAT_PROGRAM_STARTED))" >> "$COMPAT_RESULTS"
    tap_diag "$COMPAT_PROGRAM: $result ($((SECONDS - COMPAT_PROGRAM_STARTED)) s)"
}

# compat_diag NAME...: the last lines of each named log (server logs, client outputs) and the library's
# warnings and errors, as diagnostics for a failed check.
compat_diag() {
    local name
    for name in "$@"; do
        [[ -f $COMPAT_DIR/$name ]] || continue
        echo "--- $name (last lines):"
        tail -n 8 "$COMPAT_DIR/$name" | cut -c1-300
    done
    if [[ -s ${COMPAT_LOG_FILE:-} ]]; then
        # Lines read "rdmasock[PID]: LEVEL: message"; warnings and errors first, then the latest of any level.
        echo "--- ${COMPAT_LOG_FILE##*/} (warnings and errors, last 6):"
        grep -E '^rdmasock\[[0-9]+\]: (WARN|ERROR):' "$COMPAT_LOG_FILE" | tail -n 6 | cut -c1-300
        echo "--- ${COMPAT_LOG_FILE##*/} (last 6 lines):"
        tail -n 6 "$COMPAT_LOG_FILE" | cut -c1-300
    fi
}

# ----------------------------------------------------------------------------------------------- processes

# compat_server NAME CMD...: starts a server under the wrapper, bounded by COMPAT_SERVER_TIMEOUT, in its own
# process group (timeout(1) makes one) so that stopping it ends its children too. Output: COMPAT_DIR/NAME.log
# (stdout) and NAME.err (stderr).
compat_server() {
    local name=$1; shift
    timeout -k 5 "$COMPAT_SERVER_TIMEOUT" "${COMPAT_WRAP[@]}" "$@" > "$COMPAT_DIR/$name.log" \
        2> "$COMPAT_DIR/$name.err" < /dev/null &
    COMPAT_SERVER[$name]=$!
    COMPAT_GROUPS+=($!)
}

# compat_forget_group PID: a server's group that has been reaped; the cleanup must not signal its number again
# (the kernel may have given it to an unrelated process by then).
compat_forget_group() {
    local kept=() group
    for group in "${COMPAT_GROUPS[@]}"; do [[ $group == "$1" ]] || kept+=("$group"); done
    COMPAT_GROUPS=("${kept[@]}")
}

# compat_wait_server NAME [SECONDS]: waits for a server that ends by itself (one-off servers); its exit status,
# or 124 when it is still running after SECONDS (it is left running: compat_program_end stops it).
compat_wait_server() {
    local name=$1 limit=${2:-30} group=${COMPAT_SERVER[$1]:-} start=$SECONDS
    [[ -n $group ]] || return 0
    while kill -0 "$group" 2>/dev/null; do
        (( SECONDS - start < limit )) || return 124
        sleep 0.1
    done
    wait "$group" 2>/dev/null
    local status=$?
    unset "COMPAT_SERVER[$name]"
    compat_forget_group "$group"
    return $status
}

compat_server_alive() { local g=${COMPAT_SERVER[$1]:-}; [[ -n $g ]] && kill -0 "$g" 2>/dev/null; }

# compat_wait_listen NAME PORT [SECONDS]: a listener on PORT exists (the both-mode listener keeps a kernel socket
# listening, so ss sees it in both runs); fails at once when the server died.
compat_wait_listen() {
    local name=$1 port=$2 limit=${3:-30} start=$SECONDS
    while (( SECONDS - start < limit )); do
        [[ -n $(ss -Hltn "sport = :$port" 2>/dev/null) ]] && return 0
        compat_server_alive "$name" || return 1
        sleep 0.1
    done
    return 1
}

# compat_stop NAME [SIGNAL] [SECONDS]: signals the program and waits for it; then ends its whole group.
# Returns the program's exit status as timeout(1) passes it on (128+N for a signal).
compat_stop() {
    local name=$1 signal=${2:-TERM} limit=${3:-15} group=${COMPAT_SERVER[$1]:-} pid status
    [[ -n $group ]] || return 0
    pid=$(pgrep -P "$group" | head -n 1)
    if [[ -n $pid ]]; then kill "-$signal" "$pid" 2>/dev/null; else kill "-$signal" "$group" 2>/dev/null; fi
    local start=$SECONDS
    while kill -0 "$group" 2>/dev/null && (( SECONDS - start < limit )); do sleep 0.1; done
    kill -KILL -- "-$group" 2>/dev/null
    wait "$group" 2>/dev/null
    status=$?
    unset "COMPAT_SERVER[$name]"
    compat_forget_group "$group"
    return $status
}

compat_stop_all() {
    local name
    for name in "${!COMPAT_SERVER[@]}"; do compat_stop "$name" TERM 10; done
}

# compat_run NAME CMD...: runs a client under the wrapper, bounded by COMPAT_CLIENT_TIMEOUT; stdout in
# COMPAT_DIR/NAME.out, stderr in NAME.err; stdin from COMPAT_STDIN (default /dev/null). Returns its status.
compat_run() {
    local name=$1; shift
    timeout -k 5 "$COMPAT_CLIENT_TIMEOUT" "${COMPAT_WRAP[@]}" "$@" > "$COMPAT_DIR/$name.out" \
        2> "$COMPAT_DIR/$name.err" < "${COMPAT_STDIN:-/dev/null}"
}

# compat_field NAME FILE: the first "NAME: NUMBER" in FILE (memaslap and memcstat print their counters so).
compat_field() { sed -n "s/^[[:space:]]*$1: *\([0-9][0-9]*\).*/\1/p" "$2" | head -n 1; }

compat_sha() { sha256sum "$1" | cut -d' ' -f1; }

# compat_random FILE MIB: a payload nobody could compress or guess.
compat_random() { head -c "$(($2 * 1048576))" /dev/urandom > "$1"; }

# ----------------------------------------------------------------------------------------------- evidence

# compat_watch_start: samples `rdmasock stat` (every live process using the library, all users: apache's
# children run as www-data) four times a second while a program runs, so short-lived connections and clients
# that exit are seen too. Preload mode only.
compat_watch_start() {
    compat_watch_stop
    [[ $COMPAT_MODE == preload ]] || return 0
    COMPAT_WATCH_FILE=$COMPAT_DIR/$COMPAT_PROGRAM.stat.jsonl
    : > "$COMPAT_WATCH_FILE"
    (
        trap - EXIT
        while :; do
            "$RS_TOOL" stat --all-users --json 2>/dev/null | jq -c . 2>/dev/null >> "$COMPAT_WATCH_FILE"
            sleep 0.1
        done
    ) &
    COMPAT_WATCH_PID=$!
}

compat_watch_stop() {
    [[ -n ${COMPAT_WATCH_PID:-} ]] || return 0
    kill "$COMPAT_WATCH_PID" 2>/dev/null
    wait "$COMPAT_WATCH_PID" 2>/dev/null
    COMPAT_WATCH_PID=
}

# The evidence, from every snapshot: connections (accepted or client TCP sockets) with the port at either end,
# each with the most telling path it was seen on, and the RDMA bytes of every process that had a socket there.
# shellcheck disable=SC2016
COMPAT_EVIDENCE_JQ='
  ($ports | split(",")) as $ps
  | def onport: . as $s | any($ps[]; . as $p | (($s.local // "") | endswith(":" + $p))
                                          or (($s.peer // "") | endswith(":" + $p)));
  [ .[] | .[]? | select(type == "object" and has("sockets")) ] as $procs
  | [ $procs[] | . as $proc | .sockets[]
      | select(.proto == "tcp" and (.role == "accepted" or .role == "client") and onport)
      | { key: "\($proc.pid)/\(.fd)/\(.role)/\(.local)/\(.peer)", pid: $proc.pid, program: $proc.program,
          fd, role, path, reason, local, peer, bytes: (.bytes_tx + .bytes_rx) } ]
  | group_by(.key)
  | map(. as $seen | ($seen | map(.path)) as $paths
        | $seen[-1] + { path: (if any($paths[]; . == "rdma") then "rdma"
                               elif any($paths[]; . == "fallback") then "fallback"
                               elif any($paths[]; . == "kernel") then "kernel" else $seen[-1].path end),
                        bytes: ($seen | map(.bytes) | max) })
  | . as $conns
  | ([ $procs[] | select(any(.sockets[]; onport)) | .pid ] | unique) as $pids
  | def per_process(f): [ $pids[] as $pid | [ $procs[] | select(.pid == $pid) | f ] | max ] | add // 0;
    per_process((.counters.rdma_bytes_tx.tcp // 0) + (.counters.rdma_bytes_rx.tcp // 0)) as $bytes
  | per_process(.counters.sockets_rdma.tcp // 0) as $sockets_rdma
  | per_process([ (.counters.fallbacks // {})[] ] | add // 0) as $fallbacks
  | def handed_back: .path == "kernel" and .reason == "HANDED_BACK";
    { rdma: [ $conns[] | select(.path == "rdma") ],
      other: [ $conns[] | select((.path == "kernel" or .path == "fallback") and (handed_back | not)) ],
      handed_back: [ $conns[] | select(handed_back) ],
      bytes: $bytes, sockets_rdma: $sockets_rdma, fallbacks: $fallbacks,
      fallback_reasons: ([ $procs[] | select(.pid as $p | any($pids[]; . == $p)) | (.counters.fallbacks // {})
                           | to_entries[] | "\(.key)" ] | unique),
      processes: [ $procs[] | select(.pid as $p | any($pids[]; . == $p)) | "\(.program)[\(.pid)]" ]
                                | unique }'

# compat_evidence PORTS MIN_BYTES: the program's evidence check (the next declared line). PORTS is a comma list.
# Looks at the processes that had a socket on those ports (listeners included) in any snapshot, and passes when
#   - their RDMA byte counters (rdma_bytes_tx + rdma_bytes_rx, tcp) add up to at least MIN_BYTES,
#   - at least one connection on the ports was seen with path rdma, or their sockets_rdma counters say so
#     (a connection that lived between two snapshots is only in the counters),
#   - no connection on the ports was seen on the kernel or fallen back, and their fallback counters are zero; a
#     connection handed back to kernel TCP because it crossed into another process (reason HANDED_BACK: it began
#     on RDMA, docs/interception.md "Processes") is counted apart, not as one on the kernel.
# Call it while the servers still run: a last snapshot is taken here.
compat_evidence() {
    local ports=$1 min=$2
    if [[ $COMPAT_MODE != preload ]]; then
        tap_skip "$(compat_line)" "control run on the kernel (COMPAT_MODE=kernel)"
        COMPAT_NEXT=$((COMPAT_NEXT + 1))
        return 0
    fi
    "$RS_TOOL" stat --all-users --json 2>/dev/null | jq -c . 2>/dev/null >> "$COMPAT_WATCH_FILE"
    compat_watch_stop
    local summary
    if ! summary=$(jq -s -c --arg ports "$ports" "$COMPAT_EVIDENCE_JQ" "$COMPAT_WATCH_FILE" 2>&1); then
        compat_fail "cannot read the rdmasock stat snapshots in ${COMPAT_WATCH_FILE##*/}: $summary"
        return 1
    fi
    echo "$summary" > "$COMPAT_DIR/$COMPAT_PROGRAM.evidence.json"
    local rdma other handed bytes sockets_rdma fallbacks processes reasons
    read -r rdma other handed bytes sockets_rdma fallbacks < <(jq -r \
        '"\(.rdma | length) \(.other | length) \(.handed_back | length) \(.bytes) \(.sockets_rdma) \(.fallbacks)"' \
        <<< "$summary")
    processes=$(jq -r '.processes | join(" ")' <<< "$summary")
    reasons=$(jq -r '.fallback_reasons | join(", ")' <<< "$summary")
    local sample
    sample=$(jq -r '(.rdma[:3] + .handed_back[:2] + .other[:5])[]
        | "  \(.program)[\(.pid)] fd \(.fd) \(.role) \(.local) -> \(.peer) path \(.path) reason \(.reason) bytes \(.bytes)"' \
        <<< "$summary")
    local what
    what="port(s) $ports: connections seen on rdma $rdma, on the kernel $other$( ((handed)) && echo ", handed back to kernel TCP after crossing into another process $handed"); processes' counters: sockets on rdma $sockets_rdma, fallbacks $fallbacks${reasons:+ ($reasons)}, $(numfmt --to=iec "$bytes")B over RDMA (need $(numfmt --to=iec "$min")B); processes: ${processes:-none}"
    if (( bytes >= min && (rdma >= 1 || sockets_rdma >= 1) && other == 0 && fallbacks == 0 )); then
        compat_pass
        tap_diag "$COMPAT_PROGRAM evidence: $what"
        [[ -n $sample ]] && tap_diag "$sample"
    else
        local snapshots
        snapshots=$(wc -l < "$COMPAT_WATCH_FILE")
        compat_fail "$what" "rdmasock stat snapshots taken: $snapshots (${COMPAT_WATCH_FILE##*/})" \
            "${sample:-no connection on the port appeared in any snapshot}" "$(compat_diag)"
    fi
}

# ----------------------------------------------------------------------------------------------- the checks
# One function per program. Each declares its lines, starts its servers, checks, asserts the evidence while the
# servers still run, and ends with compat_program_end (which stops whatever is left).

compat_check_iperf3() {
    local bytes=$((COMPAT_IPERF_MB * 1048576))
    # iperf3 3.12's receiver stops counting when the client's TEST_END arrives on the control connection, so the
    # bytes still queued in the receive buffers at that moment are sent but never counted (also on the kernel:
    # 61.7 of 64 MiB on loopback). The receiver's count must therefore lie in [N - slack, N]; the sender's must
    # be exactly N, and the two ends must agree on what the receiver counted.
    local slack=$(( bytes / 4 < 16777216 ? bytes / 4 : 16777216 ))
    compat_program iperf3 \
        "iperf3: client to server, $COMPAT_IPERF_MB MiB (-n): the sender counted every byte, the receiver all but what was queued at the end, both ends agree" \
        "iperf3: server to client (-R), $COMPAT_IPERF_MB MiB: the sender counted every byte, the receiver all but what was queued at the end, both ends agree" \
        "iperf3: its connections went through rdmasock (rdmasock stat: path rdma, RDMA byte counters)" \
        || { compat_program_end; return; }
    local port direction status test=0
    compat_port port
    compat_watch_start
    # One server for both tests: it stays up, so its statistics can be read after them (evidence).
    compat_server iperf3-server iperf3 -s -B "$COMPAT_ADDR" -p "$port" -J
    if ! compat_wait_listen iperf3-server "$port" 20; then
        compat_fail_rest "iperf3 -s did not listen on port $port" "$(compat_diag iperf3-server.log iperf3-server.err)"
        compat_program_end
        return
    fi
    for direction in forward reverse; do
        local client=iperf3-$direction-client flags=() server_json=$COMPAT_DATA/iperf3-server-$test.json
        if [[ $direction == reverse ]]; then flags=(-R); fi
        compat_run "$client" iperf3 -c "$COMPAT_ADDR" -p "$port" -n "$bytes" "${flags[@]}" -J
        status=$?
        # The server prints one JSON document per test, once the test is over.
        local start=$SECONDS
        while (( SECONDS - start < 15 )); do
            jq -s -e --argjson i "$test" 'length > $i' "$COMPAT_DIR/iperf3-server.log" >/dev/null 2>&1 && break
            sleep 0.2
        done
        jq -s --argjson i "$test" '.[$i] // {}' "$COMPAT_DIR/iperf3-server.log" > "$server_json" 2>/dev/null
        test=$((test + 1))
        local sent received received_seen_by_other
        if [[ $direction == forward ]]; then
            sent=$(jq -r '.end.sum_sent.bytes // "none"' "$COMPAT_DIR/$client.out" 2>/dev/null)
            received=$(jq -r '.end.sum_received.bytes // "none"' "$server_json" 2>/dev/null)
            received_seen_by_other=$(jq -r '.end.sum_received.bytes // "none"' "$COMPAT_DIR/$client.out" 2>/dev/null)
        else
            sent=$(jq -r '.end.sum_sent.bytes // "none"' "$server_json" 2>/dev/null)
            received=$(jq -r '.end.streams[0].receiver.bytes // "none"' "$COMPAT_DIR/$client.out" 2>/dev/null)
            received_seen_by_other=$(jq -r '.end.sum_received.bytes // "none"' "$COMPAT_DIR/$client.out" 2>/dev/null)
        fi
        # iperf3 tests -n after each write, so its sender may count one more block (128 KiB) than asked for.
        local block=131072
        [[ $status == 0 && $sent =~ ^[0-9]+$ && $sent -ge $bytes && $sent -le $((bytes + block)) &&
           $received =~ ^[0-9]+$ && $received -le $sent &&
           $received -ge $((bytes - slack)) && $received_seen_by_other == "$received" ]]
        compat_verdict $? "client exit $status; sender counted ${sent:-nothing} (want $bytes..$((bytes + block))), receiver ${received:-nothing} (want $((bytes - slack))..sent), the other end's copy of it ${received_seen_by_other:-nothing}" \
            "$(jq -r '.error // empty' "$COMPAT_DIR/$client.out" "$server_json" 2>/dev/null)" \
            "$(compat_diag "$client.err" iperf3-server.err)"
    done
    compat_evidence "$port" "$bytes"
    compat_program_end
}

compat_check_sockperf() {
    local seconds=$COMPAT_SOCKPERF_S variant
    local -A name_of=([s]=select [p]=poll [e]=epoll)
    local lines=()
    for variant in $COMPAT_SOCKPERF_VARIANTS; do
        lines+=("sockperf: ping-pong over 2 TCP connections with ${name_of[$variant]} (-F $variant), ${seconds} s, --data-integrity: every message answered, none dropped, duplicated or out of order")
        lines+=("sockperf: throughput over 2 TCP connections with ${name_of[$variant]} (-F $variant), ${seconds} s: the server handled every message the client sent whole")
    done
    lines+=("sockperf: its connections went through rdmasock (rdmasock stat: path rdma, RDMA byte counters)")
    compat_program sockperf "${lines[@]}" || { compat_program_end; return; }
    local port1 port2 feed=$COMPAT_DATA/sockperf.feed
    compat_port port1
    compat_port port2
    printf 'T:%s:%s\nT:%s:%s\n' "$COMPAT_ADDR" "$port1" "$COMPAT_ADDR" "$port2" > "$feed"
    compat_watch_start
    local mode status server client
    for variant in $COMPAT_SOCKPERF_VARIANTS; do
        for mode in ping-pong throughput; do
            server=sockperf-$variant-$mode-server client=sockperf-$variant-$mode-client
            compat_server "$server" sockperf server -f "$feed" -F "$variant"
            if ! compat_wait_listen "$server" "$port1" 20 || ! compat_wait_listen "$server" "$port2" 20; then
                compat_fail "sockperf server did not listen on ports $port1 and $port2" \
                    "$(compat_diag "$server.log" "$server.err")"
                compat_stop "$server" KILL 5
                continue
            fi
            if [[ $mode == ping-pong ]]; then
                compat_run "$client" sockperf ping-pong -f "$feed" -F "$variant" -t "$seconds" -m 64 --data-integrity
                status=$?
                compat_stop "$server" INT 10
                local out=$COMPAT_DIR/$client.out valid clean
                # sockperf prints a "[Valid Duration]" and a drop/duplicate/order line per server it reports; in
                # each, sent must equal received and every count must be zero.
                local reported valid clean
                reported=$(grep -c 'Valid Duration' "$out")
                valid=$(grep -c 'Valid Duration.*SentMessages=\([1-9][0-9]*\); ReceivedMessages=\1$' "$out")
                clean=$(grep -c 'dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0' "$out")
                [[ $status == 0 && $reported -ge 1 && $valid == "$reported" && $clean == "$reported" ]] &&
                    ! grep -qiE 'error|integrity.*fail' "$out" "$COMPAT_DIR/$client.err"
                compat_verdict $? "client exit $status; reports with sent = received: $valid of $reported; clean (no drop/dup/reorder): $clean of $reported" \
                    "$(grep -E 'Valid Duration|dropped|ERROR|rror' "$out" | head -n 6)" \
                    "$(compat_diag "$client.err" "$server.log" "$server.err")"
            else
                compat_run "$client" sockperf throughput -f "$feed" -F "$variant" -t "$seconds" -m 1024
                status=$?
                # Let the server drain what is in flight before asking it for its count.
                sleep 1
                compat_stop "$server" INT 10
                local sent handled
                sent=$(sed -n 's/.*Total of \([0-9]*\) messages sent.*/\1/p' "$COMPAT_DIR/$client.out" | tail -n 1)
                handled=$(sed -n 's/.*Total \([0-9]*\) messages received and handled.*/\1/p' "$COMPAT_DIR/$server.log" | tail -n 1)
                # The client's run timer may interrupt its last send half-way (seen on the kernel too): that one
                # message never arrives whole, so the server may handle one fewer.
                [[ $status == 0 && -n $sent && $sent -gt 0 && -n $handled &&
                   ( $handled == "$sent" || $handled == $((sent - 1)) ) ]]
                compat_verdict $? "client exit $status; client sent ${sent:-?} messages, server handled ${handled:-?} (want the same, or one fewer)" \
                    "$(compat_diag "$client.out" "$client.err" "$server.log" "$server.err")"
            fi
        done
    done
    compat_evidence "$port1,$port2" 1048576
    compat_program_end
}

compat_check_redis() {
    local n=$COMPAT_REDIS_N
    compat_program redis \
        "redis: redis-benchmark SET and GET, $n requests each over 8 connections: the server counted exactly $n of each (INFO commandstats)" \
        "redis: redis-cli SET of a random 1 MiB value, GET back: sha256 matches" \
        "redis: its connections went through rdmasock (rdmasock stat: path rdma, RDMA byte counters)" \
        || { compat_program_end; return; }
    local port status
    compat_port port
    compat_watch_start
    compat_server redis-server redis-server --port "$port" --bind "$COMPAT_ADDR" --save '' --appendonly no \
        --dir "$COMPAT_DATA" --protected-mode no --daemonize no
    if ! compat_wait_listen redis-server "$port" 20; then
        compat_fail_rest "redis-server did not listen on port $port" "$(compat_diag redis-server.log redis-server.err)"
        compat_program_end
        return
    fi
    local cli=(redis-cli -h "$COMPAT_ADDR" -p "$port")
    compat_run redis-benchmark redis-benchmark -h "$COMPAT_ADDR" -p "$port" -n "$n" -c 8 -t set,get -q
    status=$?
    compat_run redis-commandstats "${cli[@]}" info commandstats
    local sets gets
    sets=$(sed -n 's/^cmdstat_set:calls=\([0-9]*\),.*/\1/p' "$COMPAT_DIR/redis-commandstats.out")
    gets=$(sed -n 's/^cmdstat_get:calls=\([0-9]*\),.*/\1/p' "$COMPAT_DIR/redis-commandstats.out")
    [[ $status == 0 && $sets == "$n" && $gets == "$n" ]] &&
        tr '\r' '\n' < "$COMPAT_DIR/redis-benchmark.out" | grep -q '^ *GET: [0-9.]* requests per second'

    compat_verdict $? "redis-benchmark exit $status; the server counted ${sets:-?} SET and ${gets:-?} GET, expected $n each" \
        "$(tr '\r' '\n' < "$COMPAT_DIR/redis-benchmark.out" | grep -v '^ *$' | tail -n 4)" \
        "$(compat_diag redis-benchmark.err redis-commandstats.out redis-commandstats.err redis-server.log)"

    local value=$COMPAT_DATA/redis.value got=$COMPAT_DATA/redis.got
    compat_random "$value" 1
    COMPAT_STDIN=$value compat_run redis-set "${cli[@]}" -x set compat:value
    local set_status=$?
    compat_run redis-get "${cli[@]}" --raw get compat:value
    status=$?
    # --raw prints the value and one newline.
    head -c 1048576 "$COMPAT_DIR/redis-get.out" > "$got"
    [[ $set_status == 0 && $status == 0 && $(cat "$COMPAT_DIR/redis-set.out") == OK &&
       $(stat -c %s "$COMPAT_DIR/redis-get.out") == 1048577 && $(compat_sha "$got") == "$(compat_sha "$value")" ]]
    compat_verdict $? "SET exit $set_status ($(head -c 100 "$COMPAT_DIR/redis-set.out")), GET exit $status, $(stat -c %s "$COMPAT_DIR/redis-get.out") bytes back (want 1048577)" \
        "sent sha256 $(compat_sha "$value"), got $(compat_sha "$got")" "$(compat_diag redis-set.err redis-get.err redis-server.log)"
    rm -f "$COMPAT_DIR/redis-get.out"
    compat_evidence "$port" $((2 * 1048576))
    compat_program_end
}

compat_check_memcached() {
    local n=$COMPAT_MEMC_N
    compat_program memcached \
        "memcached: memaslap (memcaslap) $n operations, 8 connections, every get verified: no miss, no verify failure; the server counted the same gets and sets" \
        "memcached: memccp then memccat of a random 512 KiB file: sha256 matches" \
        "memcached: its connections went through rdmasock (rdmasock stat: path rdma, RDMA byte counters)" \
        || { compat_program_end; return; }
    local port status
    compat_port port
    compat_watch_start
    compat_server memcached memcached -l "$COMPAT_ADDR" -p "$port" -U 0 -m 64 -t 2 -u root
    if ! compat_wait_listen memcached "$port" 20; then
        compat_fail_rest "memcached did not listen on port $port" "$(compat_diag memcached.log memcached.err)"
        compat_program_end
        return
    fi
    compat_run memaslap memcaslap -s "$COMPAT_ADDR:$port" -T 2 -c 8 -x "$n" -X 512 --verify=1.0
    status=$?
    compat_run memcstat memcstat --servers="$COMPAT_ADDR:$port"
    local out=$COMPAT_DIR/memaslap.out
    local gets sets misses vmiss vfail ops server_gets server_sets
    gets=$(compat_field cmd_get "$out") sets=$(compat_field cmd_set "$out") misses=$(compat_field get_misses "$out")
    vmiss=$(compat_field verify_misses "$out") vfail=$(compat_field verify_failed "$out")
    ops=$(sed -n 's/.*Ops: \([0-9]*\) .*/\1/p' "$out" | tail -n 1)
    server_gets=$(compat_field cmd_get "$COMPAT_DIR/memcstat.out") server_sets=$(compat_field cmd_set "$COMPAT_DIR/memcstat.out")
    [[ $status == 0 && $ops == "$n" && $misses == 0 && $vmiss == 0 && $vfail == 0 && -n $gets && $gets -gt 0 &&
       $server_gets == "$gets" && $server_sets == "$sets" ]]
    compat_verdict $? "memaslap exit $status: ops ${ops:-?} (want $n), gets ${gets:-?}, sets ${sets:-?}, misses ${misses:-?}, verify misses ${vmiss:-?}, verify failures ${vfail:-?}; server: gets ${server_gets:-?}, sets ${server_sets:-?}" \
        "$(compat_diag memaslap.err memcstat.err memcached.err)"

    local file=$COMPAT_DATA/memc.bin got=$COMPAT_DATA/memc.got
    head -c 524288 /dev/urandom > "$file"
    compat_run memccp memccp --servers="$COMPAT_ADDR:$port" "$file"
    local cp_status=$?
    compat_run memccat memccat --servers="$COMPAT_ADDR:$port" "${file##*/}"
    status=$?
    head -c 524288 "$COMPAT_DIR/memccat.out" > "$got"
    [[ $cp_status == 0 && $status == 0 && $(compat_sha "$got") == "$(compat_sha "$file")" ]]
    compat_verdict $? "memccp exit $cp_status, memccat exit $status, $(stat -c %s "$COMPAT_DIR/memccat.out") bytes back" \
        "sent sha256 $(compat_sha "$file"), got $(compat_sha "$got")" "$(compat_diag memccp.err memccat.err memcached.err)"
    rm -f "$COMPAT_DIR/memccat.out"
    compat_evidence "$port" $((2 * 524288))
    compat_program_end
}

# compat_web_root: the files the web servers serve: a 4 KiB page for load generators, a random COMPAT_HTTP_MB file
# for checksummed fetches, an upload folder.
compat_web_root() {
    local root=$COMPAT_DATA/www
    [[ -d $root ]] && { echo "$root"; return; }
    mkdir -p "$root/upload"
    head -c 4096 /dev/urandom | base64 -w 64 | head -c 4096 > "$root/page.html"
    compat_random "$root/big.bin" "$COMPAT_HTTP_MB"
    chmod -R a+rX "$root"
    chmod 0777 "$root/upload"
    echo "$root"
}

# compat_nginx_start NAME PORT: an nginx of its own (foreground master, 2 workers, sendfile, WebDAV PUT).
compat_nginx_start() {
    local name=$1 port=$2 root prefix
    root=$(compat_web_root)
    prefix=$COMPAT_DATA/$name
    mkdir -p "$prefix"
    cat > "$prefix/nginx.conf" <<CONF
daemon off;
master_process on;
worker_processes 2;
user root;
pid $prefix/nginx.pid;
error_log $COMPAT_DIR/$name.error.log warn;
events { worker_connections 256; }
http {
    log_format compat '\$status \$body_bytes_sent "\$request"';
    access_log $COMPAT_DIR/$name.access.log compat;
    client_body_temp_path $prefix/body;
    proxy_temp_path $prefix/proxy;
    fastcgi_temp_path $prefix/fastcgi;
    uwsgi_temp_path $prefix/uwsgi;
    scgi_temp_path $prefix/scgi;
    sendfile on;
    keepalive_requests 1000000;
    server {
        listen $COMPAT_ADDR:$port;
        root $root;
        location /upload/ {
            dav_methods PUT;
            client_max_body_size 1g;
        }
    }
}
CONF
    compat_server "$name" "$(compat_bin nginx)" -p "$prefix" -e "$COMPAT_DIR/$name.error.log" -c "$prefix/nginx.conf"
}

# compat_fetch NAME URL FILE: curl (under the wrapper) fetches URL; pass when the sha256 equals FILE's.
compat_fetch() {
    local name=$1 url=$2 file=$3 status
    compat_run "$name" curl -sS --fail --max-time 60 -o "$COMPAT_DATA/$name.got" -w '%{http_code} %{size_download}\n' "$url"
    status=$?
    [[ $status == 0 && $(compat_sha "$COMPAT_DATA/$name.got" 2>/dev/null) == "$(compat_sha "$file")" ]]
    compat_verdict $? "curl exit $status, $(cat "$COMPAT_DIR/$name.out" 2>/dev/null) (code, bytes); want $(stat -c %s "$file") bytes with sha256 $(compat_sha "$file")" \
        "$(compat_diag "$name.err")"
    rm -f "$COMPAT_DATA/$name.got"
}

compat_check_nginx() {
    compat_program nginx \
        "nginx: wrk, 2 threads x 8 connections for 3 s: no socket error, every response a 200 with the whole 4 KiB page (access log)" \
        "nginx: curl fetches a random $COMPAT_HTTP_MB MiB file (sendfile on): sha256 matches" \
        "nginx: its connections went through rdmasock (rdmasock stat: path rdma, RDMA byte counters)" \
        || { compat_program_end; return; }
    local port status root
    compat_port port
    root=$(compat_web_root)
    compat_watch_start
    compat_nginx_start nginx "$port"
    if ! compat_wait_listen nginx "$port" 20; then
        compat_fail_rest "nginx did not listen on port $port" "$(compat_diag nginx.err nginx.error.log)"
        compat_program_end
        return
    fi
    compat_run wrk wrk -t 2 -c 8 -d 3s "http://$COMPAT_ADDR:$port/page.html"
    status=$?
    local requests not_ok whole
    requests=$(sed -n 's/^ *\([0-9][0-9]*\) requests in .*/\1/p' "$COMPAT_DIR/wrk.out")
    not_ok=$(grep -vc '^200 ' "$COMPAT_DIR/nginx.access.log" 2>/dev/null)
    whole=$(grep -c '^200 4096 "GET /page.html' "$COMPAT_DIR/nginx.access.log" 2>/dev/null)
    # wrk counts the responses it completed; nginx also logs the few that were in flight when wrk stopped (200,
    # cut short), so the log holds at least wrk's count of whole pages.
    [[ $status == 0 && -n $requests && $requests -gt 0 && $not_ok == 0 && $whole -ge $requests ]] &&
        ! grep -qE 'Socket errors|Non-2xx' "$COMPAT_DIR/wrk.out"
    compat_verdict $? "wrk exit $status: ${requests:-?} requests; nginx logged $whole whole pages with 200 and $not_ok other statuses" \
        "$(grep -E 'requests in|Socket errors|Non-2xx' "$COMPAT_DIR/wrk.out")" "$(compat_diag wrk.err nginx.error.log)"
    compat_fetch nginx-curl "http://$COMPAT_ADDR:$port/big.bin" "$root/big.bin"
    compat_evidence "$port" $((COMPAT_HTTP_MB * 1048576))
    compat_program_end
}

compat_check_curl() {
    compat_program curl \
        "curl: PUT of a random 8 MiB file to nginx (WebDAV): the server's stored copy matches (sha256)" \
        "curl: one curl fetching 2 files over one keep-alive connection: both sha256 match, one connection made" \
        "curl: its connections went through rdmasock (rdmasock stat: path rdma, RDMA byte counters)" \
        || { compat_program_end; return; }
    local port status root
    compat_port port
    root=$(compat_web_root)
    compat_watch_start
    compat_nginx_start curl-nginx "$port"
    if ! compat_wait_listen curl-nginx "$port" 20; then
        compat_fail_rest "nginx did not listen on port $port" "$(compat_diag curl-nginx.err curl-nginx.error.log)"
        compat_program_end
        return
    fi
    local upload=$COMPAT_DATA/upload.bin
    compat_random "$upload" 8
    compat_run curl-put curl -sS --fail --max-time 60 -T "$upload" -w '%{http_code}\n' "http://$COMPAT_ADDR:$port/upload/up.bin"
    status=$?
    [[ $status == 0 && $(compat_sha "$root/upload/up.bin" 2>/dev/null) == "$(compat_sha "$upload")" ]]
    compat_verdict $? "curl exit $status, HTTP $(cat "$COMPAT_DIR/curl-put.out"); stored $(stat -c %s "$root/upload/up.bin" 2>/dev/null || echo no) bytes" \
        "$(compat_diag curl-put.err curl-nginx.error.log)"
    compat_run curl-two curl -sS --fail --max-time 60 -w '%{num_connects} %{size_download}\n' \
        -o "$COMPAT_DATA/two.1" "http://$COMPAT_ADDR:$port/big.bin" -o "$COMPAT_DATA/two.2" "http://$COMPAT_ADDR:$port/upload/up.bin"
    status=$?
    local connects
    connects=$(awk '{ n += $1 } END { print n + 0 }' "$COMPAT_DIR/curl-two.out")
    [[ $status == 0 && $connects == 1 && $(compat_sha "$COMPAT_DATA/two.1" 2>/dev/null) == "$(compat_sha "$root/big.bin")" &&
       $(compat_sha "$COMPAT_DATA/two.2" 2>/dev/null) == "$(compat_sha "$upload")" ]]
    compat_verdict $? "curl exit $status; connections made: $connects (want 1); per transfer (connects, bytes): $(tr '\n' ' ' < "$COMPAT_DIR/curl-two.out")" \
        "$(compat_diag curl-two.err curl-nginx.error.log)"
    rm -f "$COMPAT_DATA/two.1" "$COMPAT_DATA/two.2"
    compat_evidence "$port" $((16 * 1048576))
    compat_program_end
}

# compat_apache_start NAME MPM PORT: a private apache2 (own config, pid, logs and mutexes under the scratch
# folders; the master runs as root, its children as www-data), in the foreground.
compat_apache_start() {
    local name=$1 mpm=$2 port=$3 root dir modules=/usr/lib/apache2/modules mpm_conf
    root=$(compat_web_root)
    dir=$COMPAT_DATA/$name
    mkdir -p "$dir"
    chmod 0755 "$dir"
    # Prefork keeps its idle children (MaxSpareServers = MaxRequestWorkers): a child reaped between two of the
    # watcher's snapshots takes its byte counters with it (CI: the child that served the 4 MiB file, seen at
    # 1.5 MiB, was gone by the next snapshot, and the evidence counted 3.3 of 4 MiB).
    if [[ $mpm == prefork ]]; then
        mpm_conf="StartServers 2
MinSpareServers 2
MaxSpareServers 16
MaxRequestWorkers 16"
    else
        mpm_conf="StartServers 2
ServerLimit 2
ThreadsPerChild 8
MaxRequestWorkers 16
MinSpareThreads 4
MaxSpareThreads 16"
    fi
    cat > "$dir/httpd.conf" <<CONF
ServerRoot "$dir"
ServerName localhost
Listen $COMPAT_ADDR:$port
PidFile "$dir/httpd.pid"
DefaultRuntimeDir "$dir"
Mutex file:$dir default
ErrorLog "$COMPAT_DIR/$name.error.log"
LogLevel warn
LoadModule mpm_${mpm}_module $modules/mod_mpm_${mpm}.so
LoadModule authz_core_module $modules/mod_authz_core.so
User www-data
Group www-data
$mpm_conf
KeepAlive On
# ab leaves up to -c minus one connections it never writes to at the end of a run: a child spends 5 s on each,
# not the default 60 (the check prefork_family in tools/vm/jobs/compat_verbs.sh relies on 5 s too).
Timeout 5
DocumentRoot "$root"
<Directory "$root">
    Require all granted
</Directory>
LogFormat "%>s %B \"%r\"" compat
CustomLog "$COMPAT_DIR/$name.access.log" compat
CONF
    # Apache's children drop root (www-data): on verbs their receive rings are locked memory, so the operator
    # raises RLIMIT_MEMLOCK for them as docs/interception.md says (the default 8 MiB lasts a few connections).
    # (Where the hard limit cannot be raised, e.g. in a container without CAP_SYS_RESOURCE, it stays as it is.)
    compat_server "$name" sh -c 'ulimit -l unlimited 2>/dev/null; exec "$0" "$@"' \
        "$(compat_bin apache2)" -f "$dir/httpd.conf" -DFOREGROUND
}

compat_check_apache() {
    local mpm=$1 n=$COMPAT_AB_N
    compat_program "apache2-$mpm" \
        "apache2 ($mpm MPM): ab -n $n -c 4 (a connection per request): $n complete, none failed, $n responses of 200 with the whole page in the access log" \
        "apache2 ($mpm MPM): curl fetches a random $COMPAT_HTTP_MB MiB file: sha256 matches" \
        "apache2 ($mpm MPM): its connections went through rdmasock (rdmasock stat: path rdma, RDMA byte counters)" \
        || { compat_program_end; return; }
    local port status root name=apache2-$mpm
    compat_port port
    root=$(compat_web_root)
    compat_watch_start
    compat_apache_start "$name" "$mpm" "$port"
    if ! compat_wait_listen "$name" "$port" 20; then
        compat_fail_rest "apache2 did not listen on port $port" "$(compat_diag "$name.err" "$name.error.log")"
        compat_program_end
        return
    fi
    compat_run "$name-ab" ab -n "$n" -c 4 "http://$COMPAT_ADDR:$port/page.html"
    status=$?
    local complete failed whole
    complete=$(sed -n 's/^Complete requests: *\([0-9]*\)/\1/p' "$COMPAT_DIR/$name-ab.out")
    failed=$(sed -n 's/^Failed requests: *\([0-9]*\)/\1/p' "$COMPAT_DIR/$name-ab.out")
    whole=$(grep -c '^200 4096 "GET /page.html' "$COMPAT_DIR/$name.access.log" 2>/dev/null)
    [[ $status == 0 && $complete == "$n" && $failed == 0 && $whole == "$n" ]] && ! grep -q 'Non-2xx' "$COMPAT_DIR/$name-ab.out"
    compat_verdict $? "ab exit $status: complete ${complete:-?}, failed ${failed:-?}; access log: $whole responses of 200 with 4096 bytes (want $n)" \
        "$(compat_diag "$name-ab.err" "$name.error.log")"
    compat_fetch "$name-curl" "http://$COMPAT_ADDR:$port/big.bin" "$root/big.bin"
    compat_evidence "$port" $((COMPAT_HTTP_MB * 1048576))
    compat_program_end
}

compat_check_apache2_prefork() { compat_check_apache prefork; }
compat_check_apache2_event() { compat_check_apache event; }

compat_check_mariadb() {
    local n=$COMPAT_SLAP_N
    compat_program mariadb \
        "mariadb: mysqlslap, 4 clients, $n INSERTs over TCP: the table then holds exactly $n rows" \
        "mariadb: a random 256 KiB BLOB written and read back over TCP: sha256 matches (the client's copy and SHA2() in the server)" \
        "mariadb: its connections went through rdmasock (rdmasock stat: path rdma, RDMA byte counters)" \
        || { compat_program_end; return; }
    local port status dir=$COMPAT_DATA/mariadb
    compat_port port
    mkdir -p "$dir"
    # The data folder is made offline (no network), so it runs without the wrapper.
    if ! timeout 120 mariadb-install-db --no-defaults --datadir="$dir/data" --user=root \
            --auth-root-authentication-method=normal --skip-test-db > "$COMPAT_DIR/mariadb-install-db.log" 2>&1; then
        compat_fail_rest "mariadb-install-db failed" "$(tail -n 10 "$COMPAT_DIR/mariadb-install-db.log")"
        compat_program_end
        return
    fi
    # root is root@localhost, which a TCP client from an address other than 127.0.0.1 (the VM's 198.18.0.1) is
    # not: the server makes a user for any host when it starts.
    printf "CREATE USER IF NOT EXISTS 'compat'@'%%' IDENTIFIED BY 'compat';\nGRANT ALL ON *.* TO 'compat'@'%%';\n" \
        > "$dir/init.sql"
    compat_watch_start
    # Clients use --protocol=TCP; the server's unix socket (it always has one) is a private path nobody uses.
    compat_server mariadbd "$(compat_bin mariadbd)" --no-defaults --datadir="$dir/data" --user=root --port="$port" \
        --bind-address="$COMPAT_ADDR" --socket="$dir/unused.sock" --pid-file="$dir/mariadbd.pid" --skip-name-resolve \
        --skip-log-bin --innodb-buffer-pool-size=32M --init-file="$dir/init.sql" \
        --log-error="$COMPAT_DIR/mariadbd.error.log"
    if ! compat_wait_listen mariadbd "$port" 60; then
        compat_fail_rest "mariadbd did not listen on port $port" "$(compat_diag mariadbd.err mariadbd.error.log)"
        compat_program_end
        return
    fi
    local sql_client=(--no-defaults --protocol=TCP -h "$COMPAT_ADDR" -P "$port" -ucompat -pcompat)
    compat_run mysqlslap mysqlslap "${sql_client[@]}" --concurrency=4 --iterations=1 --number-of-queries="$n" \
        --create-schema=slap --no-drop --create="CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, v CHAR(64))" \
        --query="INSERT INTO t (v) VALUES (SHA2(RAND(), 256))"
    status=$?
    compat_run mariadb-count mariadb "${sql_client[@]}" -N -B -e 'SELECT COUNT(*) FROM slap.t'
    local rows
    rows=$(cat "$COMPAT_DIR/mariadb-count.out")
    [[ $status == 0 && $rows == "$n" ]]
    compat_verdict $? "mysqlslap exit $status; rows in slap.t: ${rows:-?} (want $n)" \
        "$(compat_diag mysqlslap.out mysqlslap.err mariadb-count.err mariadbd.error.log)"

    local blob=$COMPAT_DATA/blob.bin sql=$COMPAT_DATA/blob.sql got=$COMPAT_DATA/blob.got
    head -c 262144 /dev/urandom > "$blob"
    { echo "CREATE TABLE slap.blobs (id INT PRIMARY KEY, data LONGBLOB); INSERT INTO slap.blobs VALUES (1, FROM_BASE64('"
      base64 -w 0 "$blob"; echo "'));"; } > "$sql"
    COMPAT_STDIN=$sql compat_run mariadb-insert mariadb "${sql_client[@]}"
    local insert_status=$?
    compat_run mariadb-sha mariadb "${sql_client[@]}" -N -B -r -e 'SELECT SHA2(data, 256), LENGTH(data) FROM slap.blobs'
    compat_run mariadb-read mariadb "${sql_client[@]}" -N -B -r -e 'SELECT TO_BASE64(data) FROM slap.blobs'
    status=$?
    base64 -d "$COMPAT_DIR/mariadb-read.out" > "$got" 2>/dev/null
    local want server_sha
    want=$(compat_sha "$blob")
    server_sha=$(cut -f1 "$COMPAT_DIR/mariadb-sha.out")
    [[ $insert_status == 0 && $status == 0 && $(compat_sha "$got") == "$want" && $server_sha == "$want" ]]
    compat_verdict $? "insert exit $insert_status, read exit $status; sha256 sent $want, server SHA2 ${server_sha:-?}, read back $(compat_sha "$got")" \
        "$(compat_diag mariadb-insert.err mariadb-read.err mariadbd.error.log)"
    compat_evidence "$port" 262144
    compat_program_end
}

compat_check_socat() {
    local mib=$COMPAT_SOCAT_MB echo_mib=$(( (COMPAT_SOCAT_MB + 3) / 4 ))
    compat_program socat \
        "socat: one-way TCP pipe of a random $mib MiB file: sha256 matches" \
        "socat: echo through a forked child (TCP-LISTEN fork, EXEC:cat), $echo_mib MiB both ways: sha256 matches" \
        "socat: its connections went through rdmasock (rdmasock stat: path rdma, RDMA byte counters)" \
        || { compat_program_end; return; }
    local port1 port2 status
    compat_port port1
    compat_port port2
    compat_watch_start
    local in=$COMPAT_DATA/socat.in out=$COMPAT_DATA/socat.out
    compat_random "$in" "$mib"
    compat_server socat-sink socat -u "TCP-LISTEN:$port1,bind=$COMPAT_ADDR,reuseaddr" "CREATE:$out"
    if compat_wait_listen socat-sink "$port1" 20; then
        # The source holds the connection open for a second after the file, so that the stat watcher (every
        # 0.1 s) sees both processes' RDMA counters: the 64 MiB alone can pass in less than 50 ms, and a process's
        # statistics go with it (with the adaptive spin the evidence missed the transfer in a CI run).
        compat_run socat-source socat -u "SYSTEM:cat $in; sleep 1" "TCP:$COMPAT_ADDR:$port1"
        status=$?
        compat_wait_server socat-sink 30
        local sink_status=$?
        [[ $status == 0 && $sink_status == 0 && $(compat_sha "$out") == "$(compat_sha "$in")" ]]
        compat_verdict $? "sender exit $status, receiver exit $sink_status; received $(stat -c %s "$out" 2>/dev/null || echo no) of $((mib * 1048576)) bytes" \
            "$(compat_diag socat-source.err socat-sink.err)"
    else
        compat_fail "socat did not listen on port $port1" "$(compat_diag socat-sink.err)"
    fi
    rm -f "$out"
    local echo_in=$COMPAT_DATA/echo.in
    compat_random "$echo_in" "$echo_mib"
    # A fork-per-connection server hands the accepted connection to a child. Under the preload the connection is
    # accepted over RDMA by the parent, which forks and closes its copy; the child's first use claims it and it
    # continues on kernel TCP with no byte lost (docs/interception.md, "Processes").
    compat_server socat-echo socat "TCP-LISTEN:$port2,bind=$COMPAT_ADDR,reuseaddr,fork" EXEC:cat
    if compat_wait_listen socat-echo "$port2" 20; then
        # -t: after its input ends, wait up to 30 s for the echo to finish instead of socat's default 0.5 s.
        COMPAT_STDIN=$echo_in compat_run socat-echo-client socat -t 30 -b 65536 - "TCP:$COMPAT_ADDR:$port2"
        status=$?
        [[ $status == 0 && $(compat_sha "$COMPAT_DIR/socat-echo-client.out") == "$(compat_sha "$echo_in")" ]]
        compat_verdict $? "client exit $status; echoed $(stat -c %s "$COMPAT_DIR/socat-echo-client.out") of $((echo_mib * 1048576)) bytes" \
            "$(compat_diag socat-echo-client.err socat-echo.err)"
    else
        compat_fail "socat did not listen on port $port2" "$(compat_diag socat-echo.err)"
    fi
    rm -f "$COMPAT_DIR/socat-echo-client.out"
    # Both ends of the one-way pipe exit when it is done, and a process's statistics go with it: only the
    # snapshots taken while they live see its bytes, so the floor is 1 MiB rather than the whole payload.
    compat_evidence "$port1,$port2" 1048576
    compat_program_end
}

# compat_java_classes: compiles the helper once per build (javac runs without the wrapper: it is not a subject).
compat_java_classes() {
    local src=$RS_TOP/tests/helpers/java/CompatEcho.java out=${COMPAT_JAVA_CLASSES:-$RS_BUILD/java}
    if [[ ! -f $out/CompatEcho.class || $src -nt $out/CompatEcho.class ]]; then
        mkdir -p "$out" && javac -d "$out" "$src" > "$COMPAT_DIR/javac.log" 2>&1 || return 1
    fi
    echo "$out"
}

# compat_jvm_crash NAME...: the head of each fatal error report those JVMs wrote (signal, frame, thread).
compat_jvm_crash() {
    local name report
    for name in "$@"; do
        for report in "$COMPAT_DIR/$name".hs_err_*.log; do
            [[ -f $report ]] || continue
            echo "--- ${report##*/} (head):"
            grep -v '^#\s*$' "$report" | head -n 40 | cut -c1-300
        done
    done
}

compat_check_java() {
    local mib=$COMPAT_JAVA_MB conns=4
    compat_program java \
        "java: blocking sockets (ServerSocket, a thread per connection), $conns connections x $mib MiB echoed: length and sha256 of each match, the server echoed every byte" \
        "java: NIO selector server and client (nonblocking connect), $conns connections x $mib MiB echoed: length and sha256 of each match, the server echoed every byte" \
        "java: its connections went through rdmasock (rdmasock stat: path rdma, RDMA byte counters)" \
        || { compat_program_end; return; }
    local classes
    if ! classes=$(compat_java_classes); then
        compat_fail_rest "javac failed" "$(tail -n 10 "$COMPAT_DIR/javac.log")"
        compat_program_end
        return
    fi
    local port1 port2 kind port status bytes=$((mib * 1048576)) pin=()
    # COMPAT_JAVA_CPUS: run each JVM on these CPUs only (taskset). The soft-RoCE VM sets it: under QEMU's
    # multi-threaded TCG a JIT that patches code one vCPU may be executing (HotSpot making a compiled method not
    # entrant) can crash the JVM, with or without rdmasock (docs/compatibility.md, "Java in the VM").
    [[ -n ${COMPAT_JAVA_CPUS:-} ]] && pin=(taskset -c "$COMPAT_JAVA_CPUS")
    compat_port port1
    compat_port port2
    compat_watch_start
    for kind in blocking nio; do
        if [[ $kind == blocking ]]; then port=$port1; else port=$port2; fi
        local server=java-$kind-server client=java-$kind-client
        # A JVM's fatal error report goes next to the logs (its default, the process's cwd or /tmp, is lost in a VM).
        compat_server "$server" "${pin[@]}" java -Xmx256m -XX:ErrorFile="$COMPAT_DIR/$server.hs_err_%p.log" -cp "$classes" \
            CompatEcho server "$kind" "$COMPAT_ADDR" "$port"
        if ! compat_wait_listen "$server" "$port" 60; then
            compat_fail "the Java $kind server did not listen on port $port" "$(compat_diag "$server.log" "$server.err")"
            continue
        fi
        compat_run "$client" "${pin[@]}" java -Xmx256m -XX:ErrorFile="$COMPAT_DIR/$client.hs_err_%p.log" -cp "$classes" \
            CompatEcho client "$kind" "$COMPAT_ADDR" "$port" "$conns" "$bytes" "$RANDOM"
        status=$?
        # The server reports each connection once its echo is flushed and closed.
        local echoed start=$SECONDS
        while :; do
            echoed=$(awk '/^conn [0-9]+: echoed [0-9]+ bytes$/ { n += $4 } END { print n + 0 }' "$COMPAT_DIR/$server.log")
            (( echoed >= conns * bytes || SECONDS - start > 10 )) && break
            sleep 0.2
        done
        [[ $status == 0 && $echoed == $((conns * bytes)) ]] && grep -q "^all $conns connections verified" "$COMPAT_DIR/$client.out"
        compat_verdict $? "client exit $status; server echoed $echoed of $((conns * bytes)) bytes" \
            "$(compat_diag "$client.out" "$client.err" "$server.log" "$server.err"; compat_jvm_crash "$client" "$server")"
    done
    compat_evidence "$port1,$port2" "$bytes"
    compat_program_end
}

# compat_run_matrix [PROGRAM...]: the given programs (default: every one, in the order of compat_programs).
compat_run_matrix() {
    local program list=("$@")
    (( ${#list[@]} )) || read -ra list <<< "$(compat_programs)"
    for program in "${list[@]}"; do
        [[ -n ${COMPAT_BINS[$program]+x} ]] || { tap_fail "compat: $program is a program of the matrix" "known: $(compat_programs)"; continue; }
        "compat_check_${program//-/_}"
    done
}

# compat_table: the results as the markdown rows of docs/compatibility.md, also kept in COMPAT_DIR.
compat_table() {
    local date
    date=$(date -u +%Y-%m-%d)
    {
        echo "| program | package version | transport | result | date |"
        echo "|---|---|---|---|---|"
        awk -F'\t' -v date="$date" '{ printf "| %s | %s %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, date }' "$COMPAT_RESULTS"
    } > "$COMPAT_DIR/compatibility-table.md"
    cat "$COMPAT_DIR/compatibility-table.md"
}
