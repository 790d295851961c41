#!/usr/bin/env bash
# The build contract: warning-free under gcc and clang with -Wall -Wextra (as errors), `make install` with
# DESTDIR and PREFIX lays out library, headers, pkg-config file, tool and man pages, and a program compiled with
# only `pkg-config --cflags --libs rdmasock` builds and runs against the installed copy.
source "$RS_TOP/tests/lib/tap.sh"
tap_plan 6
scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
cd "$RS_TOP"

for cc in gcc clang; do
  if ! command -v $cc >/dev/null; then tap_skip "$cc build is warning-free" "$cc not installed"; continue; fi
  log=$scratch/$cc.log
  if make -s CC=$cc WERROR=1 BUILD="$scratch/$cc" all "$scratch/$cc/bench/bench_common" >"$log" 2>&1 \
     && ! grep -q 'warning:' "$log"; then
    tap_ok "$cc -Wall -Wextra build of library, tool and benchmarks is warning-free"
  else
    tap_fail "$cc build is warning-free" "$(grep -E 'warning|error' "$log" | head -n 20)"
  fi
done

dest=$scratch/dest
if make -s BUILD="$scratch/gcc" PREFIX=/opt/rs DESTDIR="$dest" install >"$scratch/install.log" 2>&1; then
  missing=()
  for f in lib/librdmasock.so lib/librdmasock.so.0 lib/librdmasock.a lib/pkgconfig/rdmasock.pc \
           include/rdmasock/stats.h bin/rdmasock share/man/man5/rdmasock.conf.5 share/man/man1/rdmasock.1 \
           share/doc/rdmasock/examples/rdmasock.conf; do
    [ -e "$dest/opt/rs/$f" ] || missing+=("$f")
  done
  if [ ${#missing[@]} -eq 0 ]; then tap_ok "make install PREFIX=/opt/rs DESTDIR=… installs every artefact"
  else tap_fail "make install installs every artefact" "missing: ${missing[*]}"; fi
else
  tap_fail "make install" "$(tail -n 20 "$scratch/install.log")"
fi

pc=$dest/opt/rs/lib/pkgconfig
flags=$(PKG_CONFIG_PATH=$pc PKG_CONFIG_SYSROOT_DIR=$dest pkg-config --cflags --libs rdmasock 2>&1)
if [[ $flags == *"-I$dest/opt/rs/include"* && $flags == *"-lrdmasock"* ]]; then
  tap_ok "pkg-config --cflags --libs rdmasock: $flags"
else
  tap_fail "pkg-config gives include and link flags" "$flags"
fi

cat > "$scratch/user.c" <<'C'
#include <rdmasock/stats.h>
#include <stdio.h>
#include <string.h>
int main(void) { printf("%s %u\n", RS_STATS_MAGIC, (unsigned)RS_STATS_LAYOUT_VERSION); return strlen(RS_STATS_MAGIC) == 0; }
C
# shellcheck disable=SC2086
if gcc -Wall -Wextra -Werror -o "$scratch/user" "$scratch/user.c" $flags 2>"$scratch/user.log" \
   && LD_LIBRARY_PATH=$dest/opt/rs/lib "$scratch/user" | grep -q RDMASOCK; then
  tap_ok "a program built from pkg-config flags alone compiles against the installed headers and links"
else
  tap_fail "program built with pkg-config flags" "$(cat "$scratch/user.log")"
fi

# The installed tool finds the installed library (not the build tree's) through its relative lib folder.
if RDMASOCK_LOG=debug "$dest/opt/rs/bin/rdmasock" run -- true 2>"$scratch/run.log" && grep -q 'loaded in true' "$scratch/run.log"; then
  tap_ok "installed rdmasock run preloads the installed library"
else
  tap_fail "installed rdmasock run preloads the installed library" "$(cat "$scratch/run.log")"
fi
