# cuemu.mk - the CUDA emulator build (included by the Makefile): a third variant of
# dtrun in build-emu/ where kernels/cuda/*.cu are compiled by g++ against
# tests/cuemu/cuemu.h and run on the CPU, so `make test` exercises the CUDA backend
# on machines without a GPU. As dtrun has libdtrun_cuda.so, dtrun-emu has
# libdtrun_cuda_emu.so beside it (the .cu objects and the emulator's runtime),
# loaded on demand through the same loader (common/cudalib.c): `make test` runs the
# dlopen path here too. The emulator has no NCCL, so that library has none.
#
#   make emu        build dtrun-emu, libdtrun_cuda_emu.so and build-emu/tests/{gpu,cuemu}/test_*
#   make emu-test   run those test binaries
#
# The emulator build is skipped under SAN=1 and when g++ is missing. With nvcc, the
# emulator's own tests (tests/cuemu/test_cuemu*.cu) are also built for the real GPU as
# $(BUILD)/tests/cuemu/test_cuemu (part of gpu-tests-build / gpu-tests).

EMU_BUILD := build-emu
CXX_EMU ?= g++
HAVE_GXX := $(shell command -v $(CXX_EMU) 2>/dev/null)

EMU_CUDA_LIB := libdtrun_cuda_emu.so
EMU_DEFS := -DDT_USE_CUDA -DDT_CUEMU -DDT_VERSION='"$(VERSION)"' -DDT_GIT_REV='"$(GIT_REV)"' \
            -DDT_CUDALIB_NAME='"$(EMU_CUDA_LIB)"' -DDT_CUDALIB_DEPS='""'
EMU_CFLAGS := -std=gnu11 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -fopenmp -pthread -I. \
              $(EMU_DEFS) -MMD -MP
EMU_CXXFLAGS := -std=gnu++17 -O2 -g -fPIC -fstack-clash-protection -Wall -Wextra -Werror -Wno-unused-parameter -Wno-unknown-pragmas \
                -Wno-unused-function -pthread -I. $(EMU_DEFS) -MMD -MP
# .cu files: C++ with the emulator's header in front of everything; <mma.h> is its shim.
EMU_CUFLAGS := -x c++ -include tests/cuemu/cuemu.h -Itests/cuemu/include $(EMU_CXXFLAGS)
EMU_LDFLAGS := -fopenmp -pthread -rdynamic
EMU_LDLIBS := -luv -lcjson -lm -ldl

# Objects depend on the flags they were compiled with (Makefile: flags_file).
ifneq ($(HAVE_GXX),)
$(call flags_file,$(EMU_BUILD)/.flags,$(CC) $(CXX_EMU) $(EMU_CFLAGS) $(EMU_CXXFLAGS) $(EMU_LDFLAGS))
endif
EMU_FLAGS_STAMP := $(EMU_BUILD)/.flags

EMU_RT_SRC := $(wildcard tests/cuemu/cuemu*.cc)
# The emulator's own tests: one binary from tests/cuemu/test_cuemu*.cu.
CUEMU_TEST_SRC := $(wildcard tests/cuemu/test_cuemu*.cu)
EMU_RT_OBJ := $(patsubst %.cc,$(EMU_BUILD)/%.o,$(EMU_RT_SRC))
EMU_CU_OBJ := $(patsubst %.cu,$(EMU_BUILD)/%.cu.o,$(CU_SRC))
EMU_LIB_OBJ := $(patsubst %.c,$(EMU_BUILD)/%.o,$(LIB_SRC) $(CLI_SRC))
# The emulated CUDA library; the emulator's test binaries link these objects in.
EMU_CUDA_OBJ := $(EMU_CU_OBJ) $(EMU_RT_OBJ)
# NCCL is not emulated.
EMU_GPU_TEST_SRC := $(filter-out tests/gpu/test_comm_nccl.c,$(GPU_TEST_SRC))
EMU_TEST_BIN := $(patsubst tests/gpu/%.c,$(EMU_BUILD)/tests/gpu/%,$(EMU_GPU_TEST_SRC)) \
                $(EMU_BUILD)/tests/cuemu/test_cuemu

.PHONY: emu emu-test clean-emu

ifneq ($(HAVE_GXX),)
emu: dtrun-emu $(EMU_CUDA_LIB) $(EMU_TEST_BIN)

emu-test: emu
	$(Q)fail=0; for t in $(EMU_TEST_BIN); do echo "== $$t"; $$t || fail=1; done; exit $$fail

dtrun-emu: $(EMU_BUILD)/cli/main.o $(EMU_LIB_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $(EMU_LDFLAGS) $^ -o $@ $(EMU_LDLIBS)

$(EMU_CUDA_LIB): $(EMU_CUDA_OBJ)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CXX_EMU) -shared -fopenmp -pthread $^ -o $@

$(EMU_BUILD)/%.o: %.c $(EMU_FLAGS_STAMP) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $< (emu)")
	$(Q)$(CC) $(EMU_CFLAGS) -c $< -o $@

$(EMU_BUILD)/%.cu.o: %.cu tests/cuemu/cuemu.h tests/cuemu/cuemu_blas.h $(EMU_FLAGS_STAMP) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CUEMU $<")
	$(Q)$(CXX_EMU) $(EMU_CUFLAGS) -c $< -o $@

$(EMU_BUILD)/tests/cuemu/%.o: tests/cuemu/%.cc $(EMU_FLAGS_STAMP) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CXX   $< (emu)")
	$(Q)$(CXX_EMU) $(EMU_CXXFLAGS) -O3 -c $< -o $@

$(EMU_BUILD)/tests/gpu/test_%: tests/gpu/test_%.c $(EMU_LIB_OBJ) $(EMU_CUDA_OBJ) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TEST  $@")
	$(Q)$(CC) $(EMU_CFLAGS) -c $< -o $@.o
	$(Q)$(CXX_EMU) $(EMU_LDFLAGS) $@.o $(EMU_LIB_OBJ) $(EMU_CUDA_OBJ) -o $@ $(EMU_LDLIBS) -lcriterion

$(EMU_BUILD)/tests/cuemu/test_cuemu: $(patsubst %.cu,$(EMU_BUILD)/%.cu.o,$(CUEMU_TEST_SRC)) $(EMU_LIB_OBJ) \
                                     $(EMU_CUDA_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TEST  $@")
	$(Q)$(CXX_EMU) $(EMU_LDFLAGS) $^ -o $@ $(EMU_LDLIBS) -lcriterion

# `make test` (not under the sanitizers) builds the emulator variant too; the runner
# runs its test binaries with the others.
ifneq ($(SAN),1)
test: emu
endif
else
emu emu-test:
	@echo "✗ CUDA emulator not built: no $(CXX_EMU)"
endif

clean: clean-emu
clean-emu:
	rm -rf $(EMU_BUILD) dtrun-emu $(EMU_CUDA_LIB)

# The emulator's own tests, compiled by nvcc for a real GPU (a cross-check of the
# emulator's semantics, run by gpu-tests on a GPU machine).
ifneq ($(HAVE_NVCC),)
GPU_TEST_BIN += $(BUILD)/tests/cuemu/test_cuemu
gpu-tests-build gpu-tests: $(BUILD)/tests/cuemu/test_cuemu

$(BUILD)/tests/cuemu/%.cu.o: NVFLAGS += -lineinfo
$(BUILD)/tests/cuemu/test_cuemu: $(patsubst %.cu,$(BUILD)/%.cu.o,$(CUEMU_TEST_SRC)) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) $^ -o $@ $(LDFLAGS) $(CUDA_LDFLAGS) -lcudart -lcublasLt -lcublas -lcriterion -lstdc++ -lm
endif

-include $(shell find $(EMU_BUILD) -name '*.d' 2>/dev/null)
