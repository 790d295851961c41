#!/usr/bin/env bash
# Interception core (issue 6 items 1, 2, 4, 5): the socket calls of an unmodified program keep the kernel's
# semantics when rdmasock converts its TCP sockets to SDP on the software RNIC, a both-mode listener serves plain
# and rdmasock clients on one port, a client falls back to kernel TCP when the peer does not run rdmasock (and a
# stranger on the RNIC's mapped port receives nothing), an rdma-only rule gets ECONNREFUSED, and the statistics
# area records each path and reason. tests/helpers/sockcheck.c does the calls and checks the data.
source "$RS_TOP/tests/lib/tap.sh"
bin="$RS_BUILD/tests/helpers/sockcheck"
scratch=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$scratch"; }
trap cleanup EXIT
[ -x "$bin" ] || { tap_plan 1; tap_fail "sockcheck built" "missing $bin"; exit 1; }

base=$(( 10000 + RANDOM % 6000 ))   # image P + 16384 below the ephemeral range
offset=16384
export RDMASOCK_TRANSPORT=soft RDMASOCK_SOFT_PORT_OFFSET=$offset
cat > "$scratch/both.conf" <<EOF
use both tcp any 127.0.0.1:$base-$((base + 40))
use both tcp any [::1]:$base-$((base + 40))
use both tcp any *:$base-$((base + 40))
EOF
printf 'use rdma tcp any 127.0.0.1:%s\n' "$((base + 30))" > "$scratch/rdma.conf"

# count_ok FILE: number of "ok -" lines; fails on any "not ok".
check_tap_output() {
    local desc=$1 file=$2 min=$3
    local ok bad
    ok=$(grep -c '^ok - ' "$file"); bad=$(grep -c '^not ok' "$file")
    if [ "$bad" -eq 0 ] && [ "$ok" -ge "$min" ]; then tap_ok "$desc ($ok checks)"
    else tap_fail "$desc" "$(grep '^not ok' "$file")" "$(tail -n 5 "$file")"; fi
}

# stat_json PID: the process's statistics area as JSON; child_of PID: the program `timeout` runs.
stat_json() { "$RS_TOOL" stat --json "$1" 2>/dev/null; }
child_of() { pgrep -P "$1" | head -n 1; }

wait_line() {   # wait_line FILE TEXT: until TEXT appears in FILE (5 s)
    for _ in $(seq 100); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
    return 1
}

# 1-2. The same program without and with rdmasock.
timeout 60 "$bin" local "$base" > "$scratch/kernel.out" 2>&1
check_tap_output "sockcheck on the kernel (control)" "$scratch/kernel.out" 50
RDMASOCK_CONF="$scratch/both.conf" LD_PRELOAD="$RS_LIB" timeout 60 "$bin" local "$((base + 10))" > "$scratch/sdp.out" 2>&1
check_tap_output "sockcheck with every TCP socket on SDP" "$scratch/sdp.out" 50

# 3-5. A both-mode listener under rdmasock serves a plain client and an rdmasock client on one port.
port=$((base + 20))
timeout 30 env RDMASOCK_CONF="$scratch/both.conf" LD_PRELOAD="$RS_LIB" "$bin" serve "$port" 3 > "$scratch/serve.out" 2>&1 &
server=$!; pids+=("$server")
wait_line "$scratch/serve.out" listening
tap_check "plain client (no rdmasock) served by the both-mode listener" timeout 20 "$bin" client 127.0.0.1 "$port" ok
tap_check "rdmasock client served over SDP on the same port" \
    env RDMASOCK_CONF="$scratch/both.conf" LD_PRELOAD="$RS_LIB" timeout 20 "$bin" client 127.0.0.1 "$port" ok
json=$(stat_json "$(child_of "$server")")
if python3 - "$json" <<'EOF'
import json, sys
a = json.loads(sys.argv[1])["counters"]
assert a["rdma_bytes_rx"]["tcp"] >= 1 << 20, a      # the rdmasock client's 1 MiB came over SDP
assert a["rdma_bytes_rx"]["tcp"] < 2 << 20, a       # the plain client's did not
assert a["decisions"].get("RULE_RDMA", 0) >= 2, a   # listener + accepted connection
EOF
then tap_ok "statistics: 1 MiB over SDP, the plain client's bytes on the kernel"
else tap_fail "statistics of the both-mode listener" "$json"; fi
kill "$server" 2>/dev/null

# 6-8. Fallback: the server does not run rdmasock; a stranger listens on the RNIC's mapped port.
port=$((base + 25))
timeout 30 "$bin" serve "$port" 1 > "$scratch/plain.out" 2>&1 &
pids+=("$!")
wait_line "$scratch/plain.out" listening
mapped=$(( (port + offset) % 65536 ))
# The stranger accepts one connection and writes whatever it receives to a file.
socat -u TCP-LISTEN:$mapped,bind=127.0.0.1,reuseaddr OPEN:"$scratch/stranger.bin",creat,trunc 2>/dev/null &
pids+=("$!")
for _ in $(seq 100); do ss -ltn "sport = :$mapped" 2>/dev/null | grep -q LISTEN && break; sleep 0.05; done
timeout 20 env RDMASOCK_CONF="$scratch/both.conf" LD_PRELOAD="$RS_LIB" "$bin" client 127.0.0.1 "$port" ok 2 \
    > "$scratch/fb.out" 2>&1 &
client=$!; pids+=("$client")
if wait_line "$scratch/fb.out" connected && ! grep -q '^not ok' "$scratch/fb.out"; then
    tap_ok "client falls back to kernel TCP, 1 MiB echoed intact"
else
    tap_fail "client falls back to kernel TCP" "$(cat "$scratch/fb.out")"
fi
json=$(stat_json "$(child_of "$client")")
if python3 - "$json" <<'EOF'
import json, sys
area = json.loads(sys.argv[1])
socks = [s for s in area["sockets"] if s["role"] == "client"]
assert socks and socks[0]["path"] == "fallback", socks
assert socks[0]["reason"] in ("PEER_NOT_RDMASOCK", "PEER_UNREACHABLE"), socks
EOF
then tap_ok "statistics: path fallback, reason peer not rdmasock"
else tap_fail "statistics of the fallback client" "$json"; fi
wait "$client" 2>/dev/null
size=$(stat -c %s "$scratch/stranger.bin" 2>/dev/null || echo missing)
if [ "$size" = 0 ]; then tap_ok "the stranger on the mapped port received 0 bytes"
else tap_fail "the stranger on the mapped port received 0 bytes" "size: $size"; fi

# 9. An rdma-only rule does not fall back: ECONNREFUSED when nobody runs rdmasock there.
port=$((base + 30))
timeout 30 "$bin" serve "$port" 1 > "$scratch/plain2.out" 2>&1 &
pids+=("$!")
wait_line "$scratch/plain2.out" listening
tap_check "rdma-only rule: connect refused, no fallback" \
    env RDMASOCK_CONF="$scratch/rdma.conf" LD_PRELOAD="$RS_LIB" timeout 20 "$bin" client 127.0.0.1 "$port" refused

# 10. A connection closed by the thread that moved its data lets go at once: its statistics slot is gone while the
#     process lives on (the thread's cache of connections, io_calls.c, drops it on close).
port=$((base + 35))
timeout 30 env RDMASOCK_CONF="$scratch/both.conf" LD_PRELOAD="$RS_LIB" "$bin" serve "$port" 1 > "$scratch/serve10.out" 2>&1 &
pids+=("$!")
wait_line "$scratch/serve10.out" listening
timeout 20 env RDMASOCK_CONF="$scratch/both.conf" LD_PRELOAD="$RS_LIB" python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', $port))
for i in range(5):
    s.sendall(bytes([i]) * 64)
    d = b''
    while len(d) < 64:
        d += s.recv(64 - len(d))
    assert d == bytes([i]) * 64, d
s.close()
print('closed', flush=True)
time.sleep(3)
" > "$scratch/close10.out" 2>&1 &
client=$!; pids+=("$client")
if wait_line "$scratch/close10.out" closed; then
    json=$(stat_json "$(child_of "$client")")
    if python3 - "$json" <<'EOF'
import json, sys
area = json.loads(sys.argv[1])
assert area["counters"]["rdma_bytes_rx"]["tcp"] == 320, area["counters"]
assert not [s for s in area["sockets"] if s["proto"] == "tcp"], area["sockets"]
EOF
    then tap_ok "a connection closed by the thread that used it leaves no socket behind (320 bytes echoed over SDP)"
    else tap_fail "a connection closed by the thread that used it leaves no socket behind" "$json"; fi
else
    tap_fail "a connection closed by the thread that used it leaves no socket behind" "$(cat "$scratch/close10.out")"
fi
wait "$client" 2>/dev/null
tap_done_plan
