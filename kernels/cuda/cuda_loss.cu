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
    if (dtype == DT_DTYPE_BF16) {
        ops->softmax_xent_forward = softmax_xent_forward<dt_bf16>;
        ops->softmax_xent_backward = softmax_xent_backward<dt_bf16>;
        ops->mse_forward = mse_forward<dt_bf16>;
        ops->mse_backward = mse_backward<dt_bf16>;
    } else {
        ops->softmax_xent_forward = softmax_xent_forward<float>;
        ops->softmax_xent_backward = softmax_xent_backward<float>;
        ops->mse_forward = mse_forward<float>;
        ops->mse_backward = mse_backward<float>;
    }
}
