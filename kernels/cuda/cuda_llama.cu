/*
 * cuda_llama.cu - the ops Llama-family models add, on the GPU: RMSNorm, rotary
 * position embedding (RoPE), SwiGLU and the KV-cache decode attention (kernels.h),
 * for float and bf16 storage with fp32 arithmetic (the formulas of
 * kernels/cpu/cpu_llama.c and cpu_attention.c).
 *
 *  - RMSNorm as cuda_layernorm.cu: one warp per row in 16-byte packs for the
 *    forward and the input gradient; the weight gradient in two stages (G blocks of
 *    row chunks write fp32 partials to the device scratch, then one thread per
 *    channel adds them in order), no atomics.
 *  - RoPE: one thread per rotated pair (x[i], x[i + HS/2]); inv_freq comes from
 *    dt_rope_inv_freq on the host, passed by value; cos and sin of the fp32 angle
 *    are taken in double and rounded, as on the CPU. A row's position is pos0 + t,
 *    or pos[b, t] for packed sequences.
 *  - SwiGLU: elementwise, a grid-stride loop over 16-byte packs of the gate and up
 *    halves when IC and the pointers allow, else one element at a time.
 *  - decode: one block of 4 warps per (sequence, head); the warps take positions
 *    0..pos in turn (warp w: w, w + 4, ...), each keeping an online softmax and its
 *    share of the output (lane l holds dims l, l + 32, ...: HS <= 256), then the
 *    four are merged in warp order. Fixed order everywhere: bitwise reproducible.
 */
#include "kernels/cuda/cuda_layers.cuh"

#define ROWS_PER_BLOCK 4 /* warps per block in the RMSNorm row kernels */
#define CHUNK_ROWS 32
#define MAX_CHUNKS 1024
#define EW_BLOCK 256
#define DEC_WARPS 4
#define DEC_DPL (DT_ROPE_MAX_HS / DT_WARP) /* head dims per lane in decode: 8 */

/* ---- RMSNorm ----------------------------------------------------------------- */

template <typename S, int N>
__global__ void rmsnorm_forward_kernel(S *out, float *rstd, const S *inp, const S *weight, int N_rows, int C,
                                       float eps) {
    int lane = threadIdx.x % DT_WARP;
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / DT_WARP;
    if (row >= N_rows) return; /* a whole warp leaves together */
    const S *x = inp + (size_t)row * C;
    S *o = out + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane * N; c < C; c += DT_WARP * N) {
        dt_vec<S, N> v = dt_vec_ld<S, N>(x + c);
        for (int k = 0; k < N; k++) ss += dt_ld(v.v[k]) * dt_ld(v.v[k]);
    }
    float s = 1.0f / sqrtf(dt_warp_sum(ss) / (float)C + eps);
    for (int c = lane * N; c < C; c += DT_WARP * N) {
        dt_vec<S, N> v = dt_vec_ld<S, N>(x + c), w = dt_vec_ld<S, N>(weight + c), r;
        for (int k = 0; k < N; k++) r.v[k] = dt_st<S>(dt_ld(v.v[k]) * s * dt_ld(w.v[k]));
        dt_vec_st<S, N>(o + c, r);
    }
    if (lane == 0) rstd[row] = s;
}

/* 16-byte packs when C is a whole number of them and every row pointer is aligned. */
template <typename S> static int rms_vec(int C, const void *a, const void *b, const void *c, const void *d) {
    return C % dt_vec_width<S>() == 0 && dt_cuda_aligned16(a) && dt_cuda_aligned16(b) && dt_cuda_aligned16(c) &&
           dt_cuda_aligned16(d);
}

template <typename S>
static void rmsnorm_forward(dt_device_t *dev, void *out, float *rstd, const void *inp, const void *weight, int N,
                            int C, float eps) {
    constexpr int W = dt_vec_width<S>();
    if (N <= 0) return;
    void (*kernel)(S *, float *, const S *, const S *, int, int, float) =
        rms_vec<S>(C, out, inp, weight, NULL) ? rmsnorm_forward_kernel<S, W> : rmsnorm_forward_kernel<S, 1>;
    DT_LAUNCH(kernel, dt_blocks(N, ROWS_PER_BLOCK), ROWS_PER_BLOCK * DT_WARP, 0, dt_cuda_stream(dev))
    ((S *)out, rstd, (const S *)inp, (const S *)weight, N, C, eps);
    DT_CUDA_LAUNCHED(dev);
}

/* dinp += s (w dout - x s^2 mean(w dout x)), a warp per row. */
template <typename S, int N>
__global__ void rmsnorm_dinp_kernel(S *dinp, const S *dout, const S *inp, const S *weight, const float *rstd,
                                    int N_rows, int C) {
    int lane = threadIdx.x % DT_WARP;
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / DT_WARP;
    if (row >= N_rows) return;
    const S *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    S *dx = dinp + (size_t)row * C;
    float s = rstd[row], dot = 0.0f;
    for (int c = lane * N; c < C; c += DT_WARP * N) {
        dt_vec<S, N> xv = dt_vec_ld<S, N>(x + c), dv = dt_vec_ld<S, N>(d + c), wv = dt_vec_ld<S, N>(weight + c);
        for (int k = 0; k < N; k++) dot += dt_ld(wv.v[k]) * dt_ld(dv.v[k]) * dt_ld(xv.v[k]);
    }
    float cf = dt_warp_sum(dot) / (float)C * s * s;
    for (int c = lane * N; c < C; c += DT_WARP * N) {
        dt_vec<S, N> xv = dt_vec_ld<S, N>(x + c), dv = dt_vec_ld<S, N>(d + c);
        dt_vec<S, N> wv = dt_vec_ld<S, N>(weight + c), gv = dt_vec_ld<S, N>(dx + c);
        for (int k = 0; k < N; k++) {
            float g = s * (dt_ld(wv.v[k]) * dt_ld(dv.v[k]) - dt_ld(xv.v[k]) * cf);
            gv.v[k] = dt_st<S>(dt_ld(gv.v[k]) + g);
        }
        dt_vec_st<S, N>(dx + c, gv);
    }
}

/* Stage 1: partial[g, c] = sum over the chunk's rows of dout * x * rstd. */
template <typename S>
__global__ void rmsnorm_dweight_partial_kernel(float *partial, const S *dout, const S *inp, const float *rstd,
                                               int N, int C, int chunk) {
    int g = blockIdx.x;
    int r0 = g * chunk, r1 = r0 + chunk < N ? r0 + chunk : N;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float dw = 0.0f;
        for (int r = r0; r < r1; r++)
            dw += dt_ld(dout[(size_t)r * C + c]) * (dt_ld(inp[(size_t)r * C + c]) * rstd[r]);
        partial[(size_t)g * C + c] = dw;
    }
}

/* Stage 2: dweight[c] += sum over g of partial[g, c], in order. */
template <typename S> __global__ void rmsnorm_dweight_final_kernel(S *dweight, const float *partial, int G, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float dw = 0.0f;
    for (int g = 0; g < G; g++) dw += partial[(size_t)g * C + c];
    dweight[c] = dt_st<S>(dt_ld(dweight[c]) + dw);
}

template <typename S>
static void rmsnorm_backward(dt_device_t *dev, void *dinp, void *dweight, const void *dout, const void *inp,
                             const void *weight, const float *rstd, int N, int C) {
    cudaStream_t st = dt_cuda_stream(dev);
    if (N <= 0) return;
    if (dinp) {
        constexpr int W = dt_vec_width<S>();
        void (*kernel)(S *, const S *, const S *, const S *, const float *, int, int) =
            rms_vec<S>(C, dinp, dout, inp, weight) ? rmsnorm_dinp_kernel<S, W> : rmsnorm_dinp_kernel<S, 1>;
        DT_LAUNCH(kernel, dt_blocks(N, ROWS_PER_BLOCK), ROWS_PER_BLOCK * DT_WARP, 0, st)
        ((S *)dinp, (const S *)dout, (const S *)inp, (const S *)weight, rstd, N, C);
        DT_CUDA_LAUNCHED(dev);
    }
    if (!dweight) return;
    int chunk = CHUNK_ROWS;
    if (dt_blocks(N, chunk) > MAX_CHUNKS) chunk = (int)dt_blocks(N, MAX_CHUNKS);
    int G = (int)dt_blocks(N, chunk);
    float *partial = (float *)dt_cuda_layer_scratch(dev, sizeof(float) * (size_t)G * C, __func__);
    if (!partial) return;
    DT_LAUNCH(rmsnorm_dweight_partial_kernel<S>, G, 256, 0, st)
    (partial, (const S *)dout, (const S *)inp, rstd, N, C, chunk);
    DT_CUDA_LAUNCHED(dev);
    DT_LAUNCH(rmsnorm_dweight_final_kernel<S>, dt_blocks(C, 256), 256, 0, st)((S *)dweight, partial, G, C);
    DT_CUDA_LAUNCHED(dev);
}

/* ---- RoPE -------------------------------------------------------------------- */

struct rope_freqs {
    float f[DT_ROPE_MAX_HS / 2];
};

/* One thread per pair (row bt, head h, i < HS/2); dir = 1 rotates by +angle (forward),
 * -1 by -angle (the transpose, for the backward). */
template <typename S>
__global__ void rope_kernel(S *x, int B, int T, int row_stride, int n_heads, int HS, int pos0, const int *pos,
                            rope_freqs fr, float dir) {
    int half = HS / 2;
    size_t n = (size_t)B * T * n_heads * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        size_t rest = idx / half;
        int h = (int)(rest % n_heads);
        size_t bt = rest / n_heads;
        float angle = (float)(pos ? pos[bt] : pos0 + (int)(bt % T)) * fr.f[i];
        float c = (float)cos((double)angle), s = dir * (float)sin((double)angle);
        S *p = x + bt * row_stride + (size_t)h * HS + i;
        float a = dt_ld(p[0]), b = dt_ld(p[half]);
        p[0] = dt_st<S>(a * c - b * s);
        p[half] = dt_st<S>(b * c + a * s);
    }
}

template <typename S>
static void rope_launch(dt_device_t *dev, void *x, int B, int T, int row_stride, int n_heads, int HS, int pos0,
                        const int *pos, const dt_rope_args_t *rope, float dir) {
    size_t n = (size_t)B * T * n_heads * (HS / 2);
    if (!n) return;
    rope_freqs fr;
    dt_rope_inv_freq(rope, HS, fr.f);
    DT_LAUNCH(rope_kernel<S>, dt_cuda_grid(dev, n, EW_BLOCK), EW_BLOCK, 0, dt_cuda_stream(dev))
    ((S *)x, B, T, row_stride, n_heads, HS, pos0, pos, fr, dir);
    dt_cuda_note_launch(dev, dir > 0 ? "rope_forward" : "rope_backward");
}

template <typename S>
static void rope_forward(dt_device_t *dev, void *x, int B, int T, int row_stride, int n_heads, int HS, int pos0,
                         const int *pos, const dt_rope_args_t *rope) {
    rope_launch<S>(dev, x, B, T, row_stride, n_heads, HS, pos0, pos, rope, 1.0f);
}

template <typename S>
static void rope_backward(dt_device_t *dev, void *dx, int B, int T, int row_stride, int n_heads, int HS, int pos0,
                          const int *pos, const dt_rope_args_t *rope) {
    rope_launch<S>(dev, dx, B, T, row_stride, n_heads, HS, pos0, pos, rope, -1.0f);
}

/* ---- SwiGLU ------------------------------------------------------------------ */

/* Packs of V elements of a row's gate half (V = 1: elements); BWD: accumulate the
 * gradients of gate and up into dinp, else write silu(gate) * up into out. */
template <typename S, int V, bool BWD>
__global__ void swiglu_kernel(S *out, S *dinp, const S *inp, const S *dout, int N, int IC) {
    size_t npack = (size_t)N * (IC / V);
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < npack; p += (size_t)gridDim.x * blockDim.x) {
        size_t n = p / (IC / V);
        int i = (int)(p % (IC / V)) * V;
        const S *g = inp + n * 2 * IC + i, *u = g + IC;
        dt_vec<S, V> gv = dt_vec_ld<S, V>(g), uv = dt_vec_ld<S, V>(u);
        if (!BWD) {
            dt_vec<S, V> o;
            for (int k = 0; k < V; k++) {
                float x = dt_ld(gv.v[k]);
                o.v[k] = dt_st<S>(x / (1.0f + expf(-x)) * dt_ld(uv.v[k]));
            }
            dt_vec_st<S, V>(out + n * IC + i, o);
        } else {
            dt_vec<S, V> dv = dt_vec_ld<S, V>(dout + n * IC + i);
            S *dg = dinp + n * 2 * IC + i, *du = dg + IC;
            dt_vec<S, V> dgv = dt_vec_ld<S, V>(dg), duv = dt_vec_ld<S, V>(du);
            for (int k = 0; k < V; k++) {
                float x = dt_ld(gv.v[k]), up = dt_ld(uv.v[k]), d = dt_ld(dv.v[k]);
                float sig = 1.0f / (1.0f + expf(-x));
                dgv.v[k] = dt_st<S>(dt_ld(dgv.v[k]) + d * up * sig * (1.0f + x * (1.0f - sig)));
                duv.v[k] = dt_st<S>(dt_ld(duv.v[k]) + d * x * sig);
            }
            dt_vec_st<S, V>(dg, dgv);
            dt_vec_st<S, V>(du, duv);
        }
    }
}

template <typename S, bool BWD>
static void swiglu_launch(dt_device_t *dev, void *out, void *dinp, const void *inp, const void *dout, int N, int IC,
                          const char *op) {
    constexpr int W = dt_vec_width<S>();
    if (N <= 0 || IC <= 0) return;
    int vec = IC % W == 0 && dt_cuda_aligned16(out) && dt_cuda_aligned16(dinp) && dt_cuda_aligned16(inp) &&
              dt_cuda_aligned16(dout);
    size_t work = (size_t)N * (vec ? IC / W : IC);
    void (*kernel)(S *, S *, const S *, const S *, int, int) =
        vec ? swiglu_kernel<S, W, BWD> : swiglu_kernel<S, 1, BWD>;
    DT_LAUNCH(kernel, dt_cuda_grid(dev, work, EW_BLOCK), EW_BLOCK, 0, dt_cuda_stream(dev))
    ((S *)out, (S *)dinp, (const S *)inp, (const S *)dout, N, IC);
    dt_cuda_note_launch(dev, op);
}

template <typename S> static void swiglu_forward(dt_device_t *dev, void *out, const void *inp, int N, int IC) {
    swiglu_launch<S, false>(dev, out, NULL, inp, NULL, N, IC, "swiglu_forward");
}

template <typename S>
static void swiglu_backward(dt_device_t *dev, void *dinp, const void *inp, const void *dout, int N, int IC) {
    swiglu_launch<S, true>(dev, NULL, dinp, inp, dout, N, IC, "swiglu_backward");
}

/* ---- KV-cache decode attention ------------------------------------------------- */

template <typename S>
__global__ void __launch_bounds__(DEC_WARPS * DT_WARP)
    decode_kernel(S *out, const S *qs, int q_stride, const S *kv, int max_T, int pos, int C, int NH, int NKV,
                  float scale) {
    __shared__ float sm[DEC_WARPS * (DT_ROPE_MAX_HS + 2)];
    int HS = C / NH, KV = NKV * HS;
    int h = blockIdx.x, b = blockIdx.y;
    int lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
    const S *q = qs + (size_t)b * q_stride + h * HS;
    const S *k0 = kv + (size_t)b * max_T * 2 * KV + h / (NH / NKV) * HS;
    float qv[DEC_DPL], acc[DEC_DPL];
#pragma unroll
    for (int i = 0; i < DEC_DPL; i++) {
        int d = lane + DT_WARP * i;
        qv[i] = d < HS ? dt_ld(q[d]) : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int t = warp; t <= pos; t += DEC_WARPS) {
        const S *k = k0 + (size_t)t * 2 * KV, *v = k + KV;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < DEC_DPL; i++) {
            int d = lane + DT_WARP * i;
            if (d < HS) s = fmaf(qv[i], dt_ld(k[d]), s);
        }
        s = dt_warp_sum(s) * scale;
        float mn = fmaxf(m, s), a = expf(m - mn), p = expf(s - mn);
        l = l * a + p;
        m = mn;
#pragma unroll
        for (int i = 0; i < DEC_DPL; i++) {
            int d = lane + DT_WARP * i;
            if (d < HS) acc[i] = acc[i] * a + p * dt_ld(v[d]);
        }
    }
    /* Each warp's (m, l, acc) into shared memory, merged by warp 0 in warp order. */
    float *mine = sm + warp * (DT_ROPE_MAX_HS + 2);
#pragma unroll
    for (int i = 0; i < DEC_DPL; i++) {
        int d = lane + DT_WARP * i;
        if (d < HS) mine[2 + d] = acc[i];
    }
    if (lane == 0) {
        mine[0] = m;
        mine[1] = l;
    }
    __syncthreads();
    if (warp != 0) return;
    float M = -INFINITY;
    for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, sm[w * (DT_ROPE_MAX_HS + 2)]);
    float L = 0.0f, f[DEC_WARPS];
    for (int w = 0; w < DEC_WARPS; w++) {
        float mw = sm[w * (DT_ROPE_MAX_HS + 2)];
        f[w] = mw == -INFINITY ? 0.0f : expf(mw - M); /* a warp with no position */
        L += sm[w * (DT_ROPE_MAX_HS + 2) + 1] * f[w];
    }
    S *o = out + (size_t)b * C + h * HS;
    for (int d = lane; d < HS; d += DT_WARP) {
        float x = 0.0f;
        for (int w = 0; w < DEC_WARPS; w++) x += sm[w * (DT_ROPE_MAX_HS + 2) + 2 + d] * f[w];
        o[d] = dt_st<S>(x / L);
    }
}

/* HS <= DT_ROPE_MAX_HS (the lanes' registers hold a head; Llama models satisfy it
 * through RoPE's own limit); a larger head is an error at synchronize. */
template <typename S>
static void attention_decode(dt_device_t *dev, void *out, const void *q, int q_stride, const void *kv, int max_T,
                             int pos, int B, int C, int NH, int NKV) {
    if (B <= 0) return;
    if (C / NH > DT_ROPE_MAX_HS) { /* reported at synchronize, under this op's name */
        dt_cuda_note_error(dev, "attention_decode (head size over DT_ROPE_MAX_HS)", cudaErrorInvalidValue);
        return;
    }
    dim3 grid(NH, B);
    DT_LAUNCH(decode_kernel<S>, grid, DEC_WARPS * DT_WARP, 0, dt_cuda_stream(dev))
    ((S *)out, (const S *)q, q_stride, (const S *)kv, max_T, pos, C, NH, NKV, 1.0f / sqrtf((float)(C / NH)));
    DT_CUDA_LAUNCHED(dev);
}

template <typename S> static void fill(dt_ops_t *o) {
    o->rmsnorm_forward = rmsnorm_forward<S>;
    o->rmsnorm_backward = rmsnorm_backward<S>;
    o->rope_forward = rope_forward<S>;
    o->rope_backward = rope_backward<S>;
    o->swiglu_forward = swiglu_forward<S>;
    o->swiglu_backward = swiglu_backward<S>;
    o->attention_decode = attention_decode<S>;
}

void dt_cuda_fill_llama_ops(dt_ops_t *ops, dt_dtype_t dtype) {
    if (dtype == DT_DTYPE_BF16)
        fill<dt_bf16>(ops);
    else
        fill<float>(ops);
}
