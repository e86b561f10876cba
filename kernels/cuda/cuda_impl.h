/*
 * cuda_impl.h - private to kernels/cuda: the CUDA device's state (dev->impl) and
 * the seams between the .cu files of the backend. Included through
 * cuda_common.cuh (C++ only).
 *
 * Files and what each fills in the op table (kernels.h), for both compute dtypes
 * (DT_DTYPE_BF16: bf16 parameters, activations and gradients with fp32 master
 * weights and fp32 accumulation; DT_DTYPE_F32: fp32 throughout, no TF32):
 *   cuda_device.cu  device open/close, alloc/free/copy/copy_2d/set/synchronize,
 *                   upload_f32/download_f32, peak_flops, error translation;
 *                   builds the table by calling the fill functions below.
 *   cuda_matmul.cu  matmul_forward/backward (cuBLASLt)      } dt_cuda_fill_core_ops
 *   cuda_elementwise.cu gelu, relu, residual, scale         }
 *   cuda_optim.cu   adamw, grad_sq_norm                     }
 *   cuda_encoder.cu, cuda_layernorm.cu, cuda_attention.cu,
 *   cuda_loss.cu    encoder, layernorm, attention,          } dt_cuda_fill_layer_ops
 *                   softmax_xent, xent_vp_*, mse            }
 *   cuda_llama.cu   rmsnorm, rope, swiglu, attention_decode }
 *   cuda_attention_block.cu  attention_block_*, attention_kv_* } (context parallelism)
 *   cuda_attention_fused.cu  the fused attention cuda_attention.cu dispatches to
 *   cuda_attention_tiles.cuh the tiles and helpers the last two share
 *
 * Errors: compute ops return void (kernels.h). Each launch is followed by
 * DT_CUDA_LAUNCHED(dev), which checks cudaGetLastError and keeps the first
 * failure (sticky) with the op's name; synchronize reports it as a dt_status with
 * CUDA's message. Calls that can fail outside ops (malloc, memcpy, cuBLASLt
 * set-up) return dt_cuda_status(...) directly.
 */
#ifndef DT_KERNELS_CUDA_IMPL_H
#define DT_KERNELS_CUDA_IMPL_H

#include <pthread.h>
#include <stddef.h>

extern "C" {
#include "common/log.h"
#include "common/status.h"
#include "kernels/kernels.h"
}

typedef __nv_bfloat16 dt_bf16;

typedef struct dt_cuda_impl {
    cudaStream_t stream;       /* every op of the device runs on this stream, in order */
    cublasLtHandle_t lt;
    cublasHandle_t blas;
    void *workspace;           /* cuBLASLt workspace */
    size_t workspace_bytes;    /* 32 MiB */
    int sm_count;
    int cc_major, cc_minor;
    char name[256];            /* cudaDeviceProp.name */
    cudaError_t sticky;        /* first error seen after a launch (cudaSuccess: none) */
    char sticky_op[64];        /* the op that saw it */
    void *scratch;             /* small device scratch (reductions), scratch_bytes */
    size_t scratch_bytes;
    /* Added by the core backend (cuda_device.cu, cuda_matmul.cu): */
    cublasStatus_t sticky_blas; /* first cuBLAS(Lt) failure inside an op, when no CUDA
                                   error came first; reported by synchronize too */
    void *staging;             /* fp32 staging for upload_f32/download_f32 (lazy) */
    size_t staging_bytes;
    struct dt_cuda_alloc_rec *allocs; /* live allocations: pointer, bytes, category */
    size_t nallocs, cap_allocs;
    pthread_mutex_t alloc_lock;
    struct dt_cuda_mm_cache *mm_cache; /* cuBLASLt plans per shape (cuda_matmul.cu) */
    int sync_each_op;          /* DTRUN_CUDA_SYNC_OPS=1: wait after every op, so an
                                  asynchronous fault is reported under its op's name */
    int matmul_gemmex;         /* DTRUN_CUDA_MATMUL=gemmex: skip cuBLASLt, use the
                                  cublasGemmEx path (tests; cuBLASLt comparisons) */
    dt_attention_kind_t attention; /* DTRUN_CUDA_ATTENTION at open: cuBLAS or fused
                                      (cuda_attention.cu, cuda_attention_fused.cu) */
    struct dt_cuda_h2d_ring *h2d; /* pinned staging of host-to-device copies (lazy;
                                     cuda_device.cu) */
    cudaStream_t copy_stream;  /* copy_async's stream (lazy): copies beside the compute */
    cudaEvent_t copy_after;    /* recorded on `stream` so a copy follows the ops issued */
} dt_cuda_impl;

static inline dt_cuda_impl *dt_cuda(dt_device_t *dev) { return (dt_cuda_impl *)dev->impl; }
static inline cudaStream_t dt_cuda_stream(dt_device_t *dev) { return dt_cuda(dev)->stream; }

/* Translates a CUDA / cuBLAS(Lt) status into dt_status (DT_STATUS_OK for success),
 * setting the detail to "<what>: <library message>". */
dt_status_t dt_cuda_status(cudaError_t e, const char *what);
dt_status_t dt_cublas_status(cublasStatus_t s, const char *what);
/* After a kernel launch: records the first launch error with the op's name. */
void dt_cuda_note_launch(dt_device_t *dev, const char *op);
#define DT_CUDA_LAUNCHED(dev) dt_cuda_note_launch((dev), __func__)
/* Inside an op: records the first cuBLAS(Lt) failure (s != SUCCESS) with the op's name. */
void dt_cuda_note_blas(dt_device_t *dev, const char *op, cublasStatus_t s);
/* Inside an op, for a failing CUDA runtime call (not a launch): records e with the op. */
void dt_cuda_note_error(dt_device_t *dev, const char *op, cudaError_t e);

/* Blocks of `block` threads for a grid-stride loop over `work` items: enough to fill
 * the GPU a few times over, never more than the work needs (at least 1). */
static inline unsigned dt_cuda_grid(dt_device_t *dev, size_t work, unsigned block) {
    size_t want = (work + block - 1) / block;
    size_t cap = (size_t)(dt_cuda(dev)->sm_count > 0 ? dt_cuda(dev)->sm_count : 1) * 8;
    if (want > cap) want = cap;
    return want ? (unsigned)want : 1u;
}

/* Releases the matmul plans (cuda_matmul.cu); called by dt_cuda_device_free. */
void dt_cuda_matmul_cache_free(dt_cuda_impl *impl);

/* Fill the compute slots of an op table for one compute dtype (F32 or BF16). */
extern "C" void dt_cuda_fill_core_ops(dt_ops_t *ops, dt_dtype_t dtype);
extern "C" void dt_cuda_fill_layer_ops(dt_ops_t *ops, dt_dtype_t dtype) __attribute__((weak));
/* The parts of dt_cuda_fill_core_ops (cuda_optim.cu) that live in other files. */
void dt_cuda_fill_matmul_ops(dt_ops_t *ops, dt_dtype_t dtype);
void dt_cuda_fill_elementwise_ops(dt_ops_t *ops, dt_dtype_t dtype);

/* Element load/store for kernels templated on the storage type (float or dt_bf16). */
static __device__ __forceinline__ float dt_ld(float x) { return x; }
static __device__ __forceinline__ float dt_ld(dt_bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T dt_st(float x);
template <> __device__ __forceinline__ float dt_st<float>(float x) { return x; }
template <> __device__ __forceinline__ dt_bf16 dt_st<dt_bf16>(float x) { return __float2bfloat16(x); }

#endif /* DT_KERNELS_CUDA_IMPL_H */
