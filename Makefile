# specmoe build. Targets: all (build/specmoe + libraries), test, debug (ASan+UBSan tests),
# fuzz, bench-peer, install, clean.
CC      ?= cc
PREFIX  ?= /usr/local
BUILD   ?= build
OPT     ?= -O3 -march=x86-64-v2 -mtune=native
WARN    := -std=c11 -Wall -Wextra -Werror -Wno-unknown-pragmas
# OpenBLAS: prefer Debian's OpenMP build so BLAS calls made inside our OpenMP regions run
# single-threaded instead of oversubscribing the cores (see BENCHMARKS.md).
BLASDIR := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp))
ifneq ($(BLASDIR),)
BLASLIB := -L$(BLASDIR) -Wl,-rpath,$(BLASDIR) -lopenblas
else
BLASLIB := -lopenblas
endif
CFLAGS  ?= $(OPT) -g
CPPFLAGS += -Iinclude -D_DEFAULT_SOURCE
LIBS    := $(BLASLIB) -llapacke -lcjson -lz -lm
OMP     := -fopenmp

LIB_SRC := $(sort $(wildcard src/*.c))
CLI_SRC := $(sort $(wildcard cli/*.c))
TEST_SRC:= $(sort $(wildcard tests/test_*.c))
HDRS    := $(wildcard include/*.h include/specmoe/*.h) $(wildcard src/*.h) $(wildcard cli/*.h)

LIB_OBJ := $(LIB_SRC:src/%.c=$(BUILD)/obj/%.o)
LIB64_OBJ := $(LIB_SRC:src/%.c=$(BUILD)/obj64/%.o)
CLI_OBJ := $(CLI_SRC:cli/%.c=$(BUILD)/obj/cli_%.o)
TESTS   := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

.PHONY: all test debug fuzz bench-peer install clean check-tests
all: $(BUILD)/specmoe $(BUILD)/libspecmoe.a $(BUILD)/libspecmoe.so $(BUILD)/specmoe.pc

$(BUILD)/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(WARN) $(CFLAGS) $(OMP) -fPIC -c $< -o $@
# the double-precision twin of the library, used by the gradient checks
$(BUILD)/obj64/%.o: src/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -DSPECMOE_DOUBLE $(WARN) $(CFLAGS) $(OMP) -c $< -o $@
$(BUILD)/obj/cli_%.o: cli/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(WARN) $(CFLAGS) $(OMP) -c $< -o $@

$(BUILD)/libspecmoe.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/libspecmoe_f64.a: $(LIB64_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/libspecmoe.so: $(LIB_OBJ)
	$(CC) -shared $(OMP) -o $@ $^ $(LIBS)
$(BUILD)/specmoe: $(CLI_OBJ) $(BUILD)/libspecmoe.a
	$(CC) $(CFLAGS) $(OMP) -o $@ $(CLI_OBJ) $(BUILD)/libspecmoe.a $(LIBS)

# tests: test_grad_*.c link the double-precision twin, the rest the float library
$(BUILD)/tests/test_grad%: tests/test_grad%.c $(wildcard tests/*.h) $(BUILD)/libspecmoe_f64.a
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -DSPECMOE_DOUBLE $(WARN) $(CFLAGS) $(OMP) -o $@ $< $(BUILD)/libspecmoe_f64.a -lcriterion $(LIBS)
$(BUILD)/tests/test_%: tests/test_%.c $(wildcard tests/*.h) $(BUILD)/libspecmoe.a
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(WARN) $(CFLAGS) $(OMP) -o $@ $< $(BUILD)/libspecmoe.a -lcriterion $(LIBS)

# `make test` builds everything and runs every test binary plus the CLI checks.
test: all $(TESTS)
	@SPECMOE_BIN=$(abspath $(BUILD)/specmoe) tests/run_tests.sh $(TESTS)

debug:
	$(MAKE) BUILD=build-debug OPT="-O0" CFLAGS="-O0 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	        LDFLAGS="-fsanitize=address,undefined" test

$(BUILD)/specmoe.pc: Makefile
	@mkdir -p $(@D)
	@printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: specmoe\nDescription: Mixture-of-Experts with spectral routing and regularisation\nVersion: 0.1.0\nLibs: -L$${libdir} -lspecmoe\nLibs.private: %s -fopenmp\nCflags: -I$${includedir}\n' \
	  "$(PREFIX)" "$(LIBS)" > $@

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/specmoe $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 $(BUILD)/libspecmoe.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/libspecmoe.so $(DESTDIR)$(PREFIX)/lib/
	install -m 644 include/specmoe.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 include/specmoe/*.h $(DESTDIR)$(PREFIX)/include/specmoe/
	install -m 755 $(BUILD)/specmoe $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(BUILD)/specmoe.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/
	-ldconfig 2>/dev/null

clean:
	rm -rf build build-debug build-fuzz
