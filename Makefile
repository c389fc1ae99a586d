# gemc: the .gem compiler and runtime. `make help` lists every target.
# Generated files all go under $(BUILD)/ (default build/).

CC      ?= cc
BUILD   ?= build
BISON   ?= bison
FLEX    ?= flex

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
           -Wvla -Wformat=2 -Wundef -Wpointer-arith -Wcast-qual
CSTD    := -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE
OPT     ?= -O2 -g
# --- layers -----------------------------------------------------------------------------
# Each folder of the product is one layer (docs/architecture.md). A folder compiles with the
# include paths of itself and of the layers it may use, and no others, so a header included
# from a layer above fails the build. Includes name a header only ("ir.h", never "../x/ir.h");
# $(BUILD)/layers.ok refuses a path in a quoted include.
LAYERS := compiler/base compiler/ir grammar compiler/sema compiler/passes kernels \
          codegen/plan codegen/ops codegen/attention codegen \
          runtime/data runtime/cpu runtime/gpu runtime/comm runtime/parallel runtime/train \
          runtime/bench \
          compiler/driver
USES_compiler/base      :=
USES_compiler/ir        := compiler/base
USES_grammar            := compiler/base $(BUILD)/grammar
USES_compiler/sema      := compiler/base compiler/ir grammar
USES_compiler/passes    := compiler/base compiler/ir
USES_kernels            :=
USES_codegen/plan       := compiler/base compiler/ir kernels
USES_codegen/ops        := $(USES_codegen/plan) codegen/plan
USES_codegen/attention  := $(USES_codegen/plan) codegen/plan
USES_codegen            := $(USES_codegen/plan) codegen/plan codegen/ops codegen/attention
USES_runtime/data       := compiler/base compiler/ir
USES_runtime/cpu        := $(USES_runtime/data) runtime/data
USES_runtime/gpu        := $(USES_runtime/cpu) runtime/cpu kernels codegen/plan
USES_runtime/comm       := $(USES_runtime/gpu) runtime/gpu
USES_runtime/parallel   := $(USES_runtime/comm) runtime/comm
USES_runtime/train      := $(USES_runtime/parallel) runtime/parallel codegen
USES_runtime/bench      := $(USES_runtime/gpu) runtime/gpu codegen codegen/attention
USES_compiler/driver    := $(filter-out compiler/driver,$(LAYERS)) $(BUILD)/grammar
# -I flags of the layer that holds $(1), a source file.
layer_of   = $(patsubst %/,%,$(dir $(1)))
layer_incs = $(addprefix -I,$(call layer_of,$(1)) $(USES_$(call layer_of,$(1))))
ALL_INCS  := $(addprefix -I,$(LAYERS) $(BUILD)/grammar)

DEPFLAGS      := -MMD -MP
CFLAGS_GEMC   := $(CSTD) $(OPT) $(WARN) $(EXTRA_CFLAGS)
# The scanner and parser that flex and bison write are not ours to lint.
CFLAGS_GEN    := $(CSTD) $(OPT) -Wall -Werror -Wno-unused-function -Wno-unused-but-set-variable \
                 -Igrammar $(addprefix -I,$(USES_grammar)) $(EXTRA_CFLAGS)
# Parallel jobs for `make test`'s build and its unit tests (tests/unit/run.sh).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
LDLIBS_GEMC   := -lm -ldl -pthread $(EXTRA_LDFLAGS)

LIB_SRCS  := $(filter-out compiler/driver/main.c,$(foreach l,$(LAYERS),$(wildcard $(l)/*.c)))
LIB_OBJS  := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRCS)) \
             $(BUILD)/obj/grammar/parser.tab.o $(BUILD)/obj/grammar/scanner.o \
             $(BUILD)/obj/gen/kernels_embedded.o
PRODUCT_FILES := $(foreach l,$(LAYERS),$(wildcard $(l)/*.c $(l)/*.h $(l)/*.def)) \
                 grammar/parser.y grammar/scanner.l
GEN_HEADERS := $(BUILD)/grammar/parser.tab.h $(BUILD)/grammar/scanner.h

UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRCS))

.PHONY: all help print-includes test test-layers test-unit test-golden test-models test-codegen test-dist test-gpu-tools test-gpu test-gpu-codegen deps demo fuzz bench-frontend clean
.DELETE_ON_ERROR:

all: $(BUILD)/gemc

# The include flags that see every layer, for scripts that compile against libgemc.a.
print-includes:
	@echo $(ALL_INCS)

help:
	@echo 'make                  build $(BUILD)/gemc'
	@echo 'make demo             the main job: build gemc, check every model, train models/gem_tiny.gem'
	@echo '                      (on the GPU when one is usable, else the CPU executor; DEMO_STEPS=2000)'
	@echo 'make test             install missing Debian packages (as root), build, run every CPU test:'
	@echo '                      test-layers, test-unit, test-golden, test-models, test-codegen,'
	@echo '                      test-dist and test-gpu-tools'
	@echo 'make test-layers      each layer sees only its own and its USES_ layers headers'
	@echo 'make test-unit        the cmocka unit tests (tests/unit/)'
	@echo 'make test-golden      the golden .ir, .grad, .err and .cu files (tests/golden/)'
	@echo 'make test-models      every models/*.gem checks without a warning'
	@echo 'make test-codegen     NVRTC compiles every model for sm_90a and sm_100a; generated kernels'
	@echo '                      run on the CPU (plan_emu, table_grad_emu) match the CPU executor'
	@echo '                      and models at each size/count limit and one past it (tests/limits)'
	@echo 'make test-gpu-tools   the GPU machine'"'"'s helper scripts, without a GPU (tests/gpu/tools_without_gpu.sh)'
	@echo 'make test-gpu         on a GPU machine: every generated kernel against the CPU executor,'
	@echo '                      GDPA cases, end-to-end curves, checkpoints, divergence, memcheck;'
	@echo '                      PART=K/N runs steps K, K+N, ... (tests/gpu/run.sh --list names them)'
	@echo 'make test-gpu-codegen on a GPU machine: codegen_small.gem kernels through the plan launches'
	@echo 'make fuzz             libFuzzer over the front end (FUZZ_SECONDS=60)'
	@echo 'make bench-frontend   time check + IR of generated 1,000- and 10,000-layer models'
	@echo 'make deps             install flex, bison and cmocka when missing (as root)'
	@echo 'make clean            remove $(BUILD)/'
	@echo 'Variables: BUILD, CC, OPT, EXTRA_CFLAGS, EXTRA_LDFLAGS, DEMO_STEPS, FUZZ_SECONDS, PART'

# --- dependencies -----------------------------------------------------------------------
# Installs flex, bison and cmocka when they are missing and we are root; otherwise prints
# the exact command to run.
deps:
	@missing=""; \
	command -v $(FLEX) >/dev/null 2>&1 || missing="$$missing flex"; \
	command -v $(BISON) >/dev/null 2>&1 || missing="$$missing bison"; \
	[ -f /usr/include/cmocka.h ] || missing="$$missing libcmocka-dev"; \
	command -v mpirun >/dev/null 2>&1 || missing="$$missing openmpi-bin"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "gemc: installing$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
	  else \
	    echo "gemc: missing$$missing; run: sudo apt-get update && sudo apt-get install -y$$missing" >&2; exit 1; \
	  fi; \
	fi

# --- the compiler -----------------------------------------------------------------------
# `&:` (make 4.3): one bison run writes both files, even under -j.
$(BUILD)/grammar/parser.tab.c $(BUILD)/grammar/parser.tab.h &: grammar/parser.y
	@mkdir -p $(BUILD)/grammar
	$(BISON) -Wall -Werror --defines=$(BUILD)/grammar/parser.tab.h -o $(BUILD)/grammar/parser.tab.c $<

$(BUILD)/grammar/scanner.c $(BUILD)/grammar/scanner.h &: grammar/scanner.l
	@mkdir -p $(BUILD)/grammar
	$(FLEX) --header-file=$(BUILD)/grammar/scanner.h -o $(BUILD)/grammar/scanner.c $<

$(BUILD)/obj/grammar/parser.tab.o: $(BUILD)/grammar/parser.tab.c | $(GEN_HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_GEN) $(DEPFLAGS) -c -o $@ $<

$(BUILD)/obj/grammar/scanner.o: $(BUILD)/grammar/scanner.c | $(GEN_HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_GEN) $(DEPFLAGS) -c -o $@ $<

# Every object of the product, with its own layer's include paths (see LAYERS). The generated
# headers come first (order only); after that, -MMD's .d files name each object's headers.
$(BUILD)/obj/%.o: %.c | $(GEN_HEADERS) $(BUILD)/layers.ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_GEMC) $(call layer_incs,$<) $(DEPFLAGS) -c -o $@ $<

# A quoted include with a path in it ("../gpu/gpu_exec.h") would step around the layers.
$(BUILD)/layers.ok: $(PRODUCT_FILES)
	@mkdir -p $(dir $@)
	@if grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*/' $(PRODUCT_FILES); then \
	  echo "gemc: an include above names a path; name the header only, and let the layer's" \
	       "include paths (Makefile, LAYERS) decide what it may see" >&2; exit 1; fi
	@touch $@

# kernels/*.cuh (the prelude and the hand-written kernels generated code pastes in) become C
# strings in the binary: kernel_<file>_cuh, NUL-terminated. No files are needed at run time.
KERNEL_SRCS := $(wildcard kernels/*.cuh)
$(BUILD)/gen/kernels_embedded.c: $(KERNEL_SRCS) Makefile
	@mkdir -p $(dir $@)
	@{ echo '// generated by the Makefile from kernels/*.cuh; do not edit'; \
	  for f in $(KERNEL_SRCS); do \
	    n=$$(basename $$f .cuh | tr -c 'a-zA-Z0-9\n' '_'); \
	    echo "const char kernel_$${n}_cuh[] = {"; \
	    od -An -v -tx1 $$f | sed 's/ *\([0-9a-f][0-9a-f]\)/0x\1,/g'; \
	    echo "0};"; \
	  done; } > $@.tmp && mv $@.tmp $@

$(BUILD)/obj/gen/kernels_embedded.o: $(BUILD)/gen/kernels_embedded.c
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(OPT) -Wall -Werror -c -o $@ $<

$(BUILD)/libgemc.a: $(LIB_OBJS) $(BUILD)/layers.ok
	@rm -f $@
	ar rcs $@ $(LIB_OBJS)

$(BUILD)/gemc: $(BUILD)/obj/compiler/driver/main.o $(BUILD)/libgemc.a
	$(CC) $(CFLAGS_GEMC) -o $@ $^ $(LDLIBS_GEMC)

-include $(LIB_OBJS:.o=.d) $(BUILD)/obj/compiler/driver/main.d

# --- tests ------------------------------------------------------------------------------
# Tests sit above every layer and see them all.
$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libgemc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_GEMC) $(ALL_INCS) -Itests/unit $(DEPFLAGS) -Wno-missing-prototypes -o $@ $< \
	  $(BUILD)/libgemc.a -lcmocka $(LDLIBS_GEMC)
-include $(UNIT_BINS:=.d)

# test_cli runs the built driver, so unit tests need it too.
test-unit: $(UNIT_BINS) $(BUILD)/gemc
	@JOBS=$(JOBS) tests/unit/run.sh $(UNIT_BINS)

test-golden: $(BUILD)/gemc
	@tests/golden/run.sh $(BUILD)/gemc

# The example models must check without a single warning.
test-models: $(BUILD)/gemc
	@set -e; for m in models/*.gem; do $(BUILD)/gemc check -q --Werror $$m; echo "ok $$m"; done

# Every model's generated CUDA compiles with NVRTC for sm_90a and sm_100a (skipped, saying
# so, when libnvrtc cannot be loaded), and the table-gradient kernels run on the CPU
# (tests/codegen/cuda_on_cpu.h) give the CPU executor's bits, and a whole training step of the
# codegen golden models' plans, run on the CPU, matches the CPU executor (plan_emu), and
# @schedule(recompute = true) changes the memory plan, never the numbers (recompute_check).
test-codegen: $(BUILD)/gemc
	@tests/codegen/nvrtc_check.sh $(BUILD)/gemc
	@tests/codegen/cuda_on_cpu_check.sh
	@tests/codegen/table_grad_emu.sh $(BUILD)/gemc
	@JOBS=$(JOBS) tests/codegen/plan_emu_all.sh $(BUILD)/gemc
	@tests/codegen/recompute_check.sh $(BUILD)/gemc
	@tests/limits/run.sh $(BUILD)/gemc

# Distributed training with real processes: 1, 2 and 4 CPU ranks through OpenMPI's mpirun
# (tests/dist/run.sh; docs/distributed.md).
test-dist: $(BUILD)/gemc
	@tests/dist/run.sh $(BUILD)/gemc

# Each layer sees exactly the headers of itself and of the layers its USES_ line names.
LAYER_HEADERS = $(foreach d,$(1),$(wildcard $(d)/*.h))
test-layers: | $(GEN_HEADERS)
	@set -e; $(foreach l,$(LAYERS),tests/layers/check_layer.sh $(l) \
	  "$(CC) $(CSTD) $(addprefix -I,$(l) $(USES_$(l)))" \
	  $(call LAYER_HEADERS,$(l) $(USES_$(l))) -- \
	  $(filter-out $(call LAYER_HEADERS,$(l) $(USES_$(l))),$(call LAYER_HEADERS,$(LAYERS)));)

# The GPU machine's helper scripts (tests/gpu/*.sh), checked without a GPU: they parse, and the
# batch draw and the A/B of two builds work over stand-ins (tests/gpu/tools_without_gpu.sh).
test-gpu-tools:
	@tests/gpu/tools_without_gpu.sh

test: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@$(MAKE) --no-print-directory test-layers test-unit test-golden test-models test-codegen \
	  test-dist test-gpu-tools

# --- GPU tests --------------------------------------------------------------------------
# On a machine with a GPU (the CUDA driver; NVRTC and cuBLASLt from the CUDA 13 toolkit):
# every generated kernel against the CPU executor, gem_tiny's 200-step curves on both
# backends, and compute-sanitizer's memcheck on a small model (tests/gpu/run.sh).
GPU_TEST := $(BUILD)/tests/gpu/test_gpu_kernels

$(GPU_TEST): tests/gpu/test_gpu_kernels.c $(BUILD)/libgemc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_GEMC) $(ALL_INCS) -Itests/gpu $(DEPFLAGS) -o $@ $< $(BUILD)/libgemc.a $(LDLIBS_GEMC)

GDPA_TEST := $(BUILD)/gpu/test_gdpa
# The standalone GDPA benchmark (the same as `gemc bench gdpa`, with --cache and --compile-only).
GDPA_BENCH := $(BUILD)/gpu/bench_gdpa

$(GDPA_TEST): tests/gpu/test_gdpa.c $(BUILD)/libgemc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_GEMC) $(ALL_INCS) -Itests/gpu $(DEPFLAGS) -o $@ $< $(BUILD)/libgemc.a $(LDLIBS_GEMC)

# Every other tests/gpu/test_*.c is one more GPU test program (tests/gpu/run.sh runs each).
GPU_EXTRA_SRCS := $(filter-out tests/gpu/test_gpu_kernels.c tests/gpu/test_gdpa.c,$(wildcard tests/gpu/test_*.c))
GPU_EXTRA_TESTS := $(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(GPU_EXTRA_SRCS))

$(GPU_EXTRA_TESTS): $(BUILD)/tests/gpu/%: tests/gpu/%.c $(BUILD)/libgemc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_GEMC) $(ALL_INCS) -Itests/gpu $(DEPFLAGS) -o $@ $< $(BUILD)/libgemc.a $(LDLIBS_GEMC)
$(GDPA_BENCH): tests/gpu/bench_gdpa.c $(BUILD)/libgemc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_GEMC) $(ALL_INCS) -Itests/gpu $(DEPFLAGS) -o $@ $< $(BUILD)/libgemc.a $(LDLIBS_GEMC)
-include $(GPU_TEST).d $(GDPA_TEST).d $(GDPA_BENCH).d $(GPU_EXTRA_TESTS:=.d)

test-gpu: $(BUILD)/gemc $(GPU_TEST) $(GDPA_TEST) $(GDPA_BENCH) $(GPU_EXTRA_TESTS)
	@tests/gpu/run.sh $(BUILD) $(if $(PART),--part $(PART))

# Generated kernels of tests/golden/codegen_small.gem (fused add + rmsnorm, pooled mean
# embedding, the table_grad pipeline with row-wise Adagrad) run through the plan's own launches
# on the GPU against CPU references (docs/codegen.md).
CODEGEN_GPU_TEST := $(BUILD)/tests/gpu/codegen_kernels_gpu

$(CODEGEN_GPU_TEST): tests/gpu/codegen_kernels_gpu.c $(BUILD)/libgemc.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_GEMC) $(ALL_INCS) $(DEPFLAGS) -Wno-missing-prototypes -o $@ $< $(BUILD)/libgemc.a \
	  $(LDLIBS_GEMC)
-include $(CODEGEN_GPU_TEST).d

test-gpu-codegen: $(CODEGEN_GPU_TEST)
	@$(CODEGEN_GPU_TEST)

# The demo trains on synthetic data from a hidden teacher; NE below 1.0 beats the constant
# predictor. It finishes in well under a minute on 2 cores, the build included.
DEMO_STEPS ?= 2000
demo: deps
	@$(MAKE) --no-print-directory all
	@set -e; for m in models/*.gem; do $(BUILD)/gemc check -q $$m; done; \
	  echo "gemc check: every model in models/ is valid"
	@echo; echo "== gemc train models/gem_tiny.gem --steps $(DEMO_STEPS)"; echo
	@$(BUILD)/gemc train models/gem_tiny.gem --backend auto --steps $(DEMO_STEPS) \
	  --report $(BUILD)/demo_report.json
	@echo; echo "every step's loss, the curve and the final metrics: $(BUILD)/demo_report.json"

# --- fuzzing and speed ------------------------------------------------------------------
# The fuzz build compiles every source with the sanitizers and GEMC_FUZZING defined (an
# internal error then aborts, so libFuzzer reports it as a crash with its input). Crashing
# inputs are saved under $(BUILD)/fuzz/ as crash-*, leak-* or timeout-*.
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_FLAGS   := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
FUZZ_SEEDS    = $(wildcard tests/golden/*.gem models/*.gem)
FUZZ_BIN     := $(BUILD)/fuzz/fuzz_frontend

$(FUZZ_BIN): tests/fuzz/fuzz_frontend.c $(PRODUCT_FILES) $(BUILD)/grammar/parser.tab.c \
             $(BUILD)/grammar/scanner.c $(BUILD)/gen/kernels_embedded.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CSTD) $(FUZZ_FLAGS) $(ALL_INCS) -DGEMC_FUZZING \
	  -o $@ tests/fuzz/fuzz_frontend.c $(LIB_SRCS) $(BUILD)/gen/kernels_embedded.c \
	  $(BUILD)/grammar/parser.tab.c $(BUILD)/grammar/scanner.c -lm -ldl -pthread

fuzz: deps
	@$(MAKE) --no-print-directory $(FUZZ_BIN)
	@mkdir -p $(BUILD)/fuzz/corpus
	@for f in $(FUZZ_SEEDS); do cp "$$f" $(BUILD)/fuzz/corpus/; done
	$(FUZZ_BIN) -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=10 \
	  -rss_limit_mb=2048 -print_final_stats=1 -dict=tests/fuzz/gem.dict \
	  -artifact_prefix=$(BUILD)/fuzz/ $(BUILD)/fuzz/corpus

# Times `gemc check` and `gemc ir` on generated 1,000- and 10,000-layer models.
bench-frontend: $(BUILD)/gemc
	@mkdir -p $(BUILD)/bench
	$(CC) $(CFLAGS_GEMC) $(ALL_INCS) -o $(BUILD)/bench/gen_big_model tests/bench/gen_big_model.c
	$(BUILD)/bench/gen_big_model 1000 > $(BUILD)/bench/big1000.gem
	$(BUILD)/bench/gen_big_model 10000 > $(BUILD)/bench/big10000.gem
	@tests/bench/bench_frontend.sh $(BUILD)/gemc $(BUILD)/bench/big1000.gem $(BUILD)/bench/big10000.gem

clean:
	rm -rf $(BUILD)
