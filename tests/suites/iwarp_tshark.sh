#!/usr/bin/env bash
# The soft RNIC's RC traffic is real iWARP: a capture of tests/helpers/rnic_rc_demo on lo, decoded by tshark's own
# MPA and DDP/RDMAP dissectors (not ours), shows the MPA Request/Reply, a good CRC32c on every FPDU, every RDMAP
# opcode the demo uses, and the Terminate with the layer/etype/ecode the target chose.
#
# tshark 4.0 predates MPA rev 2 (RFC 6581): it flags the Enhanced bit and Rev=2 with two expert warnings on the
# Request and Reply but still decodes every FPDU. So the main capture runs the demo with MPA rev 1
# (RDMASOCK_SOFT_MPA_REV=1, via --mpa-rev 1) and must decode without a single iWARP expert note; a second capture
# with the default rev 2 checks that only those two known warnings appear and the FPDUs decode just the same.
#
# The soft RNIC's RDMA port P is TCP port P + 16384 (RDMASOCK_SOFT_PORT_OFFSET, unset here so the default is what
# runs), and its listener greets first with 16 bytes (docs/wire-formats.md §5) that are not MPA: tshark must still
# find the MPA Request and Reply and every FPDU behind them.
source "$RS_TOP/tests/lib/tap.sh"
demo=$RS_BUILD/tests/helpers/rnic_rc_demo
scratch=$(mktemp -d)
capture_pid=
cleanup() { [ -n "$capture_pid" ] && kill "$capture_pid" 2>/dev/null; rm -rf "$scratch"; }
trap cleanup EXIT

skip_all() { tap_plan 1; tap_skip "iWARP capture decoded by tshark" "$1"; exit 0; }
[ -x "$demo" ] || skip_all "$demo not built (make tests)"
command -v tshark >/dev/null || skip_all "tshark not installed"
command -v tcpdump >/dev/null || skip_all "tcpdump not installed"

TS=(tshark -o tcp.try_heuristic_first:TRUE --disable-heuristic rpcrdma_iwarp)

unset RDMASOCK_SOFT_PORT_OFFSET
port_offset=16384

# capture NAME DEMO_ARGS...: runs the demo under tcpdump on lo; sets port (the TCP port of the demo's RDMA
# listener); leaves $scratch/NAME.{pcap,out}.
capture() {
  local name=$1; shift
  # Only the demo's port, with a large buffer: other programs' loopback traffic (benchmarks, other suites) must not
  # crowd the demo's frames out of the capture buffer.
  local want_port=$(( 20000 + RANDOM % 20000 ))
  local tcp_port=$(( (want_port + port_offset) % 65536 ))
  tcpdump -i lo -U --immediate-mode -B 32768 -s 0 -w "$scratch/$name.pcap" "tcp port $tcp_port" \
    2>"$scratch/$name.tcpdump" &
  capture_pid=$!
  for _ in $(seq 100); do grep -q listening "$scratch/$name.tcpdump" && break; sleep 0.05; done
  if ! grep -q listening "$scratch/$name.tcpdump"; then
    kill "$capture_pid" 2>/dev/null; wait "$capture_pid" 2>/dev/null; capture_pid=
    return 2
  fi
  "$demo" --port "$want_port" "$@" >"$scratch/$name.out" 2>&1
  local rc=$?
  sleep 0.3
  kill -INT "$capture_pid"; wait "$capture_pid" 2>/dev/null; capture_pid=
  rdma_port=$(sed -n 's/^listening on 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$scratch/$name.out")
  port=$tcp_port
  [ "$rdma_port" = "$want_port" ] || return 3
  return $rc
}

# fields NAME FIELD...: one line per frame of the demo's connection, every occurrence, comma separated.
fields() {
  local name=$1; shift
  local args=()
  for f in "$@"; do args+=(-e "$f"); done
  "${TS[@]}" -r "$scratch/$name.pcap" -Y "tcp.port == $port" -T fields -E occurrence=a -E aggregator=, "${args[@]}" \
    2>/dev/null
}

count_frames() { "${TS[@]}" -r "$scratch/$1.pcap" -Y "tcp.port == $port && ($2)" 2>/dev/null | wc -l; }

tap_plan 19

# ---- MPA rev 1: must decode cleanly ----
# CRCs asked for, so tshark can check each one: on loopback the default asks for none (rc_cm.c, want_crc). Read
# Responses over TCP, so the segmentation shows: on loopback the default places them by one copy (rc_local.c).
RDMASOCK_SOFT_MPA_CRC=on RDMASOCK_SOFT_LOCAL_READ=off capture rev1 --mpa-rev 1
rc=$?
if [ $rc -eq 2 ]; then
  # Not allowed to capture here (no CAP_NET_RAW): every check depends on the capture.
  for i in $(seq 19); do tap_skip "iWARP capture check $i" "tcpdump cannot capture on lo: $(head -n 1 "$scratch/rev1.tcpdump")"; done
  exit 0
fi
if [ $rc -eq 0 ] && grep -q '^demo ok$' "$scratch/rev1.out"; then
  tap_ok "rnic_rc_demo (MPA rev 1) ran every operation as expected (RDMA port $rdma_port = TCP port $port)"
else
  tap_fail "rnic_rc_demo (MPA rev 1) ran every operation as expected" "$(grep -v '^ok:' "$scratch/rev1.out")"
fi

n=$(count_frames rev1 'iwarp_mpa.req && iwarp_mpa.crc_flag == 1 && iwarp_mpa.marker_flag == 0 && iwarp_mpa.rev == 1')
want_pd=$(printf 'rdmasock demo: request\0' | od -An -tx1 | tr -d ' \n')
got_pd=$(fields rev1 iwarp_mpa.privatedata | grep -m1 -v '^$')
if [ "$n" -eq 1 ] && [ "$got_pd" = "$want_pd" ]; then
  tap_ok "MPA Request recognised: rev 1, CRC asked, no markers, private data intact"
else
  tap_fail "MPA Request recognised: rev 1, CRC asked, no markers, private data intact" "frames: $n" \
    "private data: $got_pd (want $want_pd)"
fi

n=$(count_frames rev1 'iwarp_mpa.rep && iwarp_mpa.rej_flag == 0 && iwarp_mpa.marker_flag == 0')
want_pd=$(printf 'rdmasock demo: reply\0' | od -An -tx1 | tr -d ' \n')
got_pd=$(fields rev1 iwarp_mpa.privatedata | grep -v '^$' | sed -n 2p)
if [ "$n" -eq 1 ] && [ "$got_pd" = "$want_pd" ]; then
  tap_ok "MPA Reply recognised: accepted, no markers, private data intact"
else
  tap_fail "MPA Reply recognised: accepted, no markers, private data intact" "frames: $n" "private data: $got_pd"
fi

# The listener greets first (16 bytes, docs/wire-formats.md §5); the initiator's first bytes are the MPA Request.
greeting=$(printf 'RDMASOCK SOFTRC\001' | od -An -tx1 | tr -d ' \n')
mpa_req=$(printf 'MPA ID Req Frame' | od -An -tx1 | tr -d ' \n')
first=$("${TS[@]}" -r "$scratch/rev1.pcap" -Y "tcp.port == $port && tcp.len > 0" -T fields -e tcp.srcport \
          -e tcp.payload 2>/dev/null | head -n 2)
{ IFS=$'\t' read -r src1 data1; IFS=$'\t' read -r src2 data2; } <<<"$first"
if [ "$src1" = "$port" ] && [ "$data1" = "$greeting" ] && [ "$src2" != "$port" ] && [[ $data2 == "$mpa_req"* ]]; then
  tap_ok "listener greeting ($greeting) is the first payload, before the MPA Request"
else
  tap_fail "listener greeting is the first payload, before the MPA Request" "first payloads:" "$first"
fi

# Every FPDU's CRC: tshark prints "(Good CRC32)" or "(Bad CRC32, should be ...)" for each one it checks.
verbose=$("${TS[@]}" -r "$scratch/rev1.pcap" -Y "tcp.port == $port" -V 2>/dev/null)
fpdus=$(fields rev1 iwarp_mpa.crc_check | tr ',' '\n' | grep -c .)
good=$(grep -c 'CRC check: .*(Good CRC32)' <<<"$verbose")
bad=$(grep -c 'Bad CRC32' <<<"$verbose")
if [ "$fpdus" -ge 13 ] && [ "$good" -eq "$fpdus" ] && [ "$bad" -eq 0 ]; then
  tap_ok "all $fpdus FPDUs carry a good CRC32c (tshark verified each one)"
else
  tap_fail "every FPDU carries a good CRC32c" "FPDUs: $fpdus, good: $good, bad: $bad"
fi

opcodes=$(fields rev1 iwarp_rdma.opcode | tr ',' '\n' | grep -v '^$' | sort | uniq -c)
for pair in "0x03:Send" "0x05:Send with Solicited Event" "0x04:Send with Invalidate" "0x00:RDMA Write" \
            "0x01:RDMA Read Request" "0x02:RDMA Read Response" "0x07:Terminate"; do
  code=${pair%%:*}; name=${pair#*:}
  if grep -q " $code\$" <<<"$opcodes"; then tap_ok "RDMAP opcode $code ($name) on the wire"
  else tap_fail "RDMAP opcode $code ($name) on the wire" "opcodes seen:" "$opcodes"; fi
done

# Multi-FPDU messages: the 40000-byte Write and Read Response each span several FPDUs, L set only on the last.
w=$(fields rev1 iwarp_rdma.opcode iwarp_ddp.last_flag | awk -F'\t' '
  { n = split($1, op, ","); split($2, l, ",");
    for (i = 1; i <= n; i++) { if (op[i] == "0x00" || op[i] == "0x02") { k[op[i] "/" l[i]]++ } } }
  END { printf "%d %d %d %d", k["0x00/0"], k["0x00/1"], k["0x02/0"], k["0x02/1"] }')
read -r w_more w_last r_more r_last <<<"$w"
# The Write refused at the end is one more single-FPDU Write.
if [ "$w_more" -ge 1 ] && [ "$w_last" -eq 2 ] && [ "$r_more" -ge 1 ] && [ "$r_last" -eq 1 ]; then
  tap_ok "40000-byte Write and Read Response segmented: $w_more+1 and $r_more+1 FPDUs, L only on the last"
else
  tap_fail "40000-byte Write and Read Response segmented into FPDUs" "write more/last: $w_more/$w_last" \
    "read response more/last: $r_more/$r_last"
fi

term=$(fields rev1 iwarp_rdma.term_layer iwarp_rdma.term_etype_ddp iwarp_rdma.term_errcode_ddp_tagged \
         iwarp_rdma.term_hdrct_m iwarp_rdma.hdrct_d iwarp_ddp.qn | awk -F'\t' '$1 != ""')
if [ "$term" = $'0x01\t0x01\t0x00\t1\t1\t2' ]; then
  tap_ok "Terminate: layer DDP, Tagged Buffer Error, Invalid STag, with the terminated header (M, D), on QN 2"
else
  tap_fail "Terminate: layer DDP, Tagged Buffer Error, Invalid STag, M and D set, QN 2" "fields: $term"
fi

# The terminated header names the refused Write: tagged, opcode Write.
th=$(fields rev1 iwarp_rdma.term_ddp_h | grep -v '^$')
if [[ "$th" =~ ^[8c]140 ]]; then tap_ok "Terminate carries the refused RDMA Write's DDP header ($th)"
else tap_fail "Terminate carries the refused RDMA Write's DDP header" "term_ddp_h: $th"; fi

experts=$("${TS[@]}" -r "$scratch/rev1.pcap" -Y "tcp.port == $port" -q -z expert 2>/dev/null |
          grep -Ei 'IWARP|DDP|RDMA|Malformed' || true)
if [ -z "$experts" ]; then tap_ok "no iWARP expert warning or malformed packet in the rev 1 capture"
else tap_fail "no iWARP expert warning or malformed packet in the rev 1 capture" "$experts"; fi

# ---- MPA rev 2 (the default): tshark 4.0 warns about the revision, decodes the rest ----
RDMASOCK_SOFT_MPA_CRC=on RDMASOCK_SOFT_LOCAL_READ=off capture rev2
rc=$?
verbose=$("${TS[@]}" -r "$scratch/rev2.pcap" -Y "tcp.port == $port" -V 2>/dev/null)
fpdus=$(fields rev2 iwarp_mpa.crc_check | tr ',' '\n' | grep -c .)
good=$(grep -c 'CRC check: .*(Good CRC32)' <<<"$verbose")
experts=$("${TS[@]}" -r "$scratch/rev2.pcap" -Y "tcp.port == $port" -q -z expert 2>/dev/null |
          grep -Ei 'IWARP|DDP|RDMA|Malformed' || true)
unexpected=$(grep -Ev 'Res field is NOT set to zero|Rev field is NOT set to one' <<<"$experts" || true)
if [ $rc -eq 0 ] && [ "$fpdus" -ge 13 ] && [ "$good" -eq "$fpdus" ] && [ -z "$unexpected" ] &&
   [ "$(count_frames rev2 'iwarp_mpa.req && iwarp_mpa.rev == 2')" -eq 1 ]; then
  tap_ok "MPA rev 2: Request/Reply and all $fpdus FPDUs decode, good CRCs, only tshark's rev-1 warnings"
else
  tap_fail "MPA rev 2 capture decodes" "demo rc $rc, FPDUs $fpdus, good $good" "experts: $experts"
fi

# ---- the default on loopback: neither side asks for CRCs, every FPDU's CRC field is zero ----
capture nocrc --mpa-rev 1
rc=$?
asked=$(count_frames nocrc 'iwarp_mpa.crc_flag == 1')
flags=$(count_frames nocrc '(iwarp_mpa.req || iwarp_mpa.rep) && iwarp_mpa.crc_flag == 0')
crcs=$(fields nocrc iwarp_mpa.crc | tr ',' '\n' | grep -v '^$' | sort | uniq -c)
nfpdu=$(fields nocrc iwarp_mpa.crc | tr ',' '\n' | grep -c .)
experts=$("${TS[@]}" -r "$scratch/nocrc.pcap" -Y "tcp.port == $port" -q -z expert 2>/dev/null |
          grep -Ei 'IWARP|DDP|RDMA|Malformed' || true)
if [ $rc -eq 0 ] && grep -q '^demo ok$' "$scratch/nocrc.out" && [ "$asked" -eq 0 ] && [ "$flags" -eq 2 ] &&
   [ "$nfpdu" -ge 11 ] && [ "$(grep -vc ' 0x00000000$' <<<"$crcs")" -eq 0 ] && [ -z "$experts" ]; then
  tap_ok "default on loopback: Request and Reply ask for no CRC, all $nfpdu FPDUs carry a zero CRC field and decode"
else
  tap_fail "default on loopback: no CRC asked, zero CRC fields" "demo rc $rc, C set in $asked frames," \
    "Request/Reply without C: $flags, FPDUs: $nfpdu, CRC values:" "$crcs" "experts: $experts"
fi

# ---- the default on loopback: the 40000-byte READ is placed by one copy, a single empty Read Response marks it ----
rr=$(fields nocrc iwarp_rdma.opcode iwarp_ddp.last_flag iwarp_mpa.ulpdulength | awk -F'\t' '
  { n = split($1, op, ","); split($2, l, ","); split($3, u, ",");
    for (i = 1; i <= n; i++) if (op[i] == "0x02") { c++; last = l[i]; len = u[i] } }
  END { printf "%d %s %s", c, last, len }')
read -r r_n r_l r_len <<<"$rr"
if grep -q '^demo ok$' "$scratch/nocrc.out" && [ "$r_n" = 1 ] && [ "$r_l" = 1 ] && [ "$r_len" = 14 ]; then
  tap_ok "default on loopback: the READ's data placed locally, one empty Read Response with L (ULPDU 14 bytes) marks it"
else
  tap_fail "default on loopback: one empty Read Response marks the locally placed READ" \
    "Read Response FPDUs: $r_n, L of the last: $r_l, its ULPDU length: $r_len"
fi
