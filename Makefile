# rdmasock: one non-recursive Makefile. Every src/**/*.c goes into the library; tests, fuzzers and tools are found
# by name (tests/unit/test_*.c, tests/fuzz/fuzz_*.c, tools/cli/*.c), so adding a file needs no edit here.

VERSION     := 0.1.0
SOVERSION   := 0
PREFIX      ?= /usr/local
LIBDIR      ?= $(PREFIX)/lib
INCLUDEDIR  ?= $(PREFIX)/include
BINDIR      ?= $(PREFIX)/bin
MANDIR      ?= $(PREFIX)/share/man
DOCDIR      ?= $(PREFIX)/share/doc/rdmasock
DESTDIR     ?=

CC          ?= gcc
FUZZ_CC     ?= clang
BUILD       ?= build
WERROR      ?=
# FUZZ_SECONDS: how long each fuzzer runs in `make fuzz` (make check passes 60).
FUZZ_SECONDS ?= 600

WARNINGS    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 -Wno-format-nonliteral \
               $(if $(WERROR),-Werror)
CPPFLAGS    += -Isrc -Iinclude -D_GNU_SOURCE -DRS_VERSION=\"$(VERSION)\"
CFLAGS      ?= -O2 -g
# Thread-local variables use the initial-exec model: the library is preloaded (its TLS is in the static block), and
# the default model for -fPIC code calls __tls_get_addr on every access, which the soft RNIC's CQ poll and the
# blocking waits make on every call. The memory and signal hooks needed initial-exec already.
CFLAGS      += -std=gnu11 -fPIC -fvisibility=hidden -pthread -ftls-model=initial-exec $(WARNINGS)
# The preloaded library is optimised across files at link time: one socket call crosses the interposer, SDP, the
# RNIC layer and the provider, and the calls between them cost more than their bodies, most of all under an
# emulated CPU (64 B rstream ping-pong over rxe under TCG, one boot: 25-34 us per transfer without, 19-21 us with;
# docs/results/sdp-verbs.md). -fno-plt calls libc through the GOT, one jump instead of two. Fat objects keep plain
# code as well, which the static library (CLI, tests, benches) uses without a link-time step. GCC only: clang's
# LTO objects need its own archiver.
IS_CLANG    := $(shell $(CC) -dM -E -x c /dev/null 2>/dev/null | grep -c __clang__)
LTO_FLAGS   ?= $(if $(filter 0,$(IS_CLANG)),-flto=auto -ffat-lto-objects -fno-plt)
# No straight-line vectorisation (GCC 12 does it at -O2): it packs neighbouring scalar stores and increments into
# SSE registers (movd, punpckldq, paddq, movq: counters and positions on every send), which saves nothing on a
# real CPU and costs an emulated one about 15 plain instructions each (TCG in the rxe VM: an SSE op 5.3-5.6 ns, an
# add 0.35 ns; docs/results/sdp-verbs.md). Loops keep theirs.
CFLAGS      += $(if $(filter 0,$(IS_CLANG)),-fno-tree-slp-vectorize)
# Link only what is used: the library must load in programs that never touch RDMA.
LIB_LDLIBS  := -Wl,--as-needed -lrdmacm -libverbs -lev -ldl -lpthread -lrt
TEST_LDLIBS := -lcmocka $(LIB_LDLIBS)

SRCS        := $(sort $(shell find src -name '*.c'))
OBJS        := $(SRCS:%.c=$(BUILD)/obj/%.o)
# Interposers: the files of src/intercept that export libc's names (RS_EXPORT). They belong in the preloaded
# librdmasock.so only; the static library (for the CLI, tests, benches) and the fuzzers must keep the real libc.
INTERPOSE_SRCS := $(sort $(shell grep -l '^RS_EXPORT' src/intercept/*.c))
INTERPOSE_OBJS := $(INTERPOSE_SRCS:%.c=$(BUILD)/obj/%.o)
ARCHIVE_OBJS := $(filter-out $(INTERPOSE_OBJS),$(OBJS))
HEADERS     := $(sort $(shell find src include -name '*.h'))
TEST_HEADERS := $(sort $(wildcard tests/unit/*.h))
LIB_SO      := $(BUILD)/librdmasock.so
LIB_A       := $(BUILD)/librdmasock.a
CLI_SRCS    := $(sort $(wildcard tools/cli/*.c))
CLI         := $(BUILD)/bin/rdmasock
PERF_SRCS   := $(sort $(wildcard tools/perf/*.c))
PERF        := $(if $(PERF_SRCS),$(BUILD)/bin/rdmasock-perf)
UNIT_SRCS   := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BINS   := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/unit/%)
HELPER_SRCS := $(sort $(wildcard tests/helpers/*.c))
HELPER_BINS := $(HELPER_SRCS:tests/helpers/%.c=$(BUILD)/tests/helpers/%)
BENCH_SRCS  := $(sort $(wildcard bench/*.c))
BENCH_BINS  := $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)
FUZZ_SRCS   := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BINS   := $(FUZZ_SRCS:tests/fuzz/%.c=$(BUILD)/fuzz/%)
# Fuzzers link objects, not the archive: leave out the interception layer (the interposers and what calls them).
FUZZ_OBJS   := $(filter-out $(BUILD)/fuzz-obj/src/intercept/%,$(SRCS:%.c=$(BUILD)/fuzz-obj/%.o))
FUZZ_FLAGS  := -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined \
               -fno-sanitize-recover=undefined -std=gnu11 -pthread

.PHONY: all lib tests helpers fuzz-build check demo bench fuzz install uninstall clean deps-build deps-check deps-demo

all: lib $(CLI) $(PERF)
lib: $(LIB_SO) $(LIB_A)

$(BUILD)/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LTO_FLAGS) -c $< -o $@

$(LIB_SO): $(OBJS)
	$(CC) $(CFLAGS) $(LTO_FLAGS) -shared -pthread -Wl,-soname,librdmasock.so.$(SOVERSION) -Wl,--no-undefined -o $@ $^ $(LIB_LDLIBS)

$(LIB_A): $(ARCHIVE_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(CLI): $(CLI_SRCS) $(LIB_A) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -DRS_LIBDIR=\"$(LIBDIR)\" $(CFLAGS) -o $@ $(CLI_SRCS) $(LIB_A) $(LIB_LDLIBS)

# The benchmark programs are built as the preloaded library is (LTO_FLAGS), so they measure the same code.
$(PERF): $(PERF_SRCS) $(LIB_A) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LTO_FLAGS) -o $@ $(PERF_SRCS) $(LIB_A) $(LIB_LDLIBS)

# Unit tests of the interposers themselves (test_intercept_*) link them in front of the static library.
$(BUILD)/tests/unit/%: tests/unit/%.c $(LIB_A) $(INTERPOSE_OBJS) $(HEADERS) $(TEST_HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(if $(filter test_intercept_%,$*),$(INTERPOSE_OBJS)) $(LIB_A) $(TEST_LDLIBS)

$(BUILD)/tests/helpers/%: tests/helpers/%.c $(LIB_A) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(LIB_A) $(LIB_LDLIBS)

$(BUILD)/bench/%: bench/%.c $(LIB_A) $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LTO_FLAGS) -o $@ $< $(LIB_A) $(LIB_LDLIBS)

$(BUILD)/fuzz-obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_FLAGS) -c $< -o $@

# Kept between builds: make would otherwise treat them as intermediates of the pattern rule and delete them.
.SECONDARY: $(FUZZ_OBJS)
$(BUILD)/fuzz/%: tests/fuzz/%.c $(FUZZ_OBJS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CPPFLAGS) $(subst fuzzer-no-link,fuzzer,$(FUZZ_FLAGS)) -o $@ $< $(FUZZ_OBJS) $(LIB_LDLIBS)

tests: all $(UNIT_BINS) $(HELPER_BINS)
fuzz-build: $(FUZZ_BINS)

# Dependencies: each entry point installs what it needs (apt-get as root; otherwise it prints the exact line).
deps-build:
	@tools/deps.sh build
deps-check:
	@tools/deps.sh build check vm compat
deps-bench:
	@tools/deps.sh build bench
deps-demo:
	@tools/deps.sh build vm demo

check: deps-check
	@$(MAKE) --no-print-directory tests fuzz-build
	@RS_BUILD=$(abspath $(BUILD)) FUZZ_SECONDS=$${FUZZ_SECONDS_CHECK:-60} tests/run

demo: deps-demo
	@$(MAKE) --no-print-directory all
	@tools/demo

bench: deps-bench
	@$(MAKE) --no-print-directory all $(BENCH_BINS)
	@RS_BUILD=$(abspath $(BUILD)) bench/run

fuzz: deps-check
	@$(MAKE) --no-print-directory fuzz-build
	@RS_BUILD=$(abspath $(BUILD)) FUZZ_SECONDS=$(FUZZ_SECONDS) tests/suites/fuzz.sh

$(BUILD)/rdmasock.pc: rdmasock.pc.in Makefile
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	    -e 's|@VERSION@|$(VERSION)|' $< > $@

install: all $(BUILD)/rdmasock.pc
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)/rdmasock $(DESTDIR)$(BINDIR) \
	    $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(DOCDIR)/examples
	install -m 0755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/librdmasock.so.$(VERSION)
	ln -sf librdmasock.so.$(VERSION) $(DESTDIR)$(LIBDIR)/librdmasock.so.$(SOVERSION)
	ln -sf librdmasock.so.$(SOVERSION) $(DESTDIR)$(LIBDIR)/librdmasock.so
	install -m 0644 $(LIB_A) $(DESTDIR)$(LIBDIR)/librdmasock.a
	install -m 0644 include/rdmasock/*.h $(DESTDIR)$(INCLUDEDIR)/rdmasock/
	install -m 0644 $(BUILD)/rdmasock.pc $(DESTDIR)$(LIBDIR)/pkgconfig/rdmasock.pc
	install -m 0755 $(CLI) $(PERF) $(DESTDIR)$(BINDIR)/
	install -m 0644 docs/man/*.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 docs/man/*.5 $(DESTDIR)$(MANDIR)/man5/
	install -m 0644 conf/rdmasock.conf $(DESTDIR)$(DOCDIR)/examples/rdmasock.conf

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/librdmasock.so* $(DESTDIR)$(LIBDIR)/librdmasock.a $(DESTDIR)$(LIBDIR)/pkgconfig/rdmasock.pc
	rm -rf $(DESTDIR)$(INCLUDEDIR)/rdmasock $(DESTDIR)$(DOCDIR)
	rm -f $(DESTDIR)$(BINDIR)/rdmasock $(DESTDIR)$(BINDIR)/rdmasock-perf $(DESTDIR)$(MANDIR)/man1/rdmasock.1 $(DESTDIR)$(MANDIR)/man5/rdmasock.conf.5

clean:
	rm -rf $(BUILD)
