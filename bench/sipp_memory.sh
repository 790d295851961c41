#!/usr/bin/env bash
# bench/sipp_memory.sh [OUTDIR]: memory of a SIPp server with many clients, one socket each (Grant 2012 §6.6.3,
# figure 6.13: the datagram mapping saved 24.1% against a connected mapping at 10,000 clients).
# One sipp UAS (built-in `uas` scenario) on 127.0.0.1 and one sipp UAC (built-in `uac`) that opens one socket per
# call (-t un: UDP, one port per client; -t tn: TCP, one connection per client) and keeps N calls up (-d), so the
# server holds N clients at once. Mappings, each with both programs started the same way:
#   udp-kernel      plain UDP, no preload (the reference)
#   udp-sendrecv    UDP under `rdmasock run`, rule `use both udp any 127.0.0.1 dgram=sendrecv`
#   udp-wrecord     the same with dgram=wrecord (one Write-Record lane per client at the server)
#   tcp-kernel      plain TCP, no preload
#   tcp-sdp         TCP under `rdmasock run`, rule `use rdma tcp any 127.0.0.1` (the stream mapping: SDP over RC)
# When every call is up, the server's Rss and Pss (/proc/PID/smaps_rollup; rdmasock and the soft RNIC live in the
# process) and the machine's Slab (/proc/meminfo, kernel socket memory, machine-wide) are read.
# Writes: dgram-sipp.csv, dgram-sipp.md (ratios udp-*/tcp-sdp and against the kernel references).
# Knobs: SIPP_CLIENTS (default "100 500 1000"), SIPP_MAPPINGS (default all five), SIPP_RATE (calls/s, default 400),
# SIPP_PER_UAC (clients per sipp client process, default 2000).
# Budget: about 2 minutes at the defaults. 10,000 clients: SIPP_CLIENTS=10000 (see dgram.md for what fitted).
DG_NAME=sipp_memory
source "$(dirname "$0")/dgram_common.sh"
tool=$RS_BUILD/bin/rdmasock
dg_need "$tool" "make all"
dg_need_cmd sipp sip-tester
dg_need_cmd ss iproute2
clients=${SIPP_CLIENTS:-100 500 1000}
mappings=${SIPP_MAPPINGS:-udp-kernel udp-sendrecv udp-wrecord tcp-kernel tcp-sdp}
rate=${SIPP_RATE:-400}
per_uac=${SIPP_PER_UAC:-2000}
# tcpdump/tshark evidence that the converted UDP runs went over datagram-iWARP (SIPP_CAPTURE=0 skips it).
capture=""
if [ "${SIPP_CAPTURE:-1}" != 0 ] && [ "$(id -u)" -eq 0 ] && command -v tcpdump >/dev/null 2>&1 && command -v tshark >/dev/null 2>&1; then
  capture=1
fi
work=$(mktemp -d /tmp/sipp_memory.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; [ -e "$work/.keep" ] || rm -rf "$work"; }
trap cleanup EXIT
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
csv=$OUT/dgram-sipp.csv
t0=$SECONDS

kb() { awk -v k="$2:" '$1 == k { print $2 }' "$1"; }

# measure MAPPING N -> "rss_kb,pss_kb,slab_delta_kb,calls_up,plain_sip,rdma_dgrams,server_fds"
measure() {
  local map=$1 n=$2 port pre=() transport proto spid hold
  port=$(dg_free_port)
  transport=${map%%-*}; proto=u1; [ "$transport" = tcp ] && proto=t1
  case $map in
    udp-sendrecv|udp-wrecord) printf 'use both udp any 127.0.0.1 dgram=%s\n' "${map#udp-}" >"$work/rules.conf" ;;
    tcp-sdp) printf 'use rdma tcp any 127.0.0.1\n' >"$work/rules.conf" ;;
  esac
  case $map in *-kernel) ;; *) pre=(env RDMASOCK_CONF="$work/rules.conf" "$tool" run --transport soft --) ;; esac
  local slab0 dpid=""
  slab0=$(kb /proc/meminfo Slab)
  # Wire evidence for the converted UDP runs: datagrams to the server's port that carry plain SIP (they start with
  # a request line or "SIP/2.0") against the others (datagram-iWARP). The first ones of each client go as plain UDP
  # while it probes the server; the rest must not.
  if [ "$transport" = udp ] && [ -n "$capture" ]; then
    tcpdump -i lo -nn -U -s 80 -w "$work/cap.pcap" "udp and dst port $port" 2>/dev/null &
    dpid=$!
    sleep 0.5
  fi
  # The server: one socket for UDP (-t u1), one per connection for TCP (-t t1 accepts them all).
  (cd "$work" && exec "${pre[@]}" sipp -sn uas -i 127.0.0.1 -p "$port" -t "$proto" -nostdin -max_socket $((n + 100)) \
      -trace_err -error_file "$work/uas-$map-$n.err" >/dev/null 2>&1) &
  spid=$!; pids+=("$spid")
  for _ in $(seq 100); do
    if ss -Hanu "sport = :$port" | grep -q . || ss -Hltn "sport = :$port" | grep -q .; then break; fi
    sleep 0.05
  done
  # The clients: one socket per call (-t un / tn), every call held 3600 s so all N are up together. They are spread
  # over ceil(N / SIPP_PER_UAC) sipp processes: under rdmasock a client socket costs several descriptors (soft
  # RNIC), and one process may not hold 10,000 of them within RLIMIT_NOFILE.
  hold=3600000
  local cpids=() k=$(((n + per_uac - 1) / per_uac)) i m left=$n
  for i in $(seq "$k"); do
    m=$((left < per_uac ? left : per_uac)); left=$((left - m))
    (cd "$work" && exec "${pre[@]}" sipp -sn uac 127.0.0.1:"$port" -i 127.0.0.1 -t "${proto:0:1}n" -nostdin         -r "$(((rate + k - 1) / k))" -l "$m" -m "$m" -d "$hold" -max_socket $((m + 100)) -trace_err \
        -error_file "$work/uac-$map-$n-$i.err" -trace_stat -stf "$work/uac-$map-$n-$i.csv" -fd 1 >/dev/null 2>&1) &
    cpids+=("$!"); pids+=("$!")
  done
  fail() {
    kill "${cpids[@]}" "$spid" ${dpid:+"$dpid"} 2>/dev/null || true
    : >"$work/.keep"    # measure runs in a command substitution: the exit trap is the parent's
    dg_die "$map $n: $* (sipp error files kept in $work)"
  }
  # Every call is up when the clients' statistics add up to n current calls. Wait for them: n / rate + margin.
  local deadline=$((SECONDS + n / rate + 60)) up=0 c
  while [ $SECONDS -lt $deadline ]; do
    # The clients' own counts (their statistics files), for both transports: under SDP the connections are not
    # kernel TCP connections on the port, so ss cannot count them.
    up=0
    for i in $(seq "$k"); do
      c=$(awk -F';' 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "CurrentCall") c = i; next } c { v = $c } END { print v + 0 }' \
          "$work/uac-$map-$n-$i.csv" 2>/dev/null || echo 0)
      up=$((up + c))
    done
    [ "$up" -ge "$n" ] && break
    kill -0 "$spid" 2>/dev/null || fail "the sipp server died"
    for c in "${cpids[@]}"; do kill -0 "$c" 2>/dev/null || fail "a sipp client died"; done
    sleep 1
  done
  [ "$up" -ge "$n" ] || fail "only $up of $n calls were up after $((n / rate + 60)) s"
  sleep 2
  local rss pss slab1 sfds
  rss=$(kb "/proc/$spid/smaps_rollup" Rss); pss=$(kb "/proc/$spid/smaps_rollup" Pss)
  sfds=$(ls "/proc/$spid/fd" | wc -l)
  slab1=$(kb /proc/meminfo Slab)
  kill "${cpids[@]}" "$spid" 2>/dev/null || true
  for c in "${cpids[@]}" "$spid"; do wait "$c" 2>/dev/null || true; done
  pids=()
  local plain=- other=-
  if [ -n "$dpid" ]; then
    kill "$dpid" 2>/dev/null || true; wait "$dpid" 2>/dev/null || true
    local acks
    read -r plain acks other < <(tshark -r "$work/cap.pcap" -T fields -e udp.payload 2>/dev/null |
      awk '/^41434b20/ { a++ } { if ($0 ~ /^(494e56495445|41434b20|425945|5349502f)/) p++; else o++ }
           END { print p + 0, a + 0, o + 0 }')
    case $map in
      udp-kernel) [ "$other" -eq 0 ] || dg_die "$map $n: $other datagrams that are not SIP on kernel UDP?" ;;
      # A client's INVITE is its first datagram, sent as plain UDP while it probes the server; its ACK comes after
      # the answer and must go over RDMA (a few may race the probe).
      *) [ "$acks" -le $((n / 20)) ] && [ "$other" -ge "$n" ] ||
           fail "the SIP traffic stayed on kernel UDP ($plain plain SIP of which $acks ACKs, $other other)" ;;
    esac
  fi
  echo "$rss,$pss,$((slab1 - slab0)),$up,$plain,$other,$sfds"
}

echo "clients,mapping,rss_kb,pss_kb,slab_delta_kb,calls_up,plain_sip_dgrams,rdma_dgrams,server_fds" >"$csv"
for n in $clients; do
  for map in $mappings; do
    r=$(measure "$map" "$n")
    echo "$n,$map,$r" >>"$csv"
    dg_log "$n clients, $map: rss,pss,slab_delta,calls_up = $r (load $(dg_load))"
    up=$(echo "$r" | cut -d, -f4)
    [ "$up" -ge "$n" ] || dg_die "$n clients, $map: only $up of $n calls were up when measured"
  done
done

md=$OUT/dgram-sipp.md
awk -F, -v loadavg="$(dg_load)" '
NR == 1 { next }
{ k = $1 SUBSEP $2; rss[k] = $3; pss[k] = $4; slab[k] = $5; up[k] = $6; wire[k] = $7 == "-" ? "-" : $8 " / " $7
  if (!($1 in seen)) { seen[$1] = 1; ns[++n] = $1 } if (!($2 in seenm)) { seenm[$2] = 1; ms[++m] = $2 } }
function r(a, b) { return b > 0 ? sprintf("%.3f", a / b) : "-" }
END {
    print "# SIPp server memory, datagram mapping vs stream mapping"
    print ""
    print "Generated by `bench/sipp_memory.sh` (sipp UAS on 127.0.0.1, sipp UAC with one socket per call, all calls held"
    print "up; soft RNIC). Rss/Pss of the server process (rdmasock and the soft RNIC included), in KiB; Slab: change"
    print "of the machine-wide kernel slab during the run (noisy: other jobs). Wire: datagrams to the server port that"
    print "are datagram-iWARP / plain SIP (tcpdump): each client sends its INVITE as plain UDP while it probes the server,"
    print "then its ACK over RDMA (the script fails if more than 5% of ACKs are plain). Load at the end: " loadavg "."
    print "The thesis (figure 6.13) compares the datagram mapping with the stream mapping: Pss / tcp-sdp; saving = 1 - that."
    print ""
    print "| clients | mapping | calls up | wire (rdma / plain) | server Rss KiB | server Pss KiB | Slab change KiB | Pss / tcp-sdp | Pss / same-protocol kernel |"
    print "|---|---|---|---|---|---|---|---|---|"
    for (i = 1; i <= n; i++) for (j = 1; j <= m; j++) {
        k = ns[i] SUBSEP ms[j]; if (!(k in rss)) continue
        ref = ms[j] ~ /^udp/ ? "udp-kernel" : "tcp-kernel"
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", ns[i], ms[j], up[k], wire[k], rss[k], pss[k], slab[k], \
            r(pss[k], pss[ns[i] SUBSEP "tcp-sdp"]), r(pss[k], pss[ns[i] SUBSEP ref])
    }
    if (n < 2) exit
    # Least-squares line Pss = fixed + slope * clients per mapping: what a client costs the server.
    print ""
    print "Per-client cost (least-squares line through the " n " client counts): Pss = fixed + slope x clients."
    print ""
    print "| mapping | fixed KiB | KiB per client | Pss at 10,000 clients (extrapolated unless measured) | / tcp-sdp |"
    print "|---|---|---|---|---|"
    for (j = 1; j <= m; j++) {
        sx = sy = sxx = sxy = c = 0
        for (i = 1; i <= n; i++) { k = ns[i] SUBSEP ms[j]; if (!(k in pss)) continue
            c++; sx += ns[i]; sy += pss[k]; sxx += ns[i] * ns[i]; sxy += ns[i] * pss[k] }
        if (c < 2) continue
        slope[j] = (c * sxy - sx * sy) / (c * sxx - sx * sx); fixed[j] = (sy - slope[j] * sx) / c
        at[ms[j]] = fixed[j] + slope[j] * 10000
    }
    for (j = 1; j <= m; j++) if (j in slope)
        printf "| %s | %.0f | %.2f | %.0f | %s |\n", ms[j], fixed[j], slope[j], at[ms[j]], r(at[ms[j]], at["tcp-sdp"])
}' "$csv" >"$md" || dg_die "summary failed"
cat "$md"
dg_log "done in $((SECONDS - t0)) s; results in $OUT (dgram-sipp.{csv,md})"
