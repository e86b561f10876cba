/*
 * test_cuemu.cuh - what the CUDA emulator's test files share (test_cuemu.cu, the
 * runtime; test_cuemu_blas.cu, cuBLASLt and cuBLAS; test_cuemu_wmma.cu, tensor
 * cores and the emulator's loud failures): the error checks, a seeded generator and
 * host<->device copies. Written as CUDA: the files build with g++ against
 * tests/cuemu/cuemu.h (build-emu/tests/cuemu/test_cuemu, run by `make test`) and with
 * nvcc against the real CUDA (build/tests/cuemu/test_cuemu, `make gpu-tests`).
 */
#ifndef DT_TESTS_CUEMU_TEST_CUEMU_CUH
#define DT_TESTS_CUEMU_TEST_CUEMU_CUH

#include "kernels/cuda/cuda_common.cuh"

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <type_traits>
#include <vector>

#define CK(call)                                                                                    \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        cr_assert_eq(e_, cudaSuccess, "%s: %s (%s)", #call, cudaGetErrorString(e_), cudaGetErrorName(e_)); \
    } while (0)
#define CKB(call)                                                                                   \
    do {                                                                                            \
        cublasStatus_t s_ = (call);                                                                 \
        cr_assert_eq(s_, CUBLAS_STATUS_SUCCESS, "%s: status %d", #call, (int)s_);                  \
    } while (0)

static uint32_t g_rng = 12345; /* per file: each test file draws its own sequence */
static inline float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)((g_rng >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

template <typename T> static inline T *dev_upload(const std::vector<T> &h) {
    T *d = nullptr;
    CK(cudaMalloc(&d, h.size() * sizeof(T)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <typename T> static inline std::vector<T> dev_download(const T *d, size_t n) {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

#endif /* DT_TESTS_CUEMU_TEST_CUEMU_CUH */
