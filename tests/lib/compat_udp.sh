# shellcheck shell=bash
# The UDP compatibility matrix (issue 7 item 4), shared by tests/suites/compat_udp.sh (software RNIC on the host)
# and tools/vm/jobs/compat_udp_verbs.sh (verbs on soft-RoCE in the VM). Sourced after tests/lib/tap.sh and
# tests/lib/compat.sh, whose TAP-line bookkeeping (compat_program, compat_pass/fail/skip, compat_program_end,
# compat_table) and process helpers (compat_server, compat_run, compat_stop, compat_wait_server) it reuses.
#
# Each program runs once per datagram method (COMPAT_UDP_MODES, default "sendrecv wrecord"): every UDP port it
# uses, clients' included (they bind fixed ports so a rule can name them: for UDP a rule's address is always the
# peer's), gets a rule `use both udp any ADDR:PORT dgram=MODE`. `both`: while a peer is being discovered its first
# datagrams go through the kernel (nothing is lost or waits), as a deployment would run it. Per mode, the data
# checks of the program, then its evidence check:
#   - every UDP socket on its ports that `rdmasock stat` saw is on path rdma (the datagram layer adopted it);
#   - the RDMA counters of the processes that had those sockets (rdma_bytes_tx.udp + rdma_bytes_rx.udp, which
#     count only datagrams that really went over RDMA, never the kernel fallback) reached at least the payload,
#     and their rdma message counters moved.
# COMPAT_MODE=kernel runs the same commands without the wrapper: the control (evidence checks skipped).
#
# Environment (all optional; the rest as in tests/lib/compat.sh):
#   COMPAT_UDP_MODES ("sendrecv wrecord")      COMPAT_UDP_ONLY  programs to run (default: compat_udp_programs)
#   COMPAT_UDP_LOSS_PCT (1)   datagrams a receiver may miss, in percent, where UDP may lose them (iperf3 -u,
#                             sockperf throughput): the kernel drops too when a loaded machine starves the reader
#   sizes: COMPAT_UDP_IPERF_MB (8) COMPAT_UDP_IPERF_RATE (20M) COMPAT_UDP_SOCAT_MB (4) COMPAT_UDP_SIPP_CALLS (100)
#          COMPAT_UDP_SIPP_RATE (50) COMPAT_UDP_FFMPEG_S (4) COMPAT_UDP_SOCKPERF_S (2) COMPAT_UDP_SOCKPERF_MPS (5000)
#          COMPAT_UDP_FFMPEG_IDLE_S (8): the receiving ffmpeg's input timeout, which also runs before the first datagram

COMPAT_UDP_MODES=${COMPAT_UDP_MODES:-sendrecv wrecord}
COMPAT_UDP_LOSS_PCT=${COMPAT_UDP_LOSS_PCT:-1}
COMPAT_UDP_IPERF_MB=${COMPAT_UDP_IPERF_MB:-8}
COMPAT_UDP_IPERF_RATE=${COMPAT_UDP_IPERF_RATE:-20M}
COMPAT_UDP_SOCAT_MB=${COMPAT_UDP_SOCAT_MB:-4}
COMPAT_UDP_SIPP_CALLS=${COMPAT_UDP_SIPP_CALLS:-100}
COMPAT_UDP_SIPP_RATE=${COMPAT_UDP_SIPP_RATE:-50}
COMPAT_UDP_FFMPEG_S=${COMPAT_UDP_FFMPEG_S:-4}
COMPAT_UDP_FFMPEG_IDLE_S=${COMPAT_UDP_FFMPEG_IDLE_S:-8}
COMPAT_UDP_SOCKPERF_S=${COMPAT_UDP_SOCKPERF_S:-2}
COMPAT_UDP_SOCKPERF_MPS=${COMPAT_UDP_SOCKPERF_MPS:-5000}

COMPAT_BINS+=(
    [iperf3-udp]="iperf3 jq"
    [sockperf-udp]="sockperf"
    [socat-udp]="socat perl"
    [sipp]="sipp"
    [ffmpeg]="ffmpeg"
)
COMPAT_PACKAGE_OF+=([sipp]=sip-tester [ffmpeg]=ffmpeg [perl]=perl-base)
COMPAT_VERSION_PACKAGE+=([iperf3-udp]=iperf3 [sockperf-udp]=sockperf [socat-udp]=socat [sipp]=sip-tester [ffmpeg]=ffmpeg)

compat_udp_programs() { echo iperf3-udp sockperf-udp socat-udp sipp ffmpeg; }

# compat_udp_begin SUITE: compat_begin, and the rule file's header for UDP.
compat_udp_begin() {
    compat_begin "$1" || return 1
    {
        echo "# UDP (tests/lib/compat_udp.sh): one rule per port a program's sockets bind, servers' and clients' alike;"
        echo "# the datagram method (dgram=) is the mode the port's run tests."
    } >> "$COMPAT_CONF"
}

# compat_udp_install_missing: as compat_install_missing, for the UDP programs.
compat_udp_install_missing() {
    local program bin missing=0
    for program in $(compat_udp_programs); do
        for bin in ${COMPAT_BINS[$program]}; do compat_have "$bin" || missing=1; done
    done
    (( missing )) || return 0
    [[ ${COMPAT_INSTALL:-1} == 0 || $(id -u) != 0 ]] && return 0
    tap_diag "compat_udp: installing the missing programs (tools/deps.sh compat)"
    "$RS_TOP/tools/deps.sh" compat > "$COMPAT_DIR/deps-udp.log" 2>&1 ||
        tap_diag "compat_udp: tools/deps.sh compat failed: $(tail -n 3 "$COMPAT_DIR/deps-udp.log")"
}

COMPAT_UDP_MODE=
COMPAT_UDP_PORTS=()

# compat_udp_port VAR: a UDP port free now (nothing bound to it, nor to its image P + 16384 in the software RNIC's
# port space) and not yet used by the suite; adds its rule for COMPAT_UDP_MODE. 10000-16383 as in compat_port.
compat_udp_port() {
    local -n _compat_udp_out=$1
    local _p _tries=0
    while (( _tries++ < 200 )); do
        _p=$((10000 + (RANDOM * 32768 + RANDOM) % 6384))
        [[ " ${COMPAT_PORTS[*]} ${COMPAT_UDP_PORTS[*]} " == *" $_p "* ]] && continue
        [[ -n $(ss -Hantu "( sport = :$_p or dport = :$_p or sport = :$((_p + 16384)) )" 2>/dev/null) ]] && continue
        COMPAT_UDP_PORTS+=("$_p")
        printf 'use both udp any %s:%s dgram=%s\n' "$COMPAT_ADDR" "$_p" "$COMPAT_UDP_MODE" >> "$COMPAT_CONF"
        _compat_udp_out=$_p
        return 0
    done
    return 1
}

# compat_udp_wait_bound NAME PORT [SECONDS]: a UDP socket is bound to PORT; fails at once when the server died.
compat_udp_wait_bound() {
    local name=$1 port=$2 limit=${3:-30} start=$SECONDS
    while (( SECONDS - start < limit )); do
        [[ -n $(ss -Huan "sport = :$port" 2>/dev/null) ]] && return 0
        compat_server_alive "$name" || return 1
        sleep 0.1
    done
    return 1
}

# compat_udp_wait_file FILE BYTES [SECONDS]: FILE has BYTES bytes, or stopped growing for 3 s.
compat_udp_wait_file() {
    local file=$1 want=$2 limit=${3:-30} start=$SECONDS size last=-1 still=$SECONDS
    while (( SECONDS - start < limit )); do
        size=$(stat -c %s "$file" 2>/dev/null || echo 0)
        (( size >= want )) && return 0
        if (( size != last )); then last=$size; still=$SECONDS; elif (( SECONDS - still >= 3 )); then return 1; fi
        sleep 0.1
    done
    return 1
}

# ----------------------------------------------------------------------------------------------- evidence

# compat_udp_watch_start: samples `rdmasock stat` while the current mode runs (preload mode only).
compat_udp_watch_start() {
    compat_watch_stop
    [[ $COMPAT_MODE == preload ]] || return 0
    COMPAT_WATCH_FILE=$COMPAT_DIR/$COMPAT_PROGRAM-$COMPAT_UDP_MODE.stat.jsonl
    : > "$COMPAT_WATCH_FILE"
    # Raw documents (no jq per sample: a sample every ~0.1 s even on a loaded machine, so short-lived senders are
    # seen too); jq -s reads the stream of arrays later.
    (
        trap - EXIT
        while :; do
            "$RS_TOOL" stat --all-users --json >> "$COMPAT_WATCH_FILE" 2>/dev/null
            sleep 0.05
        done
    ) &
    # shellcheck disable=SC2034  # compat_watch_stop (tests/lib/compat.sh) ends it
    COMPAT_WATCH_PID=$!
}

# UDP sockets bound to one of the ports (local address), the most telling path each was seen on, and the RDMA
# counters (proto udp) of every process that had one, each process's largest value over the snapshots.
# shellcheck disable=SC2016
COMPAT_UDP_EVIDENCE_JQ='
  ($ports | split(",")) as $ps
  | def onport: . as $s | any($ps[]; . as $p | (($s.local // "") | endswith(":" + $p)));
  [ .[] | .[]? | select(type == "object" and has("sockets")) ] as $procs
  | [ $procs[] | . as $proc | .sockets[] | select(.proto == "udp" and onport)
      | { key: "\($proc.pid)/\(.fd)/\(.local)", pid: $proc.pid, program: $proc.program, fd, path, reason, local,
          peer, bytes: (.bytes_tx + .bytes_rx), msgs: (.msgs_tx + .msgs_rx) } ]
  | group_by(.key)
  | map(. as $seen | ($seen | map(.path)) as $paths
        | $seen[-1] + { path: (if all($paths[]; . == "rdma") then "rdma" else ($paths - ["rdma"])[0] end),
                        bytes: ($seen | map(.bytes) | max), msgs: ($seen | map(.msgs) | max) })
  | . as $socks
  | ([ $socks[] | .pid ] | unique) as $pids
  | def per_process(f): [ $pids[] as $pid | [ $procs[] | select(.pid == $pid) | f ] | max ] | add // 0;
  { rdma: [ $socks[] | select(.path == "rdma") ], other: [ $socks[] | select(.path != "rdma") ],
    bytes: per_process((.counters.rdma_bytes_tx.udp // 0) + (.counters.rdma_bytes_rx.udp // 0)),
    msgs: per_process((.counters.rdma_msgs_tx.udp // 0) + (.counters.rdma_msgs_rx.udp // 0)),
    processes: [ $procs[] | select(.pid as $p | any($pids[]; . == $p)) | "\(.program)[\(.pid)]" ] | unique }'

# compat_udp_evidence PORTS MIN_BYTES: the evidence check of the current mode (the next declared line).
# Call it while the servers still run: a last snapshot is taken here.
compat_udp_evidence() {
    local ports=$1 min=$2
    if [[ $COMPAT_MODE != preload ]]; then
        compat_skip_one "control run on the kernel (COMPAT_MODE=kernel)"
        return 0
    fi
    compat_watch_stop
    "$RS_TOOL" stat --all-users --json >> "$COMPAT_WATCH_FILE" 2>/dev/null
    local summary
    # A sample cut short by the watcher's end is not a document: keep whatever parses.
    if ! summary=$(jq -c -n --stream 'fromstream(1 | truncate_stream(inputs))' "$COMPAT_WATCH_FILE" 2>/dev/null |
                   jq -s -c '[.]' | jq -c --arg ports "$ports" "$COMPAT_UDP_EVIDENCE_JQ" 2>&1); then
        compat_fail "cannot read the rdmasock stat snapshots in ${COMPAT_WATCH_FILE##*/}: $summary"
        return 1
    fi
    echo "$summary" > "$COMPAT_DIR/$COMPAT_PROGRAM-$COMPAT_UDP_MODE.evidence.json"
    local rdma other bytes msgs processes sample what
    read -r rdma other bytes msgs < <(jq -r '"\(.rdma | length) \(.other | length) \(.bytes) \(.msgs)"' <<< "$summary")
    processes=$(jq -r '.processes | join(" ")' <<< "$summary")
    sample=$(jq -r '(.rdma[:4] + .other[:4])[]
        | "  \(.program)[\(.pid)] fd \(.fd) \(.local) -> \(.peer) path \(.path) reason \(.reason) rdma bytes \(.bytes) msgs \(.msgs)"' \
        <<< "$summary")
    what="port(s) $ports ($COMPAT_UDP_MODE): UDP sockets on rdma $rdma, elsewhere $other; processes' RDMA counters (udp): $(numfmt --to=iec "$bytes")B in $msgs datagrams (need $(numfmt --to=iec "$min")B); processes: ${processes:-none}"
    if (( bytes >= min && msgs > 0 && rdma >= 1 && other == 0 )); then
        compat_pass
        tap_diag "$COMPAT_PROGRAM evidence ($COMPAT_UDP_MODE): $what"
        [[ -n $sample ]] && tap_diag "$sample"
    else
        compat_fail "$what" "rdmasock stat samples: $(grep -c '^\[' "$COMPAT_WATCH_FILE") (${COMPAT_WATCH_FILE##*/})" \
            "${sample:-no UDP socket on the ports appeared in any snapshot}" "$(compat_diag)"
    fi
}

# compat_udp_summary: the datagram layer's per-socket summaries from the program's library log (sockets closed
# by the application: where their datagrams went, what was dropped), as diagnostics.
compat_udp_summary() {
    [[ -s ${COMPAT_LOG_FILE:-} ]] || return 0
    grep -E 'INFO: dgram: fd [0-9]+ closed' "$COMPAT_LOG_FILE" | tail -n 6 | cut -c1-400
}

# compat_udp_lines PROGRAM LINE...: the lines of every mode (each LINE gets " [MODE]"), plus the evidence per mode.
COMPAT_UDP_DECLARED=()
compat_udp_lines() {
    local mode line
    COMPAT_UDP_DECLARED=()
    for mode in $COMPAT_UDP_MODES; do
        for line in "$@"; do COMPAT_UDP_DECLARED+=("$line [$mode]"); done
        COMPAT_UDP_DECLARED+=("${COMPAT_PROGRAM_TITLE:-$1}: its UDP sockets went over RDMA (rdmasock stat: path rdma, RDMA datagram counters) [$mode]")
    done
}

# ----------------------------------------------------------------------------------------------- the checks

compat_udp_check_iperf3_udp() {
    local bytes=$((COMPAT_UDP_IPERF_MB * 1048576)) rate=$COMPAT_UDP_IPERF_RATE window=2097152 limit
    # -w: socket buffers of 2 MiB so a reader starved for a moment does not drop; iperf3 fails ("socket buffer
    # size not set correctly") when the sysctls cap what it asked for, so it asks for no more than they allow.
    local sysctl
    for sysctl in rmem_max wmem_max; do
        read -r limit < "/proc/sys/net/core/$sysctl" 2>/dev/null || continue
        (( limit < window )) && window=$limit
    done
    COMPAT_PROGRAM_TITLE="iperf3 -u"
    compat_udp_lines \
        "iperf3 -u: client to server, $COMPAT_UDP_IPERF_MB MiB at $rate (-l 1400 -w $(numfmt --to=iec "$window")): the receiver lost at most $COMPAT_UDP_LOSS_PCT% and saw none out of order" \
        "iperf3 -u: server to client (-R), $COMPAT_UDP_IPERF_MB MiB at $rate: the receiver lost at most $COMPAT_UDP_LOSS_PCT% and saw none out of order"
    compat_program iperf3-udp "${COMPAT_UDP_DECLARED[@]}" || { compat_program_end; return; }
    local mode
    for mode in $COMPAT_UDP_MODES; do
        COMPAT_UDP_MODE=$mode
        local port cport test=0 server=iperf3-udp-$mode-server
        compat_udp_port port
        compat_udp_port cport
        # The control connection is TCP on the same port: kept on the kernel so the evidence is about UDP alone
        # (iperf3's TCP is the TCP matrix's subject) and a control hiccup cannot pass for a datagram problem.
        printf 'use kernel tcp any *:%s\n' "$port" >> "$COMPAT_CONF"
        compat_udp_watch_start
        compat_server "$server" iperf3 -s -B "$COMPAT_ADDR" -p "$port" -J
        if ! compat_wait_listen "$server" "$port" 20; then
            compat_fail "iperf3 -s did not listen on port $port" "$(compat_diag "$server.log" "$server.err")"
            compat_fail "(not run: the server did not start)"
            compat_udp_evidence "$port,$cport" "$bytes"
            compat_stop "$server" KILL 5
            continue
        fi
        local direction
        for direction in forward reverse; do
            local client=iperf3-udp-$mode-$direction flags=() server_json=$COMPAT_DATA/iperf3-udp-$mode-$test.json status
            [[ $direction == reverse ]] && flags=(-R)
            compat_run "$client" iperf3 -c "$COMPAT_ADDR" -p "$port" --cport "$cport" -u -b "$rate" -l 1400 -w "$window" \
                -n "$bytes" "${flags[@]}" -J
            status=$?
            local start=$SECONDS
            while (( SECONDS - start < 15 )); do
                jq -s -e --argjson i "$test" 'length > $i' "$COMPAT_DIR/$server.log" >/dev/null 2>&1 && break
                sleep 0.2
            done
            jq -s --argjson i "$test" '.[$i] // {}' "$COMPAT_DIR/$server.log" > "$server_json" 2>/dev/null
            test=$((test + 1))
            local sender_json=$COMPAT_DIR/$client.out receiver_json=$server_json
            [[ $direction == reverse ]] && { sender_json=$server_json; receiver_json=$COMPAT_DIR/$client.out; }
            local sent got lost ooo
            sent=$(jq -r '.end.streams[0].udp.packets // "none"' "$sender_json" 2>/dev/null)
            read -r got lost ooo < <(jq -r '.end.streams[0].udp | "\(.packets // "none") \(.lost_packets // "none") \(.out_of_order // "none")"' \
                "$receiver_json" 2>/dev/null)
            # The receiver counts packets up to the highest sequence number it saw (lost ones included) and stops
            # when TEST_END arrives on the control connection: what is still queued then is neither counted nor
            # lost (the kernel run shows it too), so up to a tenth may be missing from its count.
            [[ $status == 0 && $sent =~ ^[0-9]+$ && $got =~ ^[0-9]+$ && $lost =~ ^[0-9]+$ && $ooo == 0 &&
               $got -le $sent && $((got * 10)) -ge $((sent * 9)) && $((lost * 100)) -le $((got * COMPAT_UDP_LOSS_PCT)) ]]
            compat_verdict $? "client exit $status; sender sent ${sent:-?} datagrams; receiver counted ${got:-?}, lost ${lost:-?}, out of order ${ooo:-?}" \
                "$(jq -r '.error // empty' "$COMPAT_DIR/$client.out" "$server_json" 2>/dev/null)" \
                "$(compat_diag "$client.err" "$server.err")"
        done
        compat_udp_evidence "$port,$cport" "$bytes"
        compat_stop "$server" TERM 10
    done
    compat_udp_summary | while IFS= read -r l; do tap_diag "$l"; done
    compat_program_end
}

compat_udp_check_sockperf_udp() {
    local seconds=$COMPAT_UDP_SOCKPERF_S mps=$COMPAT_UDP_SOCKPERF_MPS
    COMPAT_PROGRAM_TITLE="sockperf (UDP)"
    compat_udp_lines \
        "sockperf (UDP): ping-pong, ${seconds} s, 64 B, --data-integrity: every message answered, none dropped, duplicated or out of order" \
        "sockperf (UDP): throughput, ${seconds} s, 1 KiB at $mps msg/s: the server handled every message sent but at most $COMPAT_UDP_LOSS_PCT%"
    compat_program sockperf-udp "${COMPAT_UDP_DECLARED[@]}" || { compat_program_end; return; }
    local mode
    for mode in $COMPAT_UDP_MODES; do
        COMPAT_UDP_MODE=$mode
        local port cport_pp cport_tp kind status tp_bytes=0
        compat_udp_port port
        compat_udp_port cport_pp
        compat_udp_port cport_tp
        compat_udp_watch_start
        for kind in ping-pong throughput; do
            local server=sockperf-udp-$mode-$kind-server client=sockperf-udp-$mode-$kind
            # --buffer-size: SO_RCVBUF 4 MiB (the sysctl may cap it), so a reader the loaded machine starves for a
            # moment does not drop: the kernel run gets the same.
            compat_server "$server" sockperf server -i "$COMPAT_ADDR" -p "$port" --buffer-size 4194304
            if ! compat_udp_wait_bound "$server" "$port" 20; then
                compat_fail "sockperf server did not bind UDP port $port" "$(compat_diag "$server.log" "$server.err")"
                compat_stop "$server" KILL 5
                continue
            fi
            if [[ $kind == ping-pong ]]; then
                compat_run "$client" sockperf ping-pong -i "$COMPAT_ADDR" -p "$port" --client_ip "$COMPAT_ADDR" \
                    --client_port "$cport_pp" -t "$seconds" -m 64 --data-integrity
                status=$?
                compat_stop "$server" INT 10
                local out=$COMPAT_DIR/$client.out reported valid clean
                reported=$(grep -c 'Valid Duration' "$out")
                valid=$(grep -c 'Valid Duration.*SentMessages=\([1-9][0-9]*\); ReceivedMessages=\1$' "$out")
                clean=$(grep -c 'dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0' "$out")
                [[ $status == 0 && $reported -ge 1 && $valid == "$reported" && $clean == "$reported" ]] &&
                    ! grep -qiE 'error|integrity.*fail' "$out" "$COMPAT_DIR/$client.err"
                compat_verdict $? "client exit $status; reports with sent = received: $valid of $reported; clean (no drop/dup/reorder): $clean of $reported" \
                    "$(grep -E 'Valid Duration|dropped|rror' "$out" | head -n 6)" "$(compat_diag "$client.err" "$server.err")"
            else
                compat_run "$client" sockperf throughput -i "$COMPAT_ADDR" -p "$port" --client_ip "$COMPAT_ADDR" \
                    --client_port "$cport_tp" -t "$seconds" -m 1024 --mps "$mps"
                status=$?
                # The server's count is printed when it stops: wait until what was sent can have been read.
                local sent handled start=$SECONDS
                sent=$(sed -n 's/.*Total of \([0-9]*\) messages sent.*/\1/p' "$COMPAT_DIR/$client.out" | tail -n 1)
                sleep 0.5
                compat_stop "$server" INT 10
                handled=$(sed -n 's/.*Total \([0-9]*\) messages received and handled.*/\1/p' "$COMPAT_DIR/$server.log" | tail -n 1)
                [[ $sent =~ ^[0-9]+$ ]] && tp_bytes=$((sent * 1024))
                [[ $status == 0 && $sent =~ ^[0-9]+$ && $sent -gt 0 && $handled =~ ^[0-9]+$ && $handled -le $sent &&
                   $(( (sent - handled) * 100 )) -le $((sent * COMPAT_UDP_LOSS_PCT)) ]]
                compat_verdict $? "client exit $status; client sent ${sent:-?} messages, server handled ${handled:-?} (at most $COMPAT_UDP_LOSS_PCT% missing)" \
                    "$(compat_diag "$client.out" "$client.err" "$server.log" "$server.err")"
            fi
        done
        # Both servers are stopped by now: the snapshots taken while they ran carry their counters.
        # Half the bytes the throughput client sent, at least 64 KiB: a fixed 1 MiB failed a slow VM boot whose
        # client sent fewer messages in its seconds although every socket was on RDMA.
        local need=$((tp_bytes / 2))
        (( need < 65536 )) && need=65536
        compat_udp_evidence "$port,$cport_pp,$cport_tp" "$need"
    done
    compat_udp_summary | while IFS= read -r l; do tap_diag "$l"; done
    compat_program_end
}

# The sender's pacing and datagram sizes: FILE goes to stdout in pieces that cycle through sizes from 1 byte to
# the largest UDP payload (socat sends each read as one datagram), with a pause after each, so neither end
# overruns a receive queue on a loaded machine. Then it keeps the pipe open LINGER microseconds, so the sender
# lives on (idle) and the stat samples see its final counters.
# shellcheck disable=SC2016
COMPAT_UDP_PACER='
use strict; use Time::HiRes qw(usleep);
my ($file, $pause, $linger) = @ARGV; my @sizes = (1400, 8192, 65507, 1, 32768, 512, 60000, 16384, 1472, 200);
open(my $fh, "<:raw", $file) or die "$file: $!"; binmode STDOUT; my ($buf, $i) = ("", 0);
while (my $n = read($fh, $buf, $sizes[$i++ % @sizes])) {
    my $o = 0; while ($o < $n) { my $w = syswrite(STDOUT, $buf, $n - $o, $o); die "write: $!" unless defined $w; $o += $w; }
    usleep($pause);
}
usleep($linger);'

compat_udp_check_socat_udp() {
    local mib=$COMPAT_UDP_SOCAT_MB
    COMPAT_PROGRAM_TITLE="socat (UDP)"
    compat_udp_lines \
        "socat (UDP): a random $mib MiB file as datagrams of 1 to 65,507 bytes (UDP-SENDTO to UDP-RECV): sha256 matches, and the receiver read the datagrams the sender sent, same sizes, same order"
    compat_program socat-udp "${COMPAT_UDP_DECLARED[@]}" || { compat_program_end; return; }
    local in=$COMPAT_DATA/socat-udp.in mode
    compat_random "$in" "$mib"
    for mode in $COMPAT_UDP_MODES; do
        COMPAT_UDP_MODE=$mode
        local port cport status out=$COMPAT_DATA/socat-udp-$mode.out sink=socat-udp-$mode-sink source=socat-udp-$mode-source
        compat_udp_port port
        compat_udp_port cport
        compat_udp_watch_start
        # -d -d -d: socat logs "transferred N bytes" per read and per write, i.e. per datagram on either end.
        compat_server "$sink" socat -d -d -d -u -b 65536 "UDP-RECV:$port,bind=$COMPAT_ADDR,rcvbuf=2097152" "CREATE:$out"
        if ! compat_udp_wait_bound "$sink" "$port" 20; then
            compat_fail "socat did not bind UDP port $port" "$(compat_diag "$sink.err")"
        else
            # compat_run's wrapper is for the program only: the pacer feeds its stdin through a pipe.
            local fifo=$COMPAT_DATA/socat-udp-$mode.fifo
            mkfifo "$fifo"
            perl -e "$COMPAT_UDP_PACER" "$in" 2000 1500000 > "$fifo" &
            local pacer=$!
            COMPAT_STDIN=$fifo compat_run "$source" socat -d -d -d -u -b 65507 STDIN \
                "UDP-SENDTO:$COMPAT_ADDR:$port,bind=$COMPAT_ADDR,sourceport=$cport"
            status=$?
            wait "$pacer" 2>/dev/null
            rm -f "$fifo"
            compat_udp_wait_file "$out" $((mib * 1048576)) 30
            local sent_sizes got_sizes
            sent_sizes=$(sed -n 's/.* I transferred \([0-9]*\) bytes from 0 to .*/\1/p' "$COMPAT_DIR/$source.err" | md5sum)
            got_sizes=$(sed -n 's/.* I transferred \([0-9]*\) bytes from [0-9]* to [0-9]*$/\1/p' "$COMPAT_DIR/$sink.err" | md5sum)
            local nsent ngot
            nsent=$(grep -c ' I transferred [0-9]* bytes from 0 to ' "$COMPAT_DIR/$source.err")
            ngot=$(grep -c ' I transferred [0-9]* bytes from ' "$COMPAT_DIR/$sink.err")
            [[ $status == 0 && $(compat_sha "$out") == "$(compat_sha "$in")" && $nsent -gt 0 && $sent_sizes == "$got_sizes" ]]
            compat_verdict $? "sender exit $status; received $(stat -c %s "$out" 2>/dev/null || echo no) of $((mib * 1048576)) bytes; datagrams sent $nsent, received $ngot (sizes and order $([[ $sent_sizes == "$got_sizes" ]] && echo match || echo differ))" \
                "$(compat_diag "$source.err" "$sink.err")"
        fi
        # Half the file: the first datagrams go through the kernel while the sender's probe is answered, and the
        # sender's own counters are in the snapshots only if one was taken while it ran (a VM run saw the
        # receiver's 842 KiB of 1 MiB and none of the sender's).
        compat_udp_evidence "$port,$cport" $((mib * 1048576 / 2))
        compat_stop "$sink" TERM 5
        rm -f "$out"
    done
    compat_udp_summary | while IFS= read -r l; do tap_diag "$l"; done
    compat_program_end
}

# compat_udp_sipp_stat FILE COLUMN: the last row's value of COLUMN (e.g. "SuccessfulCall(C)") in a -trace_stat file.
compat_udp_sipp_stat() {
    awk -F';' -v col="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == col) c = i; next } { v = $c } END { print v }' "$1" 2>/dev/null
}

compat_udp_check_sipp() {
    local n=$COMPAT_UDP_SIPP_CALLS rate=$COMPAT_UDP_SIPP_RATE
    COMPAT_PROGRAM_TITLE="sipp"
    compat_udp_lines \
        "sipp: built-in uac scenario against the built-in uas, $n calls over UDP at $rate calls/s (INVITE, 100, 180, 200, ACK, BYE, 200): both ends count $n successful calls and 0 failed"
    compat_program sipp "${COMPAT_UDP_DECLARED[@]}" || { compat_program_end; return; }
    local mode attempt
    for mode in $COMPAT_UDP_MODES; do
      COMPAT_UDP_MODE=$mode
      # A second try only when the first one failed under overload: sipp's own watchdog tripped (its timers ran
      # late), so its UDP retransmissions were legitimate and a late duplicate answer aborted a call (sipp's default
      # on an unexpected message). That is SIP on a starved machine (TCG), not a datagram rdmasock lost or made.
      for attempt in 1 2; do
        local port cport status uas=sipp-$mode-uas uac=sipp-$mode-uac verdict=1
        compat_udp_port port
        compat_udp_port cport
        compat_udp_watch_start
        # -nostdin: no terminal; -trace_stat: the counters as CSV, written at the end (-stf names the file).
        compat_server "$uas" sipp -sn uas -i "$COMPAT_ADDR" -p "$port" -m "$n" -nostdin -trace_stat \
            -stf "$COMPAT_DIR/$uas.csv" -trace_err -error_file "$COMPAT_DIR/$uas.errors"
        if ! compat_udp_wait_bound "$uas" "$port" 20; then
            compat_fail "the sipp uas did not bind UDP port $port" "$(compat_diag "$uas.log" "$uas.err")"
        else
            compat_run "$uac" sipp -sn uac "$COMPAT_ADDR:$port" -i "$COMPAT_ADDR" -p "$cport" -m "$n" -r "$rate" -nostdin \
                -trace_stat -stf "$COMPAT_DIR/$uac.csv" -trace_err -error_file "$COMPAT_DIR/$uac.errors"
            status=$?
            compat_wait_server "$uas" 20
            local uas_status=$? ok_c fail_c ok_s fail_s
            ok_c=$(compat_udp_sipp_stat "$COMPAT_DIR/$uac.csv" 'SuccessfulCall(C)')
            fail_c=$(compat_udp_sipp_stat "$COMPAT_DIR/$uac.csv" 'FailedCall(C)')
            ok_s=$(compat_udp_sipp_stat "$COMPAT_DIR/$uas.csv" 'SuccessfulCall(C)')
            fail_s=$(compat_udp_sipp_stat "$COMPAT_DIR/$uas.csv" 'FailedCall(C)')
            [[ $status == 0 && $uas_status == 0 && $ok_c == "$n" && $fail_c == 0 && $ok_s == "$n" && $fail_s == 0 ]]
            verdict=$?
            if ((verdict != 0 && attempt == 1)) && grep -qi 'watchdog' "$COMPAT_DIR/$uac.errors" "$COMPAT_DIR/$uac.out" 2>/dev/null; then
                tap_diag "sipp ($mode): uac exit $status (successful ${ok_c:-?}, failed ${fail_c:-?}) with sipp's watchdog tripped (overloaded machine): once more"
                compat_stop "$uas" KILL 5
                for f in "$uac.errors" "$uas.errors" "$uac.csv" "$uas.csv"; do
                    [[ -f $COMPAT_DIR/$f ]] && mv "$COMPAT_DIR/$f" "$COMPAT_DIR/$f.try1"
                done
                continue
            fi
            compat_verdict $verdict "uac exit $status (successful ${ok_c:-?}, failed ${fail_c:-?}); uas exit $uas_status (successful ${ok_s:-?}, failed ${fail_s:-?}); want $n and 0 at both" \
                "$(compat_diag "$uac.errors" "$uas.errors" "$uac.out" "$uas.log")"
        fi
        # Both ends have exited: their counters are in the snapshots taken while they ran. The SIP messages of
        # the calls are some 2 KB per call each way; a tenth of the calls' worth is the floor.
        compat_udp_evidence "$port,$cport" $((n * 200))
        compat_stop "$uas" KILL 5
        break
      done
    done
    compat_udp_summary | while IFS= read -r l; do tap_diag "$l"; done
    compat_program_end
}

# compat_udp_framemd5 FILE OUT: the MD5 of every decoded video frame of FILE, one line each (timestamps dropped:
# they are the muxer's business, the pictures are what must survive the trip).
compat_udp_framemd5() {
    ffmpeg -hide_banner -nostdin -loglevel error -i "$1" -map 0:v -f framemd5 - 2>/dev/null |
        awk -F', *' '!/^#/ { print $NF }' > "$2"
}

compat_udp_check_ffmpeg() {
    local seconds=$COMPAT_UDP_FFMPEG_S frames=$((COMPAT_UDP_FFMPEG_S * 25))
    COMPAT_PROGRAM_TITLE="ffmpeg"
    compat_udp_lines \
        "ffmpeg: a ${seconds} s generated clip (testsrc, MPEG-2, 25 fps) streamed in real time as MPEG-TS over udp:// to a receiving ffmpeg that writes it: its $frames decoded frames are those of the same clip encoded to a file (framemd5), and the receiver exits by itself"
    compat_program ffmpeg "${COMPAT_UDP_DECLARED[@]}" || { compat_program_end; return; }
    # The encoder is made deterministic (one thread, bitexact): the reference is the same clip written to a file.
    local src=(-f lavfi -i "testsrc=size=320x240:rate=25:duration=$seconds" -c:v mpeg2video -q:v 4 -g 25 -threads 1
               -bitexact -flags +bitexact -f mpegts -mpegts_flags +resend_headers)
    local ref=$COMPAT_DATA/ffmpeg-ref.ts ref_md5=$COMPAT_DATA/ffmpeg-ref.md5
    if ! ffmpeg -hide_banner -nostdin -loglevel error -y "${src[@]}" "$ref" > "$COMPAT_DIR/ffmpeg-ref.log" 2>&1; then
        compat_fail_rest "ffmpeg cannot encode the reference clip" "$(tail -n 5 "$COMPAT_DIR/ffmpeg-ref.log")"
        compat_program_end
        return
    fi
    compat_udp_framemd5 "$ref" "$ref_md5"
    local mode
    for mode in $COMPAT_UDP_MODES; do
        COMPAT_UDP_MODE=$mode
        local port cport status rx=ffmpeg-$mode-receiver tx=ffmpeg-$mode-sender out=$COMPAT_DATA/ffmpeg-$mode.ts
        compat_udp_port port
        compat_udp_port cport
        compat_udp_watch_start
        # timeout=: the receiver ends COMPAT_UDP_FFMPEG_IDLE_S after the stream stops (as "Input/output error"); its
        # UDP reader thread (the default fifo) is cancelled on the way out, which must work on a converted socket
        # too. The timeout also runs before the first datagram: on a loaded machine the sending ffmpeg took over
        # 3 s to start, and in a slow VM boot over 8 s (the receiver gave up before the stream began).
        compat_server "$rx" ffmpeg -hide_banner -nostdin -loglevel error -y \
            -i "udp://$COMPAT_ADDR:$port?localaddr=$COMPAT_ADDR&timeout=$((COMPAT_UDP_FFMPEG_IDLE_S * 1000000))" \
            -map 0 -c copy -f mpegts "$out"
        if ! compat_udp_wait_bound "$rx" "$port" 30; then
            compat_fail "the receiving ffmpeg did not bind UDP port $port" "$(compat_diag "$rx.err")"
        else
            compat_run "$tx" ffmpeg -hide_banner -nostdin -loglevel error -re "${src[@]}" \
                "udp://$COMPAT_ADDR:$port?localaddr=$COMPAT_ADDR&localport=$cport&pkt_size=1316"
            status=$?
            compat_wait_server "$rx" $((COMPAT_UDP_FFMPEG_IDLE_S + 22))
            local rx_status=$? got_md5=$COMPAT_DATA/ffmpeg-$mode.md5 nref ngot
            compat_udp_framemd5 "$out" "$got_md5"
            nref=$(wc -l < "$ref_md5")
            ngot=$(wc -l < "$got_md5")
            # The receiver's exit: 0, or 1 after its input timed out (ffmpeg reports the timeout as an I/O error).
            [[ $status == 0 && ( $rx_status == 0 || $rx_status == 1 ) && $nref == "$frames" ]] && cmp -s "$ref_md5" "$got_md5"
            compat_verdict $? "sender exit $status; receiver exit $rx_status (124: still running after $((COMPAT_UDP_FFMPEG_IDLE_S + 22)) s); decoded frames $ngot, reference $nref (want $frames), frame checksums $(cmp -s "$ref_md5" "$got_md5" && echo match || echo differ)" \
                "$(compat_diag "$tx.err" "$rx.err")"
        fi
        compat_udp_evidence "$port,$cport" "$(stat -c %s "$ref")"
        compat_stop "$rx" KILL 5
        rm -f "$out"
    done
    compat_udp_summary | while IFS= read -r l; do tap_diag "$l"; done
    compat_program_end
}

# compat_udp_run_matrix [PROGRAM...]: the given programs (default: every one, in the order of compat_udp_programs).
compat_udp_run_matrix() {
    # COMPAT_ONLY selects programs of the TCP matrix; this one is selected by COMPAT_UDP_ONLY alone.
    # shellcheck disable=SC2034  # read by compat_wanted (tests/lib/compat.sh)
    local COMPAT_ONLY=
    local program list=("$@")
    (( ${#list[@]} )) || read -ra list <<< "${COMPAT_UDP_ONLY:-$(compat_udp_programs)}"
    for program in "${list[@]}"; do
        [[ " $(compat_udp_programs) " == *" $program "* ]] || { tap_fail "compat_udp: $program is a program of the matrix" "known: $(compat_udp_programs)"; continue; }
        "compat_udp_check_${program//-/_}"
    done
}
