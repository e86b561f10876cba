# dtrun - torchrun in C with a training runtime inside.
#
#   make            build ./dtrun (CPU always; CUDA backend + NCCL when nvcc is found)
#   make test       all tests (unit + integration), one summary line at the end
#   make test SAN=1 the same under AddressSanitizer + UBSan
#   make run        the demo
#   make bench      benchmarks
#   make fuzz       libFuzzer target for the store's frame parser (clang)
#   make clean
#
# Options: NO_CUDA=1 (skip CUDA), SAN=1, CUDA_ARCH="-gencode ...", V=1 (echo commands).
# Sources are found by folder (ARCHITECTURE.md): adding a file needs no edit here.

CC      ?= gcc
NVCC    ?= nvcc
VERSION := 0.1.0
GIT_REV := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

SAN ?= 0
ifeq ($(SAN),1)
  BUILD := build-san
  SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
  OPT := -O1
else
  BUILD := build
  SANFLAGS :=
  ARCH ?= -march=native
  OPT := -O3 $(ARCH)
endif

CFLAGS  := -std=gnu11 $(OPT) -g -Wall -Wextra -Werror -Wno-unused-parameter \
           -fopenmp -pthread -I. $(SANFLAGS) \
           -DDT_VERSION='"$(VERSION)"' -DDT_GIT_REV='"$(GIT_REV)"' -MMD -MP
LDFLAGS := -fopenmp -pthread $(SANFLAGS)
LDLIBS  := -luv -lcjson -lopenblas -lm -ldl

# ---- CUDA detection -------------------------------------------------------
HAVE_NVCC := $(shell command -v $(NVCC) 2>/dev/null)
ifeq ($(NO_CUDA),1)
  HAVE_NVCC :=
endif
CU_SRC := $(wildcard kernels/cuda/*.cu runtime/*/*.cu)
ifneq ($(HAVE_NVCC),)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(HAVE_NVCC)))
  CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 \
               -gencode arch=compute_90,code=compute_90
  CFLAGS  += -DDT_USE_CUDA -I$(CUDA_HOME)/include
  NVFLAGS := -O3 -std=c++17 $(CUDA_ARCH) -I. -DDT_USE_CUDA -Xcompiler -fPIC,-Wall \
             -DDT_VERSION='"$(VERSION)"'
  LDFLAGS += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -Wl,-rpath,$(CUDA_HOME)/lib64 \
             -Wl,-rpath,$(CUDA_HOME)/lib
  LDLIBS  += -lcudart -lcublasLt -lcublas -lnccl -lstdc++
  CU_OBJ  := $(patsubst %.cu,$(BUILD)/%.cu.o,$(CU_SRC))
  FEATURES := "✓ nvcc found: CUDA backend and NCCL communicator built ($(CUDA_HOME))"
else
  CU_OBJ  :=
  FEATURES := "✗ CUDA backend not built (no nvcc or NO_CUDA=1): CPU only"
endif

# ---- sources --------------------------------------------------------------
LIB_SRC := $(wildcard common/*.c rendezvous/*.c kernels/*.c kernels/cpu/*.c runtime/*/*.c)
CLI_SRC := $(filter-out cli/main.c,$(wildcard cli/*.c))
LIB_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRC) $(CLI_SRC)) $(CU_OBJ)
MAIN_OBJ := $(BUILD)/cli/main.o
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
GPU_TEST_SRC := $(wildcard tests/gpu/test_*.c)
GPU_TEST_BIN := $(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(GPU_TEST_SRC))
HELPER_SRC := $(wildcard tests/helpers/*.c)
HELPER_BIN := $(patsubst tests/helpers/%.c,$(BUILD)/tests/helpers/%,$(HELPER_SRC))

ifeq ($(V),1)
  Q :=
else
  Q := @
endif

DEPS_STAMP := $(BUILD)/.deps-ok

.PHONY: all deps test run bench fuzz clean features gpu-tests gpu-tests-build
all: features dtrun$(if $(filter 1,$(SAN)),-san)

features:
	@echo $(FEATURES)

$(DEPS_STAMP): scripts/install-deps.sh
	@mkdir -p $(BUILD)
	$(Q)scripts/install-deps.sh
	@touch $@

deps: $(DEPS_STAMP)

$(BUILD)/%.o: %.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC  $<")
	$(Q)$(NVCC) $(NVFLAGS) -c $< -o $@

dtrun: $(MAIN_OBJ) $(LIB_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

dtrun-san: $(MAIN_OBJ) $(LIB_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/test_%: tests/test_%.c $(LIB_OBJ) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TEST  $@")
	$(Q)$(CC) $(CFLAGS) $< $(LIB_OBJ) -o $@ $(LDFLAGS) $(LDLIBS) -lcriterion

$(BUILD)/tests/gpu/test_%: tests/gpu/test_%.c $(LIB_OBJ) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) $< $(LIB_OBJ) -o $@ $(LDFLAGS) $(LDLIBS) -lcriterion

$(BUILD)/tests/helpers/%: tests/helpers/%.c $(LIB_OBJ) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) $< $(LIB_OBJ) -o $@ $(LDFLAGS) $(LDLIBS)

DTRUN_BIN := $(if $(filter 1,$(SAN)),dtrun-san,dtrun)

test: features $(DTRUN_BIN) $(TEST_BIN) $(HELPER_BIN)
	$(Q)DTRUN=$(CURDIR)/$(DTRUN_BIN) BUILD=$(BUILD) SAN=$(SAN) scripts/run_tests.sh

gpu-tests-build: $(DTRUN_BIN) $(GPU_TEST_BIN)

gpu-tests: $(DTRUN_BIN) $(GPU_TEST_BIN)
	$(Q)for t in $(GPU_TEST_BIN); do $$t || exit 1; done

run: features dtrun
	$(Q)scripts/demo.sh

bench: features dtrun
	$(Q)scripts/bench/run_all.sh

# libFuzzer target for the store's frame parser; FUZZ_SECONDS=60 make fuzz
FUZZ_SECONDS ?= 60
fuzz: | $(DEPS_STAMP)
	@mkdir -p build-fuzz/corpus
	$(Q)clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -I. \
	    tests/fuzz/fuzz_store_frame.c rendezvous/proto.c common/status.c common/mem.c \
	    common/log.c common/clock.c -o build-fuzz/fuzz_store_frame
	$(Q)build-fuzz/fuzz_store_frame -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	    build-fuzz/corpus tests/fuzz/seeds

clean:
	rm -rf build build-san build-fuzz dtrun dtrun-san

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# The CUDA emulator build (build-emu/, `make emu`, run by `make test`): tests/cuemu/cuemu.mk
include tests/cuemu/cuemu.mk
