#!/usr/bin/env bash
# Datagram-iWARP on the wire, checked by a decoder nobody here wrote: tshark's iwarp_ddp_rdmap dissector, attached
# to UDP ports with the two-line Lua shim of docs/wire-formats.md §4. The soft RNIC's datagrams (SEND, SEND with
# SE, a segmented SEND, Write-Record, Read Request/Response and a Terminate) must decode field by field as the
# documented layout says.
source "$RS_TOP/tests/lib/tap.sh"
demo=$RS_BUILD/tests/helpers/rnic_ud_demo
for tool in tcpdump tshark; do
  command -v $tool >/dev/null || { tap_plan 1; tap_skip "datagram wire decode" "$tool not installed"; exit 0; }
done
[ -x "$demo" ] || { tap_plan 1; tap_fail "rnic_ud_demo built" "missing $demo"; exit 1; }

scratch=$(mktemp -d); trap 'kill $dump 2>/dev/null; rm -rf "$scratch"' EXIT
a=$(( 30000 + RANDOM % 10000 )); b=$((a + 1))
cat > "$scratch/ddp_udp.lua" <<LUA
local ddp = Dissector.get("iwarp_ddp_rdmap")
DissectorTable.get("udp.port"):add($a, ddp)
DissectorTable.get("udp.port"):add($b, ddp)
LUA

tcpdump -i lo --immediate-mode -B 32768 -U -w "$scratch/ud.pcap" "udp and (port $a or port $b)" 2>"$scratch/tcpdump.err" &
dump=$!
for _ in $(seq 100); do grep -q 'listening on' "$scratch/tcpdump.err" && break; sleep 0.05; done
if "$demo" $a $b >"$scratch/demo.out" 2>&1; then demo_ok=1; else demo_ok=0; fi
sleep 0.3; kill -INT $dump; wait $dump 2>/dev/null

tap_plan 8
[ $demo_ok = 1 ] && tap_ok "demo: every datagram operation completed with intact data" \
  || tap_fail "demo completed" "$(cat "$scratch/demo.out")"

fields() {
  tshark -r "$scratch/ud.pcap" -X lua_script:"$scratch/ddp_udp.lua" --disable-heuristic rpcrdma_iwarp \
    -T fields -E separator=, "$@" 2>"$scratch/tshark.err"
}
# One line per datagram: opcode, tagged, last, stag, to, qn, msn, mo, read size, term layer/etype/errcode.
fields -e iwarp_rdma.opcode -e iwarp_ddp.tagged_flag -e iwarp_ddp.last_flag -e iwarp_ddp.stag \
  -e iwarp_ddp.tagged_offset -e iwarp_ddp.qn -e iwarp_ddp.msn -e iwarp_ddp.mo -e iwarp_rdma.rdmardsz \
  -e iwarp_rdma.sinkstag -e iwarp_rdma.term_layer -e iwarp_rdma.term_etype_rdma -e iwarp_rdma.term_errcode_rdma \
  > "$scratch/f.csv"
total=$(fields -e frame.number | wc -l)
decoded=$(awk -F, '$1 != ""' "$scratch/f.csv" | wc -l)
malformed=$(tshark -r "$scratch/ud.pcap" -X lua_script:"$scratch/ddp_udp.lua" --disable-heuristic rpcrdma_iwarp \
  -Y _ws.malformed 2>/dev/null | wc -l)
if [ "$total" -gt 0 ] && [ "$decoded" -eq "$total" ] && [ "$malformed" -eq 0 ]; then
  tap_ok "all $total datagrams decode as DDP/RDMAP, none malformed"
else
  tap_fail "every datagram decodes" "total $total decoded $decoded malformed $malformed" "$(head -c 600 "$scratch/tshark.err")"
fi

# tshark prints hex fields as 0x..; rewrite them as decimal (mawk has no strtonum) and put the opcode first again.
awk -F, 'function num(v,   i, n, c) { if (v !~ /^0x/) return v; n = 0
           for (i = 3; i <= length(v); i++) { c = index("0123456789abcdef", tolower(substr(v, i, 1))) - 1; n = n * 16 + c }
           return n }
         { out = num($1); for (i = 1; i <= NF; i++) out = out "," num($i); print out }' "$scratch/f.csv" > "$scratch/g.csv"
count() { awk -F, -v op="$1" '$1 == op' "$scratch/g.csv" | wc -l; }

sends=$(awk -F, '$1 == 3 && $3 == 0 && $7 == 0' "$scratch/g.csv" | wc -l)
seg=$(awk -F, '$1 == 3 && $9 == 64512 && $4 == 1' "$scratch/g.csv" | wc -l)
if [ "$(count 3)" -eq 3 ] && [ "$sends" -eq 3 ] && [ "$seg" -eq 1 ]; then
  tap_ok "SEND: untagged QN 0; the 100,000-byte message is two segments, the last at MO 64512 with L set"
else
  tap_fail "SEND datagrams" "$(grep '^3,' "$scratch/g.csv")"
fi
[ "$(count 5)" -eq 1 ] && tap_ok "SEND with solicited event: opcode 0x5, once" \
  || tap_fail "SEND with SE" "$(cat "$scratch/g.csv")"

rec=$(awk -F, '$1 == 13 && $3 == 1 && $4 == 1 && $5 != "" && $6 != ""' "$scratch/g.csv" | wc -l)
[ "$rec" -eq 1 ] && tap_ok "Write-Record: opcode 0xD, tagged, single last segment, with STag and tagged offset" \
  || tap_fail "Write-Record datagram" "$(grep '^13,' "$scratch/g.csv")" "$(cat "$scratch/g.csv")"

reqs=$(awk -F, '$1 == 1 && $7 == 1 && ($10 == 2000 || $10 == 100)' "$scratch/g.csv" | wc -l)
[ "$reqs" -eq 2 ] && tap_ok "Read Request: untagged QN 1 with the asked sizes (2000 and 100 bytes)" \
  || tap_fail "Read Requests" "$(grep '^1,' "$scratch/g.csv")"

# The response is tagged with the sink STag (the read tag) of the 2000-byte request.
tag=$(awk -F, '$1 == 1 && $10 == 2000 { print $11 }' "$scratch/g.csv")
resp=$(awk -F, -v t="$tag" '$1 == 2 && $3 == 1 && $4 == 1 && $5 == t' "$scratch/g.csv" | wc -l)
[ -n "$tag" ] && [ "$resp" -eq 1 ] && tap_ok "Read Response: tagged, last, carries the request's sink STag $tag" \
  || tap_fail "Read Response" "tag=$tag" "$(grep -E '^(1|2),' "$scratch/g.csv")"

term=$(awk -F, '$1 == 7 && $7 == 2 && $12 == 0 && $13 == 1 && $14 == 0' "$scratch/g.csv" | wc -l)
[ "$term" -eq 1 ] && tap_ok "Terminate: QN 2, layer RDMAP, etype remote protection, code invalid STag" \
  || tap_fail "Terminate for the bad STag" "$(grep '^7,' "$scratch/g.csv")"
