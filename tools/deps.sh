#!/usr/bin/env bash
# Installs the Debian 12 packages a make target needs. As root it runs apt-get itself; otherwise it prints the
# exact command to run and fails, so nothing half-installed is left behind.
#   usage: tools/deps.sh GROUP...   (groups: build check vm bench compat demo)
set -euo pipefail

declare -A GROUP=(
  [build]="gcc make pkg-config libibverbs-dev librdmacm-dev libev-dev uthash-dev libcmocka-dev"
  [check]="clang libclang-rt-14-dev valgrind groff-base man-db tshark tcpdump iproute2 procps psmisc socat"
  [vm]="qemu-system-x86 busybox-static cpio kmod iproute2 rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest tcpdump tshark"
  [bench]="gcc gnuplot-nox sockperf ffmpeg sip-tester tcpdump tshark iproute2"
  # The unmodified programs of the compatibility matrices (tests/suites/compat_soft.sh, vm_compat.sh; UDP:
  # compat_udp.sh, vm_compat_udp.sh) and the demo.
  # They are test subjects only: the suites start private instances on free ports, never the system services.
  [compat]="iperf3 sockperf redis-server redis-tools memcached libmemcached-tools nginx wrk apache2 apache2-utils
            mariadb-server mariadb-client socat curl openjdk-17-jdk-headless jq coreutils procps iproute2
            sip-tester ffmpeg"
  # tools/demo: the redis pair it runs over rdmasock, and what it reads the evidence with.
  [demo]="redis-server redis-tools jq iproute2 procps"
)

want=()
for g in "$@"; do
  [ -n "${GROUP[$g]+x}" ] || { echo "tools/deps.sh: unknown group '$g' (build check vm bench compat demo)" >&2; exit 2; }
  for p in ${GROUP[$g]}; do want+=("$p"); done
done

missing=()
for p in $(printf '%s\n' "${want[@]}" | sort -u); do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

line="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "rdmasock needs these Debian packages. As root, run:" >&2
  echo "  apt-get update && $line" >&2
  exit 1
fi
echo "rdmasock: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# An old or empty package list finds nothing; refresh it once when it is older than a day.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -n 1)" ]; then
  apt-get update -qq
fi
# Server packages (redis, memcached, nginx, apache2, mariadb) would start system-wide daemons on install; the
# suites never use those, so a policy-rc.d that forbids starting services is put in place for the install when the
# machine has none, and removed afterwards.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# tools/deps.sh: no service starts during this install\nexit 101\n' > "$policy"
  chmod 0755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
# Another apt run (a parallel make target) holds the dpkg lock for a while; wait for it instead of failing.
apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 "${missing[@]}" >/dev/null
