/*
 * cuda_layers.cuh - private to the layer ops of the CUDA backend (cuda_encoder.cu,
 * cuda_layernorm.cu, cuda_attention.cu, cuda_loss.cu, cuda_llama.cu, cuda_layers.cu): reductions
 * over a warp or a block in a fixed order, 16-byte vector loads and stores, the
 * device's shared scratch buffer, and the per-file fill functions that
 * dt_cuda_fill_layer_ops calls.
 *
 * Determinism: every reduction here is a butterfly over the lanes of a warp
 * (__shfl_xor_sync) followed, for a block, by one more butterfly over the warps'
 * partial results held in shared memory. The order of operations depends only on
 * blockDim, never on timing, so results are bitwise identical run to run.
 */
#ifndef DT_KERNELS_CUDA_LAYERS_CUH
#define DT_KERNELS_CUDA_LAYERS_CUH

#include <math.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_vec.cuh" /* defines: dt_cuda_aligned16 */

#define DT_WARP 32
#define DT_FULL_MASK 0xffffffffu

/* ---- reductions ---------------------------------------------------------- */

/* Sum over the 32 lanes of a warp; every lane gets the same bits (float addition
 * is commutative, and each butterfly step adds the same two values on both sides). */
static __device__ __forceinline__ float dt_warp_sum(float x) {
    for (int o = DT_WARP / 2; o > 0; o >>= 1) x += __shfl_xor_sync(DT_FULL_MASK, x, o);
    return x;
}

static __device__ __forceinline__ float dt_warp_max(float x) {
    for (int o = DT_WARP / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(DT_FULL_MASK, x, o));
    return x;
}

/* An online softmax normaliser: the running max m and sum s of exp(x - m). */
typedef struct dt_maxsum {
    float m, s;
} dt_maxsum;

/* Adds one value to a running (max, sum): one exp per value. */
static __device__ __forceinline__ void dt_maxsum_add(dt_maxsum *a, float x) {
    if (x > a->m) {
        a->s = a->s * expf(a->m - x) + 1.0f; /* expf(-inf) = 0 for the first value */
        a->m = x;
    } else {
        a->s += expf(x - a->m);
    }
}

/* Merges two normalisers; symmetric in its arguments, so butterflies agree. */
static __device__ __forceinline__ dt_maxsum dt_maxsum_merge(dt_maxsum a, dt_maxsum b) {
    dt_maxsum r;
    r.m = fmaxf(a.m, b.m);
    if (r.m == -INFINITY) {
        r.s = 0.0f;
    } else {
        r.s = a.s * expf(a.m - r.m) + b.s * expf(b.m - r.m);
    }
    return r;
}

static __device__ __forceinline__ dt_maxsum dt_warp_maxsum(dt_maxsum a) {
    for (int o = DT_WARP / 2; o > 0; o >>= 1) {
        dt_maxsum b;
        b.m = __shfl_xor_sync(DT_FULL_MASK, a.m, o);
        b.s = __shfl_xor_sync(DT_FULL_MASK, a.s, o);
        a = dt_maxsum_merge(a, b);
    }
    return a;
}

/* Sum over a block whose blockDim.x is a multiple of 32 (at most 1024); every thread
 * gets the result. `sh` is 32 floats of shared memory, free again on return. */
static __device__ __forceinline__ float dt_block_sum(float x, float *sh) {
    int lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
    int nwarps = blockDim.x / DT_WARP;
    x = dt_warp_sum(x);
    __syncthreads(); /* a previous use of sh is finished */
    if (lane == 0) sh[warp] = x;
    __syncthreads();
    x = lane < nwarps ? sh[lane] : 0.0f;
    return dt_warp_sum(x);
}

/* (max, sum) over a block, as dt_block_sum; `sh` is 64 floats of shared memory. */
static __device__ __forceinline__ dt_maxsum dt_block_maxsum(dt_maxsum a, float *sh) {
    int lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
    int nwarps = blockDim.x / DT_WARP;
    a = dt_warp_maxsum(a);
    __syncthreads();
    if (lane == 0) {
        sh[warp] = a.m;
        sh[DT_WARP + warp] = a.s;
    }
    __syncthreads();
    dt_maxsum b;
    b.m = lane < nwarps ? sh[lane] : -INFINITY;
    b.s = lane < nwarps ? sh[DT_WARP + lane] : 0.0f;
    return dt_warp_maxsum(b);
}

/* ---- 16-byte vectors ------------------------------------------------------ */

/* N elements of storage type S loaded or stored together: one 16-byte access when
 * N * sizeof(S) == 16 (the address must then be 16-byte aligned: host code checks
 * dt_cuda_aligned16 before picking such a kernel), else one by one. The same code
 * as cuda_vec.cuh's dt_pack, plus the N = 1 form that the fallback kernels use. */
template <typename S, int N> struct dt_vec {
    S v[N];
};

template <typename S, int N> static __device__ __forceinline__ dt_vec<S, N> dt_vec_ld(const S *p) {
    dt_vec<S, N> r;
    if constexpr (N * sizeof(S) == 16) {
        int4 bits = *reinterpret_cast<const int4 *>(p);
        memcpy(&r, &bits, sizeof bits);
    } else {
        for (int i = 0; i < N; i++) r.v[i] = p[i];
    }
    return r;
}

template <typename S, int N>
static __device__ __forceinline__ void dt_vec_st(S *p, const dt_vec<S, N> &x) {
    if constexpr (N * sizeof(S) == 16) {
        int4 bits;
        memcpy(&bits, &x, sizeof bits);
        *reinterpret_cast<int4 *>(p) = bits;
    } else {
        for (int i = 0; i < N; i++) p[i] = x.v[i];
    }
}

/* Elements per 16 bytes: 4 fp32, 8 bf16. */
template <typename S> constexpr int dt_vec_width() { return (int)(16 / sizeof(S)); }


/* ---- host-side helpers (cuda_layers.cu) ---------------------------------- */

/* The device's shared scratch (dt_cuda_impl.scratch), grown to at least `bytes`
 * (the old buffer is freed after the stream drains; the size is kept in the
 * memory accounting). Its contents do not survive from one op to the next: any op
 * may use it. NULL on failure, recorded as op's error (reported at synchronize). */
void *dt_cuda_layer_scratch(dt_device_t *dev, size_t bytes, const char *op);

/* Grid size for n items at `per_block` items per block. */
static inline unsigned dt_blocks(size_t n, size_t per_block) {
    return (unsigned)((n + per_block - 1) / per_block);
}

/* The per-file parts of dt_cuda_fill_layer_ops. */
void dt_cuda_fill_encoder_ops(dt_ops_t *ops, dt_dtype_t dtype);
void dt_cuda_fill_layernorm_ops(dt_ops_t *ops, dt_dtype_t dtype);
void dt_cuda_fill_attention_ops(dt_ops_t *ops, dt_dtype_t dtype);
void dt_cuda_fill_loss_ops(dt_ops_t *ops, dt_dtype_t dtype);
void dt_cuda_fill_llama_ops(dt_ops_t *ops, dt_dtype_t dtype);
void dt_cuda_fill_lora_ops(dt_ops_t *ops, dt_dtype_t dtype); /* cuda_lora.cu */
void dt_cuda_fill_attention_block_ops(dt_ops_t *ops, dt_dtype_t dtype); /* cuda_attention_block.cu */

/* The fused attention (cuda_attention_fused.cu), for the device's compute dtype;
 * cuda_attention.cu calls these when dt_cuda_attention_fused says so. */
size_t dt_cuda_fa_saved_bytes(int B, int T, int C, int NH, size_t elem);
size_t dt_cuda_fa_scratch_bytes(int B, int T, int C, int NH);
void dt_cuda_fa_forward(dt_device_t *dev, void *out, void *saved, const void *qkv, const int *pos, int B, int T,
                        int C, int NH, int NKV);
void dt_cuda_fa_backward(dt_device_t *dev, void *dqkv, void *scratch, const void *dout, const void *qkv,
                         const void *saved, const int *pos, int B, int T, int C, int NH, int NKV);
/* 1 when the device's attention is the fused kernel for this shape: asked for at
 * open (DTRUN_CUDA_ATTENTION=fused) and HS within DT_ATTENTION_FUSED_MAX_HS. */
static inline int dt_cuda_attention_fused(const dt_device_t *dev, int C, int NH) {
    return ((const dt_cuda_impl *)dev->impl)->attention == DT_ATTENTION_FUSED &&
           dt_attention_uses_fused(DT_ATTENTION_FUSED, C / NH);
}

#endif /* DT_KERNELS_CUDA_LAYERS_CUH */
