# specmoe build. Targets: all (build/specmoe + libraries), test, debug (ASan+UBSan tests),
# fuzz, bench-peer, install, clean.
CC      ?= cc
MAKEFLAGS += --no-print-directory
PREFIX  ?= /usr/local
BUILD   ?= build
OPT     ?= -O3 -march=x86-64-v2 -mtune=native
# -fno-math-errno: nothing reads errno after sqrt/exp/log, and with errno kept GCC cannot vectorise
# a loop that calls sqrtf (Adam's update); results are unchanged (IEEE sqrt is exact either way).
# -fno-trapping-math: nothing reads the floating-point exception flags, and with them kept GCC does
# not if-convert comparisons, so a loop with a clamp (the float tanh) stays scalar; values unchanged.
WARN    := -std=c11 -Wall -Wextra -Werror -Wno-unknown-pragmas -fno-math-errno -fno-trapping-math
# OpenBLAS: prefer Debian's OpenMP build so BLAS calls made inside our OpenMP regions run
# single-threaded instead of oversubscribing the cores (see BENCHMARKS.md).
BLASDIR := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp))
ifneq ($(BLASDIR),)
BLASLIB := -L$(BLASDIR) -Wl,-rpath,$(BLASDIR) -lopenblas
else
BLASLIB := -lopenblas
endif
CFLAGS  ?= $(OPT) -g
# the version has one definition, CLI_VERSION in cli/common.h (`specmoe --version`); specmoe.pc reads it
VERSION := $(shell sed -n 's/^\#define CLI_VERSION "\(.*\)"/\1/p' cli/common.h)
ifeq ($(VERSION),)
$(error cli/common.h: no line '#define CLI_VERSION "..."' to take the version from)
endif
CPPFLAGS += -Iinclude -Isrc -D_DEFAULT_SOURCE
# MuJoCo (Debian's libmujoco-dev): the physics of the envs/mujoco/ environments
LIBS    := $(BLASLIB) -llapacke -lcjson -lmujoco -lz -lm
OMP     := -fopenmp
# MPI (src/dist/: data- and expert-parallel runs under mpirun): on when OpenMPI's mpicc wrapper is
# found (Debian's libopenmpi-dev, installed by scripts/setup.sh), off with `make MPI=0`. The compiler
# stays $(CC): mpicc only tells the include and link flags. Switching MPI rebuilds every object
# (the stamp below), so build/ never mixes the two.
MPI     ?= $(if $(shell command -v mpicc 2>/dev/null),1,0)
ifeq ($(MPI),1)
CPPFLAGS += -DSPECMOE_MPI $(shell mpicc --showme:compile)
LIBS    += $(shell mpicc --showme:link)
endif
MPI_STAMP := $(BUILD)/.mpi-$(MPI)

# src/core -> src/nn -> src/methods/<paper> -> src/io -> src/train (docs/ARCHITECTURE.md)
LIB_SRC := $(sort $(wildcard src/*/*.c src/methods/*/*.c))
# environments (envs/<family>/<task>.c, the vector and registry in envs/): part of the library
ENV_SRC := $(sort $(wildcard envs/*.c envs/*/*.c))
CLI_SRC := $(sort $(wildcard cli/*.c))
# the benchmarks and paper studies, linked into build/specmoe (docs/CLI.md)
EXP_SRC := $(sort $(wildcard experiments/*/*.c))
TEST_SRC:= $(sort $(wildcard tests/test_*.c))
HDRS    := $(wildcard include/*.h include/specmoe/*/*.h include/specmoe/methods/*/*.h) $(wildcard src/*/*.h envs/*/*.h) $(MPI_STAMP)
# the tool's own headers: an edit to one rebuilds the tool, not the library
CLI_HDRS:= $(HDRS) $(wildcard cli/*.h experiments/*.h experiments/*/*.h)

LIB_OBJ := $(LIB_SRC:src/%.c=$(BUILD)/obj/%.o) $(ENV_SRC:envs/%.c=$(BUILD)/obj/envs/%.o)
LIB64_OBJ := $(LIB_SRC:src/%.c=$(BUILD)/obj64/%.o) $(ENV_SRC:envs/%.c=$(BUILD)/obj64/envs/%.o)
CLI_OBJ := $(CLI_SRC:cli/%.c=$(BUILD)/obj/cli_%.o)
# experiments/<paper>/<file>.c -> obj/exp/<paper>/<file>.o: papers may reuse file names
EXP_OBJ := $(EXP_SRC:experiments/%.c=$(BUILD)/obj/exp/%.o)
TESTS   := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

.PHONY: all test tools debug fuzz bench-peer install install-check clean
all: $(BUILD)/specmoe $(BUILD)/libspecmoe.a $(BUILD)/libspecmoe.so $(BUILD)/specmoe.pc

# the stamp of the MPI setting the objects were built with (every object depends on it via HDRS)
$(MPI_STAMP):
	@mkdir -p $(@D) && rm -f $(BUILD)/.mpi-* && touch $@

$(BUILD)/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(WARN) $(CFLAGS) $(OMP) -fPIC -c $< -o $@
$(BUILD)/obj/envs/%.o: envs/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(WARN) $(CFLAGS) $(OMP) -fPIC -c $< -o $@
$(BUILD)/obj64/envs/%.o: envs/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -DSPECMOE_DOUBLE $(WARN) $(CFLAGS) $(OMP) -c $< -o $@
# the double-precision twin of the library, used by the gradient checks
$(BUILD)/obj64/%.o: src/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -DSPECMOE_DOUBLE $(WARN) $(CFLAGS) $(OMP) -c $< -o $@
# the tool's sources include "cli/common.h", "experiments/experiments.h", ... from the top directory
$(BUILD)/obj/cli_%.o: cli/%.c $(CLI_HDRS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -I. $(WARN) $(CFLAGS) $(OMP) -c $< -o $@
$(BUILD)/obj/exp/%.o: experiments/%.c $(CLI_HDRS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -I. $(WARN) $(CFLAGS) $(OMP) -c $< -o $@

$(BUILD)/libspecmoe.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/libspecmoe_f64.a: $(LIB64_OBJ)
	@rm -f $@
	ar rcs $@ $^
# the shared library carries a SONAME of its major version: libspecmoe.so.$(SOMAJOR), file libspecmoe.so.$(VERSION)
SOMAJOR := $(firstword $(subst ., ,$(VERSION)))
$(BUILD)/libspecmoe.so: $(LIB_OBJ)
	$(CC) -shared $(CFLAGS) $(OMP) -Wl,-soname,libspecmoe.so.$(SOMAJOR) -o $@ $^ $(LIBS)
$(BUILD)/specmoe: $(CLI_OBJ) $(EXP_OBJ) $(BUILD)/libspecmoe.a
	$(CC) $(CFLAGS) $(OMP) -o $@ $(CLI_OBJ) $(EXP_OBJ) $(BUILD)/libspecmoe.a $(LIBS)

# tests: test_grad_*.c link the double-precision twin, the rest the float library
$(BUILD)/tests/test_grad%: tests/test_grad%.c $(wildcard tests/*.h) $(BUILD)/libspecmoe_f64.a
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -DSPECMOE_DOUBLE $(WARN) $(CFLAGS) $(OMP) -o $@ $< $(BUILD)/libspecmoe_f64.a -lcriterion $(LIBS)
$(BUILD)/tests/test_%: tests/test_%.c $(wildcard tests/*.h) $(BUILD)/libspecmoe.a
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(WARN) $(CFLAGS) $(OMP) -o $@ $< $(BUILD)/libspecmoe.a -lcriterion $(LIBS)

# the Hugging Face fixture generator the CLI checks use (tests/hf_fixture.h)
$(BUILD)/tests/hf_gen: tests/hf_gen.c tests/hf_fixture.h $(BUILD)/libspecmoe.a
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(WARN) $(CFLAGS) $(OMP) -o $@ $< $(BUILD)/libspecmoe.a $(LIBS)

# the multi-process checks' helper (tests/mpi_tests.sh runs it under mpirun; built without MPI it
# still compares checkpoints)
$(BUILD)/tests/mpi_check: tests/mpi_check.c $(BUILD)/libspecmoe.a
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(WARN) $(CFLAGS) $(OMP) -o $@ $< $(BUILD)/libspecmoe.a $(LIBS)

# the measuring tools of BENCHMARKS.md that link the library (built by `make test`, so they keep compiling)
TOOLS := $(BUILD)/penalty_time $(BUILD)/step_time $(BUILD)/dqn_update
$(BUILD)/%_time: tools/sphere/%_time.c tools/sphere/cpu_time.h $(BUILD)/libspecmoe.a
	$(CC) $(CPPFLAGS) -I. $(WARN) $(CFLAGS) $(OMP) -o $@ $< $(BUILD)/libspecmoe.a $(LIBS)
# the DQN update of any --arch network timed alone, against the FMA peak (tools/peers/:
# compare_tokenize.sh, tokenize_updates.sh; compare_dqn.sh builds its own beside its --bin)
$(BUILD)/dqn_update: tools/peers/dqn_update.c experiments/engine/peak.c experiments/engine/peak.h $(BUILD)/libspecmoe.a
	$(CC) $(CPPFLAGS) -I. $(WARN) $(CFLAGS) $(OMP) -o $@ tools/peers/dqn_update.c experiments/engine/peak.c $(BUILD)/libspecmoe.a $(LIBS)
tools: $(TOOLS)

# `make test` builds everything and runs every test binary plus the CLI and MPI checks.
test: all $(TESTS) $(TOOLS) $(BUILD)/tests/hf_gen $(BUILD)/tests/mpi_check install-check
	@SPECMOE_BIN=$(abspath $(BUILD)/specmoe) SPECMOE_HF_GEN=$(abspath $(BUILD)/tests/hf_gen) \
	  SPECMOE_MPI=$(MPI) SPECMOE_MPI_CHECK=$(abspath $(BUILD)/tests/mpi_check) tests/run_tests.sh $(TESTS)

# install into a scratch prefix, then build and run the examples with the flags pkg-config gives
install-check: all
	@rm -rf $(BUILD)/prefix && $(MAKE) -s install PREFIX=$(abspath $(BUILD)/prefix) >/dev/null
	@PKG_CONFIG_PATH=$(abspath $(BUILD)/prefix)/lib/pkgconfig sh -c \
	  'for e in hello_moe compose_moe; do $(CC) $(CFLAGS) examples/$$e.c $$(pkg-config --cflags --libs --static specmoe) -o $(BUILD)/$$e || exit 1; done' \
	  && LD_LIBRARY_PATH=$(abspath $(BUILD)/prefix)/lib $(BUILD)/hello_moe \
	  && LD_LIBRARY_PATH=$(abspath $(BUILD)/prefix)/lib $(BUILD)/compose_moe \
	  && readelf -d $(BUILD)/prefix/lib/libspecmoe.so.$(VERSION) | grep -q 'SONAME.*\[libspecmoe.so.$(SOMAJOR)\]' \
	  && [ -L $(BUILD)/prefix/lib/libspecmoe.so.$(SOMAJOR) ] && [ -L $(BUILD)/prefix/lib/libspecmoe.so ] \
	  && echo 'install-check: pkg-config --cflags --libs specmoe works (examples/hello_moe.c, examples/compose_moe.c); libspecmoe.so.$(VERSION) has SONAME libspecmoe.so.$(SOMAJOR)'

# the whole suite again with AddressSanitizer + UBSan (any report fails the run)
debug:
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	$(MAKE) BUILD=build-debug CFLAGS="-O0 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test

$(BUILD)/specmoe.pc: Makefile cli/common.h
	@mkdir -p $(@D)
	@printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: specmoe\nDescription: Mixture-of-Experts with spectral routing and regularisation\nVersion: $(VERSION)\nLibs: -L$${libdir} -lspecmoe\nLibs.private: %s -fopenmp\nCflags: -I$${includedir}\n' \
	  "$(PREFIX)" "$(LIBS)" > $@

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/specmoe $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 $(BUILD)/libspecmoe.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/libspecmoe.so $(DESTDIR)$(PREFIX)/lib/libspecmoe.so.$(VERSION)
	ln -sf libspecmoe.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libspecmoe.so.$(SOMAJOR)
	ln -sf libspecmoe.so.$(SOMAJOR) $(DESTDIR)$(PREFIX)/lib/libspecmoe.so
	install -m 644 include/specmoe.h $(DESTDIR)$(PREFIX)/include/
	cd include && for h in specmoe/*/*.h specmoe/methods/*/*.h; do install -D -m 644 $$h $(DESTDIR)$(PREFIX)/include/$$h; done
	install -m 755 $(BUILD)/specmoe $(DESTDIR)$(PREFIX)/bin/
	sed 's|^prefix=.*|prefix=$(PREFIX)|' $(BUILD)/specmoe.pc > $(DESTDIR)$(PREFIX)/lib/pkgconfig/specmoe.pc
	-ldconfig 2>/dev/null || true

clean:
	rm -rf build build-debug build-fuzz

# fuzz: libFuzzer targets for the outside-data parsers (fuzz/fuzz_*.c), built with clang under
# ASan+UBSan into build-fuzz/. The library is compiled into an archive there, so each target links
# only the objects it needs: the safetensors, IDX, HF config/index and calibration targets need the
# readers alone, while the model description (model_config, checkpoint) is checked against every
# router and layer kind, which pulls in most of the library with BLAS, LAPACK and OpenMP. Each target
# runs FUZZ_SECONDS; fuzz/corpus/<name>/ holds the committed seeds, and new inputs go to
# build-fuzz/corpus/<name>/ so the tree stays clean. A crash leaves its reproducer in build-fuzz/ and
# fails the target.
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_DIR     := build-fuzz
FUZZ_NAMES   := safetensors idx hf calib model_config checkpoint runlog
FUZZ_SRC     := $(LIB_SRC)
FUZZ_OBJ     := $(FUZZ_SRC:src/%.c=$(FUZZ_DIR)/obj/%.o) $(ENV_SRC:envs/%.c=$(FUZZ_DIR)/obj/envs/%.o)
FUZZ_LIB     := $(FUZZ_DIR)/libspecmoe_fuzz.a
# keep the objects: they are intermediates of a pattern chain, which make would otherwise delete
.SECONDARY: $(FUZZ_OBJ)
# -Wno-pass-failed: clang at -O1 cannot honour every `omp simd` request (src/core/optim.c); it only warns
FUZZ_CFLAGS  := -std=c11 -Wall -Wextra -Werror -Iinclude -Isrc -D_DEFAULT_SOURCE -g -O1 -fno-omit-frame-pointer \
                -fno-sanitize-recover=undefined -fopenmp -Wno-pass-failed

$(FUZZ_DIR)/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,address,undefined -c $< -o $@
$(FUZZ_DIR)/obj/envs/%.o: envs/%.c $(HDRS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,address,undefined -c $< -o $@
$(FUZZ_LIB): $(FUZZ_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(FUZZ_DIR)/fuzz_%: fuzz/fuzz_%.c $(FUZZ_LIB) $(HDRS) $(wildcard fuzz/*.h)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer,address,undefined -o $@ $< $(FUZZ_LIB) $(LIBS)

fuzz: $(FUZZ_NAMES:%=$(FUZZ_DIR)/fuzz_%)
	@for t in $(FUZZ_NAMES); do \
	    mkdir -p $(FUZZ_DIR)/corpus/$$t; \
	    dict=; [ -f fuzz/$$t.dict ] && dict=-dict=fuzz/$$t.dict; \
	    echo "== fuzz_$$t for $(FUZZ_SECONDS) s"; \
	    $(FUZZ_DIR)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	        -artifact_prefix=$(FUZZ_DIR)/$$t- $$dict $(FUZZ_DIR)/corpus/$$t fuzz/corpus/$$t || exit 1; \
	done

# bench-peer: `specmoe bench layer` and the PyTorch peer (tools/bench_peer.py, Debian's python3-torch)
# at the same shapes and thread count, with the specmoe/PyTorch tokens-per-second ratio per shape.
THREADS ?= 2
bench-peer: $(BUILD)/specmoe
	tools/bench_compare.sh --threads $(THREADS) --bin $(BUILD)/specmoe

# golden_gen writes tests/data/golden_v0.safetensors (see tests/golden_cases.h); not part of `test`
$(BUILD)/tests/golden_gen: tests/golden_gen.c tests/golden_cases.h $(BUILD)/libspecmoe.a
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(WARN) $(CFLAGS) $(OMP) -o $@ $< $(BUILD)/libspecmoe.a $(LIBS)
