/*
 * cuemu.h - a CUDA emulator on the CPU, for tests: force-included (g++ -x c++
 * -std=c++17 -include tests/cuemu/cuemu.h -DDT_CUEMU -DDT_USE_CUDA) before every .cu
 * file of kernels/cuda, so the very same sources run on a machine without a GPU.
 * Kernels run as cooperative fibers (tests/cuemu/cuemu.cc), one block at a time,
 * every thread of the block a fiber; cuBLASLt/cuBLAS calls run as reference loops
 * (tests/cuemu/cuemu_blas.cc). Everything executes synchronously, in issue order.
 *
 * It does not include the CUDA headers. What kernels and the backend may use is
 * exactly this list; anything else fails to compile here, on purpose:
 *
 *   qualifiers   __global__ __device__ __host__ __forceinline__
 *                __launch_bounds__(...) __restrict__ __align__(n) __shared__
 *                (static __shared__ variables: poisoned with 0xFF before every block, like
 *                dynamic shared memory, except in function templates, where GCC ignores
 *                the section attribute: there they start at zero and keep the previous
 *                block's contents; no initialisers, as in CUDA)
 *   launch       DT_LAUNCH(kernel, grid, block, smem, stream)(args...),
 *                DT_DYN_SMEM(T, name) (dynamic shared memory: poisoned with 0xFF at the
 *                start of every block, 32-byte aligned (WMMA pointers), a PROT_NONE page
 *                right after its end, rounded up to 32 bytes)
 *   built-ins    dim3 uint3 threadIdx blockIdx blockDim gridDim warpSize
 *   sync         __syncthreads() __syncwarp(mask) __threadfence() __threadfence_block()
 *                __shfl_sync __shfl_xor_sync __shfl_down_sync __shfl_up_sync
 *                (float, int, unsigned, long long, unsigned long long, double; width)
 *                __ballot_sync __any_sync __all_sync
 *   atomics      atomicAdd (float, double, int, unsigned, unsigned long long),
 *                atomicMax (int, unsigned), atomicMin (int, unsigned),
 *                atomicCAS (int, unsigned, unsigned long long), atomicExch (int,
 *                unsigned, float)
 *   math         expf logf tanhf sqrtf rsqrtf fmaxf fminf fabsf powf erff floorf ceilf
 *                isnan isinf isfinite (and the rest of <math.h>), __expf __logf
 *                __fdividef __frcp_rn __float_as_int __int_as_float __float_as_uint
 *                __uint_as_float INFINITY NAN FLT_MAX; min/max (int, unsigned, long long,
 *                unsigned long long, float, double)
 *   loads        __ldg __ldcs __ldcg __stcs __stcg (scalars, float2/4, int2/4,
 *                uint2/4, bf16, bf162; a misaligned address aborts, as it faults on a GPU)
 *   vectors      float2 float4 int2 int4 uint2 uint4 make_float2 make_float4
 *                make_int2 make_int4 make_uint2 make_uint4 (16-byte aligned where CUDA's are)
 *   bf16         __nv_bfloat16 (2 bytes, CUDA's bit layout; no implicit conversion and no
 *                arithmetic operators: convert explicitly), __nv_bfloat162,
 *                __float2bfloat16 __float2bfloat16_rn (round to nearest even, NaN ->
 *                0x7FFF) __float2bfloat16_rz __bfloat162float __floats2bfloat162_rn
 *                __float22bfloat162_rn __bfloat1622float2 __low2float __high2float
 *   runtime      cudaError_t and its codes below, cudaGetErrorString/Name,
 *                cudaGetLastError, cudaPeekAtLastError, cudaGetDeviceCount (1 emulated
 *                GPU; 0 + cudaErrorNoDevice when DTRUN_CUEMU_GPUS=0 or CUDA_VISIBLE_DEVICES
 *                hides it), cudaSetDevice,
 *                cudaGetDevice, cudaGetDeviceProperties, cudaDeviceGetAttribute,
 *                cudaMemGetInfo, cudaMalloc, cudaFree, cudaMallocHost, cudaHostAlloc,
 *                cudaFreeHost,
 *                cudaMemcpy(Async), cudaMemset(Async), cudaStreamCreate(WithFlags),
 *                cudaStreamDestroy, cudaStreamSynchronize, cudaStreamWaitEvent,
 *                cudaDeviceSynchronize, cudaEventCreate(WithFlags), cudaEventRecord,
 *                cudaEventSynchronize, cudaEventElapsedTime, cudaEventDestroy,
 *                cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize)
 *   WMMA         #include <mma.h> (tests/cuemu/include/mma.h: the names come from here),
 *                nvcuda::wmma::fragment<matrix_a|matrix_b, 16, 16, 16, __nv_bfloat16,
 *                row_major|col_major>, fragment<accumulator, 16, 16, 16, float>
 *                (num_elements 8, num_storage_elements, element_type, x[]), fill_fragment,
 *                load_matrix_sync (a/b: layout from the type; accumulator: layout_t
 *                mem_row_major|mem_col_major), store_matrix_sync (accumulator), mma_sync
 *                (d = a*b + c, products exact, sums in double, rounded to fp32 once; d may
 *                be c). The _sync calls are warp-collective: all 32 lanes of a full warp at
 *                the same call with the same pointer, ldm and layout; the pointer 32-byte
 *                aligned, ldm a multiple of 16 bytes (8 bf16, 4 floats); anything else
 *                aborts naming the kernel. Element-to-lane mapping (unspecified in CUDA;
 *                differs per use here, so code that relies on one gives wrong numbers):
 *                element k (0..7) of lane l holds, of the 16x16 logical matrix (row r,
 *                column c; memory layout does not change it),
 *                  accumulator  r = 2k + l/16, c = l%16  (row-major index l + 32k)
 *                  matrix_a     r = l%16, c = 2k + l/16  (column-major index l + 32k)
 *                  matrix_b     r = l/2,  c = 8*(l%2) + k (row-major index 8l + k)
 *   cuBLASLt     cublasLtCreate/Destroy, cublasLtMatmulDescCreate/Destroy/SetAttribute,
 *                cublasLtMatrixLayoutCreate/Destroy/SetAttribute,
 *                cublasLtMatmulPreferenceCreate/Destroy/SetAttribute (MAX_WORKSPACE_BYTES,
 *                REDUCTION_SCHEME_MASK, MIN_ALIGNMENT_A/B/C/D_BYTES: when set, cublasLtMatmul
 *                refuses pointers less aligned than the algorithm's heuristic was told, with
 *                NOT_SUPPORTED; so are bias/aux pointers less aligned (up to 16 bytes) than
 *                the ones the heuristic saw), cublasLtMatmulAlgoGetHeuristic,
 *                cublasLtMatmul,
 *                cublasLtGetStatusString/Name
 *   cuBLAS       cublasCreate/Destroy/SetStream/SetMathMode/SetWorkspace, cublasGemmEx,
 *                cublasGemmStridedBatchedEx, cublasGemmBatchedEx (pointer arrays in device
 *                memory; two members writing the same C refused), cublasSgemm,
 *                cublasGetStatusString/Name
 *
 * Loud on misuse: a divergent or deadlocked barrier, a shuffle whose mask names an
 * exited lane, a launch fault, a write past the end of a cudaMalloc'd buffer, a memcpy
 * against where the pointers live: each aborts or fails with a message naming the
 * kernel, block and thread. Device memory is poisoned with 0xFF (NaN in fp32 and bf16).
 * Thread order: even blocks run their threads first to last, odd blocks last to first
 * (between barriers), so reading another thread's write without a barrier shows up as
 * poison in one of them (DTRUN_CUEMU_ORDER=forward: always first to last).
 * Environment: DTRUN_CUEMU_GPUS=N (GPUs on the machine, 1; 0: none), CUDA_VISIBLE_DEVICES
 * (as with the real runtime), DTRUN_CUEMU_MEM_GB (device memory, 16),
 * DTRUN_CUEMU_STACK_KB (thread stacks, 64), DTRUN_CUEMU_STATS=1 (launches by kernel, and
 * the counters below, at exit), DTRUN_CUEMU_HOST_GUARD=1 (device memory PROT_NONE outside emulator calls:
 * host code dereferencing a device pointer faults, as on a GPU; costs system time).
 * Counters for tests (extern "C" cuemu_counter(name), declared weak by C tests so that
 * they link against the real runtime too, where it is NULL): "stream_sync"
 * (cudaStreamSynchronize + cudaDeviceSynchronize calls), "event_sync"
 * (cudaEventSynchronize), "blas_call" (cuBLAS GEMM and cublasLtMatmul calls); an
 * unknown name returns ~0ULL.
 * The cuBLASLt / cuBLAS declarations are in cuemu_blas.h, which this file includes at
 * its end.
 */
#ifndef DT_TESTS_CUEMU_H
#define DT_TESTS_CUEMU_H

#ifndef __cplusplus
#error "cuemu.h is C++ only: compile .cu files with g++ -x c++"
#endif

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

/* ---- qualifiers ------------------------------------------------------------------ */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* Blocks run one at a time on one OS thread, so a static local is the block's memory.
 * All of them live in one section, which the scheduler poisons (0xFF) before each block. */
#define __shared__ static __attribute__((section("cuemu_shared"), aligned(16)))
#define CUDART_VERSION 13000

/* ---- built-in vector types and variables ---------------------------------------- */
struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct __align__(8) float2 { float x, y; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) int2 { int x, y; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(8) uint2 { unsigned int x, y; };
struct __align__(16) uint4 { unsigned int x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline int2 make_int2(int x, int y) { return int2{x, y}; }
static inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

/* Set by the scheduler before every switch to a thread's fiber. */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static constexpr int warpSize = 32;

/* ---- runtime types (CUDA 13 names and values) ------------------------------------ */
enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxBlockDimX = 2,
    cudaDevAttrMaxBlockDimY = 3,
    cudaDevAttrMaxBlockDimZ = 4,
    cudaDevAttrMaxGridDimX = 5,
    cudaDevAttrMaxGridDimY = 6,
    cudaDevAttrMaxGridDimZ = 7,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMaxRegistersPerBlock = 12,
    cudaDevAttrClockRate = 13,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrMemoryClockRate = 36,
    cudaDevAttrGlobalMemoryBusWidth = 37,
    cudaDevAttrL2CacheSize = 38,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

/* The fields of CUDA 13's cudaDeviceProp that the emulator fills (same names). */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    size_t totalConstMem;
    int major;
    int minor;
    int multiProcessorCount;
    int memoryBusWidth;
    int l2CacheSize;
    int maxThreadsPerMultiProcessor;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor;
    size_t sharedMemPerBlockOptin;
    int maxBlocksPerMultiProcessor;
    int unifiedAddressing;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
};

/* ---- runtime API -------------------------------------------------------------------- */
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream = 0);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t height, enum cudaMemcpyKind kind, cudaStream_t stream = 0);
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream = 0);
cudaError_t cudaStreamCreate(cudaStream_t *pStream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);

/* The C++ conveniences cuda_runtime.h has. */
template <class T> static inline cudaError_t cudaMalloc(T **devPtr, size_t size) {
    return cudaMalloc((void **)(void *)devPtr, size);
}
template <class T> static inline cudaError_t cudaMallocHost(T **ptr, size_t size) {
    return cudaMallocHost((void **)(void *)ptr, size);
}
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *entry, enum cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)entry, attr, value);
}

/* ---- bf16 ------------------------------------------------------------------------------ */
struct __align__(2) __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
};
struct __align__(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

static inline unsigned int cuemu_f2u(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float cuemu_u2f(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    unsigned int u = cuemu_f2u(f);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffU) > 0x7f800000U) {
        r.__x = 0x7fffU;
    } else {
        u += 0x7fffU + ((u >> 16) & 1U); /* round to nearest, ties to even */
        r.__x = (unsigned short)(u >> 16);
    }
    return r;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline __nv_bfloat16 __float2bfloat16_rz(float f) {
    unsigned int u = cuemu_f2u(f);
    __nv_bfloat16 r;
    r.__x = (u & 0x7fffffffU) > 0x7f800000U ? (unsigned short)0x7fffU : (unsigned short)(u >> 16);
    return r;
}
static inline float __bfloat162float(__nv_bfloat16 b) { return cuemu_u2f((unsigned int)b.__x << 16); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
static inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return __floats2bfloat162_rn(v.x, v.y); }
static inline float2 __bfloat1622float2(__nv_bfloat162 v) {
    return float2{__bfloat162float(v.x), __bfloat162float(v.y)};
}
static inline float __low2float(__nv_bfloat162 v) { return __bfloat162float(v.x); }
static inline float __high2float(__nv_bfloat162 v) { return __bfloat162float(v.y); }

/* ---- math intrinsics ------------------------------------------------------------------- */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* glibc declares __expf/__logf itself: macros, so the calls are the plain ones. */
#define __expf(x) expf(x)
#define __logf(x) logf(x)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned int __float_as_uint(float f) { return cuemu_f2u(f); }
static inline float __uint_as_float(unsigned int u) { return cuemu_u2f(u); }

/* CUDA's integer and floating min/max overloads (host and device). */
#define CUEMU_MINMAX(T, R)                                                             \
    static inline R min(T a, T b) { return a < b ? (R)a : (R)b; }                      \
    static inline R max(T a, T b) { return a > b ? (R)a : (R)b; }
CUEMU_MINMAX(int, int)
CUEMU_MINMAX(unsigned int, unsigned int)
CUEMU_MINMAX(long long, long long)
CUEMU_MINMAX(unsigned long long, unsigned long long)
#undef CUEMU_MINMAX
static inline unsigned int min(int a, unsigned int b) { return min((unsigned int)a, b); }
static inline unsigned int min(unsigned int a, int b) { return min(a, (unsigned int)b); }
static inline unsigned int max(int a, unsigned int b) { return max((unsigned int)a, b); }
static inline unsigned int max(unsigned int a, int b) { return max(a, (unsigned int)b); }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

/* Cache-hinted loads and stores: plain memory accesses here, with CUDA's alignment
 * rule checked (a misaligned vector access faults on a GPU). */
namespace cuemu {
[[noreturn]] void misaligned(const char *what, const void *p, size_t align);
}
#define CUEMU_LDST(T)                                                                  \
    static inline const T *cuemu_aligned(const T *p, const char *what) {               \
        if ((uintptr_t)p % alignof(T)) cuemu::misaligned(what, p, alignof(T));         \
        return p;                                                                      \
    }                                                                                  \
    static inline T __ldg(const T *p) { return *cuemu_aligned(p, "__ldg"); }           \
    static inline T __ldcs(const T *p) { return *cuemu_aligned(p, "__ldcs"); }         \
    static inline T __ldcg(const T *p) { return *cuemu_aligned(p, "__ldcg"); }         \
    static inline void __stcs(T *p, T v) { *const_cast<T *>(cuemu_aligned(p, "__stcs")) = v; } \
    static inline void __stcg(T *p, T v) { *const_cast<T *>(cuemu_aligned(p, "__stcg")) = v; }
CUEMU_LDST(char)
CUEMU_LDST(signed char)
CUEMU_LDST(unsigned char)
CUEMU_LDST(short)
CUEMU_LDST(unsigned short)
CUEMU_LDST(int)
CUEMU_LDST(unsigned int)
CUEMU_LDST(long long)
CUEMU_LDST(unsigned long long)
CUEMU_LDST(float)
CUEMU_LDST(double)
CUEMU_LDST(float2)
CUEMU_LDST(float4)
CUEMU_LDST(int2)
CUEMU_LDST(int4)
CUEMU_LDST(uint2)
CUEMU_LDST(uint4)
CUEMU_LDST(__nv_bfloat16)
CUEMU_LDST(__nv_bfloat162)
#undef CUEMU_LDST

/* ---- atomics (blocks and threads never run at once: plain read-modify-write) ------------ */
static inline float atomicAdd(float *p, float v) { float o = *p; *p = o + v; return o; }
static inline double atomicAdd(double *p, double v) { double o = *p; *p = o + v; return o; }
static inline int atomicAdd(int *p, int v) { int o = *p; *p = (int)((unsigned)o + (unsigned)v); return o; }
static inline unsigned int atomicAdd(unsigned int *p, unsigned int v) { unsigned o = *p; *p = o + v; return o; }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    unsigned long long o = *p; *p = o + v; return o;
}
static inline int atomicMax(int *p, int v) { int o = *p; if (v > o) *p = v; return o; }
static inline unsigned int atomicMax(unsigned int *p, unsigned int v) { unsigned o = *p; if (v > o) *p = v; return o; }
static inline int atomicMin(int *p, int v) { int o = *p; if (v < o) *p = v; return o; }
static inline unsigned int atomicMin(unsigned int *p, unsigned int v) { unsigned o = *p; if (v < o) *p = v; return o; }
static inline int atomicCAS(int *p, int cmp, int v) { int o = *p; if (o == cmp) *p = v; return o; }
static inline unsigned int atomicCAS(unsigned int *p, unsigned int cmp, unsigned int v) {
    unsigned o = *p; if (o == cmp) *p = v; return o;
}
static inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long cmp, unsigned long long v) {
    unsigned long long o = *p; if (o == cmp) *p = v; return o;
}
static inline int atomicExch(int *p, int v) { int o = *p; *p = v; return o; }
static inline unsigned int atomicExch(unsigned int *p, unsigned int v) { unsigned o = *p; *p = v; return o; }
static inline float atomicExch(float *p, float v) { float o = *p; *p = v; return o; }

/* ---- the emulator's runtime (tests/cuemu/cuemu.cc) -------------------------------------- */
namespace cuemu {

/* Barriers: the site (file, line) identifies the barrier for divergence checks. */
void syncthreads(const char *file, int line);
void syncwarp(unsigned mask, const char *file, int line);
enum shfl_mode { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR };
unsigned long long shfl(unsigned mask, unsigned long long bits, int mode, int arg, int width,
                        const char *what, const char *file, int line);
enum vote_mode { VOTE_BALLOT, VOTE_ANY, VOTE_ALL };
unsigned vote(unsigned mask, bool pred, int mode, const char *what, const char *file, int line);
unsigned char *dyn_smem(void);

template <typename T> static inline T shfl_t(unsigned mask, T v, int mode, int arg, int width,
                                             const char *what, const char *file, int line) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, int>::value ||
                      std::is_same<T, unsigned int>::value || std::is_same<T, double>::value ||
                      std::is_same<T, long long>::value || std::is_same<T, unsigned long long>::value,
                  "cuemu: shuffles take float, int, unsigned, long long, unsigned long long or double");
    unsigned long long bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = shfl(mask, bits, mode, arg, width, what, file, line);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

/* One kernel launch: validated, then every block run in order, every thread a fiber. */
struct launch_cfg {
    const char *name;
    const void *fn;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};
void run_kernel(const launch_cfg &cfg, void (*thunk)(void *), void *ctx);

template <typename... P> struct launcher {
    launch_cfg cfg;
    void (*fn)(P...);
    template <typename... A> void operator()(A &&...a) const {
        static_assert(sizeof...(A) == sizeof...(P), "cuemu: kernel launched with the wrong number of arguments");
        struct ctx_t {
            void (*fn)(P...);
            std::tuple<typename std::decay<P>::type...> args;
        } ctx{fn, std::tuple<typename std::decay<P>::type...>(std::forward<A>(a)...)};
        /* Every thread calls the kernel with its own copy of the parameters. */
        run_kernel(cfg, [](void *c) { auto *x = static_cast<ctx_t *>(c); std::apply(x->fn, x->args); }, &ctx);
    }
};
template <typename... P>
static inline launcher<P...> make_launcher(const char *name, void (*fn)(P...), dim3 grid, dim3 block,
                                           size_t smem, cudaStream_t stream) {
    return launcher<P...>{launch_cfg{name, (const void *)fn, grid, block, smem, stream}, fn};
}

} /* namespace cuemu */

#define DT_LAUNCH(kernel, grid, block, smem, stream) \
    cuemu::make_launcher(#kernel, kernel, dim3(grid), dim3(block), (size_t)(smem), (stream))
#define DT_DYN_SMEM(T, name) T *name = reinterpret_cast<T *>(cuemu::dyn_smem())

#define __syncthreads() cuemu::syncthreads(__FILE__, __LINE__)
/* Blocks run one after another: memory is always coherent, fences have nothing to do. */
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}
/* Votes: every lane the mask names must take part, as for shuffles. */
#define __ballot_sync(mask, pred) cuemu::vote((mask), (pred) != 0, cuemu::VOTE_BALLOT, "__ballot_sync", __FILE__, __LINE__)
#define __any_sync(mask, pred) (int)cuemu::vote((mask), (pred) != 0, cuemu::VOTE_ANY, "__any_sync", __FILE__, __LINE__)
#define __all_sync(mask, pred) (int)cuemu::vote((mask), (pred) != 0, cuemu::VOTE_ALL, "__all_sync", __FILE__, __LINE__)
#define __syncwarp(...) cuemu::syncwarp(cuemu_mask_or_full(__VA_ARGS__), __FILE__, __LINE__)
static inline unsigned cuemu_mask_or_full(void) { return 0xffffffffU; }
static inline unsigned cuemu_mask_or_full(unsigned m) { return m; }
#define __shfl_sync(mask, v, src, ...) \
    cuemu::shfl_t((mask), (v), cuemu::SHFL_IDX, (src), cuemu_width(__VA_ARGS__), "__shfl_sync", __FILE__, __LINE__)
#define __shfl_up_sync(mask, v, d, ...) \
    cuemu::shfl_t((mask), (v), cuemu::SHFL_UP, (int)(d), cuemu_width(__VA_ARGS__), "__shfl_up_sync", __FILE__, __LINE__)
#define __shfl_down_sync(mask, v, d, ...)                                                             \
    cuemu::shfl_t((mask), (v), cuemu::SHFL_DOWN, (int)(d), cuemu_width(__VA_ARGS__), "__shfl_down_sync", \
                  __FILE__, __LINE__)
#define __shfl_xor_sync(mask, v, m, ...) \
    cuemu::shfl_t((mask), (v), cuemu::SHFL_XOR, (m), cuemu_width(__VA_ARGS__), "__shfl_xor_sync", __FILE__, __LINE__)
static inline int cuemu_width(void) { return 32; }
static inline int cuemu_width(int w) { return w; }

/* ---- WMMA (tensor cores): nvcuda::wmma, CUDA 13's names, 16x16x16 bf16 -> fp32 only -------- */
namespace cuemu {
/* One lane's part of a warp-collective WMMA call (tests/cuemu/cuemu_wmma.cc). */
enum wmma_op { WMMA_LOAD_A, WMMA_LOAD_B, WMMA_LOAD_C, WMMA_STORE_D, WMMA_MMA };
struct wmma_args {
    wmma_op op;
    const void *ptr; /* memory: loads read, stores write it */
    unsigned ldm;
    int col_major;   /* memory layout */
    void *frag;      /* this lane's x[]: loaded into (loads, mma's d) or stored from */
    const __nv_bfloat16 *a, *b; /* mma_sync's operands (this lane's x[]) */
    const float *c;
};
void wmma_call(const char *what, wmma_args *args, const char *file, int line);
} /* namespace cuemu */

namespace nvcuda {
namespace wmma {
struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;
enum layout_t { mem_row_major, mem_col_major };

template <typename T> struct helper_traits {
    typedef T element_type;
    typedef T storage_element_type;
    typedef T fill_argument_type;
};

template <typename T, int size, int packed_size = size> struct __align__(8) __frag_base {
    enum { num_elements = size };
    enum { num_storage_elements = packed_size };
    typedef T element_type;
    typedef typename helper_traits<T>::storage_element_type storage_element_type;
    storage_element_type x[num_storage_elements];
};

/* Element-wise, no warp collective (as in CUDA). */
template <typename T, int size, int packed_size>
static inline void fill_fragment(__frag_base<T, size, packed_size> &f,
                                 const typename helper_traits<T>::fill_argument_type &in) {
    for (int i = 0; i < f.num_storage_elements; i++) f.x[i] = in;
}

/* Only the specialisations below exist: any other shape or type fails to compile. */
template <typename Use, int m, int n, int k, typename T, typename Layout = void> class fragment;
template <> class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, row_major> : public __frag_base<__nv_bfloat16, 8> {};
template <> class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, col_major> : public __frag_base<__nv_bfloat16, 8> {};
template <> class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, row_major> : public __frag_base<__nv_bfloat16, 8> {};
template <> class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, col_major> : public __frag_base<__nv_bfloat16, 8> {};
template <> class fragment<accumulator, 16, 16, 16, float> : public __frag_base<float, 8> {};

template <typename L> struct cuemu_is_col : std::false_type {};
template <> struct cuemu_is_col<col_major> : std::true_type {};

/* The trailing file/line parameters are filled in at the call site: they name the call
 * in the emulator's messages (and identify it, as for shuffles). */
template <typename L>
static inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, __nv_bfloat16, L> &a, const __nv_bfloat16 *p,
                                    unsigned ldm, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    cuemu::wmma_args w{cuemu::WMMA_LOAD_A, p, ldm, cuemu_is_col<L>::value, a.x, nullptr, nullptr, nullptr};
    cuemu::wmma_call("load_matrix_sync(matrix_a)", &w, file, line);
}
template <typename L>
static inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __nv_bfloat16, L> &b, const __nv_bfloat16 *p,
                                    unsigned ldm, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    cuemu::wmma_args w{cuemu::WMMA_LOAD_B, p, ldm, cuemu_is_col<L>::value, b.x, nullptr, nullptr, nullptr};
    cuemu::wmma_call("load_matrix_sync(matrix_b)", &w, file, line);
}
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &c, const float *p, unsigned ldm,
                                    layout_t layout, const char *file = __builtin_FILE(),
                                    int line = __builtin_LINE()) {
    cuemu::wmma_args w{cuemu::WMMA_LOAD_C, p, ldm, layout == mem_col_major, c.x, nullptr, nullptr, nullptr};
    if (layout != mem_row_major && layout != mem_col_major) w.col_major = -1; /* refused by wmma_call */
    cuemu::wmma_call("load_matrix_sync(accumulator)", &w, file, line);
}
static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &d, unsigned ldm,
                                     layout_t layout, const char *file = __builtin_FILE(),
                                     int line = __builtin_LINE()) {
    cuemu::wmma_args w{cuemu::WMMA_STORE_D, p, ldm, layout == mem_col_major, const_cast<float *>(d.x), nullptr,
                       nullptr, nullptr};
    if (layout != mem_row_major && layout != mem_col_major) w.col_major = -1;
    cuemu::wmma_call("store_matrix_sync", &w, file, line);
}
template <typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c, const char *file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
    cuemu::wmma_args w{cuemu::WMMA_MMA, nullptr, 0, 0, d.x, a.x, b.x, c.x};
    cuemu::wmma_call("mma_sync", &w, file, line);
}
} /* namespace wmma */
} /* namespace nvcuda */

/* ---- cuBLAS / cuBLASLt (cuemu_blas.h) ------------------------------------------------- */
#include "cuemu_blas.h"

extern "C" unsigned long long cuemu_counter(const char *name);

#endif /* DT_TESTS_CUEMU_H */
