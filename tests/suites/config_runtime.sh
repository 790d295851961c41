#!/usr/bin/env bash
# A broken configuration never breaks the host program: with librdmasock.so preloaded and a bad rule file or
# environment value, a real program (socat) still exchanges data correctly over kernel TCP, the error is logged
# exactly once with file:line:column, and the statistics area says why every socket stays on the kernel.
source "$RS_TOP/tests/lib/tap.sh"
scratch=$(mktemp -d)
cleanup() { [ -n "${server:-}" ] && kill "$server" 2>/dev/null; rm -rf "$scratch"; }
trap cleanup EXIT
command -v socat >/dev/null || { tap_plan 1; tap_skip "config runtime checks" "socat not installed"; exit 0; }

port=$(( 20000 + RANDOM % 20000 ))
# A plain echo server without rdmasock: the peer that must never see anything unusual.
socat TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork EXEC:cat >/dev/null 2>&1 &
server=$!
for _ in $(seq 50); do socat /dev/null TCP:127.0.0.1:$port 2>/dev/null && break; sleep 0.1; done

head -c 65536 /dev/urandom > "$scratch/payload"
want=$(sha256sum < "$scratch/payload")

printf 'use rdma tcp client 10.0.0.0/8:7000\nusee both tcp server *:80\n' > "$scratch/typo.conf"
printf 'use rdma tcp client 10.0.0.0/8:7000\n\x00\x01\xff\xfe garbage\n' > "$scratch/binary.conf"
printf 'use rdma tcp server 10.1.2.0/33\n' > "$scratch/prefix.conf"
printf 'use both tcp client *:9000-8000\n' > "$scratch/range.conf"
printf 'qos gold sl=3\nuse both tcp client *:* qos=gold\n' > "$scratch/good.conf"

# run_client NAME EXPECTED_LOG_REGEX ENV...: echo the payload through the server with rdmasock preloaded.
run_client() {
  local name=$1 expect=$2; shift 2
  local got
  got=$(env "$@" LD_PRELOAD="$RS_LIB" socat -t 5 - TCP:127.0.0.1:$port < "$scratch/payload" 2>"$scratch/$name.err" | sha256sum)
  local errors
  errors=$(grep -c 'rdmasock\[[0-9]*\]: ERROR' "$scratch/$name.err")
  if [ "$got" != "$want" ]; then
    tap_fail "$name: data arrives intact over the kernel" "sha256 mismatch" "$(head -n 5 "$scratch/$name.err")"
  elif [ -z "$expect" ]; then
    if [ "$errors" -eq 0 ]; then tap_ok "$name: 64 KiB echoed intact, no error logged"
    else tap_fail "$name: no error expected" "$(cat "$scratch/$name.err")"; fi
  elif [ "$errors" -eq 1 ] && grep -Eq "$expect" "$scratch/$name.err"; then
    tap_ok "$name: 64 KiB echoed intact; one error: $(grep ERROR "$scratch/$name.err" | head -n 1 | cut -c1-110)"
  else
    tap_fail "$name: exactly one error matching /$expect/" "$(cat "$scratch/$name.err")"
  fi
}

run_client "missing explicit file" "nonexistent\.conf.*No such file.*stays on the kernel" RDMASOCK_CONF=$scratch/nonexistent.conf
run_client "unknown keyword" "typo\.conf:2:1: .*usee" RDMASOCK_CONF=$scratch/typo.conf
run_client "binary garbage" "binary\.conf:2:1: .*0x00" RDMASOCK_CONF=$scratch/binary.conf
run_client "bad prefix" "prefix\.conf:1:30: .*33" RDMASOCK_CONF=$scratch/prefix.conf
run_client "reversed port range" "range\.conf:1:[0-9]+: .*revers" RDMASOCK_CONF=$scratch/range.conf
run_client "directory as config" "is a directory|Is a directory" RDMASOCK_CONF=$scratch
run_client "bad RDMASOCK_TRANSPORT" "RDMASOCK_TRANSPORT='warp'" RDMASOCK_CONF=$scratch/good.conf RDMASOCK_TRANSPORT=warp
run_client "bad RDMASOCK_LOG" "RDMASOCK_LOG" RDMASOCK_CONF=$scratch/good.conf RDMASOCK_LOG=loud
run_client "valid config" "" RDMASOCK_CONF=$scratch/good.conf
run_client "no config at all" "" RDMASOCK_CONF=

# The statistics area of a running process explains the decision.
RDMASOCK_CONF=$scratch/prefix.conf LD_PRELOAD="$RS_LIB" sleep 5 2>/dev/null &
sleeper=$!
json=""
# A reader that comes before the library has read the file is told "loading", never "none".
for _ in $(seq 50); do
  json=$("$RS_TOOL" stat --json "$sleeper" 2>/dev/null) && ! grep -q '"status": *"loading"' <<<"$json" && break
  if grep -q '"status": *"none"' <<<"$json"; then break; fi
  sleep 0.1
done
kill $sleeper 2>/dev/null; wait $sleeper 2>/dev/null
if grep -q '"status": *"error"' <<<"$json" && grep -q '1:30' <<<"$json"; then
  tap_ok "rdmasock stat shows the config error of a running process"
else
  tap_fail "rdmasock stat shows the config error" "$json"
fi
# Killed processes leave their area behind; --gc removes it.
if [ ! -e /dev/shm/rdmasock.$(id -u).$sleeper ] || "$RS_TOOL" stat --gc 2>&1 | grep -q "rdmasock.$(id -u).$sleeper"; then
  tap_ok "the area of a killed process is removed (at exit or by stat --gc)"
else
  tap_fail "stale area removed by stat --gc" "$(ls /dev/shm)"
fi
# check-conf exits 1 with the same position, 0 with the parsed rules.
if ! "$RS_TOOL" check-conf "$scratch/typo.conf" 2>"$scratch/cc.err" && grep -q 'typo.conf:2:1:' "$scratch/cc.err" \
   && "$RS_TOOL" check-conf "$scratch/good.conf" | grep -q '^use both tcp client'; then
  tap_ok "rdmasock check-conf: exit 1 with file:line:col on error, exit 0 with canonical rules"
else
  tap_fail "rdmasock check-conf" "$(cat "$scratch/cc.err")"
fi
"$RS_TOOL" check-conf "$RS_TOP/conf/rdmasock.conf" >/dev/null 2>"$scratch/ex.err" \
  && tap_ok "the shipped conf/rdmasock.conf is valid" || tap_fail "conf/rdmasock.conf is valid" "$(cat "$scratch/ex.err")"

# A rule's stream options reach the SDP connections it converts, over the software RNIC (tests/helpers/rulecheck:
# one process writes 24 MiB to itself in nonblocking 256 KiB writes and checks every byte, then asks the writer's
# socket for its options and statistics). lend_ring= on a rule wins over RDMASOCK_LEND_RING either way; without it
# the environment decides.
rulecheck=$RS_BUILD/tests/helpers/rulecheck
# check_rule NAME RULE_OPTIONS WANT_LEND WANT_LENDS(yes|no) ENV...
check_rule() {
  local name=$1 opts=$2 want_lend=$3 want_lends=$4 rport out; shift 4
  rport=$(( 20000 + RANDOM % 20000 ))
  printf 'use rdma tcp any 127.0.0.1:%d %s\n' "$rport" "$opts" > "$scratch/rule.conf"
  out=$(env "$@" RDMASOCK_CONF="$scratch/rule.conf" RDMASOCK_TRANSPORT=soft LD_PRELOAD="$RS_LIB" \
        timeout 120 "$rulecheck" "$rport" 24 2>"$scratch/rule.err")
  local status=$? lends
  lends=$(sed -n 's/.* ring_lends=\([0-9]*\).*/\1/p' <<<"$out")
  if [ "$status" -eq 0 ] && grep -q '^intact=yes ' <<<"$out" && grep -q " lend_ring=$want_lend " <<<"$out" \
     && grep -q " threshold=65536 " <<<"$out" \
     && { { [ "$want_lends" = yes ] && [ "${lends:-0}" -gt 0 ]; } || { [ "$want_lends" = no ] && [ "${lends:-1}" -eq 0 ]; }; }; then
    tap_ok "rule '$opts' ($*): 24 MiB intact over SDP; $out"
  else
    tap_fail "rule '$opts' ($*): lend_ring=$want_lend, ring lent: $want_lends, 24 MiB intact" \
      "exit $status: $out" "$(tail -n 5 "$scratch/rule.err")"
  fi
}
if [ -x "$rulecheck" ]; then
  check_rule "lend on" "zcopy_threshold=64k lend_ring=on" 1 yes RDMASOCK_LEND_RING=off
  check_rule "lend off" "zcopy_threshold=64k lend_ring=off" 0 no RDMASOCK_LEND_RING=on
  check_rule "lend from env" "zcopy_threshold=64k" 1 yes RDMASOCK_LEND_RING=on
else
  tap_fail "rule options reach SDP sockets" "missing $rulecheck (make tests)"
fi
tap_done_plan
