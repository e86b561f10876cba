/*
 * cuda_optim.cu - ops over flat ranges of the parameter, gradient and optimizer
 * buffers: the AdamW step (fp32 master weights writing the compute-dtype copy,
 * optionally with stochastic rounding to bf16) and the squared gradient norm (a
 * two-stage reduction in double with a fixed order). Also dt_cuda_fill_core_ops,
 * which fills the table's matmul, elementwise and optimizer slots.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/sr_hash.h" /* defines: dt_sr_bits, dt_sr_round_bits */

#include "kernels/cuda/cuda_vec.cuh"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define NORM_BLOCKS 512  /* fixed, so the summation order depends on n only */
#define NORM_THREADS 256 /* power of two (tree reduction) */
#define ADAMW_BLOCK 256

/* ---- stochastic rounding --------------------------------------------------------- */

/* x rounded to bf16 up or down, up with probability (x - down) / (up - down): add 16
 * random bits below bf16's last mantissa bit and truncate (on the magnitude, so
 * negative numbers round symmetrically). Infinities and NaN round to nearest. */
static __device__ __forceinline__ dt_bf16 bf16_round_stochastic(float x, uint32_t r) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    if ((b & 0x7f800000u) == 0x7f800000u) return __float2bfloat16(x);
    b = dt_sr_round_bits(b, r);
    float y;
    memcpy(&y, &b, sizeof y);
    return __float2bfloat16(y); /* exact: y has a bf16's bits */
}

template <typename T> static __device__ __forceinline__ T store_param(float w, uint32_t key, size_t i, int sr);
template <> __device__ __forceinline__ float store_param<float>(float w, uint32_t, size_t, int) { return w; }
template <> __device__ __forceinline__ dt_bf16 store_param<dt_bf16>(float w, uint32_t key, size_t i, int sr) {
    return sr ? bf16_round_stochastic(w, dt_sr_bits(key, i)) : __float2bfloat16(w);
}

/* ---- AdamW --------------------------------------------------------------------- */

/* The update of kernels/cpu/cpu_optim.c, element by element in fp32. MASTER: master
 * holds the weights and params receive their copy; else params (fp32) are the weights. */
template <typename T, bool MASTER>
__global__ void adamw_kernel(T *params, float *master, const T *grads, float *m, float *v, size_t n, float lr,
                             float b1, float b2, float eps, float wd, float gs, float bc1, float bc2, uint32_t key,
                             int sr) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = dt_ld(grads[i]) * gs;
        float w = MASTER ? master[i] : dt_ld(params[i]);
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        w = w - lr * (mhat / (sqrtf(vhat) + eps) + wd * w);
        if (MASTER) master[i] = w;
        params[i] = store_param<T>(w, key, i, sr);
    }
}

template <typename T>
static void adamw(dt_device_t *dev, void *params, float *master, const void *grads, float *m, float *v, size_t n,
                  const dt_adamw_args_t *a, int decay) {
    if (!n) return;
    if (!master && sizeof(T) != sizeof(float)) {
        /* bf16 parameters need fp32 master weights to update (kernels.h) */
        dt_cuda_note_error(dev, "adamw (bf16 parameters without master weights)", cudaErrorInvalidValue);
        return;
    }
    float wd = decay ? a->weight_decay : 0.0f;
    double t = a->step < 1 ? 1.0 : (double)a->step;
    float bc1 = (float)(1.0 - pow((double)a->beta1, t));
    float bc2 = (float)(1.0 - pow((double)a->beta2, t));
    int sr = a->sr_seed != 0;
    /* the step enters the key, so a fixed seed still draws fresh bits every step */
    uint32_t key = (uint32_t)a->sr_seed * 0x9e3779b9u + (uint32_t)(a->step < 1 ? 1 : a->step) * 0x632be5abu;
    key = (key ^ (key >> 15)) * 0x2c1b3c6du;
    unsigned grid = dt_cuda_grid(dev, n, ADAMW_BLOCK);
    cudaStream_t s = dt_cuda_stream(dev);
    if (master)
        DT_LAUNCH((adamw_kernel<T, true>), grid, ADAMW_BLOCK, 0, s)((T *)params, master, (const T *)grads, m, v, n,
                                                                    a->lr, a->beta1, a->beta2, a->eps, wd,
                                                                    a->grad_scale, bc1, bc2, key, sr);
    else
        DT_LAUNCH((adamw_kernel<T, false>), grid, ADAMW_BLOCK, 0, s)((T *)params, master, (const T *)grads, m, v, n,
                                                                     a->lr, a->beta1, a->beta2, a->eps, wd,
                                                                     a->grad_scale, bc1, bc2, key, sr);
    dt_cuda_note_launch(dev, "adamw");
}

/* ---- squared gradient norm --------------------------------------------------------- */

/* Tree sum of sh[0..NORM_THREADS) into sh[0]; every thread of the block calls it. */
static __device__ __forceinline__ void block_sum(double *sh) {
    for (int w = NORM_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
}

/* Stage 1: block b of the nb = gridDim.x blocks (a function of n only, at most
 * NORM_BLOCKS, so the order stays fixed for a given n while short ranges launch
 * few blocks) sums its share in a fixed order. With vec (16-byte aligned
 * grads), thread t of block b takes the packs b*NORM_THREADS + t + j*nb*
 * NORM_THREADS (V elements each, so more bytes are in flight per load) and block 0
 * also the n % V elements after the last pack; otherwise the same pattern over
 * single elements. */
template <typename T>
__global__ void sq_norm_partial_kernel(double *part, const T *g, size_t n, int vec) {
    __shared__ double sh[NORM_THREADS];
    constexpr int V = dt_pack<T>::N;
    double s = 0.0;
    size_t first = (size_t)blockIdx.x * NORM_THREADS + threadIdx.x, stride = (size_t)gridDim.x * NORM_THREADS;
    size_t npack = vec ? n / V : 0;
    for (size_t p = first; p < npack; p += stride) {
        dt_pack<T> x = dt_pack_load(g + p * V);
#pragma unroll
        for (int k = 0; k < V; k++) {
            double d = (double)dt_ld(x.e[k]);
            s += d * d;
        }
    }
    size_t rest = npack * V;
    if (!vec) {
        for (size_t i = first; i < n; i += stride) {
            double d = (double)dt_ld(g[i]);
            s += d * d;
        }
    } else if (blockIdx.x == 0 && rest + threadIdx.x < n) {
        double d = (double)dt_ld(g[rest + threadIdx.x]);
        s += d * d;
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    block_sum(sh);
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

/* Stage 2: one block adds the nb partial sums into out (onto it when accumulate). */
__global__ void sq_norm_final_kernel(double *out, const double *part, int nb, int accumulate) {
    __shared__ double sh[NORM_THREADS];
    double s = 0.0;
    for (int i = threadIdx.x; i < nb; i += NORM_THREADS) s += part[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    block_sum(sh);
    if (threadIdx.x == 0) *out = accumulate ? *out + sh[0] : sh[0];
}

/* Both stages for one range; the range's sum lands in (or, accumulate, onto) *total.
 * The stream orders the ranges, so part is reused and the additions go in range order. */
template <typename T>
static void sq_norm_enqueue(dt_device_t *dev, double *part, double *total, const void *grads, size_t n,
                            int accumulate) {
    dt_cuda_impl *c = dt_cuda(dev);
    int vec = dt_cuda_aligned16(grads);
    size_t units = vec ? (n + dt_pack<T>::N - 1) / dt_pack<T>::N : n;
    size_t want = (units + NORM_THREADS - 1) / NORM_THREADS;
    int nb = want < NORM_BLOCKS ? (int)want : NORM_BLOCKS;
    DT_LAUNCH(sq_norm_partial_kernel<T>, nb, NORM_THREADS, 0, c->stream)(part, (const T *)grads, n, vec);
    dt_cuda_note_launch(dev, "grad_sq_norm");
    DT_LAUNCH(sq_norm_final_kernel, 1, NORM_THREADS, 0, c->stream)(total, part, nb, accumulate);
    dt_cuda_note_launch(dev, "grad_sq_norm");
}

/* The host waits once, for the one double. */
static double sq_norm_fetch(dt_device_t *dev, const double *total) {
    dt_cuda_impl *c = dt_cuda(dev);
    double result = NAN;
    cudaError_t e = cudaMemcpyAsync(&result, total, sizeof result, cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        dt_cuda_note_error(dev, "grad_sq_norm", e);
        return NAN;
    }
    return result;
}

template <typename T> static double grad_sq_norm(dt_device_t *dev, const void *grads, size_t n) {
    if (!n) return 0.0;
    /* scratch_bytes (64 KiB) holds the NORM_BLOCKS + 1 doubles */
    double *part = (double *)dt_cuda(dev)->scratch, *total = part + NORM_BLOCKS;
    sq_norm_enqueue<T>(dev, part, total, grads, n, 0);
    return sq_norm_fetch(dev, total);
}

template <typename T>
static double grad_sq_norm_ranges(dt_device_t *dev, const void *const *grads, const size_t *counts, int n) {
    double *part = (double *)dt_cuda(dev)->scratch, *total = part + NORM_BLOCKS;
    int queued = 0;
    for (int i = 0; i < n; i++) {
        if (!counts[i]) continue;
        sq_norm_enqueue<T>(dev, part, total, grads[i], counts[i], queued++ > 0);
    }
    return queued ? sq_norm_fetch(dev, total) : 0.0;
}

/* ---- the table --------------------------------------------------------------------- */

extern "C" void dt_cuda_fill_core_ops(dt_ops_t *ops, dt_dtype_t dtype) {
    dt_cuda_fill_matmul_ops(ops, dtype);
    dt_cuda_fill_elementwise_ops(ops, dtype);
    if (dtype == DT_DTYPE_BF16) {
        ops->adamw = adamw<dt_bf16>;
        ops->grad_sq_norm = grad_sq_norm<dt_bf16>;
        ops->grad_sq_norm_ranges = grad_sq_norm_ranges<dt_bf16>;
    } else {
        ops->adamw = adamw<float>;
        ops->grad_sq_norm = grad_sq_norm<float>;
        ops->grad_sq_norm_ranges = grad_sq_norm_ranges<float>;
    }
}
