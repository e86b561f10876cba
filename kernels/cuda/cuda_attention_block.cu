/*
 * cuda_attention_block.cu - context parallelism's attention on the GPU (kernels.h:
 * attention_block_*, attention_kv_pack, attention_kv_grad_add): a rank's local query
 * rows against one key/value block at a time, masked by global index, merged into a
 * running (o, lse) in fp32; the backward recomputes the probabilities from the final
 * lse. The formulas of kernels/cpu/cpu_attention_block.c, for float and bf16
 * storage with fp32 arithmetic.
 *
 * A straightforward first version, one warp per row as the decode kernel
 * (cuda_llama.cu): lane l holds head dims l, l + 32, ... (HS <= DT_ROPE_MAX_HS), a
 * dot product is a warp butterfly, and the keys are walked one at a time in order.
 *  - forward: block (4 query rows, head, sequence); each warp runs an online
 *    softmax over the block's keys its row sees, then merges into o and lse.
 *  - backward: dq with a warp per (query row, head), over the keys in order; dk and
 *    dv with a warp per (key row, key/value head), over the group's query heads and
 *    then the query rows in order, added to dkv once. Each gradient row has one
 *    owner and a fixed order: bitwise reproducible, no atomics.
 * Known headroom: no tiling through shared memory (every key is read by each query
 * row's warp), two recomputations of the scores in the backward.
 */
#include "kernels/cuda/cuda_layers.cuh"

#define CPB_WARPS 4                          /* rows (warps) per block */
#define CPB_DPL (DT_ROPE_MAX_HS / DT_WARP)   /* head dims per lane: 8 */
#define CPB_EW_BLOCK 256

static size_t block_scratch_bytes(const dt_device_t *dev, int B, int Tq, int Tk, int C, int NH, int NKV) {
    return 0; /* the GPU kernels keep everything in registers */
}

static int head_fits(dt_device_t *dev, int C, int NH, const char *op) {
    if (C / NH <= DT_ROPE_MAX_HS) return 1;
    dt_cuda_note_error(dev, op, cudaErrorInvalidValue); /* reported at synchronize */
    return 0;
}

/* A head's HS values of row x into the lane's registers (0 beyond HS). */
template <typename S> static __device__ __forceinline__ void load_head(float *r, const S *x, int HS, int lane) {
#pragma unroll
    for (int i = 0; i < CPB_DPL; i++) {
        int d = lane + DT_WARP * i;
        r[i] = d < HS ? dt_ld(x[d]) : 0.0f;
    }
}

/* The dot product of the lane's registers r with row x, over the warp. */
template <typename S>
static __device__ __forceinline__ float dot_head(const float *r, const S *x, int HS, int lane) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < CPB_DPL; i++) {
        int d = lane + DT_WARP * i;
        if (d < HS) s = fmaf(r[i], dt_ld(x[d]), s);
    }
    return dt_warp_sum(s);
}

static __device__ __forceinline__ int sees(int lo, int hi, int k) { return lo <= k && k <= hi; }

/* ---- forward ------------------------------------------------------------------ */

template <typename S>
__global__ void __launch_bounds__(CPB_WARPS * DT_WARP)
    block_forward_kernel(float *o, float *lse, const S *qkv, const S *kv, const int *qidx, const int *qlo,
                         const int *kidx, int first, int Tq, int Tk, int C, int NH, int NKV, float scale) {
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV, KV2 = 2 * KV;
    int lane = threadIdx.x % DT_WARP, t = blockIdx.x * CPB_WARPS + threadIdx.x / DT_WARP;
    int h = blockIdx.y, b = blockIdx.z;
    if (t >= Tq) return; /* a whole warp leaves together */
    size_t row = (size_t)b * Tq + t;
    int lo = qlo[row], hi = qidx[row];
    const S *k0 = kv + (size_t)b * Tk * KV2 + h / (NH / NKV) * HS;
    const int *ki = kidx + (size_t)b * Tk;
    float qv[CPB_DPL], acc[CPB_DPL];
    load_head(qv, qkv + row * C3 + h * HS, HS, lane);
#pragma unroll
    for (int i = 0; i < CPB_DPL; i++) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j < Tk; j++) {
        if (!sees(lo, hi, ki[j])) continue; /* the same for every lane */
        const S *k = k0 + (size_t)j * KV2, *v = k + KV;
        float s = dot_head(qv, k, HS, lane) * scale;
        float mn = fmaxf(m, s), a = expf(m - mn), p = expf(s - mn);
        l = l * a + p;
        m = mn;
#pragma unroll
        for (int i = 0; i < CPB_DPL; i++) {
            int d = lane + DT_WARP * i;
            if (d < HS) acc[i] = acc[i] * a + p * dt_ld(v[d]);
        }
    }
    float *orow = o + row * C + h * HS, *lp = lse + ((size_t)b * NH + h) * Tq + t;
    float l0 = first ? -INFINITY : *lp;
    __syncwarp(DT_FULL_MASK); /* every lane has read lse before lane 0 writes it */
    if (m == -INFINITY) { /* no key of this block: unchanged, or started when first */
        if (first) {
            for (int d = lane; d < HS; d += DT_WARP) orow[d] = 0.0f;
            if (lane == 0) *lp = -INFINITY;
        }
        return;
    }
    float l1 = m + logf(l);
    if (l0 == -INFINITY) { /* the first keys the row sees: o is this block's */
#pragma unroll
        for (int i = 0; i < CPB_DPL; i++) {
            int d = lane + DT_WARP * i;
            if (d < HS) orow[d] = acc[i] / l;
        }
        if (lane == 0) *lp = l1;
        return;
    }
    /* With the block's normalised output acc / l and lse l1: acc / l exp(l1 - ln) is
     * acc exp(m - ln). */
    float ln = fmaxf(l0, l1) + log1pf(expf(-fabsf(l0 - l1))), a = expf(l0 - ln), c = expf(m - ln);
#pragma unroll
    for (int i = 0; i < CPB_DPL; i++) {
        int d = lane + DT_WARP * i;
        if (d < HS) orow[d] = orow[d] * a + acc[i] * c;
    }
    if (lane == 0) *lp = ln;
}

template <typename S>
static void block_forward(dt_device_t *dev, float *o, float *lse, void *scratch, const void *qkv, const void *kv,
                          const int *qidx, const int *qlo, const int *kidx, int first, int B, int Tq, int Tk, int C,
                          int NH, int NKV) {
    if (B <= 0 || Tq <= 0 || !head_fits(dev, C, NH, "attention_block_forward (head size over DT_ROPE_MAX_HS)"))
        return;
    dim3 grid(dt_blocks((size_t)Tq, CPB_WARPS), NH, B);
    DT_LAUNCH(block_forward_kernel<S>, grid, CPB_WARPS * DT_WARP, 0, dt_cuda_stream(dev))
    (o, lse, (const S *)qkv, (const S *)kv, qidx, qlo, kidx, first, Tq, Tk, C, NH, NKV,
     1.0f / sqrtf((float)(C / NH)));
    DT_CUDA_LAUNCHED(dev);
}

/* ---- elementwise: finish, delta, kv_pack, kv_grad_add ----------------------------- */

template <typename S> __global__ void finish_kernel(S *out, const float *o, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = dt_st<S>(o[i]);
}

template <typename S> static void block_finish(dt_device_t *dev, void *out, const float *o, int B, int Tq, int C) {
    size_t n = (size_t)B * Tq * C;
    if (n == 0) return;
    DT_LAUNCH(finish_kernel<S>, dt_cuda_grid(dev, n, CPB_EW_BLOCK), CPB_EW_BLOCK, 0, dt_cuda_stream(dev))
    ((S *)out, o, n);
    DT_CUDA_LAUNCHED(dev);
}

/* One thread per (b, h, t), its HS products in order. */
template <typename S>
__global__ void delta_kernel(float *delta, const S *dout, const S *out, int B, int Tq, int C, int NH) {
    size_t n = (size_t)B * NH * Tq;
    int HS = C / NH;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bh = i / Tq, t = i % Tq, b = bh / NH, h = bh % NH;
        const S *d = dout + (b * Tq + t) * C + h * HS, *y = out + (b * Tq + t) * C + h * HS;
        float s = 0.0f;
        for (int k = 0; k < HS; k++) s = fmaf(dt_ld(d[k]), dt_ld(y[k]), s);
        delta[i] = s;
    }
}

template <typename S>
static void block_delta(dt_device_t *dev, float *delta, const void *dout, const void *out, int B, int Tq, int C,
                        int NH) {
    size_t n = (size_t)B * NH * Tq;
    if (n == 0) return;
    DT_LAUNCH(delta_kernel<S>, dt_cuda_grid(dev, n, CPB_EW_BLOCK), CPB_EW_BLOCK, 0, dt_cuda_stream(dev))
    (delta, (const S *)dout, (const S *)out, B, Tq, C, NH);
    DT_CUDA_LAUNCHED(dev);
}

template <typename S> __global__ void kv_pack_kernel(S *kv, const S *qkv, size_t rows, int C, int KV2) {
    size_t n = rows * KV2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        kv[i] = qkv[(i / KV2) * (C + KV2) + C + i % KV2];
}

template <typename S>
static void kv_pack(dt_device_t *dev, void *kv, const void *qkv, int B, int T, int C, int NH, int NKV) {
    int KV2 = 2 * NKV * (C / NH);
    size_t rows = (size_t)B * T;
    if (rows * KV2 == 0) return;
    DT_LAUNCH(kv_pack_kernel<S>, dt_cuda_grid(dev, rows * KV2, CPB_EW_BLOCK), CPB_EW_BLOCK, 0, dt_cuda_stream(dev))
    ((S *)kv, (const S *)qkv, rows, C, KV2);
    DT_CUDA_LAUNCHED(dev);
}

template <typename S> __global__ void kv_grad_add_kernel(S *dqkv, const float *dkv, size_t rows, int C, int KV2) {
    size_t n = rows * KV2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        S *d = dqkv + (i / KV2) * (C + KV2) + C + i % KV2;
        *d = dt_st<S>(dt_ld(*d) + dkv[i]);
    }
}

template <typename S>
static void kv_grad_add(dt_device_t *dev, void *dqkv, const float *dkv, int B, int T, int C, int NH, int NKV) {
    int KV2 = 2 * NKV * (C / NH);
    size_t rows = (size_t)B * T;
    if (rows * KV2 == 0) return;
    DT_LAUNCH(kv_grad_add_kernel<S>, dt_cuda_grid(dev, rows * KV2, CPB_EW_BLOCK), CPB_EW_BLOCK, 0,
              dt_cuda_stream(dev))
    ((S *)dqkv, dkv, rows, C, KV2);
    DT_CUDA_LAUNCHED(dev);
}

/* ---- backward ------------------------------------------------------------------ */

/* dq of one query row and head: sum over the keys it sees, in order. */
template <typename S>
__global__ void __launch_bounds__(CPB_WARPS * DT_WARP)
    block_dq_kernel(S *dqkv, const S *dout, const S *qkv, const S *kv, const float *lse, const float *delta,
                    const int *qidx, const int *qlo, const int *kidx, int Tq, int Tk, int C, int NH, int NKV,
                    float scale) {
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV, KV2 = 2 * KV;
    int lane = threadIdx.x % DT_WARP, t = blockIdx.x * CPB_WARPS + threadIdx.x / DT_WARP;
    int h = blockIdx.y, b = blockIdx.z;
    if (t >= Tq) return;
    size_t row = (size_t)b * Tq + t, bht = ((size_t)b * NH + h) * Tq + t;
    float l = lse[bht], dl = delta[bht];
    if (l == -INFINITY) return; /* the row saw no key anywhere, so none here */
    int lo = qlo[row], hi = qidx[row];
    const S *k0 = kv + (size_t)b * Tk * KV2 + h / (NH / NKV) * HS;
    const int *ki = kidx + (size_t)b * Tk;
    float qv[CPB_DPL], dov[CPB_DPL], dq[CPB_DPL];
    load_head(qv, qkv + row * C3 + h * HS, HS, lane);
    load_head(dov, dout + row * C + h * HS, HS, lane);
#pragma unroll
    for (int i = 0; i < CPB_DPL; i++) dq[i] = 0.0f;
    int seen = 0;
    for (int j = 0; j < Tk; j++) {
        if (!sees(lo, hi, ki[j])) continue;
        const S *k = k0 + (size_t)j * KV2, *v = k + KV;
        float p = expf(dot_head(qv, k, HS, lane) * scale - l);
        float ds = p * (dot_head(dov, v, HS, lane) - dl);
        seen = 1;
#pragma unroll
        for (int i = 0; i < CPB_DPL; i++) {
            int d = lane + DT_WARP * i;
            if (d < HS) dq[i] = fmaf(ds, dt_ld(k[d]), dq[i]);
        }
    }
    if (!seen) return; /* untouched, bitwise */
    S *dr = dqkv + row * C3 + h * HS;
#pragma unroll
    for (int i = 0; i < CPB_DPL; i++) {
        int d = lane + DT_WARP * i;
        if (d < HS) dr[d] = dt_st<S>(dt_ld(dr[d]) + scale * dq[i]);
    }
}

/* dk and dv of one key row and key/value head: over the group's query heads, then
 * the query rows that see it, in order; added to dkv once. */
template <typename S>
__global__ void __launch_bounds__(CPB_WARPS * DT_WARP)
    block_dkv_kernel(float *dkv, const S *dout, const S *qkv, const S *kv, const float *lse, const float *delta,
                     const int *qidx, const int *qlo, const int *kidx, int Tq, int Tk, int C, int NH, int NKV,
                     float scale) {
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV, KV2 = 2 * KV, rep = NH / NKV;
    int lane = threadIdx.x % DT_WARP, j = blockIdx.x * CPB_WARPS + threadIdx.x / DT_WARP;
    int g = blockIdx.y, b = blockIdx.z;
    if (j >= Tk) return;
    size_t krow = (size_t)b * Tk + j;
    int kj = kidx[krow];
    float kv_[CPB_DPL], vv[CPB_DPL], dk[CPB_DPL], dv[CPB_DPL];
    load_head(kv_, kv + krow * KV2 + g * HS, HS, lane);
    load_head(vv, kv + krow * KV2 + KV + g * HS, HS, lane);
#pragma unroll
    for (int i = 0; i < CPB_DPL; i++) dk[i] = dv[i] = 0.0f;
    int seen = 0;
    for (int h = g * rep; h < (g + 1) * rep; h++)
        for (int t = 0; t < Tq; t++) {
            size_t row = (size_t)b * Tq + t, bht = ((size_t)b * NH + h) * Tq + t;
            if (!sees(qlo[row], qidx[row], kj) || lse[bht] == -INFINITY) continue;
            const S *q = qkv + row * C3 + h * HS, *dO = dout + row * C + h * HS;
            float p = expf(dot_head(kv_, q, HS, lane) * scale - lse[bht]);
            float ds = p * (dot_head(vv, dO, HS, lane) - delta[bht]);
            seen = 1;
#pragma unroll
            for (int i = 0; i < CPB_DPL; i++) {
                int d = lane + DT_WARP * i;
                if (d < HS) {
                    dk[i] = fmaf(ds, dt_ld(q[d]), dk[i]);
                    dv[i] = fmaf(p, dt_ld(dO[d]), dv[i]);
                }
            }
        }
    if (!seen) return;
    float *dr = dkv + krow * KV2 + g * HS;
#pragma unroll
    for (int i = 0; i < CPB_DPL; i++) {
        int d = lane + DT_WARP * i;
        if (d < HS) {
            dr[d] += scale * dk[i];
            dr[KV + d] += dv[i];
        }
    }
}

template <typename S>
static void block_backward(dt_device_t *dev, void *dqkv, float *dkv, void *scratch, const void *dout,
                           const void *qkv, const void *kv, const float *lse, const float *delta, const int *qidx,
                           const int *qlo, const int *kidx, int B, int Tq, int Tk, int C, int NH, int NKV) {
    if (B <= 0 || Tq <= 0 || Tk <= 0 ||
        !head_fits(dev, C, NH, "attention_block_backward (head size over DT_ROPE_MAX_HS)"))
        return;
    float scale = 1.0f / sqrtf((float)(C / NH));
    dim3 gq(dt_blocks((size_t)Tq, CPB_WARPS), NH, B), gk(dt_blocks((size_t)Tk, CPB_WARPS), NKV, B);
    DT_LAUNCH(block_dq_kernel<S>, gq, CPB_WARPS * DT_WARP, 0, dt_cuda_stream(dev))
    ((S *)dqkv, (const S *)dout, (const S *)qkv, (const S *)kv, lse, delta, qidx, qlo, kidx, Tq, Tk, C, NH, NKV,
     scale);
    DT_CUDA_LAUNCHED(dev);
    DT_LAUNCH(block_dkv_kernel<S>, gk, CPB_WARPS * DT_WARP, 0, dt_cuda_stream(dev))
    (dkv, (const S *)dout, (const S *)qkv, (const S *)kv, lse, delta, qidx, qlo, kidx, Tq, Tk, C, NH, NKV, scale);
    DT_CUDA_LAUNCHED(dev);
}

template <typename S> static void fill(dt_ops_t *o) {
    o->attention_block_scratch_bytes = block_scratch_bytes;
    o->attention_kv_pack = kv_pack<S>;
    o->attention_block_forward = block_forward<S>;
    o->attention_block_finish = block_finish<S>;
    o->attention_block_delta = block_delta<S>;
    o->attention_block_backward = block_backward<S>;
    o->attention_kv_grad_add = kv_grad_add<S>;
}

void dt_cuda_fill_attention_block_ops(dt_ops_t *ops, dt_dtype_t dtype) {
    if (dtype == DT_DTYPE_BF16)
        fill<dt_bf16>(ops);
    else
        fill<float>(ops);
}
