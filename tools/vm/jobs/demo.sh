#!/bin/bash
# The `make demo` job (through tools/vm/demo): real RDMA exchanges on the
# guest's soft-RoCE device, explained as they run. Fails unless rping's data
# comes back verified, ib_send_lat prints its result row, and an unmodified
# redis-server/redis-benchmark pair runs over rdmasock's verbs transport on
# rxe0 with its data intact and `rdmasock stat` showing the RDMA path
# (tools/demo redis, the same run the host half of the demo makes).

# shellcheck source=../lib.sh
. "$RS_VM_LIB" || exit 1
dev=$RS_VM_RDMA_DEV
addr=$RS_VM_ADDR
failed=0

field() { awk -v key="$1:" '$1 == key { $1 = ""; sub(/^ +/, ""); print; exit }' "$2"; }

ibv_devinfo -d "$dev" > "$RS_VM_OUT/devinfo.txt" 2>&1
# The RoCEv2 GID is the IPv4-mapped one: "GID[  1]:  ::ffff:198.18.0.1, RoCE v2".
gid=$(ibv_devinfo -v -d "$dev" 2>/dev/null |
      awk '/GID\[ *[0-9]+\]:/ && /ffff:/ && /v2/ { sub(/.*\][ \t]*:[ \t]*/, ""); sub(/,.*/, ""); print; exit }')
echo "guest kernel $(uname -r), RDMA driver rdma_rxe (soft-RoCE), $(rdma link show "$dev/1" | sed 's/^link //')"
echo "device $dev: transport $(field transport "$RS_VM_OUT/devinfo.txt") (RoCE: the IB transport in UDP/IP), port $(field state "$RS_VM_OUT/devinfo.txt"), link layer $(field link_layer "$RS_VM_OUT/devinfo.txt"), RoCEv2 GID ${gid:-?} ($addr)"
echo

echo "1) rping: RC queue pair set up by rdma_cm on $addr:7174, 10 round trips of SEND + RDMA READ + RDMA WRITE"
rs_vm_bg demo_rping_server timeout 60 rping -s -a "$addr" -C 10 -v
if rs_vm_wait_listen 7174 30 &&
   timeout 60 rping -c -a "$addr" -C 10 -v -V > "$RS_VM_OUT/rping.txt" 2>&1 &&
   rs_vm_wait demo_rping_server 30 &&
   verdict=$(rs_vm_rping_verified "$RS_VM_OUT/rping.txt" 10); then
    grep '^ping data:' "$RS_VM_OUT/rping.txt" | sed -n '1p;$p' | sed 's/^/   /'
    echo "   -> 10/10 payloads came back intact (checked by rping -V and by sequence/shift here)"
else
    echo "   -> FAILED: ${verdict:-see below}"
    sed 's/^/   | /' "$RS_VM_OUT/rping.txt"
    failed=1
fi
echo

echo "2) ib_send_lat (perftest): 1000 RC sends of 2 bytes on $dev, connected by rdma_cm"
if rs_vm_serve send_lat 18515 ib_send_lat -d "$dev" -R -n 1000 -p 18515 -- \
       ib_send_lat -d "$dev" -R -n 1000 -p 18515 "$addr" > /dev/null &&
   [[ $(cat "$RS_VM_OUT/send_lat_server.rc") == 0 ]] &&
   row=$(awk '$1 == 2 && $2 == 1000 && $5 > 0 && NF >= 8 { print; exit }' "$RS_VM_OUT/send_lat.txt") &&
   [[ -n "$row" ]]; then
    grep -m1 '#bytes' "$RS_VM_OUT/send_lat.txt" | sed 's/^ */   /'
    echo "$row" | awk '{ $1 = $1; print "   " $0 }'
    read -r _ _ t_min _ t_typical t_avg _ <<< "$row"
    echo "   -> typical latency ${t_typical} us (min ${t_min}, avg ${t_avg}); emulated CPUs on a shared host,"
    echo "      so this shows the exchange ran on $dev, not what RDMA hardware would do"
else
    echo "   -> FAILED"
    sed 's/^/   | /' "$RS_VM_OUT/send_lat.txt"
    failed=1
fi
echo

echo "3) redis-server and redis-benchmark, unmodified, under rdmasock run --transport verbs: SDP over an RC QP on $dev"
if [[ -x $RS_TOOL || -x $RS_BUILD/bin/rdmasock ]]; then
    if "$RS_TOP/tools/demo" redis --transport verbs --addr "$addr" --requests "${RS_DEMO_VM_REQUESTS:-5000}" \
            --out "$RS_VM_OUT/redis-verbs"; then
        echo "   -> redis over rdmasock on $dev: benchmark done, 1 MiB value intact, connections on the RDMA path"
    else
        echo "   -> FAILED (files in $RS_VM_OUT/redis-verbs)"
        failed=1
    fi
else
    echo "   -> FAILED: rdmasock is not built (make all)"
    failed=1
fi
echo
exit $failed
