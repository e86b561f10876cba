/*
 * cuda_attention_block.cu - context parallelism's attention on the GPU (kernels.h:
 * attention_block_*, attention_kv_pack, attention_kv_grad_add): a rank's local query
 * rows against one key/value block at a time, masked by global index, merged into a
 * running (o, lse) in fp32; the backward recomputes the probabilities from the final
 * lse. The formulas of kernels/cpu/cpu_attention_block.c, for float and bf16
 * storage with fp32 arithmetic.
 *
 * Tiled kernels for HS <= DT_ATTENTION_FUSED_MAX_HS, on the fused attention's
 * tiling (cuda_attention_tiles.cuh: 32 query rows by 32 keys, 128 threads, tiles in
 * shared memory as fp32):
 *  - forward, block (query tile, h, b): the Q tile once, then each key tile of the
 *    block in order through shared memory, an online softmax per row (the running
 *    max starts at -inf and subtracts 0 until the row sees a key, as the fused
 *    kernel's packed rows do); at the end each row's (o_blk, lse_blk) is merged into
 *    o and lse (first = 1: started first; a row that saw no key keeps them bitwise).
 *  - backward: dq with a block per (query tile, h) over the key tiles; dk and dv
 *    with a block per (key tile, key/value head g) over g's query heads and then the
 *    query tiles, in registers, added to dkv once. P and dS are recomputed per tile
 *    pair in each. Every gradient row has one owner and a fixed order: bitwise
 *    reproducible, no atomics. Rows (keys) that saw no score are not written.
 *  - a (query tile, key tile) pair is skipped before K, V (or Q, dO) are loaded
 *    when no query of the one can see a key of the other, from the tiles' extreme
 *    global indices: the ring's blocks in the future of every row, and the keys of
 *    earlier documents, cost a 32-int load per tile.
 * Wider heads (up to DT_ROPE_MAX_HS) take the simple kernels, one warp per row as
 * the decode kernel (cuda_llama.cu): lane l holds head dims l, l + 32, ..., a dot
 * product is a warp butterfly, the keys are walked one at a time in order.
 *  - forward: block (4 query rows, head, sequence); each warp runs an online
 *    softmax over the block's keys its row sees, then merges into o and lse.
 *  - backward: dq with a warp per (query row, head), over the keys in order; dk and
 *    dv with a warp per (key row, key/value head), over the group's query heads and
 *    then the query rows in order, added to dkv once.
 * The simple kernels are also the tests' second reference
 * (dt_cuda_fill_attention_block_simple_ops). Known headroom of the tiled ones: no
 * tensor cores in bf16 (the fused attention's WMMA builds would carry over: the
 * mask is per element either way), no cp.async, and P recomputed in both backward
 * kernels.
 */
#include <limits.h>

#include "kernels/cuda/cuda_attention_tiles.cuh"
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
    simple_forward_kernel(float *o, float *lse, const S *qkv, const S *kv, const int *qidx, const int *qlo,
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
static void simple_forward(dt_device_t *dev, float *o, float *lse, void *scratch, const void *qkv, const void *kv,
                          const int *qidx, const int *qlo, const int *kidx, int first, int B, int Tq, int Tk, int C,
                          int NH, int NKV) {
    if (B <= 0 || Tq <= 0 || !head_fits(dev, C, NH, "attention_block_forward (head size over DT_ROPE_MAX_HS)"))
        return;
    dim3 grid(dt_blocks((size_t)Tq, CPB_WARPS), NH, B);
    DT_LAUNCH(simple_forward_kernel<S>, grid, CPB_WARPS * DT_WARP, 0, dt_cuda_stream(dev))
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
    simple_dq_kernel(S *dqkv, const S *dout, const S *qkv, const S *kv, const float *lse, const float *delta,
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
    simple_dkv_kernel(float *dkv, const S *dout, const S *qkv, const S *kv, const float *lse, const float *delta,
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
static void simple_backward(dt_device_t *dev, void *dqkv, float *dkv, void *scratch, const void *dout,
                           const void *qkv, const void *kv, const float *lse, const float *delta, const int *qidx,
                           const int *qlo, const int *kidx, int B, int Tq, int Tk, int C, int NH, int NKV) {
    if (B <= 0 || Tq <= 0 || Tk <= 0 ||
        !head_fits(dev, C, NH, "attention_block_backward (head size over DT_ROPE_MAX_HS)"))
        return;
    float scale = 1.0f / sqrtf((float)(C / NH));
    dim3 gq(dt_blocks((size_t)Tq, CPB_WARPS), NH, B), gk(dt_blocks((size_t)Tk, CPB_WARPS), NKV, B);
    DT_LAUNCH(simple_dq_kernel<S>, gq, CPB_WARPS * DT_WARP, 0, dt_cuda_stream(dev))
    ((S *)dqkv, (const S *)dout, (const S *)qkv, (const S *)kv, lse, delta, qidx, qlo, kidx, Tq, Tk, C, NH, NKV,
     scale);
    DT_CUDA_LAUNCHED(dev);
    DT_LAUNCH(simple_dkv_kernel<S>, gk, CPB_WARPS * DT_WARP, 0, dt_cuda_stream(dev))
    (dkv, (const S *)dout, (const S *)qkv, (const S *)kv, lse, delta, qidx, qlo, kidx, Tq, Tk, C, NH, NKV, scale);
    DT_CUDA_LAUNCHED(dev);
}

/* ---- tiled kernels (HS <= DT_ATTENTION_FUSED_MAX_HS) ----------------------------
 * The fused attention's tiling (cuda_attention_tiles.cuh: 32 query rows by 32 keys,
 * 128 threads, fp32 tiles in shared memory) with the mask by global index. Before a
 * (query tile, key tile) pair is loaded, warp 0 reduces the query tile's smallest
 * qlo and largest qidx and the key tile's smallest and largest kidx; a pair with
 * kidx max < qlo min or kidx min > qidx max has no visible score and is skipped
 * whole (a ring's blocks in the future of every row cost one 32-int load per tile).
 * Rows past Tq take lo = INT_MAX, hi = INT_MIN and keys past Tk kidx = INT_MIN, so
 * the one test qlo <= kidx <= qidx masks them too (global indices are >= 0). */

/* Min and max of an int over a warp. */
static __device__ __forceinline__ int warp_min_int(int x) {
    for (int o = DT_WARP / 2; o > 0; o >>= 1) x = min(x, __shfl_xor_sync(DT_FULL_MASK, x, o));
    return x;
}
static __device__ __forceinline__ int warp_max_int(int x) {
    for (int o = DT_WARP / 2; o > 0; o >>= 1) x = max(x, __shfl_xor_sync(DT_FULL_MASK, x, o));
    return x;
}

/* Query rows q0 .. q0+31 of a sequence: lo[r], hi[r], and bound[0] = min lo,
 * bound[1] = max hi over the rows in range. Warp 0 works; the caller syncs after. */
static __device__ __forceinline__ void tile_query_bounds(int *lo, int *hi, int *bound, const int *qlo,
                                                         const int *qidx, int q0, int Tq) {
    if (threadIdx.x >= DT_WARP) return;
    int r = threadIdx.x, in = q0 + r < Tq;
    int l = in ? qlo[q0 + r] : INT_MAX, h = in ? qidx[q0 + r] : INT_MIN;
    lo[r] = l, hi[r] = h;
    l = warp_min_int(l), h = warp_max_int(h);
    if (r == 0) bound[0] = l, bound[1] = h;
}

/* Keys k0 .. k0+31 of a sequence: idx[j] (INT_MIN past Tk), bound[0] = min and
 * bound[1] = max kidx over the keys in range. Warp 0 works; the caller syncs after. */
static __device__ __forceinline__ void tile_key_bounds(int *idx, int *bound, const int *kidx, int k0, int Tk) {
    if (threadIdx.x >= DT_WARP) return;
    int j = threadIdx.x, in = k0 + j < Tk, k = in ? kidx[k0 + j] : INT_MIN;
    idx[j] = k;
    int lo = warp_min_int(in ? k : INT_MAX), hi = warp_max_int(k);
    if (j == 0) bound[0] = lo, bound[1] = hi;
}

/* bound: query tile's (min lo, max hi), then key tile's (min, max). */
static __device__ __forceinline__ int tile_pair_unseen(const int *bound) {
    return bound[3] < bound[0] || bound[2] > bound[1];
}

/* ---- tiled forward: block (query tile, h, b), over the key tiles in order ---- */

static size_t tiled_forward_smem(int HS) {
    return sizeof(float) * (3 * (size_t)FA_TILE * (HS + 1) + (size_t)FA_TILE * FA_PS + 4 * FA_TILE) +
           sizeof(int) * (3 * FA_TILE + 4);
}

template <typename S>
__global__ void __launch_bounds__(FA_THREADS)
    tiled_forward_kernel(float *o, float *lse, const S *qkv, const S *kv, const int *qidx, const int *qlo,
                         const int *kidx, int first, int Tq, int Tk, int C, int NH, int NKV, float scale) {
    DT_DYN_SMEM(float, sm);
    int HS = C / NH, hp = HS + 1, KV = NKV * HS, C3 = C + 2 * KV, KV2 = 2 * KV;
    int q0 = blockIdx.x * FA_TILE, h = blockIdx.y, b = blockIdx.z;
    int lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
    float *sq = sm, *sk = sq + FA_TILE * hp, *sv = sk + FA_TILE * hp, *sp = sv + FA_TILE * hp;
    float *salpha = sp + FA_TILE * FA_PS, *srm = salpha + FA_TILE, *srl = srm + FA_TILE, *sl0 = srl + FA_TILE;
    int *slo = (int *)(sl0 + FA_TILE), *shi = slo + FA_TILE, *skidx = shi + FA_TILE, *sb = skidx + FA_TILE;
    const S *q = qkv + (size_t)b * Tq * C3 + h * HS;
    const S *k = kv + (size_t)b * Tk * KV2 + h / (NH / NKV) * HS, *v = k + KV;
    fa_load(sq, q, C3, q0, Tq, HS, hp);
    tile_query_bounds(slo, shi, sb, qlo + (size_t)b * Tq, qidx + (size_t)b * Tq, q0, Tq);

    float m[FA_ROWS_PER_WARP], l[FA_ROWS_PER_WARP]; /* rows warp + FA_WARPS i */
#pragma unroll
    for (int i = 0; i < FA_ROWS_PER_WARP; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    float acc[FA_DPT]; /* O[lane][warp + FA_WARPS i] */
#pragma unroll
    for (int i = 0; i < FA_DPT; i++) acc[i] = 0.0f;

    for (int k0 = 0; k0 < Tk; k0 += FA_TILE) {
        __syncthreads(); /* the previous tile's readers are done (first: the queries are in) */
        tile_key_bounds(skidx, sb + 2, kidx + (size_t)b * Tk, k0, Tk);
        __syncthreads();
        if (tile_pair_unseen(sb)) continue; /* the same for the whole block */
        fa_load(sk, k, KV2, k0, Tk, HS, hp);
        fa_load(sv, v, KV2, k0, Tk, HS, hp);
        __syncthreads();
        fa_tile_step(m, l, acc, sq, sk, sv, sp, salpha, HS, hp, scale, warp, lane,
                     [&](int r, int j) { return sees(slo[r], shi[r], skidx[j]); });
    }
    /* The block's (m, l) per row, and the running lse, where every thread of a row
     * reads them (before warp 0 writes the new lse). */
#pragma unroll
    for (int i = 0; i < FA_ROWS_PER_WARP; i++)
        if (lane == 0) srm[warp + FA_WARPS * i] = m[i], srl[warp + FA_WARPS * i] = l[i];
    size_t bh = (size_t)b * NH + h;
    if (threadIdx.x < FA_TILE) {
        int r = threadIdx.x;
        sl0[r] = first || q0 + r >= Tq ? -INFINITY : lse[bh * Tq + q0 + r];
    }
    __syncthreads();
    int r = lane, t = q0 + r;
    if (t >= Tq) return;
    float mr = srm[r], lr = srl[r], l0 = sl0[r];
    float *orow = o + ((size_t)b * Tq + t) * C + h * HS, *lp = lse + bh * Tq + t;
    if (mr == -INFINITY) { /* no key of this block: unchanged, or started when first */
        if (!first) return;
#pragma unroll
        for (int i = 0; i < FA_DPT; i++) {
            int d = warp + FA_WARPS * i;
            if (d < HS) orow[d] = 0.0f;
        }
        if (warp == 0) *lp = -INFINITY;
        return;
    }
    float l1 = mr + logf(lr);
    if (l0 == -INFINITY) { /* the first keys the row sees: o is this block's */
#pragma unroll
        for (int i = 0; i < FA_DPT; i++) {
            int d = warp + FA_WARPS * i;
            if (d < HS) orow[d] = acc[i] / lr;
        }
        if (warp == 0) *lp = l1;
        return;
    }
    /* As the simple kernel: acc / l exp(l1 - ln) is acc exp(m - ln). */
    float ln = fmaxf(l0, l1) + log1pf(expf(-fabsf(l0 - l1))), a = expf(l0 - ln), c = expf(mr - ln);
#pragma unroll
    for (int i = 0; i < FA_DPT; i++) {
        int d = warp + FA_WARPS * i;
        if (d < HS) orow[d] = orow[d] * a + acc[i] * c;
    }
    if (warp == 0) *lp = ln;
}

/* ---- tiled backward: dq per query tile, dk/dv per key tile ---- */

/* Shared memory of both backward kernels: Q, dO, K, V tiles (32, HS + 1), P and dS
 * (32, 33), lse and delta of the query rows, their lo and hi, the keys' kidx, the
 * four tile bounds, and which rows (dq) or keys (dk/dv) saw a score. */
struct tiled_bwd_smem {
    float *q, *dout, *k, *v, *p, *ds, *lse, *D;
    int *lo, *hi, *kidx, *bound, *seen;
};

static size_t tiled_backward_smem(int HS) {
    return sizeof(float) * (4 * (size_t)FA_TILE * (HS + 1) + 2 * (size_t)FA_TILE * FA_PS + 2 * FA_TILE) +
           sizeof(int) * (4 * FA_TILE + 4);
}

static __device__ __forceinline__ tiled_bwd_smem tiled_bwd_carve(float *sm, int hp) {
    tiled_bwd_smem s;
    s.q = sm;
    s.dout = s.q + FA_TILE * hp;
    s.k = s.dout + FA_TILE * hp;
    s.v = s.k + FA_TILE * hp;
    s.p = s.v + FA_TILE * hp;
    s.ds = s.p + FA_TILE * FA_PS;
    s.lse = s.ds + FA_TILE * FA_PS;
    s.D = s.lse + FA_TILE;
    s.lo = (int *)(s.D + FA_TILE);
    s.hi = s.lo + FA_TILE;
    s.kidx = s.hi + FA_TILE;
    s.seen = s.kidx + FA_TILE;
    s.bound = s.seen + FA_TILE;
    return s;
}

/* Q, dO, lse and delta of query rows q0 .. q0+31 of one head (rows past Tq: zeros,
 * lse -inf). */
template <typename S>
static __device__ __forceinline__ void tiled_load_queries(tiled_bwd_smem s, const S *q, const S *dout,
                                                          const float *lse, const float *D, int q0, int Tq, int C,
                                                          int C3, int HS) {
    fa_load(s.q, q, C3, q0, Tq, HS, HS + 1);
    fa_load(s.dout, dout, C, q0, Tq, HS, HS + 1);
    for (int r = threadIdx.x; r < FA_TILE; r += blockDim.x) {
        s.lse[r] = q0 + r < Tq ? lse[q0 + r] : -INFINITY;
        s.D[r] = q0 + r < Tq ? D[q0 + r] : 0.0f;
    }
}

/* P and dS of the tiles in shared memory, 0 where the key is not visible (or the row
 * saw no key anywhere: lse -inf); marks seen[r] (by_key 0) or seen[j] (1) where a
 * score is. Caller syncs before and after. */
static __device__ __forceinline__ void tiled_p_ds(tiled_bwd_smem s, int by_key, int HS, float scale) {
    int hp = HS + 1, lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
#pragma unroll
    for (int i = 0; i < FA_ROWS_PER_WARP; i++) {
        int r = warp + FA_WARPS * i, j = lane;
        float p = 0.0f, ds = 0.0f;
        if (sees(s.lo[r], s.hi[r], s.kidx[j]) && s.lse[r] != -INFINITY) {
            p = expf(scale * fa_dot(s.q + r * hp, s.k + j * hp, HS) - s.lse[r]);
            ds = p * (fa_dot(s.dout + r * hp, s.v + j * hp, HS) - s.D[r]);
            s.seen[by_key ? j : r] = 1;
        }
        s.p[r * FA_PS + j] = p;
        s.ds[r * FA_PS + j] = ds;
    }
}

/* Block (query tile, h, b): dq of 32 query rows over the key tiles in order. */
template <typename S>
__global__ void __launch_bounds__(FA_THREADS)
    tiled_dq_kernel(S *dqkv, const S *dout, const S *qkv, const S *kv, const float *lse, const float *delta,
                    const int *qidx, const int *qlo, const int *kidx, int Tq, int Tk, int C, int NH, int NKV,
                    float scale) {
    DT_DYN_SMEM(float, sm);
    int HS = C / NH, hp = HS + 1, KV = NKV * HS, C3 = C + 2 * KV, KV2 = 2 * KV;
    int q0 = blockIdx.x * FA_TILE, h = blockIdx.y, b = blockIdx.z;
    int lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
    tiled_bwd_smem s = tiled_bwd_carve(sm, hp);
    size_t bh = (size_t)b * NH + h;
    const S *k = kv + (size_t)b * Tk * KV2 + h / (NH / NKV) * HS, *v = k + KV;
    tiled_load_queries(s, qkv + (size_t)b * Tq * C3 + h * HS, dout + (size_t)b * Tq * C + h * HS, lse + bh * Tq,
                       delta + bh * Tq, q0, Tq, C, C3, HS);
    tile_query_bounds(s.lo, s.hi, s.bound, qlo + (size_t)b * Tq, qidx + (size_t)b * Tq, q0, Tq);
    for (int r = threadIdx.x; r < FA_TILE; r += blockDim.x) s.seen[r] = 0;
    float dq[FA_DPT]; /* [query lane][dim warp + FA_WARPS i] */
#pragma unroll
    for (int i = 0; i < FA_DPT; i++) dq[i] = 0.0f;
    for (int k0 = 0; k0 < Tk; k0 += FA_TILE) {
        __syncthreads();
        tile_key_bounds(s.kidx, s.bound + 2, kidx + (size_t)b * Tk, k0, Tk);
        __syncthreads();
        if (tile_pair_unseen(s.bound)) continue;
        fa_load(s.k, k, KV2, k0, Tk, HS, hp);
        fa_load(s.v, v, KV2, k0, Tk, HS, hp);
        __syncthreads();
        tiled_p_ds(s, 0, HS, scale);
        __syncthreads();
        const float *dsr = s.ds + lane * FA_PS;
#pragma unroll
        for (int i = 0; i < FA_DPT; i++) {
            int d = warp + FA_WARPS * i;
            if (d >= HS) continue; /* constant indices: dq stays in registers */
            float a = dq[i];
            for (int j = 0; j < FA_TILE; j++) a = fmaf(dsr[j], s.k[j * hp + d], a);
            dq[i] = a;
        }
    }
    __syncthreads();
    int t = q0 + lane;
    if (t >= Tq || !s.seen[lane]) return; /* a row that saw nothing: untouched, bitwise */
    S *dqp = dqkv + ((size_t)b * Tq + t) * C3 + h * HS;
#pragma unroll
    for (int i = 0; i < FA_DPT; i++) {
        int d = warp + FA_WARPS * i;
        if (d < HS) dqp[d] = dt_st<S>(dt_ld(dqp[d]) + scale * dq[i]);
    }
}

/* Block (key tile, g, b): dk and dv of 32 keys of key/value head g over the group's
 * query heads, then the query tiles, in order, summed in registers and added to dkv
 * once (no two blocks write one key's gradient: no atomics). */
template <typename S>
__global__ void __launch_bounds__(FA_THREADS)
    tiled_dkv_kernel(float *dkv, const S *dout, const S *qkv, const S *kv, const float *lse, const float *delta,
                     const int *qidx, const int *qlo, const int *kidx, int Tq, int Tk, int C, int NH, int NKV,
                     float scale) {
    DT_DYN_SMEM(float, sm);
    int HS = C / NH, hp = HS + 1, KV = NKV * HS, C3 = C + 2 * KV, KV2 = 2 * KV, rep = NH / NKV;
    int k0 = blockIdx.x * FA_TILE, g = blockIdx.y, b = blockIdx.z;
    int lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
    tiled_bwd_smem s = tiled_bwd_carve(sm, hp);
    const S *k = kv + (size_t)b * Tk * KV2 + g * HS, *v = k + KV;
    fa_load(s.k, k, KV2, k0, Tk, HS, hp);
    fa_load(s.v, v, KV2, k0, Tk, HS, hp);
    tile_key_bounds(s.kidx, s.bound + 2, kidx + (size_t)b * Tk, k0, Tk);
    for (int j = threadIdx.x; j < FA_TILE; j += blockDim.x) s.seen[j] = 0;
    float dk[FA_DPT], dv[FA_DPT]; /* [key lane][dim warp + FA_WARPS i] */
#pragma unroll
    for (int i = 0; i < FA_DPT; i++) dk[i] = dv[i] = 0.0f;
    int nqt = (Tq + FA_TILE - 1) / FA_TILE;
    for (int qi = 0; qi < rep * nqt; qi++) { /* (query head of the group, query tile) */
        int h = g * rep + qi / nqt, q0 = qi % nqt * FA_TILE;
        size_t bh = (size_t)b * NH + h;
        __syncthreads();
        tile_query_bounds(s.lo, s.hi, s.bound, qlo + (size_t)b * Tq, qidx + (size_t)b * Tq, q0, Tq);
        __syncthreads();
        if (tile_pair_unseen(s.bound)) continue;
        tiled_load_queries(s, qkv + (size_t)b * Tq * C3 + h * HS, dout + (size_t)b * Tq * C + h * HS, lse + bh * Tq,
                           delta + bh * Tq, q0, Tq, C, C3, HS);
        __syncthreads();
        tiled_p_ds(s, 1, HS, scale);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < FA_DPT; i++) {
            int d = warp + FA_WARPS * i;
            if (d >= HS) continue; /* constant indices: dk, dv stay in registers */
            float a = dv[i], c = dk[i];
            for (int r = 0; r < FA_TILE; r++) {
                a = fmaf(s.p[r * FA_PS + lane], s.dout[r * hp + d], a);
                c = fmaf(s.ds[r * FA_PS + lane], s.q[r * hp + d], c);
            }
            dv[i] = a;
            dk[i] = c;
        }
    }
    __syncthreads();
    int j = k0 + lane;
    if (j >= Tk || !s.seen[lane]) return; /* a key no row saw: untouched, bitwise */
    float *dr = dkv + ((size_t)b * Tk + j) * KV2 + g * HS;
#pragma unroll
    for (int i = 0; i < FA_DPT; i++) {
        int d = warp + FA_WARPS * i;
        if (d < HS) {
            dr[d] += scale * dk[i];
            dr[KV + d] += dv[i];
        }
    }
}

/* ---- host side ---- */

/* The tiled kernels take the head sizes the fused attention does. */
static int tiled_fits(int C, int NH) { return C / NH >= 1 && C / NH <= DT_ATTENTION_FUSED_MAX_HS; }

template <typename S>
static void tiled_forward(dt_device_t *dev, float *o, float *lse, const void *qkv, const void *kv, const int *qidx,
                          const int *qlo, const int *kidx, int first, int B, int Tq, int Tk, int C, int NH,
                          int NKV) {
    size_t smem = tiled_forward_smem(C / NH);
    if (!fa_smem_ok(dev, tiled_forward_kernel<S>, smem, "attention_block_forward")) return;
    dim3 grid(dt_blocks((size_t)Tq, FA_TILE), NH, B);
    DT_LAUNCH(tiled_forward_kernel<S>, grid, FA_THREADS, smem, dt_cuda_stream(dev))
    (o, lse, (const S *)qkv, (const S *)kv, qidx, qlo, kidx, first, Tq, Tk, C, NH, NKV,
     1.0f / sqrtf((float)(C / NH)));
    DT_CUDA_LAUNCHED(dev);
}

template <typename S>
static void tiled_backward(dt_device_t *dev, void *dqkv, float *dkv, const void *dout, const void *qkv,
                           const void *kv, const float *lse, const float *delta, const int *qidx, const int *qlo,
                           const int *kidx, int B, int Tq, int Tk, int C, int NH, int NKV) {
    float scale = 1.0f / sqrtf((float)(C / NH));
    size_t smem = tiled_backward_smem(C / NH);
    if (!fa_smem_ok(dev, tiled_dq_kernel<S>, smem, "attention_block_backward") ||
        !fa_smem_ok(dev, tiled_dkv_kernel<S>, smem, "attention_block_backward"))
        return;
    dim3 gq(dt_blocks((size_t)Tq, FA_TILE), NH, B), gk(dt_blocks((size_t)Tk, FA_TILE), NKV, B);
    DT_LAUNCH(tiled_dq_kernel<S>, gq, FA_THREADS, smem, dt_cuda_stream(dev))
    ((S *)dqkv, (const S *)dout, (const S *)qkv, (const S *)kv, lse, delta, qidx, qlo, kidx, Tq, Tk, C, NH, NKV,
     scale);
    DT_CUDA_LAUNCHED(dev);
    DT_LAUNCH(tiled_dkv_kernel<S>, gk, FA_THREADS, smem, dt_cuda_stream(dev))
    (dkv, (const S *)dout, (const S *)qkv, (const S *)kv, lse, delta, qidx, qlo, kidx, Tq, Tk, C, NH, NKV, scale);
    DT_CUDA_LAUNCHED(dev);
}

/* The ops: tiled where the head fits, else the simple kernels. */
template <typename S>
static void block_forward(dt_device_t *dev, float *o, float *lse, void *scratch, const void *qkv, const void *kv,
                          const int *qidx, const int *qlo, const int *kidx, int first, int B, int Tq, int Tk, int C,
                          int NH, int NKV) {
    if (B <= 0 || Tq <= 0) return;
    if (tiled_fits(C, NH))
        tiled_forward<S>(dev, o, lse, qkv, kv, qidx, qlo, kidx, first, B, Tq, Tk, C, NH, NKV);
    else
        simple_forward<S>(dev, o, lse, scratch, qkv, kv, qidx, qlo, kidx, first, B, Tq, Tk, C, NH, NKV);
}

template <typename S>
static void block_backward(dt_device_t *dev, void *dqkv, float *dkv, void *scratch, const void *dout,
                           const void *qkv, const void *kv, const float *lse, const float *delta, const int *qidx,
                           const int *qlo, const int *kidx, int B, int Tq, int Tk, int C, int NH, int NKV) {
    if (B <= 0 || Tq <= 0 || Tk <= 0) return;
    if (tiled_fits(C, NH))
        tiled_backward<S>(dev, dqkv, dkv, dout, qkv, kv, lse, delta, qidx, qlo, kidx, B, Tq, Tk, C, NH, NKV);
    else
        simple_backward<S>(dev, dqkv, dkv, scratch, dout, qkv, kv, lse, delta, qidx, qlo, kidx, B, Tq, Tk, C, NH,
                           NKV);
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

/* The simple kernels at every head size, in place of the tiled ones: the tests'
 * second reference (tests/gpu/test_cp_cuda.c holds both to the CPU and to each
 * other). */
extern "C" void dt_cuda_fill_attention_block_simple_ops(dt_ops_t *ops, dt_dtype_t dtype) {
    if (dtype == DT_DTYPE_BF16) {
        ops->attention_block_forward = simple_forward<dt_bf16>;
        ops->attention_block_backward = simple_backward<dt_bf16>;
    } else {
        ops->attention_block_forward = simple_forward<float>;
        ops->attention_block_backward = simple_backward<float>;
    }
}
