/*
 * cuda_attention_fused_bwd.cuh - the fused attention's backward kernels
 * (scalar fp32 and bf16 tensor-core builds: the row dot D, the key/value pass
 * and the query pass; see cuda_attention_fused.cu's purpose block for the
 * algorithm). Not a standalone header: cuda_attention_fused.cu includes it once,
 * after its tile constants and shared device helpers (fa_load, fa_dot, the
 * FA_WM fragment constants), so the kernels stay in that one translation unit
 * whose PTX the Makefile keeps (-keep) and test_fused_attention_ptx.sh reads.
 */

/* ---- backward ------------------------------------------------------------------ */

/* D[b][h][t] = sum_d dout[b][t][h HS + d] out[b][t][h HS + d]: one warp per row. */
template <typename S>
__global__ void fa_rowdot_kernel(float *D, const S *dout, const S *out, int B, int T, int C, int NH) {
    int lane = threadIdx.x % DT_WARP;
    long long row = (long long)blockIdx.x * (blockDim.x / DT_WARP) + threadIdx.x / DT_WARP;
    if (row >= (long long)B * NH * T) return;
    int HS = C / NH;
    int t = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / T / NH);
    size_t o = ((size_t)b * T + t) * C + h * HS;
    float s = 0.0f;
    for (int d = lane; d < HS; d += DT_WARP) s = fmaf(dt_ld(dout[o + d]), dt_ld(out[o + d]), s);
    s = dt_warp_sum(s);
    if (lane == 0) D[row] = s;
}

/* Shared memory of both backward kernels: Q, dO, K, V tiles (32, hp), the P and
 * dS tiles (32, 33), and lse, D and the first key (fa_key_lo) of the query rows. */
struct fa_bwd_smem {
    float *q, *dout, *k, *v, *p, *ds, *lse, *D;
    int *lo;
};

static size_t fa_backward_smem(int HS) {
    int hp = HS + 1;
    return sizeof(float) * (4 * (size_t)FA_TILE * hp + 2 * (size_t)FA_TILE * FA_PS + 2 * FA_TILE) +
           sizeof(int) * FA_TILE;
}

/* The dk/dv pass of key tile kt: the query tiles kt, kt + 1, ... that hold a row
 * attending to one of its keys, nqt - kt without pos; with pos up to the first
 * query tile whose first row's document starts after the key tile (every later
 * row's starts later still). At least 1: query k0 attends to key k0. */
static __device__ __forceinline__ int fa_query_tiles(const int *pb, int kt, int nqt) {
    if (!pb) return nqt - kt;
    int n = 1, klast = kt * FA_TILE + FA_TILE - 1;
    while (kt + n < nqt && fa_key_lo(pb, (kt + n) * FA_TILE) <= klast) n++;
    return n;
}

static __device__ __forceinline__ fa_bwd_smem fa_bwd_carve(float *sm, int hp) {
    fa_bwd_smem s;
    s.q = sm;
    s.dout = s.q + FA_TILE * hp;
    s.k = s.dout + FA_TILE * hp;
    s.v = s.k + FA_TILE * hp;
    s.p = s.v + FA_TILE * hp;
    s.ds = s.p + FA_TILE * FA_PS;
    s.lse = s.ds + FA_TILE * FA_PS;
    s.D = s.lse + FA_TILE;
    s.lo = (int *)(s.D + FA_TILE);
    return s;
}

/* Query rows q0.. of Q, dO, lse, D and lo into shared memory (rows past T: zeros). */
template <typename S>
static __device__ __forceinline__ void fa_load_queries(fa_bwd_smem s, const S *q, const S *dout,
                                                       const float *lse, const float *D, const int *pb, int q0,
                                                       int T, int C, int C3, int HS) {
    int hp = HS + 1;
    fa_load(s.q, q, C3, q0, T, HS, hp);
    fa_load(s.dout, dout, C, q0, T, HS, hp);
    for (int r = threadIdx.x; r < FA_TILE; r += blockDim.x) {
        s.lse[r] = q0 + r < T ? lse[q0 + r] : 0.0f;
        s.D[r] = q0 + r < T ? D[q0 + r] : 0.0f;
    }
    fa_load_lo(s.lo, pb, q0, FA_TILE, T);
}

/* P and dS of the (q0, k0) tile from the tiles in shared memory; 0 where masked
 * (key after the query or before its document) or past T. Caller syncs before and
 * after. */
static __device__ __forceinline__ void fa_tile_p_ds(fa_bwd_smem s, int q0, int k0, int T, int HS,
                                                    float scale) {
    int hp = HS + 1, lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
    for (int i = 0; i < FA_ROWS_PER_WARP; i++) {
        int r = warp + FA_WARPS * i, t = q0 + r, j = k0 + lane;
        float p = 0.0f, ds = 0.0f;
        if (j >= s.lo[r] && j <= t && t < T) {
            p = expf(scale * fa_dot(s.q + r * hp, s.k + lane * hp, HS) - s.lse[r]);
            ds = p * (fa_dot(s.dout + r * hp, s.v + lane * hp, HS) - s.D[r]);
        }
        s.p[r * FA_PS + lane] = p;
        s.ds[r * FA_PS + lane] = ds;
    }
}

/* Block (key tile, g, b): dk and dv of 32 keys of key/value head g over the query
 * tiles from the diagonal (fa_query_tiles of them), for each query head h of its
 * group in turn, summed in registers. */
template <typename S>
__global__ void __launch_bounds__(FA_THREADS)
    fa_dkdv_kernel(S *dqkv, const S *dout, const S *qkv, const float *lse, const float *D, const int *pos, int T,
                   int C, int NH, int NKV, float scale) {
    DT_DYN_SMEM(float, sm);
    int HS = C / NH, hp = HS + 1, C3 = C + 2 * NKV * HS, rep = NH / NKV;
    int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
    int lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
    fa_bwd_smem s = fa_bwd_carve(sm, hp);
    size_t kbase = (size_t)b * T * C3 + C + g * HS;
    const S *k = qkv + kbase, *v = k + NKV * HS;
    const int *pb = pos ? pos + (size_t)b * T : NULL;
    int k0 = kt * FA_TILE, nq = fa_query_tiles(pb, kt, (T + FA_TILE - 1) / FA_TILE);
    fa_load(s.k, k, C3, k0, T, HS, hp);
    fa_load(s.v, v, C3, k0, T, HS, hp);
    float dk[FA_DPT], dv[FA_DPT]; /* [key lane][dim warp + FA_WARPS i] */
    #pragma unroll
    for (int i = 0; i < FA_DPT; i++) dk[i] = dv[i] = 0.0f;
    for (int qi = 0; qi < rep * nq; qi++) { /* (query head of the group, query tile) */
        int h = g * rep + qi / nq, qt = kt + qi % nq, q0 = qt * FA_TILE;
        const S *q = qkv + (size_t)b * T * C3 + h * HS;
        const S *dO = dout + (size_t)b * T * C + h * HS;
        const float *lse_bh = lse + ((size_t)b * NH + h) * T, *D_bh = D + ((size_t)b * NH + h) * T;
        __syncthreads();
        fa_load_queries(s, q, dO, lse_bh, D_bh, pb, q0, T, C, C3, HS);
        __syncthreads();
        fa_tile_p_ds(s, q0, k0, T, HS, scale);
        __syncthreads();
        #pragma unroll
        for (int i = 0; i < FA_DPT; i++) {
            int d = warp + FA_WARPS * i;
            if (d >= HS) continue; /* constant indices: acc stays in registers */
            float a = dv[i], c = dk[i];
            for (int r = 0; r < FA_TILE; r++) {
                a = fmaf(s.p[r * FA_PS + lane], s.dout[r * hp + d], a);
                c = fmaf(s.ds[r * FA_PS + lane], s.q[r * hp + d], c);
            }
            dv[i] = a;
            dk[i] = c;
        }
    }
    int j = k0 + lane;
    if (j >= T) return;
    S *dkp = dqkv + kbase + (size_t)j * C3, *dvp = dkp + NKV * HS;
    #pragma unroll
    for (int i = 0; i < FA_DPT; i++) {
        int d = warp + FA_WARPS * i;
        if (d >= HS) continue; /* constant indices: acc stays in registers */
        dkp[d] = dt_st<S>(dt_ld(dkp[d]) + scale * dk[i]);
        dvp[d] = dt_st<S>(dt_ld(dvp[d]) + dv[i]);
    }
}

/* Block (query tile, h, b): dq of 32 query rows over the key tiles from its first
 * row's document's up to the diagonal. */
template <typename S>
__global__ void __launch_bounds__(FA_THREADS)
    fa_dq_kernel(S *dqkv, const S *dout, const S *qkv, const float *lse, const float *D, const int *pos, int T,
                 int C, int NH, int NKV, float scale) {
    DT_DYN_SMEM(float, sm);
    int HS = C / NH, hp = HS + 1, C3 = C + 2 * NKV * HS;
    int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
    fa_bwd_smem s = fa_bwd_carve(sm, hp);
    size_t base = (size_t)b * T * C3 + h * HS;
    const S *q = qkv + base, *k = qkv + (size_t)b * T * C3 + C + h / (NH / NKV) * HS, *v = k + NKV * HS;
    const S *dO = dout + (size_t)b * T * C + h * HS;
    const float *lse_bh = lse + ((size_t)b * NH + h) * T, *D_bh = D + ((size_t)b * NH + h) * T;
    const int *pb = pos ? pos + (size_t)b * T : NULL;
    int q0 = qt * FA_TILE;
    fa_load_queries(s, q, dO, lse_bh, D_bh, pb, q0, T, C, C3, HS);
    float dq[FA_DPT]; /* [query lane][dim warp + FA_WARPS i] */
    #pragma unroll
    for (int i = 0; i < FA_DPT; i++) dq[i] = 0.0f;
    for (int kt = fa_key_lo(pb, q0) / FA_TILE; kt <= qt; kt++) {
        int k0 = kt * FA_TILE;
        __syncthreads();
        fa_load(s.k, k, C3, k0, T, HS, hp);
        fa_load(s.v, v, C3, k0, T, HS, hp);
        __syncthreads();
        fa_tile_p_ds(s, q0, k0, T, HS, scale);
        __syncthreads();
        const float *dsr = s.ds + lane * FA_PS;
        #pragma unroll
        for (int i = 0; i < FA_DPT; i++) {
            int d = warp + FA_WARPS * i;
            if (d >= HS) continue; /* constant indices: acc stays in registers */
            float a = dq[i];
            for (int j = 0; j < FA_TILE; j++) a = fmaf(dsr[j], s.k[j * hp + d], a);
            dq[i] = a;
        }
    }
    int t = q0 + lane;
    if (t >= T) return;
    S *dqp = dqkv + base + (size_t)t * C3;
    #pragma unroll
    for (int i = 0; i < FA_DPT; i++) {
        int d = warp + FA_WARPS * i;
        if (d >= HS) continue; /* constant indices: acc stays in registers */
        dqp[d] = dt_st<S>(dt_ld(dqp[d]) + scale * dq[i]);
    }
}

/* ---- backward on tensor cores (bf16, HS a multiple of 16) ------------------------
 * The tiles of the scalar backward with every product on WMMA fragments: per
 * (query tile, key tile) S = Q K^T and dP = dO V^T (one 16x16 fragment of each per
 * warp), then P = exp(scale S - lse) and dS = P (dP - D) elementwise in fp32,
 * rounded to bf16 for the products that follow: dV += P^T dO and dK += dS^T Q
 * (key-tile kernel), dQ += dS K (query-tile kernel). Those accumulators never need
 * rescaling, so they stay in fragments for the whole loop (2 x HS/16 fragments
 * per matrix, NF = 1 to 4 per warp); at the end they go through shared memory (the
 * tile area, free by then) and are added to dqkv once, in a fixed order. */

/* Fragments per warp of a (32, HS) accumulator, 1 to 4 (HS <= DT_ATTENTION_FUSED_MAX_HS):
 * the kernels are built for each count (NF template parameter) so that a head size
 * of 64 holds 2 per matrix in registers, not the 4 that HS 128 needs; with at most
 * 128 registers a thread, 4 blocks (16 warps) fit on an SM where 232 registers
 * allowed 2. */
#define FA_NF(HS) ((2 * ((HS) / FA_WM) + FA_WARPS - 1) / FA_WARPS)
#define FA_WMMA_MIN_BLOCKS 4

struct fa_wbwd_smem {
    dt_bf16 *q, *dout, *k, *v; /* (32, HS + 8) */
    float *s, *dp;             /* (32, FA_S_LD) */
    dt_bf16 *p, *ds;           /* (32, FA_P_LD) */
    float *lse, *D;            /* (32) */
    int *lo;                   /* (32) */
};

static size_t fa_backward_wmma_smem(int HS) {
    size_t hsp = HS + 8;
    return 4 * FA_TILE * hsp * sizeof(dt_bf16) + 2 * FA_TILE * FA_S_LD * sizeof(float) +
           2 * FA_TILE * FA_P_LD * sizeof(dt_bf16) + 2 * FA_TILE * sizeof(float) + FA_TILE * sizeof(int);
}

static __device__ __forceinline__ fa_wbwd_smem fa_wbwd_carve(unsigned char *smb, int hsp) {
    fa_wbwd_smem s;
    s.q = (dt_bf16 *)smb;
    s.dout = s.q + FA_TILE * hsp;
    s.k = s.dout + FA_TILE * hsp;
    s.v = s.k + FA_TILE * hsp;
    s.s = (float *)(s.v + FA_TILE * hsp);
    s.dp = s.s + FA_TILE * FA_S_LD;
    s.p = (dt_bf16 *)(s.dp + FA_TILE * FA_S_LD);
    s.ds = s.p + FA_TILE * FA_P_LD;
    s.lse = (float *)(s.ds + FA_TILE * FA_P_LD);
    s.D = s.lse + FA_TILE;
    s.lo = (int *)(s.D + FA_TILE);
    return s;
}

static __device__ __forceinline__ void fa_wload_queries(fa_wbwd_smem s, const dt_bf16 *q, const dt_bf16 *dout,
                                                        const float *lse, const float *D, const int *pb, int q0,
                                                        int T, int C, int C3, int HS, int vec) {
    int hsp = HS + 8;
    fa_load_bf16(s.q, q, C3, q0, T, HS, hsp, vec);
    fa_load_bf16(s.dout, dout, C, q0, T, HS, hsp, vec);
    for (int r = threadIdx.x; r < FA_TILE; r += blockDim.x) {
        s.lse[r] = q0 + r < T ? lse[q0 + r] : 0.0f;
        s.D[r] = q0 + r < T ? D[q0 + r] : 0.0f;
    }
    fa_load_lo(s.lo, pb, q0, FA_TILE, T);
}

/* S and dP of the (q0, k0) tile on WMMA, then P and dS (bf16) elementwise. Caller
 * syncs before (tiles loaded); this syncs between its two steps and after. */
static __device__ __forceinline__ void fa_wtile_p_ds(fa_wbwd_smem s, int q0, int k0, int T, int HS, float scale) {
    using namespace nvcuda;
    int hsp = HS + 8, lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
    int sr = FA_WM * (warp >> 1), sc = FA_WM * (warp & 1);
    dt_wfrag_acc fs, fdp;
    wmma::fill_fragment(fs, 0.0f);
    wmma::fill_fragment(fdp, 0.0f);
    for (int d = 0; d < HS; d += FA_WM) {
        dt_wfrag_a_row fa;
        dt_wfrag_b_col fb;
        dt_wmma_lds(fa, s.q + sr * hsp + d, hsp);
        dt_wmma_lds(fb, s.k + sc * hsp + d, hsp);
        wmma::mma_sync(fs, fa, fb, fs);
        dt_wmma_lds(fa, s.dout + sr * hsp + d, hsp);
        dt_wmma_lds(fb, s.v + sc * hsp + d, hsp);
        wmma::mma_sync(fdp, fa, fb, fdp);
    }
    dt_wmma_sts_acc(s.s + sr * FA_S_LD + sc, fs, FA_S_LD);
    dt_wmma_sts_acc(s.dp + sr * FA_S_LD + sc, fdp, FA_S_LD);
    __syncthreads();
    for (int i = 0; i < FA_ROWS_PER_WARP; i++) {
        int r = warp + FA_WARPS * i, t = q0 + r, j = k0 + lane;
        float p = 0.0f, ds = 0.0f;
        if (j >= s.lo[r] && j <= t && t < T) {
            p = expf(scale * s.s[r * FA_S_LD + lane] - s.lse[r]);
            ds = p * (s.dp[r * FA_S_LD + lane] - s.D[r]);
        }
        s.p[r * FA_P_LD + lane] = __float2bfloat16(p);
        s.ds[r * FA_P_LD + lane] = __float2bfloat16(ds);
    }
    __syncthreads();
}

/* Adds scale * acc (32, HS) from shared memory (ld) into rows r0.. of a (T, HS)
 * bf16 matrix with row stride rs. */
static __device__ __forceinline__ void fa_add_rows(dt_bf16 *dst, const float *acc, int ld, int rs, int r0, int T,
                                                   int HS, float scale) {
    for (int i = threadIdx.x; i < FA_TILE * HS; i += blockDim.x) {
        int r = i / HS, d = i % HS;
        if (r0 + r >= T) continue;
        dt_bf16 *p = dst + (size_t)(r0 + r) * rs + d;
        *p = __float2bfloat16(__bfloat162float(*p) + scale * acc[r * ld + d]);
    }
}

template <int NF>
__global__ void __launch_bounds__(FA_THREADS, FA_WMMA_MIN_BLOCKS)
    fa_dkdv_wmma_kernel(dt_bf16 *dqkv, const dt_bf16 *dout, const dt_bf16 *qkv, const float *lse, const float *D,
                        const int *pos, int T, int C, int NH, int NKV, float scale, int vec) {
    using namespace nvcuda;
    DT_DYN_SMEM(unsigned char, smb);
    int HS = C / NH, hsp = HS + 8, hso = HS + 4, C3 = C + 2 * NKV * HS, rep = NH / NKV;
    int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z, warp = threadIdx.x / DT_WARP;
    fa_wbwd_smem s = fa_wbwd_carve(smb, hsp);
    size_t kbase = (size_t)b * T * C3 + C + g * HS;
    const dt_bf16 *k = qkv + kbase, *v = k + NKV * HS;
    const int *pb = pos ? pos + (size_t)b * T : NULL;
    int k0 = kt * FA_TILE, nq = fa_query_tiles(pb, kt, (T + FA_TILE - 1) / FA_TILE), n_o = 2 * (HS / FA_WM);
    fa_load_bf16(s.k, k, C3, k0, T, HS, hsp, vec);
    fa_load_bf16(s.v, v, C3, k0, T, HS, hsp, vec);
    dt_wfrag_acc fdk[NF], fdv[NF];
#pragma unroll
    for (int u = 0; u < NF; u++) {
        wmma::fill_fragment(fdk[u], 0.0f);
        wmma::fill_fragment(fdv[u], 0.0f);
    }
    for (int qi = 0; qi < rep * nq; qi++) { /* (query head of the group, query tile) */
        int h = g * rep + qi / nq, qt = kt + qi % nq;
        const dt_bf16 *q = qkv + (size_t)b * T * C3 + h * HS;
        const dt_bf16 *dO = dout + (size_t)b * T * C + h * HS;
        const float *lse_bh = lse + ((size_t)b * NH + h) * T, *D_bh = D + ((size_t)b * NH + h) * T;
        int q0 = qt * FA_TILE;
        __syncthreads();
        fa_wload_queries(s, q, dO, lse_bh, D_bh, pb, q0, T, C, C3, HS, vec);
        __syncthreads();
        fa_wtile_p_ds(s, q0, k0, T, HS, scale);
#pragma unroll
        for (int u = 0; u < NF; u++) {
            int f = warp + FA_WARPS * u;
            if (f >= n_o) continue;
            int kr = FA_WM * (f & 1), dc = FA_WM * (f >> 1); /* rows: keys; columns: head dims */
            for (int j = 0; j < FA_TILE; j += FA_WM) {       /* j: queries */
                dt_wfrag_a_col fa; /* P^T, dS^T */
                dt_wfrag_b_row fb; /* dO, Q */
                dt_wmma_lds(fa, s.p + j * FA_P_LD + kr, FA_P_LD);
                dt_wmma_lds(fb, s.dout + j * hsp + dc, hsp);
                wmma::mma_sync(fdv[u], fa, fb, fdv[u]);
                dt_wmma_lds(fa, s.ds + j * FA_P_LD + kr, FA_P_LD);
                dt_wmma_lds(fb, s.q + j * hsp + dc, hsp);
                wmma::mma_sync(fdk[u], fa, fb, fdk[u]);
            }
        }
    }
    __syncthreads(); /* the tile area becomes the two (32, HS + 4) fp32 results */
    float *rk = (float *)smb, *rv = rk + FA_TILE * hso;
#pragma unroll
    for (int u = 0; u < NF; u++) {
        int f = warp + FA_WARPS * u;
        if (f >= n_o) continue;
        int kr = FA_WM * (f & 1), dc = FA_WM * (f >> 1);
        dt_wmma_sts_acc(rk + kr * hso + dc, fdk[u], hso);
        dt_wmma_sts_acc(rv + kr * hso + dc, fdv[u], hso);
    }
    __syncthreads();
    fa_add_rows(dqkv + kbase, rk, hso, C3, k0, T, HS, scale);
    fa_add_rows(dqkv + kbase + NKV * HS, rv, hso, C3, k0, T, HS, 1.0f);
}

template <int NF>
__global__ void __launch_bounds__(FA_THREADS, FA_WMMA_MIN_BLOCKS)
    fa_dq_wmma_kernel(dt_bf16 *dqkv, const dt_bf16 *dout, const dt_bf16 *qkv, const float *lse, const float *D,
                      const int *pos, int T, int C, int NH, int NKV, float scale, int vec) {
    using namespace nvcuda;
    DT_DYN_SMEM(unsigned char, smb);
    int HS = C / NH, hsp = HS + 8, hso = HS + 4, C3 = C + 2 * NKV * HS;
    int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, warp = threadIdx.x / DT_WARP;
    fa_wbwd_smem s = fa_wbwd_carve(smb, hsp);
    size_t base = (size_t)b * T * C3 + h * HS;
    const dt_bf16 *q = qkv + base;
    const dt_bf16 *k = qkv + (size_t)b * T * C3 + C + h / (NH / NKV) * HS, *v = k + NKV * HS;
    const dt_bf16 *dO = dout + (size_t)b * T * C + h * HS;
    const float *lse_bh = lse + ((size_t)b * NH + h) * T, *D_bh = D + ((size_t)b * NH + h) * T;
    const int *pb = pos ? pos + (size_t)b * T : NULL;
    int q0 = qt * FA_TILE, n_o = 2 * (HS / FA_WM);
    fa_wload_queries(s, q, dO, lse_bh, D_bh, pb, q0, T, C, C3, HS, vec);
    dt_wfrag_acc fdq[NF];
#pragma unroll
    for (int u = 0; u < NF; u++) wmma::fill_fragment(fdq[u], 0.0f);
    for (int kt = fa_key_lo(pb, q0) / FA_TILE; kt <= qt; kt++) {
        int k0 = kt * FA_TILE;
        __syncthreads();
        fa_load_bf16(s.k, k, C3, k0, T, HS, hsp, vec);
        fa_load_bf16(s.v, v, C3, k0, T, HS, hsp, vec);
        __syncthreads();
        fa_wtile_p_ds(s, q0, k0, T, HS, scale);
#pragma unroll
        for (int u = 0; u < NF; u++) {
            int f = warp + FA_WARPS * u;
            if (f >= n_o) continue;
            int qr = FA_WM * (f & 1), dc = FA_WM * (f >> 1);
            for (int j = 0; j < FA_TILE; j += FA_WM) { /* j: keys */
                dt_wfrag_a_row fa; /* dS */
                dt_wfrag_b_row fb; /* K */
                dt_wmma_lds(fa, s.ds + qr * FA_P_LD + j, FA_P_LD);
                dt_wmma_lds(fb, s.k + j * hsp + dc, hsp);
                wmma::mma_sync(fdq[u], fa, fb, fdq[u]);
            }
        }
    }
    __syncthreads();
    float *rq = (float *)smb;
#pragma unroll
    for (int u = 0; u < NF; u++) {
        int f = warp + FA_WARPS * u;
        if (f >= n_o) continue;
        dt_wmma_sts_acc(rq + FA_WM * (f & 1) * hso + FA_WM * (f >> 1), fdq[u], hso);
    }
    __syncthreads();
    fa_add_rows(dqkv + base, rq, hso, C3, q0, T, HS, scale);
}
