#!/usr/bin/env bash
# bench/dgram_netem.sh [OUTDIR]: Grant 2012 figures 6.6 and 6.7 on a real lossy link: iperf3 -u from one soft-RoCE
# VM to another (tools/vm/jobs/dgram_netem.sh), kernel UDP next to datagram-iWARP send/recv and Write-Record over
# verbs (rdmasock run), with `tc netem loss` of 0, 0.1, 0.5, 1 and 5% on the sender's link, for datagrams of
# 1,024, 8,192 and 65,000 bytes at a fixed offered load. Writes dgram-netem.csv, dgram-netem.md and
# dgram-netem.png to OUTDIR (default build/bench-results). One VM boot, a few minutes under TCG.
#   Environment: RS_NETEM_SIZES, RS_NETEM_LOSS, RS_NETEM_RATE (8M), RS_NETEM_SECONDS (3), passed to the job;
#   DGRAM_NETEM_SUMMARY_ONLY=1 redoes the summary and plot from OUTDIR/dgram-netem.csv without running the VMs.
DG_NAME=dgram_netem
# shellcheck source=dgram_common.sh
source "$(dirname "$0")/dgram_common.sh"
dg_need "$RS_BUILD/bin/rdmasock" "make all"
dg_need_cmd iperf3 iperf3
dg_need_cmd jq jq
if [[ ${DGRAM_NETEM_SUMMARY_ONLY:-0} != 1 ]]; then
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
env_args=()
for name in RS_NETEM_SIZES RS_NETEM_LOSS RS_NETEM_RATE RS_NETEM_SECONDS; do
  [[ -n ${!name+x} ]] && env_args+=(--env "$name=${!name}")
done
dg_log "two VMs, iperf3 -u b -> a under netem loss (load $(dg_load))"
"$RS_TOP/tools/vm/vm" run --pair --timeout 1800 --out "$run" "${env_args[@]}" \
  -- "$RS_TOP/tools/vm/jobs/dgram_netem.sh" >&2 || dg_die "the VM pair failed (see above)"
[[ -s $run/b.netem.csv ]] || dg_die "no results from the VMs"
tr -d '"' < "$run/b.netem.csv" > "$OUT/dgram-netem.csv"
# The RDMA paths must really have carried the data: the servers' RDMA receive counters.
for path in sendrecv wrecord; do
  rx=$(jq -r '(if type == "array" then .[0] else . end).counters.rdma_bytes_rx.udp // 0' "$run/a.$path.stat.json" 2>/dev/null || echo 0)
  [[ $rx =~ ^[0-9]+$ && $rx -gt 1000000 ]] || dg_die "$path: the server received $rx bytes over RDMA: the stream did not go over datagram-iWARP"
  echo "$path $rx" >> "$OUT/dgram-netem.rdma-bytes"
done
# What iperf3 said about each point (a failed point's error is there).
mkdir -p "$OUT/dgram-netem-json"
cp "$run"/netem.*.json "$run"/netem.*.json.err "$OUT/dgram-netem-json/" 2>/dev/null || true
# Runs repeated because iperf3's own UDP set-up datagram was lost (tools/vm/jobs/dgram_netem.sh).
cp "$run/b.netem-retries.txt" "$OUT/dgram-netem-retries.txt" 2>/dev/null || rm -f "$OUT/dgram-netem-retries.txt"
fi

# Summary: goodput under loss relative to the same path without loss, beside the independent-loss model: a
# datagram survives only if every packet of it does, (1-p)^k with k its packets on the wire (IP fragments of
# 1,480 bytes for kernel UDP; rxe's 1,024-byte MTU less the 40-byte datagram header for datagram-iWARP).
awk -F, 'NR > 1 { key = $1 "," $2; g[key "," $3] = $8; sent[key "," $3] = $5; paths[$1]; sizes[$2]; loss[$3] }
  function ceil(x) { return x == int(x) ? x : int(x) + 1 }
  END {
    print "# Datagram goodput under link loss (two soft-RoCE VMs, tc netem on the sender)"
    print ""
    print "iperf3 -u b -> a at a fixed offered load; goodput = offered x (1 - receiver loss). Ratio: goodput / goodput of"
    print "the same path at 0% loss; model: (1-p)^k, k = packets per datagram on the wire. TCG: only ratios count."
    print ""
    print "| path | size (B) | loss % | goodput Mbit/s | / lossless | model |"
    print "|---|---|---|---|---|---|"
    n = split("kernel sendrecv wrecord", P, " ")
    m = split("1024 8192 65000", S, " ")
    q = split("0 0.1 0.5 1 5", L, " ")
    for (i = 1; i <= n; i++) for (j = 1; j <= m; j++) for (l = 1; l <= q; l++) {
      key = P[i] "," S[j]; if (!((key "," L[l]) in g)) continue
      base = g[key ",0"]; v = g[key "," L[l]]
      k = P[i] == "kernel" ? ceil((S[j] + 8) / 1480) : ceil(S[j] / 984)
      r = (base > 0) ? sprintf("%.3f", v / base) : "n/a"
      if (sent[key "," L[l]] == 0) {
        printf "| %s | %s | %s | run failed (dgram-netem-json) | | %.3f |\n", P[i], S[j], L[l], (1 - L[l] / 100) ^ k
        continue
      }
      printf "| %s | %s | %s | %.2f | %s | %.3f |\n", P[i], S[j], L[l], v, r, (1 - L[l] / 100) ^ k
    }
  }' "$OUT/dgram-netem.csv" > "$OUT/dgram-netem.md"
if [[ -s $OUT/dgram-netem-retries.txt ]]; then
  { echo
    echo "Runs repeated because netem dropped iperf3's own UDP set-up datagram (it has no retry, so the client fails"
    echo "before sending data, on any path): $(tr -d '"' < "$OUT/dgram-netem-retries.txt" | paste -sd ';' -)."
  } >> "$OUT/dgram-netem.md"
fi
if command -v gnuplot >/dev/null; then
  gnuplot -e "out='$OUT/dgram-netem.png'; csv='$OUT/dgram-netem.csv'" "$RS_TOP/bench/plot/dgram-netem.gp" ||
    dg_die "gnuplot failed"
fi
cat "$OUT/dgram-netem.md"
