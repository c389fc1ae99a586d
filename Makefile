# gemc: the .gem compiler and runtime.
#   make            build build/gemc
#   make test       install missing packages (as root), build, run every CPU test
#   make demo       the main job: build gemc and train models/gem_tiny.gem (CPU), printing
#                   the learning curve and the final held-out metrics (DEMO_STEPS)
#   make fuzz       libFuzzer over the whole front end (FUZZ_SECONDS, default 60)
#   make bench-frontend   time check+IR of generated 1,000- and 10,000-layer models
# Generated files all go under build/.

CC      ?= cc
BUILD   ?= build
BISON   ?= bison
FLEX    ?= flex

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
           -Wvla -Wformat=2 -Wundef -Wpointer-arith -Wcast-qual
CSTD    := -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE
OPT     ?= -O2 -g
CPPFLAGS_GEMC := -Icompiler -Iruntime -Icodegen -I$(BUILD)/grammar
CFLAGS_GEMC   := $(CSTD) $(OPT) $(WARN) $(CPPFLAGS_GEMC) $(EXTRA_CFLAGS)
# The scanner and parser that flex and bison write are not ours to lint.
CFLAGS_GEN    := $(CSTD) $(OPT) -Wall -Werror -Wno-unused-function -Wno-unused-but-set-variable \
                 $(CPPFLAGS_GEMC) -Igrammar $(EXTRA_CFLAGS)
LDLIBS_GEMC   := -lm $(EXTRA_LDFLAGS)

LIB_SRCS  := $(filter-out compiler/main.c,$(wildcard compiler/*.c)) $(wildcard grammar/*.c) \
             $(wildcard runtime/*.c) $(wildcard codegen/*.c)
LIB_OBJS  := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRCS)) \
             $(BUILD)/obj/grammar/parser.tab.o $(BUILD)/obj/grammar/scanner.o
HEADERS   := $(wildcard compiler/*.h compiler/*.def grammar/*.h runtime/*.h codegen/*.h) $(BUILD)/grammar/parser.tab.h

UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRCS))

.PHONY: all test test-unit test-golden test-models deps demo fuzz bench-frontend clean
.DELETE_ON_ERROR:

all: $(BUILD)/gemc

# --- dependencies -----------------------------------------------------------------------
# Installs flex, bison and cmocka when they are missing and we are root; otherwise prints
# the exact command to run.
deps:
	@missing=""; \
	command -v $(FLEX) >/dev/null 2>&1 || missing="$$missing flex"; \
	command -v $(BISON) >/dev/null 2>&1 || missing="$$missing bison"; \
	[ -f /usr/include/cmocka.h ] || missing="$$missing libcmocka-dev"; \
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

$(BUILD)/obj/grammar/parser.tab.o: $(BUILD)/grammar/parser.tab.c $(BUILD)/grammar/scanner.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_GEN) -c -o $@ $<

$(BUILD)/obj/grammar/scanner.o: $(BUILD)/grammar/scanner.c $(BUILD)/grammar/parser.tab.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_GEN) -c -o $@ $<

$(BUILD)/obj/%.o: %.c $(HEADERS) $(BUILD)/grammar/scanner.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_GEMC) -c -o $@ $<

$(BUILD)/libgemc.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/gemc: $(BUILD)/obj/compiler/main.o $(BUILD)/libgemc.a
	$(CC) $(CFLAGS_GEMC) -o $@ $^ $(LDLIBS_GEMC)

# --- tests ------------------------------------------------------------------------------
$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libgemc.a $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_GEMC) -Wno-missing-prototypes -o $@ $< $(BUILD)/libgemc.a -lcmocka $(LDLIBS_GEMC)

# test_cli runs the built driver, so unit tests need it too.
test-unit: $(UNIT_BINS) $(BUILD)/gemc
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; $$t; done

test-golden: $(BUILD)/gemc
	@tests/golden/run.sh $(BUILD)/gemc

# The example models must check without a single warning.
test-models: $(BUILD)/gemc
	@set -e; for m in models/*.gem; do $(BUILD)/gemc check -q --Werror $$m; echo "ok $$m"; done

test: deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory test-unit test-golden test-models

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

$(FUZZ_BIN): tests/fuzz/fuzz_frontend.c $(LIB_SRCS) $(BUILD)/grammar/parser.tab.c \
             $(BUILD)/grammar/scanner.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CSTD) $(FUZZ_FLAGS) $(CPPFLAGS_GEMC) -Igrammar -DGEMC_FUZZING \
	  -o $@ tests/fuzz/fuzz_frontend.c $(LIB_SRCS) \
	  $(BUILD)/grammar/parser.tab.c $(BUILD)/grammar/scanner.c -lm

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
	$(CC) $(CFLAGS_GEMC) -o $(BUILD)/bench/gen_big_model tests/bench/gen_big_model.c
	$(BUILD)/bench/gen_big_model 1000 > $(BUILD)/bench/big1000.gem
	$(BUILD)/bench/gen_big_model 10000 > $(BUILD)/bench/big10000.gem
	@tests/bench/bench_frontend.sh $(BUILD)/gemc $(BUILD)/bench/big1000.gem $(BUILD)/bench/big10000.gem

clean:
	rm -rf $(BUILD)
