/*
 * cuda_loss.cu - loss ops on the GPU: fused softmax + cross-entropy over a padded
 * vocabulary, and mean squared error (kernels.h).
 *
 * Softmax + cross-entropy: one block per row. Each thread runs an online
 * (max, sum of exp) over its columns j < V (padded columns j >= V are never read
 * into the sums), the block merges the threads' pairs with butterflies in a fixed
 * order, and loss = log(sum) + max - x[target]. The probabilities exist only in
 * registers: the forward writes N floats, the backward writes dlogits directly.
 * The row is read with 16-byte loads when Vp and the pointer allow.
 *
 * Backward in place: dlogits may be the logits. Every thread reads the elements
 * it later writes (same column mapping in both passes), the target's logit is
 * read by thread 0 before the block's reduction (whose barriers order it before
 * any write), so each element is read before it is overwritten.
 *
 * A target < 0 marks an ignored row: loss 0, a row of zero gradients.
 *
 * The vocabulary-parallel form (xent_vp_*) splits the same computation at the two
 * reductions a tensor-parallel group must share: a block per row finds the max of
 * the rank's real columns, the caller all-reduces it, a block per row sums exp(x -
 * max) and picks the target's logit, the caller all-reduces those, and the loss
 * and the gradient follow from the three fp32 stats of the row.
 */
#include "kernels/cuda/cuda_layers.cuh"

#define XENT_THREADS 256
#define MSE_THREADS 128

/* Max and sum of exp(x - max) over the first V logits of a row, for the whole block
 * (every thread gets the result); the padded columns are never read. */
template <typename S, int N> __device__ dt_maxsum row_maxsum(const S *x, int V, float *sh) {
    dt_maxsum a = {-INFINITY, 0.0f};
    for (int j0 = threadIdx.x * N; j0 < V; j0 += blockDim.x * N) {
        dt_vec<S, N> v = dt_vec_ld<S, N>(x + j0);
        for (int k = 0; k < N; k++)
            if (j0 + k < V) dt_maxsum_add(&a, dt_ld(v.v[k]));
    }
    return dt_block_maxsum(a, sh);
}

template <typename S, int N>
__global__ void xent_forward_kernel(float *losses, const S *logits, const int *targets, int V,
                                    int Vp) {
    __shared__ float sh[2 * DT_WARP];
    int n = blockIdx.x, tgt = targets[n];
    if (tgt < 0) { /* uniform over the block: no barrier is skipped by some only */
        if (threadIdx.x == 0) losses[n] = 0.0f;
        return;
    }
    const S *x = logits + (size_t)n * Vp;
    dt_maxsum a = row_maxsum<S, N>(x, V, sh);
    if (threadIdx.x == 0)
        losses[n] = (float)(log((double)a.s) + (double)a.m - (double)dt_ld(x[tgt]));
}

template <typename S, int N>
__global__ void xent_backward_kernel(S *dlogits, float *losses, const S *logits,
                                     const int *targets, float dscale, int V, int Vp) {
    __shared__ float sh[2 * DT_WARP];
    int n = blockIdx.x, tgt = targets[n];
    const S *x = logits + (size_t)n * Vp;
    S *d = dlogits + (size_t)n * Vp;
    if (tgt < 0) {
        dt_vec<S, N> z;
        for (int k = 0; k < N; k++) z.v[k] = dt_st<S>(0.0f);
        for (int j0 = threadIdx.x * N; j0 < Vp; j0 += blockDim.x * N) dt_vec_st<S, N>(d + j0, z);
        if (threadIdx.x == 0 && losses) losses[n] = 0.0f;
        return;
    }
    float xt = threadIdx.x == 0 ? dt_ld(x[tgt]) : 0.0f; /* before anyone writes */
    dt_maxsum a = row_maxsum<S, N>(x, V, sh);
    float scale = dscale / a.s;
    for (int j0 = threadIdx.x * N; j0 < Vp; j0 += blockDim.x * N) {
        dt_vec<S, N> v = dt_vec_ld<S, N>(x + j0), o;
        for (int k = 0; k < N; k++) {
            int j = j0 + k;
            float g = 0.0f;
            if (j < V) {
                g = expf(dt_ld(v.v[k]) - a.m) * scale;
                if (j == tgt) g -= dscale;
            }
            o.v[k] = dt_st<S>(g);
        }
        dt_vec_st<S, N>(d + j0, o);
    }
    if (threadIdx.x == 0 && losses)
        losses[n] = (float)(log((double)a.s) + (double)a.m - (double)xt);
}

/* 16-byte loads when every row starts aligned. */
template <typename S> static int xent_vec(int Vp, const void *a, const void *b) {
    return Vp % dt_vec_width<S>() == 0 && dt_cuda_aligned16(a) && dt_cuda_aligned16(b);
}

template <typename S>
static void softmax_xent_forward(dt_device_t *dev, float *losses, const void *logits,
                                 const int *targets, int N, int V, int Vp) {
    constexpr int W = dt_vec_width<S>();
    if (N <= 0) return;
    void (*kernel)(float *, const S *, const int *, int, int) =
        xent_vec<S>(Vp, logits, logits) ? xent_forward_kernel<S, W> : xent_forward_kernel<S, 1>;
    DT_LAUNCH(kernel, N, XENT_THREADS, 0, dt_cuda_stream(dev))
    (losses, (const S *)logits, targets, V, Vp);
    DT_CUDA_LAUNCHED(dev);
}

template <typename S>
static void softmax_xent_backward(dt_device_t *dev, void *dlogits, float *losses,
                                  const void *logits, const int *targets, float dscale, int N,
                                  int V, int Vp) {
    constexpr int W = dt_vec_width<S>();
    if (N <= 0) return;
    void (*kernel)(S *, float *, const S *, const int *, float, int, int) =
        xent_vec<S>(Vp, logits, dlogits) ? xent_backward_kernel<S, W> : xent_backward_kernel<S, 1>;
    DT_LAUNCH(kernel, N, XENT_THREADS, 0, dt_cuda_stream(dev))
    ((S *)dlogits, losses, (const S *)logits, targets, dscale, V, Vp);
    DT_CUDA_LAUNCHED(dev);
}

/* ---- vocabulary-parallel softmax + cross-entropy (kernels.h: xent_vp_*) ------
 * The rank's slice is (N, Vl), its columns global [v0, v0 + Vl); the first R of
 * them are real (global index < V), the rest padding and never read into a sum. */

static int vp_real(int Vl, int v0, int V) {
    int r = V - v0;
    return r < 0 ? 0 : (r > Vl ? Vl : r);
}

/* Max over a block (blockDim.x a multiple of 32); every thread gets it. `sh` is 32
 * floats of shared memory. */
static __device__ __forceinline__ float block_max(float x, float *sh) {
    int lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
    int nwarps = blockDim.x / DT_WARP;
    x = dt_warp_max(x);
    __syncthreads();
    if (lane == 0) sh[warp] = x;
    __syncthreads();
    x = lane < nwarps ? sh[lane] : -INFINITY;
    return dt_warp_max(x);
}

template <typename S, int N>
__global__ void xent_vp_max_kernel(float *stats, const S *logits, int Vl, int R) {
    __shared__ float sh[DT_WARP];
    int n = blockIdx.x;
    const S *x = logits + (size_t)n * Vl;
    float m = -INFINITY;
    for (int j0 = threadIdx.x * N; j0 < R; j0 += blockDim.x * N) {
        dt_vec<S, N> v = dt_vec_ld<S, N>(x + j0);
        for (int k = 0; k < N; k++)
            if (j0 + k < R) m = fmaxf(m, dt_ld(v.v[k]));
    }
    m = block_max(m, sh);
    if (threadIdx.x == 0) stats[n] = m;
}

template <typename S, int N>
__global__ void xent_vp_sums_kernel(float *stats, const S *logits, const int *targets, int rows,
                                    int Vl, int v0, int R) {
    __shared__ float sh[DT_WARP];
    int n = blockIdx.x, tgt = targets[n];
    float *sum_out = stats + rows + n, *xt_out = stats + 2 * (size_t)rows + n;
    if (tgt < 0) { /* uniform over the block */
        if (threadIdx.x == 0) *sum_out = *xt_out = 0.0f;
        return;
    }
    const S *x = logits + (size_t)n * Vl;
    float mx = stats[n], s = 0.0f;
    for (int j0 = threadIdx.x * N; j0 < R; j0 += blockDim.x * N) {
        dt_vec<S, N> v = dt_vec_ld<S, N>(x + j0);
        for (int k = 0; k < N; k++)
            if (j0 + k < R) s += expf(dt_ld(v.v[k]) - mx);
    }
    s = dt_block_sum(s, sh);
    if (threadIdx.x == 0) {
        *sum_out = s;
        *xt_out = tgt >= v0 && tgt - v0 < R ? dt_ld(x[tgt - v0]) : 0.0f;
    }
}

__global__ void xent_vp_loss_kernel(float *losses, const float *stats, const int *targets, int N) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    losses[n] = targets[n] < 0 ? 0.0f
                               : (float)(log((double)stats[N + n]) + (double)stats[n] -
                                         (double)stats[2 * (size_t)N + n]);
}

/* In place is safe: each thread reads the elements it then writes. */
template <typename S, int N>
__global__ void xent_vp_backward_kernel(S *dlogits, const S *logits, const int *targets,
                                        const float *stats, float dscale, int rows, int Vl, int v0,
                                        int R) {
    int n = blockIdx.x, tgt = targets[n];
    const S *x = logits + (size_t)n * Vl;
    S *d = dlogits + (size_t)n * Vl;
    float mx = 0.0f, scale = 0.0f;
    int t = -1; /* the target's local column, -1 when not on this rank */
    if (tgt >= 0) {
        mx = stats[n];
        scale = dscale / stats[rows + n];
        t = tgt >= v0 && tgt - v0 < R ? tgt - v0 : -1;
    }
    int real = tgt >= 0 ? R : 0; /* an ignored row is all zeros */
    for (int j0 = threadIdx.x * N; j0 < Vl; j0 += blockDim.x * N) {
        dt_vec<S, N> v = dt_vec_ld<S, N>(x + j0), o;
        for (int k = 0; k < N; k++) {
            int j = j0 + k;
            float g = 0.0f;
            if (j < real) {
                g = expf(dt_ld(v.v[k]) - mx) * scale;
                if (j == t) g -= dscale;
            }
            o.v[k] = dt_st<S>(g);
        }
        dt_vec_st<S, N>(d + j0, o);
    }
}

template <typename S>
static void xent_vp_max(dt_device_t *dev, float *stats, const void *logits, int N, int Vl, int v0,
                        int V) {
    constexpr int W = dt_vec_width<S>();
    if (N <= 0) return;
    void (*kernel)(float *, const S *, int, int) =
        xent_vec<S>(Vl, logits, logits) ? xent_vp_max_kernel<S, W> : xent_vp_max_kernel<S, 1>;
    DT_LAUNCH(kernel, N, XENT_THREADS, 0, dt_cuda_stream(dev))
    (stats, (const S *)logits, Vl, vp_real(Vl, v0, V));
    DT_CUDA_LAUNCHED(dev);
}

template <typename S>
static void xent_vp_sums(dt_device_t *dev, float *stats, const void *logits, const int *targets, int N,
                         int Vl, int v0, int V) {
    constexpr int W = dt_vec_width<S>();
    if (N <= 0) return;
    void (*kernel)(float *, const S *, const int *, int, int, int, int) =
        xent_vec<S>(Vl, logits, logits) ? xent_vp_sums_kernel<S, W> : xent_vp_sums_kernel<S, 1>;
    DT_LAUNCH(kernel, N, XENT_THREADS, 0, dt_cuda_stream(dev))
    (stats, (const S *)logits, targets, N, Vl, v0, vp_real(Vl, v0, V));
    DT_CUDA_LAUNCHED(dev);
}

static void xent_vp_loss(dt_device_t *dev, float *losses, const float *stats, const int *targets, int N) {
    if (N <= 0) return;
    DT_LAUNCH(xent_vp_loss_kernel, dt_blocks((size_t)N, 256), 256, 0, dt_cuda_stream(dev))
    (losses, stats, targets, N);
    DT_CUDA_LAUNCHED(dev);
}

template <typename S>
static void xent_vp_backward(dt_device_t *dev, void *dlogits, const void *logits, const int *targets,
                             const float *stats, float dscale, int N, int Vl, int v0, int V) {
    constexpr int W = dt_vec_width<S>();
    if (N <= 0) return;
    void (*kernel)(S *, const S *, const int *, const float *, float, int, int, int, int) =
        xent_vec<S>(Vl, logits, dlogits) ? xent_vp_backward_kernel<S, W> : xent_vp_backward_kernel<S, 1>;
    DT_LAUNCH(kernel, N, XENT_THREADS, 0, dt_cuda_stream(dev))
    ((S *)dlogits, (const S *)logits, targets, stats, dscale, N, Vl, v0, vp_real(Vl, v0, V));
    DT_CUDA_LAUNCHED(dev);
}

/* ---- mean squared error ---------------------------------------------------- */

template <typename S>
__global__ void mse_forward_kernel(float *losses, const S *pred, const float *target, int D) {
    __shared__ float sh[DT_WARP];
    int n = blockIdx.x;
    const S *p = pred + (size_t)n * D;
    const float *y = target + (size_t)n * D;
    float sum = 0.0f;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float e = dt_ld(p[j]) - y[j];
        sum += e * e;
    }
    sum = dt_block_sum(sum, sh);
    if (threadIdx.x == 0) losses[n] = sum / (float)D;
}

template <typename S>
__global__ void mse_backward_kernel(S *dpred, const S *pred, const float *target, float k,
                                    size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dpred[i] = dt_st<S>(k * (dt_ld(pred[i]) - target[i]));
}

template <typename S>
static void mse_forward(dt_device_t *dev, float *losses, const void *pred, const float *target,
                        int N, int D) {
    if (N <= 0) return;
    DT_LAUNCH(mse_forward_kernel<S>, N, MSE_THREADS, 0, dt_cuda_stream(dev))
    (losses, (const S *)pred, target, D);
    DT_CUDA_LAUNCHED(dev);
}

template <typename S>
static void mse_backward(dt_device_t *dev, void *dpred, const void *pred, const float *target,
                         float dscale, int N, int D) {
    size_t n = (size_t)N * D;
    if (n == 0) return;
    DT_LAUNCH(mse_backward_kernel<S>, dt_blocks(n, 256), 256, 0, dt_cuda_stream(dev))
    ((S *)dpred, (const S *)pred, target, 2.0f * dscale / (float)D, n);
    DT_CUDA_LAUNCHED(dev);
}

void dt_cuda_fill_loss_ops(dt_ops_t *ops, dt_dtype_t dtype) {
    ops->xent_vp_loss = xent_vp_loss; /* fp32 stats and losses in either dtype */
    if (dtype == DT_DTYPE_BF16) {
        ops->softmax_xent_forward = softmax_xent_forward<dt_bf16>;
        ops->softmax_xent_backward = softmax_xent_backward<dt_bf16>;
        ops->xent_vp_max = xent_vp_max<dt_bf16>;
        ops->xent_vp_sums = xent_vp_sums<dt_bf16>;
        ops->xent_vp_backward = xent_vp_backward<dt_bf16>;
        ops->mse_forward = mse_forward<dt_bf16>;
        ops->mse_backward = mse_backward<dt_bf16>;
    } else {
        ops->softmax_xent_forward = softmax_xent_forward<float>;
        ops->softmax_xent_backward = softmax_xent_backward<float>;
        ops->xent_vp_max = xent_vp_max<float>;
        ops->xent_vp_sums = xent_vp_sums<float>;
        ops->xent_vp_backward = xent_vp_backward<float>;
        ops->mse_forward = mse_forward<float>;
        ops->mse_backward = mse_backward<float>;
    }
}
