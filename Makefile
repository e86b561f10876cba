# dtrun - torchrun in C with a training runtime inside.
#
#   make            build ./dtrun (no CUDA in it), and beside it libdtrun_cuda.so (the
#                   CUDA backend + NCCL communicator, loaded by GPU workers) when nvcc is found
#   make test       all tests (unit + integration), one summary line at the end
#   make test SAN=1 the same under AddressSanitizer + UBSan
#   make test-gpu-script  the one-call GPU check (scripts/gpu_check.sh) end to end on
#                   the CPU emulator: GPU_CHECK_EMU=1, packing, preflight, every row
#   make run        the demo
#   make bench      benchmarks
#   make fuzz       libFuzzer targets for every parser of a user's file and the store's
#                   frame parser (clang), FUZZ_SECONDS each; FUZZ_TARGETS= picks some
#   make fuzz-server  libFuzzer target for the running store over several connections
#   make clean
#
# Options: NO_CUDA=1 (no libdtrun_cuda.so), SAN=1 (dtrun-san; no CUDA library),
#          CUDA_ARCH="-gencode ...", V=1 (echo commands).
# Sources are found by folder (ARCHITECTURE.md): adding a file needs no edit here.

CC      ?= gcc
NVCC    ?= nvcc
VERSION := 0.1.0
GIT_REV := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

# Every core compiles unless -j was given (the CUDA library's nvcc jobs above all).
ifeq ($(filter -j%,$(MAKEFLAGS)),)
  MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif
SAN ?= 0
ifeq ($(SAN),1)
  BUILD := build-san
  SANFLAGS := -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow -fno-omit-frame-pointer
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
# -rdynamic: the CUDA library resolves dt_* (errors, accounted memory, log, the
# communicator's internals) from the binary that loads it: one copy of each.
LDFLAGS := -fopenmp -pthread -rdynamic $(SANFLAGS)
LDLIBS  := -luv -lcjson -lm -lmvec -ldl

# ---- CUDA detection -------------------------------------------------------
# dtrun itself is built without CUDA headers, defines or libraries; the CUDA code
# (kernels/cuda/*.cu and the NCCL communicator, runtime/*/*_nccl.c) goes into
# libdtrun_cuda.so beside it, which common/cudalib.c loads in the workers that use
# a GPU. Under SAN=1 the library is not built (the sanitizers do not cover nvcc's
# code, and there is no GPU to run it on where the suite runs).
HAVE_NVCC := $(shell command -v $(NVCC) 2>/dev/null)
ifeq ($(NO_CUDA),1)
  HAVE_NVCC :=
endif
CUDA_LIB := libdtrun_cuda.so
CU_SRC := $(wildcard kernels/cuda/*.cu runtime/*/*.cu)
CU_C_SRC := $(wildcard runtime/*/*_nccl.c)
ifneq ($(HAVE_NVCC),)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(HAVE_NVCC)))
  CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 \
               -gencode arch=compute_90,code=compute_90
  CUDA_CFLAGS := -DDT_USE_CUDA -I$(CUDA_HOME)/include
  # -MMD -MP: .cu objects depend on the headers they include (kernels/kernels.h's op
  # table above all), as the C objects do.
  NVFLAGS := -O3 -std=c++17 $(CUDA_ARCH) -I. -DDT_USE_CUDA -Xcompiler -fPIC,-Wall \
             -DDT_VERSION='"$(VERSION)"' -MMD -MP
  CUDA_LDFLAGS := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -Wl,-rpath,$(CUDA_HOME)/lib64 \
                  -Wl,-rpath,$(CUDA_HOME)/lib
  CUDA_LDLIBS := -lcudart -lcublasLt -lcublas -lnccl -lstdc++
  CU_OBJ  := $(patsubst %.cu,$(BUILD)/%.cu.o,$(CU_SRC)) $(patsubst %.c,$(BUILD)/%.pic.o,$(CU_C_SRC))
  # The library's CUDA dependencies by soname (what the loader preloads), read from
  # the installed CUDA libraries so that they follow its version.
  soname = $(shell f=$$(ls $(CUDA_HOME)/lib64/lib$(1).so $(CUDA_HOME)/lib/lib$(1).so \
             $$($(CC) -print-file-name=lib$(1).so) 2>/dev/null | head -1); \
             readelf -d "$$f" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  CUDA_DEPS := $(strip $(foreach l,cudart cublasLt cublas nccl,$(call soname,$(l))))
  ifeq ($(SAN),1)
    CUDA_LIB_TARGET :=
    FEATURES := "✗ CUDA library not built under SAN=1 (sanitizers do not cover nvcc's code): dtrun-san runs on the CPU"
  else
    CUDA_LIB_TARGET := $(CUDA_LIB)
    FEATURES := "✓ nvcc found: $(CUDA_LIB) built beside dtrun (CUDA backend + NCCL communicator, $(CUDA_HOME); loaded by GPU workers only)"
  endif
else
  CU_OBJ  :=
  CUDA_LIB_TARGET :=
  FEATURES := "✗ CUDA library not built (no nvcc, or NO_CUDA=1): dtrun runs on the CPU"
endif

# ---- sources --------------------------------------------------------------
LIB_SRC := $(filter-out $(CU_C_SRC),$(wildcard common/*.c rendezvous/*.c kernels/*.c kernels/cpu/*.c runtime/*/*.c))
CLI_SRC := $(filter-out cli/main.c,$(wildcard cli/*.c))
LIB_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRC) $(CLI_SRC))
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

# Objects depend on the flags they were compiled with (less the git revision), kept
# in $(BUILD)/.flags, rewritten only when they change: after a change of options or
# of the detected features `make` recompiles instead of linking objects built for
# another configuration (non-PIC objects in a shared library, say).
# flags_file FILE, FLAGS: FILE holds FLAGS; its time changes only with its content.
flags_file = $(shell mkdir -p $(dir $(1)))$(file >$(1).new,$(filter-out -DDT_GIT_REV=%,$(2)))$(shell \
             cmp -s $(1).new $(1) && rm -f $(1).new || mv -f $(1).new $(1))
$(call flags_file,$(BUILD)/.flags,$(CC) $(CFLAGS) $(LDFLAGS) $(CUDA_CFLAGS) $(NVFLAGS) $(CUDA_DEPS))
FLAGS_STAMP := $(BUILD)/.flags
# The revision alone: only cli/main.c prints it (dtrun --version), so only main.o is
# rebuilt when HEAD moves (it printed the revision of the last full build before).
$(call flags_file,$(BUILD)/.git_rev,$(GIT_REV))

.PHONY: all deps test test-long run bench fuzz fuzz-server clean features gpu-tests gpu-tests-build test-gpu-script install
all: features dtrun$(if $(filter 1,$(SAN)),-san) $(CUDA_LIB_TARGET)

$(BUILD)/cli/main.o: $(BUILD)/.git_rev  # after all: the first rule is the default goal

features:
	@echo $(FEATURES)

$(DEPS_STAMP): scripts/install-deps.sh
	@mkdir -p $(BUILD)
	$(Q)scripts/install-deps.sh
	@touch $@

deps: $(DEPS_STAMP)

$(BUILD)/%.o: %.c $(FLAGS_STAMP) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

# The C files of the CUDA library: position-independent, with CUDA's headers.
$(BUILD)/%.pic.o: %.c $(FLAGS_STAMP) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $< (CUDA library)")
	$(Q)$(CC) $(CFLAGS) -fPIC $(CUDA_CFLAGS) -c $< -o $@

# The loader preloads the CUDA library's dependencies by these sonames.
$(BUILD)/common/cudalib.o: CFLAGS += $(if $(CUDA_DEPS),-DDT_CUDALIB_DEPS='"$(CUDA_DEPS)"')

$(BUILD)/%.cu.o: %.cu $(FLAGS_STAMP) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC  $<")
	$(Q)$(NVCC) $(NVFLAGS) -c $< -o $@

# The fused attention's PTX is kept (build/kernels/cuda/keep/*.compute_90.ptx, no
# extra compile): tests/integration/test_fused_attention_ptx.sh checks from it that
# every WMMA load and store names shared memory (LDSM, not generic LD.E) and, through
# ptxas -v, that the tensor-core kernels fit 4 blocks per SM without spilling.
$(BUILD)/kernels/cuda/cuda_attention_fused.cu.o: NVFLAGS += -keep -keep-dir $(BUILD)/kernels/cuda/keep
$(BUILD)/kernels/cuda/cuda_attention_fused.cu.o: | $(BUILD)/kernels/cuda/keep
$(BUILD)/kernels/cuda/keep:
	@mkdir -p $@

dtrun: $(MAIN_OBJ) $(LIB_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

dtrun-san: $(MAIN_OBJ) $(LIB_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# Its undefined dt_* symbols are dtrun's (linked -rdynamic).
$(CUDA_LIB): $(CU_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) -shared -fopenmp -pthread $^ -o $@ $(CUDA_LDFLAGS) $(CUDA_LDLIBS)

$(BUILD)/tests/test_%: tests/test_%.c $(LIB_OBJ) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TEST  $@")
	$(Q)$(CC) $(CFLAGS) $< $(LIB_OBJ) -o $@ $(LDFLAGS) $(LDLIBS) -lcriterion

# The GPU tests and the CUDA op benchmarks link the CUDA code in (the loader finds
# its symbols in the process); every other binary is CUDA-free like dtrun.
$(BUILD)/tests/gpu/test_%: tests/gpu/test_%.c $(LIB_OBJ) $(CU_OBJ) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) $(CUDA_CFLAGS) $< $(LIB_OBJ) $(CU_OBJ) -o $@ $(LDFLAGS) $(CUDA_LDFLAGS) $(LDLIBS) \
	    $(if $(CU_OBJ),$(CUDA_LDLIBS)) -lcriterion

$(BUILD)/tests/helpers/bench_cuda_%: tests/helpers/bench_cuda_%.c $(LIB_OBJ) $(CU_OBJ) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) $(CUDA_CFLAGS) $< $(LIB_OBJ) $(CU_OBJ) -o $@ $(LDFLAGS) $(CUDA_LDFLAGS) $(LDLIBS) \
	    $(if $(CU_OBJ),$(CUDA_LDLIBS))

$(BUILD)/tests/helpers/%: tests/helpers/%.c $(LIB_OBJ) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) $< $(LIB_OBJ) -o $@ $(LDFLAGS) $(LDLIBS)

DTRUN_BIN := $(if $(filter 1,$(SAN)),dtrun-san,dtrun)

test: features $(DTRUN_BIN) $(CUDA_LIB_TARGET) $(TEST_BIN) $(HELPER_BIN)
	$(Q)DTRUN=$(CURDIR)/$(DTRUN_BIN) BUILD=$(BUILD) SAN=$(SAN) scripts/run_tests.sh

# The long scenarios (tests/long/), a tier of their own so `make test` stays short;
# CI (.ci/run) runs them after it.
test-long: features $(DTRUN_BIN) $(CUDA_LIB_TARGET) $(HELPER_BIN) $(if $(filter 1,$(SAN)),,emu)
	$(Q)DTRUN=$(CURDIR)/$(DTRUN_BIN) BUILD=$(BUILD) SAN=$(SAN) TIER=long scripts/run_tests.sh

gpu-tests-build: $(DTRUN_BIN) $(CUDA_LIB_TARGET) $(GPU_TEST_BIN)

gpu-tests: $(DTRUN_BIN) $(CUDA_LIB_TARGET) $(GPU_TEST_BIN)
	$(Q)for t in $(GPU_TEST_BIN); do $$t || exit 1; done

# scripts/gpu_check.sh as on the GPU machine, against the emulator build (about 30 s);
# `make test` runs only its packing and preflight (tests/integration/test_gpu_script.sh).
test-gpu-script: features dtrun
	$(Q)GPU_CHECK_EMU=1 OUT=$${OUT:-/tmp/gpu_check_emu} bash scripts/gpu_check.sh

# The demo trains on the CPU (configs/demo.json: device cpu): it does not wait for the
# CUDA library (`make` builds it).
run: features dtrun
	$(Q)scripts/demo.sh

bench: features dtrun $(CUDA_LIB_TARGET)
	$(Q)scripts/bench/run_all.sh

# ---- fuzzing ----------------------------------------------------------------
# One libFuzzer target per parser of a file a user hands dtrun (and the store's
# frame parser), tests/fuzz/fuzz_NAME.c, each linked from the sources it needs
# compiled once with clang's sanitizers into build-fuzz/obj. `make fuzz` runs every
# target for FUZZ_SECONDS (default 60) from its seeds (tests/fuzz/seeds_NAME) and
# prints per target the inputs run, the findings and the peak RSS (scripts/fuzz.sh);
# FUZZ_TARGETS="tokenizer shard" runs some. A crash, a sanitizer report, an input
# over 10 s or over 2 GiB is a finding (its input in build-fuzz/artifacts/NAME/).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= store_frame tokenizer safetensors st_index hf_config adapter_config ckpt_meta report shard \
                chat_template
FUZZ_CFLAGS := -std=gnu11 -g -O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
               -fopenmp -pthread -I.
FUZZ_LDFLAGS := -fsanitize=fuzzer,address,undefined -fopenmp -pthread
FUZZ_LDLIBS := -luv -lcjson -lm -ldl
FUZZ_BASE := common/status.c common/mem.c common/log.c common/clock.c common/fs.c common/fs_safe.c
# What dt_model_lookup brings in: every model, and the CPU kernels their ops name.
FUZZ_MODELS := $(addprefix runtime/model/,model.c registry.c gpt.c llama.c mlp.c net.c net_linear.c \
               recompute.c stage.c lora.c lora_config.c net_cp.c) kernels/backend.c $(wildcard kernels/cpu/*.c) common/cudalib.c \
               common/gpuinfo.c common/meminfo.c common/rng.c
FUZZ_SRC_store_frame := rendezvous/proto.c
FUZZ_SRC_tokenizer := $(addprefix runtime/tokenize/,tok.c tok_bpe.c tok_chunk.c tok_cut.c tok_load.c tok_pretok.c \
                      tok_unicode.c tok_unicode_tables.c)
FUZZ_SRC_chat_template := $(wildcard runtime/tokenize/jinja_*.c) runtime/tokenize/tok_unicode.c \
                          runtime/tokenize/tok_unicode_tables.c
FUZZ_SRC_safetensors := runtime/ckpt/st_read.c
FUZZ_SRC_st_index := runtime/ckpt/st_read.c
FUZZ_SRC_hf_config := runtime/model/hf_config.c $(FUZZ_MODELS)
FUZZ_SRC_adapter_config := runtime/model/lora_config.c
FUZZ_SRC_ckpt_meta := $(addprefix runtime/ckpt/,ckpt_load.c ckpt_io.c ckpt_meta.c ckpt_read.c) $(FUZZ_MODELS)
FUZZ_SRC_report := runtime/tools/report.c
FUZZ_SRC_shard := runtime/tokenize/shard.c $(addprefix runtime/train/,data.c data_ahead.c data_mix.c data_read.c) \
                  common/rng.c
FUZZ_BINS := $(patsubst %,build-fuzz/fuzz_%,$(FUZZ_TARGETS))
# The objects of target $(1) (a function: a % in a pattern rule's prerequisites is the stem).
fuzz_objs = $(patsubst %.c,build-fuzz/obj/%.o,$(sort $(FUZZ_BASE) $(FUZZ_SRC_$(1))))

fuzz: $(FUZZ_BINS)
	$(Q)FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh $(FUZZ_TARGETS)

build-fuzz/obj/%.o: %.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CLANG $<")
	$(Q)clang $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

.PRECIOUS: build-fuzz/obj/%.o
.SECONDEXPANSION:
build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c $$(call fuzz_objs,$$*)
	@$(if $(Q),echo "  FUZZ  $@")
	$(Q)clang $(FUZZ_CFLAGS) $(FUZZ_LDFLAGS) $< $(filter %.o,$^) -o $@ $(FUZZ_LDLIBS)

-include $(wildcard build-fuzz/obj/*/*.d build-fuzz/obj/*/*/*.d)

# The running server fed sequences of frames over several connections.
fuzz-server: | $(DEPS_STAMP)
	@mkdir -p build-fuzz/corpus-server
	$(Q)clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -I. \
	    tests/fuzz/fuzz_store_server.c rendezvous/store_server*.c rendezvous/store_auth.c rendezvous/store_client.c common/sha256.c common/rng.c common/fs.c common/fs_safe.c \
	    rendezvous/proto.c common/status.c common/mem.c common/log.c common/clock.c \
	    -luv -lpthread -o build-fuzz/fuzz_store_server
	$(Q)build-fuzz/fuzz_store_server -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	    build-fuzz/corpus-server tests/fuzz/seeds_server tests/fuzz/seeds

# make install [PREFIX=/usr/local] [DESTDIR=...]: dtrun into $(PREFIX)/bin and, when
# built, its CUDA library beside it (where the binary looks first: common/cudalib.c).
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
install: features dtrun $(CUDA_LIB_TARGET)
	install -d "$(DESTDIR)$(BINDIR)"
	install -m 755 dtrun "$(DESTDIR)$(BINDIR)/dtrun"
	$(if $(CUDA_LIB_TARGET),install -m 755 $(CUDA_LIB) "$(DESTDIR)$(BINDIR)/$(CUDA_LIB)")
	@echo "installed $(DESTDIR)$(BINDIR)/dtrun$(if $(CUDA_LIB_TARGET), and $(CUDA_LIB) beside it)"

clean:
	rm -rf build build-san build-fuzz dtrun dtrun-san $(CUDA_LIB)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# The CUDA emulator build (build-emu/, `make emu`, run by `make test`): tests/cuemu/cuemu.mk
include tests/cuemu/cuemu.mk
