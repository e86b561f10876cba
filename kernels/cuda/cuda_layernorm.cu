/*
 * cuda_layernorm.cu - layernorm over the last dim on the GPU (eps 1e-5), forward
 * saving fp32 mean and rstd, and backward (kernels.h).
 *
 * Forward and the input gradient: one warp per row; the lanes stride over the row
 * in 16-byte packs (8 bf16 / 4 fp32; one element at a time when C or a pointer does
 * not allow packs) and reduce with warp butterflies, so every row's sums have a
 * fixed order. Mean and variance take two passes over the row
 * (the second hits L1), as the CPU op does: no E[x^2] - E[x]^2 cancellation.
 *
 * Parameter gradients (dweight, dbias: sums over all N rows) in two stages, with
 * no float atomics:
 *   1. G blocks each own a contiguous chunk of rows; thread c sums its channels over
 *      the chunk in row order and writes one partial per channel to the scratch
 *      (G, 2, C) fp32;
 *   2. one thread per channel adds the G partials in order and accumulates (+=)
 *      into dweight and dbias.
 * G depends on N only (chunks of 32 rows, at most 1024 chunks), so the order is
 * the same on every run. The scratch is the device's shared one (cuda_layers.cu).
 */
#include "kernels/cuda/cuda_layers.cuh"

#define LN_EPS 1e-5f
#define ROWS_PER_BLOCK 4 /* warps per block in the row kernels */
#define CHUNK_ROWS 32
#define MAX_CHUNKS 1024

/* Lane `lane` of a warp visits the row's elements in packs of N (16 bytes when
 * N > 1): pack p = lane, lane + 32, ... The same lane visits the same elements in
 * every pass, and the order of each lane's additions is fixed. */
template <typename S, int N>
__global__ void layernorm_forward_kernel(S *out, float *mean, float *rstd, const S *inp,
                                         const S *weight, const S *bias, int N_rows, int C) {
    int lane = threadIdx.x % DT_WARP;
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / DT_WARP;
    if (row >= N_rows) return; /* a whole warp leaves together; no block barrier follows */
    const S *x = inp + (size_t)row * C;
    S *o = out + (size_t)row * C;
    float sum = 0.0f;
    for (int c = lane * N; c < C; c += DT_WARP * N) {
        dt_vec<S, N> v = dt_vec_ld<S, N>(x + c);
        for (int k = 0; k < N; k++) sum += dt_ld(v.v[k]);
    }
    float m = dt_warp_sum(sum) / (float)C;
    float var = 0.0f;
    for (int c = lane * N; c < C; c += DT_WARP * N) {
        dt_vec<S, N> v = dt_vec_ld<S, N>(x + c);
        for (int k = 0; k < N; k++) {
            float d = dt_ld(v.v[k]) - m;
            var += d * d;
        }
    }
    float s = 1.0f / sqrtf(dt_warp_sum(var) / (float)C + LN_EPS);
    for (int c = lane * N; c < C; c += DT_WARP * N) {
        dt_vec<S, N> v = dt_vec_ld<S, N>(x + c), w = dt_vec_ld<S, N>(weight + c);
        dt_vec<S, N> b = dt_vec_ld<S, N>(bias + c), r;
        for (int k = 0; k < N; k++)
            r.v[k] = dt_st<S>((dt_ld(v.v[k]) - m) * s * dt_ld(w.v[k]) + dt_ld(b.v[k]));
        dt_vec_st<S, N>(o + c, r);
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = s;
    }
}

/* 16-byte packs when C is a whole number of them and every row pointer is aligned. */
template <typename S> static int ln_vec(int C, const void *a, const void *b, const void *c,
                                        const void *d, const void *e) {
    return C % dt_vec_width<S>() == 0 && dt_cuda_aligned16(a) && dt_cuda_aligned16(b) &&
           dt_cuda_aligned16(c) && dt_cuda_aligned16(d) && dt_cuda_aligned16(e);
}

template <typename S>
static void layernorm_forward(dt_device_t *dev, void *out, float *mean, float *rstd,
                              const void *inp, const void *weight, const void *bias, int N,
                              int C) {
    constexpr int W = dt_vec_width<S>();
    if (N <= 0) return;
    void (*kernel)(S *, float *, float *, const S *, const S *, const S *, int, int) =
        ln_vec<S>(C, out, inp, weight, bias, NULL) ? layernorm_forward_kernel<S, W>
                                                   : layernorm_forward_kernel<S, 1>;
    DT_LAUNCH(kernel, dt_blocks(N, ROWS_PER_BLOCK), ROWS_PER_BLOCK * DT_WARP, 0, dt_cuda_stream(dev))
    ((S *)out, mean, rstd, (const S *)inp, (const S *)weight, (const S *)bias, N, C);
    DT_CUDA_LAUNCHED(dev);
}

/* dinp += (w dout - mean(w dout) - norm mean(w dout norm)) rstd, a warp per row,
 * packs as in the forward. */
template <typename S, int N>
__global__ void layernorm_dinp_kernel(S *dinp, const S *dout, const S *inp, const S *weight,
                                      const float *mean, const float *rstd, int N_rows, int C) {
    int lane = threadIdx.x % DT_WARP;
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / DT_WARP;
    if (row >= N_rows) return;
    const S *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    S *dx = dinp + (size_t)row * C;
    float m = mean[row], s = rstd[row];
    float dmean = 0.0f, dnmean = 0.0f;
    for (int c = lane * N; c < C; c += DT_WARP * N) {
        dt_vec<S, N> xv = dt_vec_ld<S, N>(x + c), dv = dt_vec_ld<S, N>(d + c);
        dt_vec<S, N> wv = dt_vec_ld<S, N>(weight + c);
        for (int k = 0; k < N; k++) {
            float dnorm = dt_ld(wv.v[k]) * dt_ld(dv.v[k]);
            dmean += dnorm;
            dnmean += dnorm * (dt_ld(xv.v[k]) - m) * s;
        }
    }
    dmean = dt_warp_sum(dmean) / (float)C;
    dnmean = dt_warp_sum(dnmean) / (float)C;
    for (int c = lane * N; c < C; c += DT_WARP * N) {
        dt_vec<S, N> xv = dt_vec_ld<S, N>(x + c), dv = dt_vec_ld<S, N>(d + c);
        dt_vec<S, N> wv = dt_vec_ld<S, N>(weight + c), gv = dt_vec_ld<S, N>(dx + c);
        for (int k = 0; k < N; k++) {
            float norm = (dt_ld(xv.v[k]) - m) * s;
            float g = (dt_ld(wv.v[k]) * dt_ld(dv.v[k]) - dmean - norm * dnmean) * s;
            gv.v[k] = dt_st<S>(dt_ld(gv.v[k]) + g);
        }
        dt_vec_st<S, N>(dx + c, gv);
    }
}

/* Stage 1: partial[g, 0, c] = sum over the chunk's rows of dout * norm,
 * partial[g, 1, c] = sum of dout. */
template <typename S>
__global__ void layernorm_dparam_partial_kernel(float *partial, const S *dout, const S *inp,
                                                const float *mean, const float *rstd, int N,
                                                int C, int chunk) {
    int g = blockIdx.x;
    int r0 = g * chunk, r1 = r0 + chunk < N ? r0 + chunk : N;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float dw = 0.0f, db = 0.0f;
        for (int r = r0; r < r1; r++) {
            float d = dt_ld(dout[(size_t)r * C + c]);
            dw += d * (dt_ld(inp[(size_t)r * C + c]) - mean[r]) * rstd[r];
            db += d;
        }
        partial[(size_t)g * 2 * C + c] = dw;
        partial[(size_t)g * 2 * C + C + c] = db;
    }
}

/* Stage 2: dweight[c] += sum over g of partial[g, 0, c]; dbias likewise. */
template <typename S>
__global__ void layernorm_dparam_final_kernel(S *dweight, S *dbias, const float *partial, int G,
                                              int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float dw = 0.0f, db = 0.0f;
    for (int g = 0; g < G; g++) {
        dw += partial[(size_t)g * 2 * C + c];
        db += partial[(size_t)g * 2 * C + C + c];
    }
    if (dweight) dweight[c] = dt_st<S>(dt_ld(dweight[c]) + dw);
    if (dbias) dbias[c] = dt_st<S>(dt_ld(dbias[c]) + db);
}

template <typename S>
static void layernorm_backward(dt_device_t *dev, void *dinp, void *dweight, void *dbias,
                               const void *dout, const void *inp, const void *weight,
                               const float *mean, const float *rstd, int N, int C) {
    cudaStream_t st = dt_cuda_stream(dev);
    if (N <= 0) return;
    if (dinp) {
        constexpr int W = dt_vec_width<S>();
        void (*kernel)(S *, const S *, const S *, const S *, const float *, const float *, int, int) =
            ln_vec<S>(C, dinp, dout, inp, weight, NULL) ? layernorm_dinp_kernel<S, W>
                                                        : layernorm_dinp_kernel<S, 1>;
        DT_LAUNCH(kernel, dt_blocks(N, ROWS_PER_BLOCK), ROWS_PER_BLOCK * DT_WARP, 0, st)
        ((S *)dinp, (const S *)dout, (const S *)inp, (const S *)weight, mean, rstd, N, C);
        DT_CUDA_LAUNCHED(dev);
    }
    if (!dweight && !dbias) return;
    int chunk = CHUNK_ROWS;
    if (dt_blocks(N, chunk) > MAX_CHUNKS) chunk = (int)dt_blocks(N, MAX_CHUNKS);
    int G = (int)dt_blocks(N, chunk);
    float *partial = (float *)dt_cuda_layer_scratch(dev, sizeof(float) * 2 * (size_t)G * C, __func__);
    if (!partial) return;
    DT_LAUNCH(layernorm_dparam_partial_kernel<S>, G, 256, 0, st)
    (partial, (const S *)dout, (const S *)inp, mean, rstd, N, C, chunk);
    DT_CUDA_LAUNCHED(dev);
    DT_LAUNCH(layernorm_dparam_final_kernel<S>, dt_blocks(C, 256), 256, 0, st)
    ((S *)dweight, (S *)dbias, partial, G, C);
    DT_CUDA_LAUNCHED(dev);
}

void dt_cuda_fill_layernorm_ops(dt_ops_t *ops, dt_dtype_t dtype) {
    if (dtype == DT_DTYPE_BF16) {
        ops->layernorm_forward = layernorm_forward<dt_bf16>;
        ops->layernorm_backward = layernorm_backward<dt_bf16>;
    } else {
        ops->layernorm_forward = layernorm_forward<float>;
        ops->layernorm_backward = layernorm_backward<float>;
    }
}
