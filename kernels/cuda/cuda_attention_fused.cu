/*
 * cuda_attention_fused.cu - causal multi-head self-attention as one fused,
 * memory-efficient kernel per pass (FlashAttention-2 style): the (T, T) scores
 * and probabilities are never written to memory. Chosen over the cuBLAS path of
 * cuda_attention.cu with DTRUN_CUDA_ATTENTION=fused (read at device open) for
 * head sizes up to DT_ATTENTION_FUSED_MAX_HS; cuda_attention.cu dispatches here.
 *
 * Layout as the op table says: qkv (B, T, C + 2*NKV*HS) with q (NH heads), k and v
 * (NKV heads each) side by side; out (B, T, C). Query head h reads key/value head
 * h / (NH/NKV) (grouped-query attention; NKV == NH is multi-head). Tiles of 32
 * query rows by 32 keys (64 query rows in the bf16 tensor-core forward for HS <= 64),
 * 128 threads (4 warps) per block (cuda_attention_tiles.cuh, which context
 * parallelism's tiled block kernels in cuda_attention_block.cu share), fp32 math on float or bf16 storage, scale
 * 1/sqrt(HS):
 *
 *   forward, block (query tile, h, b): Q tile in shared memory; for each key tile
 *     up to the diagonal: S = scale Q K^T (32 x 32, one warp per row, one lane per
 *     key, -inf right of the diagonal), running max m and sum l per row (online
 *     softmax), P = exp(S - m), O = O exp(m_old - m) + P V. At the end out = O / l,
 *     and lse = m + log l per row is saved.
 *   backward: D = rowsum(dout * out) per (b, h, t) (kernel 1, into the scratch);
 *     kernel 2, block (key tile, key/value head g, b): for each query head h of
 *     g's group and each query tile from the diagonal on, recompute
 *     P = exp(scale Q K^T - lse) and dS = P (dout V^T - D), then dv += P^T dout,
 *     dk += scale dS^T Q, accumulated in registers over the whole group (no two
 *     blocks write one key's gradient), added to dqkv once; kernel 3, block
 *     (query tile, h, b): the same tiles over the key tiles up to the diagonal,
 *     dq += scale dS K. Every sum has a fixed order (no atomics),
 *     so results are bitwise identical run to run.
 *
 * Packed sequences (kernels.h: pos): query t attends to keys lo(t) = t - pos[b,t]
 * .. t. lo never decreases with t, so a query tile's smallest bound is its first
 * row's: the forward and the dq pass start at the key tile holding it (the key
 * tiles of earlier documents are skipped), the dk/dv pass stops at the first query
 * tile whose first row starts after the key tile, and every score with j < lo(t)
 * is masked like those right of the diagonal. A row may then meet a tile with no
 * key of its own (m still -inf): the online softmax subtracts 0 there instead of m,
 * so its weights stay 0 (without pos, key 0 comes first and m is always finite).
 *
 * saved = lse (B, NH, T) fp32 followed by a copy of out (B, T, C) in the compute
 * dtype (the backward's D needs out, which the op table does not pass back);
 * scratch = D (B, NH, T) fp32. GPT-2 124M, B=16, T=1024, bf16: 25.9 MB saved per
 * layer against 403 MB for the probabilities of the cuBLAS path.
 *
 * Two builds of each pass: in bf16 with HS a multiple of 16, every matrix product
 * of a tile runs on tensor cores (nvcuda::wmma 16x16x16 bf16 fragments, fp32
 * accumulation; P and dS rounded to bf16 for their products, as FlashAttention
 * does); otherwise (fp32, or odd head sizes) scalar fp32 FMAs from shared memory.
 * Whether it beats the cuBLAS path on a GPU is what tests/helpers/bench_cuda_layers
 * and scripts/gpu_check.sh measure (not yet run: no GPU so far). The tensor-core
 * kernels read every fragment with shared-memory instructions (cuda_wmma.cuh: one
 * LDSM per fragment, where <mma.h>'s generic loads gave 8 LD.E), the forward takes 64
 * query rows per block for HS <= 64, and the backward is built per accumulator count
 * so that it fits 128 registers (4 blocks an SM); scripts/bench/sass_fused.sh prints
 * the counts, tests/integration/test_fused_attention_ptx.sh holds them. Known
 * headroom: S, P and O go through shared memory between the two products of a tile
 * (a WMMA fragment's element-to-row mapping is unspecified; mma.sync's documented
 * one would keep them in registers, as FlashAttention-2 does), tiles are loaded
 * with 16-byte vectors but not cp.async, and the two backward passes recompute P
 * twice.
 */
#include "kernels/cuda/cuda_layers.cuh"
#include "kernels/cuda/cuda_attention_tiles.cuh"
#include "kernels/cuda/cuda_wmma.cuh"

/* The first key query t of a sequence attends to: its document's start when pb (the
 * sequence's T positions) is given, else 0. */
static __device__ __forceinline__ int fa_key_lo(const int *pb, int t) { return pb ? t - pb[t] : 0; }

/* lo[r] = fa_key_lo of query rows q0 .. q0 + rows - 1 (0 past T). */
static __device__ __forceinline__ void fa_load_lo(int *lo, const int *pb, int q0, int rows, int T) {
    for (int r = threadIdx.x; r < rows; r += blockDim.x) lo[r] = q0 + r < T ? fa_key_lo(pb, q0 + r) : 0;
}

/* ---- forward ------------------------------------------------------------------- */

static size_t fa_forward_smem(int HS) {
    int hp = HS + 1;
    return sizeof(float) * (3 * (size_t)FA_TILE * hp + (size_t)FA_TILE * FA_PS + 2 * FA_TILE) +
           sizeof(int) * FA_TILE;
}

/* End of a forward tile: each warp's RPW row sums l (rows warp + FA_WARPS i) into
 * shared memory (to normalise the output) and the rows' log-sum-exp m + log l (what
 * the backward keeps). */
template <int RPW>
static __device__ __forceinline__ void store_row_sums(float *sl, float *lse_bh, const float *m, const float *l,
                                                      int q0, int T, int warp, int lane) {
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        int r = warp + FA_WARPS * i;
        if (lane == 0) {
            sl[r] = l[i];
            if (q0 + r < T) lse_bh[q0 + r] = m[i] + logf(l[i]);
        }
    }
}

template <typename S>
__global__ void __launch_bounds__(FA_THREADS)
    fa_forward_kernel(S *out, float *lse, S *out_copy, const S *qkv, const int *pos, int T, int C, int NH, int NKV,
                      float scale) {
    DT_DYN_SMEM(float, sm);
    int HS = C / NH, hp = HS + 1, C3 = C + 2 * NKV * HS;
    int qt = gridDim.x - 1 - blockIdx.x; /* the longest rows first */
    int h = blockIdx.y, b = blockIdx.z;
    int lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
    float *sq = sm, *sk = sq + FA_TILE * hp, *sv = sk + FA_TILE * hp;
    float *sp = sv + FA_TILE * hp, *salpha = sp + FA_TILE * FA_PS, *sl = salpha + FA_TILE;
    int *slo = (int *)(sl + FA_TILE);
    const S *q = qkv + (size_t)b * T * C3 + h * HS;
    const S *k = qkv + (size_t)b * T * C3 + C + h / (NH / NKV) * HS, *v = k + NKV * HS;
    const int *pb = pos ? pos + (size_t)b * T : NULL;
    int q0 = qt * FA_TILE;
    fa_load(sq, q, C3, q0, T, HS, hp);
    fa_load_lo(slo, pb, q0, FA_TILE, T);

    float m[FA_ROWS_PER_WARP], l[FA_ROWS_PER_WARP]; /* rows warp + FA_WARPS i */
    for (int i = 0; i < FA_ROWS_PER_WARP; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    float acc[FA_DPT]; /* O[lane][warp + FA_WARPS i] */
    #pragma unroll
    for (int i = 0; i < FA_DPT; i++) acc[i] = 0.0f;

    /* from the key tile of the block's first document on (0 without pos) */
    for (int kt = fa_key_lo(pb, q0) / FA_TILE; kt <= qt; kt++) {
        int k0 = kt * FA_TILE;
        __syncthreads(); /* the previous tile's readers are done (and slo is loaded) */
        fa_load(sk, k, C3, k0, T, HS, hp);
        fa_load(sv, v, C3, k0, T, HS, hp);
        __syncthreads();
        fa_tile_step(m, l, acc, sq, sk, sv, sp, salpha, HS, hp, scale, warp, lane, [&](int r, int c) {
            int t = q0 + r, j = k0 + c; /* key c of the tile */
            return j >= slo[r] && j <= t && j < T;
        });
    }
    store_row_sums<FA_ROWS_PER_WARP>(sl, lse + ((size_t)b * NH + h) * T, m, l, q0, T, warp, lane);
    __syncthreads();
    int t = q0 + lane;
    if (t >= T) return;
    float inv = 1.0f / sl[lane];
    size_t o = ((size_t)b * T + t) * C + h * HS;
    #pragma unroll
    for (int i = 0; i < FA_DPT; i++) {
        int d = warp + FA_WARPS * i;
        if (d >= HS) continue; /* constant indices: acc stays in registers */
        S y = dt_st<S>(acc[i] * inv);
        out[o + d] = y;
        out_copy[o + d] = y;
    }
}

/* ---- forward on tensor cores (bf16, HS a multiple of 16) -------------------------
 * Blocks of QR query rows (64 for HS <= 64, else 32) over key tiles of 32, with both
 * products of a tile on WMMA 16x16x16 bf16 fragments (fp32 accumulation): S = Q K^T
 * (QR/16 x 2 output fragments, two or one per warp, HS/16 steps) and O += P V
 * (QR/16 x HS/16 output fragments, the warps taking turns, two 16-key steps). P is
 * rounded to bf16 for the product (as FlashAttention does); the row sums l add the
 * same rounded values, so each row's weights sum to 1. O lives in shared memory
 * (fp32): the online softmax rescales its rows there between the two products,
 * since a fragment's element-to-row mapping is unspecified. Leading dimensions:
 * bf16 tiles HS + 8, P 40, S 36 and O HS + 4 floats (multiples of 16 bytes; every
 * fragment pointer 32-byte aligned). Every fragment load and store goes through
 * cuda_wmma.cuh (shared-memory instructions: LDSM, not generic loads).
 *
 * 64 query rows per block read each key/value tile once for 64 queries instead of
 * 32: about half the K/V traffic from L2 (GPT-2 124M, B=16, T=1024, HS=64: 272 tile
 * loads of 8 KB per head instead of 528, 428 MB per layer instead of 830 MB, against
 * 27 GFLOP of tile products) and half the barriers per product. Shared memory is then 50 KB at HS 64 (4 blocks, 16 warps an SM); at
 * HS 128 it would be 83 KB (2 blocks), so wider heads keep 32 rows (49 KB, 4). */

#define FA_WM 16
#define FA_S_LD (FA_TILE + 4)  /* floats */
#define FA_P_LD (FA_TILE + 8)  /* bf16 */
#define FA_QROWS(HS) ((HS) <= 64 ? 64 : 32) /* query rows per block of the WMMA forward */

static size_t fa_forward_wmma_smem(int HS) {
    size_t hsp = HS + 8, hso = HS + 4, qr = FA_QROWS(HS);
    return qr * hsp * sizeof(dt_bf16) + 2 * FA_TILE * hsp * sizeof(dt_bf16) + qr * FA_S_LD * sizeof(float) +
           qr * FA_P_LD * sizeof(dt_bf16) + qr * hso * sizeof(float) + 2 * qr * sizeof(float) + qr * sizeof(int);
}

/* Rows r0 .. r0+rows-1 of a (T, HS) bf16 matrix with row stride rs into a (rows, ld)
 * bf16 tile; rows past T are zero. vec: 16-byte loads and stores (8 elements; the
 * host checked that src is 16-byte aligned; HS, rs and ld are multiples of 8 here). */
static __device__ __forceinline__ void fa_load_bf16_rows(dt_bf16 *dst, const dt_bf16 *src, int rs, int r0,
                                                         int rows, int T, int HS, int ld, int vec) {
    if (vec) {
        int nv = HS / 8;
        for (int i = threadIdx.x; i < rows * nv; i += blockDim.x) {
            int r = i / nv, d = (i % nv) * 8;
            int4 x = make_int4(0, 0, 0, 0);
            if (r0 + r < T) x = *reinterpret_cast<const int4 *>(src + (size_t)(r0 + r) * rs + d);
            *reinterpret_cast<int4 *>(dst + r * ld + d) = x;
        }
        return;
    }
    for (int i = threadIdx.x; i < rows * HS; i += blockDim.x) {
        int r = i / HS, d = i % HS;
        dst[r * ld + d] = r0 + r < T ? src[(size_t)(r0 + r) * rs + d] : __float2bfloat16(0.0f);
    }
}

/* The same for a 32-row tile. */
static __device__ __forceinline__ void fa_load_bf16(dt_bf16 *dst, const dt_bf16 *src, int rs, int r0, int T,
                                                    int HS, int ld, int vec) {
    fa_load_bf16_rows(dst, src, rs, r0, FA_TILE, T, HS, ld, vec);
}

template <int QR>
__global__ void __launch_bounds__(FA_THREADS)
    fa_forward_wmma_kernel(dt_bf16 *out, float *lse, dt_bf16 *out_copy, const dt_bf16 *qkv, const int *pos, int T,
                           int C, int NH, int NKV, float scale, int vec) {
    using namespace nvcuda;
    constexpr int RPW = QR / FA_WARPS;        /* softmax rows per warp */
    constexpr int SFW = (QR / FA_WM) * 2 / FA_WARPS; /* S fragments per warp */
    DT_DYN_SMEM(unsigned char, smb);
    int HS = C / NH, hsp = HS + 8, hso = HS + 4, C3 = C + 2 * NKV * HS;
    int qt = gridDim.x - 1 - blockIdx.x; /* the longest rows first */
    int h = blockIdx.y, b = blockIdx.z;
    int lane = threadIdx.x % DT_WARP, warp = threadIdx.x / DT_WARP;
    dt_bf16 *sq = (dt_bf16 *)smb, *sk = sq + QR * hsp, *sv = sk + FA_TILE * hsp;
    float *ss = (float *)(sv + FA_TILE * hsp);
    dt_bf16 *sp = (dt_bf16 *)(ss + QR * FA_S_LD);
    float *so = (float *)(sp + QR * FA_P_LD), *salpha = so + QR * hso, *sl = salpha + QR;
    int *slo = (int *)(sl + QR);
    const dt_bf16 *q = qkv + (size_t)b * T * C3 + h * HS;
    const dt_bf16 *k = qkv + (size_t)b * T * C3 + C + h / (NH / NKV) * HS, *v = k + NKV * HS;
    const int *pb = pos ? pos + (size_t)b * T : NULL;
    int q0 = qt * QR;
    fa_load_bf16_rows(sq, q, C3, q0, QR, T, HS, hsp, vec);
    fa_load_lo(slo, pb, q0, QR, T);
    for (int i = threadIdx.x; i < QR * hso; i += blockDim.x) so[i] = 0.0f;

    float m[RPW], l[RPW]; /* rows warp + FA_WARPS i */
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    int n_o = (QR / FA_WM) * (HS / FA_WM); /* O fragments */
    /* Key tiles from the block's first document's (0 without pos) up to the block's
     * last query row in range. */
    int nkt = (min(q0 + QR, T) - 1) / FA_TILE + 1;
    for (int kt = fa_key_lo(pb, q0) / FA_TILE; kt < nkt; kt++) {
        int k0 = kt * FA_TILE;
        __syncthreads(); /* the previous tile's readers are done */
        fa_load_bf16(sk, k, C3, k0, T, HS, hsp, vec);
        fa_load_bf16(sv, v, C3, k0, T, HS, hsp, vec);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < SFW; u++) {
            int f = warp + FA_WARPS * u, sr = FA_WM * (f >> 1), sc = FA_WM * (f & 1);
            dt_wfrag_acc acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int d = 0; d < HS; d += FA_WM) {
                dt_wfrag_a_row fa;
                dt_wfrag_b_col fb; /* K^T */
                dt_wmma_lds(fa, sq + sr * hsp + d, hsp);
                dt_wmma_lds(fb, sk + sc * hsp + d, hsp);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            dt_wmma_sts_acc(ss + sr * FA_S_LD + sc, acc, FA_S_LD);
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            int r = warp + FA_WARPS * i, t = q0 + r, j = k0 + lane;
            float s = j >= slo[r] && j <= t && j < T ? scale * ss[r * FA_S_LD + lane] : -INFINITY;
            float mn = fmaxf(m[i], dt_warp_max(s)), ms = fa_shift(mn);
            dt_bf16 pw = __float2bfloat16(expf(s - ms));
            float a = expf(m[i] - ms);
            l[i] = l[i] * a + dt_warp_sum(__bfloat162float(pw));
            m[i] = mn;
            sp[r * FA_P_LD + lane] = pw;
            if (lane == 0) salpha[r] = a;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < QR * HS; i += blockDim.x) {
            int r = i / HS, d = i % HS;
            so[r * hso + d] *= salpha[r];
        }
        __syncthreads();
        for (int f = warp; f < n_o; f += FA_WARPS) {
            int orow = FA_WM * (f % (QR / FA_WM)), ocol = FA_WM * (f / (QR / FA_WM));
            dt_wfrag_acc acc;
            dt_wmma_lds_acc(acc, so + orow * hso + ocol, hso);
            for (int j = 0; j < FA_TILE; j += FA_WM) {
                dt_wfrag_a_row fa;
                dt_wfrag_b_row fb;
                dt_wmma_lds(fa, sp + orow * FA_P_LD + j, FA_P_LD);
                dt_wmma_lds(fb, sv + j * hsp + ocol, hsp);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            dt_wmma_sts_acc(so + orow * hso + ocol, acc, hso);
        }
    }
    store_row_sums<RPW>(sl, lse + ((size_t)b * NH + h) * T, m, l, q0, T, warp, lane);
    __syncthreads();
    for (int i = threadIdx.x; i < QR * HS; i += blockDim.x) {
        int r = i / HS, d = i % HS, t = q0 + r;
        if (t >= T) continue;
        size_t o = ((size_t)b * T + t) * C + h * HS + d;
        dt_bf16 y = __float2bfloat16(so[r * hso + d] / sl[r]);
        out[o] = y;
        out_copy[o] = y;
    }
}

/* The backward kernels (cuda_attention_fused_bwd.cuh: kept in this translation
 * unit, whose PTX the Makefile keeps). */
#include "kernels/cuda/cuda_attention_fused_bwd.cuh"

/* ---- host side ------------------------------------------------------------------ */

size_t dt_cuda_fa_saved_bytes(int B, int T, int C, int NH, size_t elem) {
    return sizeof(float) * (size_t)B * NH * T + elem * (size_t)B * T * C;
}

size_t dt_cuda_fa_scratch_bytes(int B, int T, int C, int NH) {
    (void)C;
    return sizeof(float) * (size_t)B * NH * T;
}

/* The bf16 tensor-core forward with QR = FA_QROWS(HS) query rows per block. */
template <int QR>
static void fa_forward_wmma(dt_device_t *dev, void *out, float *lse, void *out_copy, const void *qkv, const int *pos,
                            int B, int T, int C, int NH, int NKV) {
    int HS = C / NH;
    size_t smem = fa_forward_wmma_smem(HS);
    if (!fa_smem_ok(dev, fa_forward_wmma_kernel<QR>, smem, __func__)) return;
    dim3 grid((T + QR - 1) / QR, NH, B);
    DT_LAUNCH(fa_forward_wmma_kernel<QR>, grid, FA_THREADS, smem, dt_cuda_stream(dev))
    ((dt_bf16 *)out, lse, (dt_bf16 *)out_copy, (const dt_bf16 *)qkv, pos, T, C, NH, NKV, 1.0f / sqrtf((float)HS),
     dt_cuda_aligned16(qkv));
    DT_CUDA_LAUNCHED(dev);
}

template <typename S>
static void fa_forward(dt_device_t *dev, void *out, void *saved, const void *qkv, const int *pos, int B, int T,
                       int C, int NH, int NKV) {
    int HS = C / NH;
    float *lse = (float *)saved;
    S *out_copy = (S *)((char *)saved + sizeof(float) * (size_t)B * NH * T);
    dim3 grid((T + FA_TILE - 1) / FA_TILE, NH, B);
    if constexpr (sizeof(S) == 2) {
        if (HS % FA_WM == 0) { /* tensor cores */
            if (FA_QROWS(HS) == 64)
                fa_forward_wmma<64>(dev, out, lse, out_copy, qkv, pos, B, T, C, NH, NKV);
            else
                fa_forward_wmma<32>(dev, out, lse, out_copy, qkv, pos, B, T, C, NH, NKV);
            return;
        }
    }
    size_t smem = fa_forward_smem(HS);
    if (!fa_smem_ok(dev, fa_forward_kernel<S>, smem, __func__)) return;
    DT_LAUNCH(fa_forward_kernel<S>, grid, FA_THREADS, smem, dt_cuda_stream(dev))
    ((S *)out, lse, out_copy, (const S *)qkv, pos, T, C, NH, NKV, 1.0f / sqrtf((float)HS));
    DT_CUDA_LAUNCHED(dev);
}

/* The bf16 tensor-core backward with NF = FA_NF(HS) accumulator fragments per warp. */
template <int NF>
static void fa_backward_wmma(dt_device_t *dev, void *dqkv, const void *dout, const void *qkv, const float *lse,
                             const float *D, const int *pos, int B, int T, int C, int NH, int NKV) {
    int HS = C / NH, vec = dt_cuda_aligned16(qkv) && dt_cuda_aligned16(dout);
    float scale = 1.0f / sqrtf((float)HS);
    dim3 grid((T + FA_TILE - 1) / FA_TILE, NH, B), grid_kv((T + FA_TILE - 1) / FA_TILE, NKV, B);
    size_t smem = fa_backward_wmma_smem(HS);
    if (!fa_smem_ok(dev, fa_dkdv_wmma_kernel<NF>, smem, __func__) ||
        !fa_smem_ok(dev, fa_dq_wmma_kernel<NF>, smem, __func__))
        return;
    DT_LAUNCH(fa_dkdv_wmma_kernel<NF>, grid_kv, FA_THREADS, smem, dt_cuda_stream(dev))
    ((dt_bf16 *)dqkv, (const dt_bf16 *)dout, (const dt_bf16 *)qkv, lse, D, pos, T, C, NH, NKV, scale, vec);
    DT_CUDA_LAUNCHED(dev);
    DT_LAUNCH(fa_dq_wmma_kernel<NF>, grid, FA_THREADS, smem, dt_cuda_stream(dev))
    ((dt_bf16 *)dqkv, (const dt_bf16 *)dout, (const dt_bf16 *)qkv, lse, D, pos, T, C, NH, NKV, scale, vec);
    DT_CUDA_LAUNCHED(dev);
}

template <typename S>
static void fa_backward(dt_device_t *dev, void *dqkv, void *scratch, const void *dout, const void *qkv,
                        const void *saved, const int *pos, int B, int T, int C, int NH, int NKV) {
    int HS = C / NH;
    const float *lse = (const float *)saved;
    const S *out = (const S *)((const char *)saved + sizeof(float) * (size_t)B * NH * T);
    float *D = (float *)scratch;
    float scale = 1.0f / sqrtf((float)HS);
    size_t rows = (size_t)B * NH * T;
    DT_LAUNCH(fa_rowdot_kernel<S>, dt_blocks(rows, 8), 8 * DT_WARP, 0, dt_cuda_stream(dev))
    (D, (const S *)dout, out, B, T, C, NH);
    DT_CUDA_LAUNCHED(dev);
    dim3 grid((T + FA_TILE - 1) / FA_TILE, NH, B), grid_kv((T + FA_TILE - 1) / FA_TILE, NKV, B);
    if constexpr (sizeof(S) == 2) {
        if (HS % FA_WM == 0) { /* tensor cores */
            switch (FA_NF(HS)) {
            case 1: fa_backward_wmma<1>(dev, dqkv, dout, qkv, lse, D, pos, B, T, C, NH, NKV); return;
            case 2: fa_backward_wmma<2>(dev, dqkv, dout, qkv, lse, D, pos, B, T, C, NH, NKV); return;
            case 3: fa_backward_wmma<3>(dev, dqkv, dout, qkv, lse, D, pos, B, T, C, NH, NKV); return;
            default: fa_backward_wmma<4>(dev, dqkv, dout, qkv, lse, D, pos, B, T, C, NH, NKV); return;
            }
        }
    }
    size_t smem = fa_backward_smem(HS);
    if (!fa_smem_ok(dev, fa_dkdv_kernel<S>, smem, __func__) || !fa_smem_ok(dev, fa_dq_kernel<S>, smem, __func__))
        return;
    DT_LAUNCH(fa_dkdv_kernel<S>, grid_kv, FA_THREADS, smem, dt_cuda_stream(dev))
    ((S *)dqkv, (const S *)dout, (const S *)qkv, lse, D, pos, T, C, NH, NKV, scale);
    DT_CUDA_LAUNCHED(dev);
    DT_LAUNCH(fa_dq_kernel<S>, grid, FA_THREADS, smem, dt_cuda_stream(dev))
    ((S *)dqkv, (const S *)dout, (const S *)qkv, lse, D, pos, T, C, NH, NKV, scale);
    DT_CUDA_LAUNCHED(dev);
}

void dt_cuda_fa_forward(dt_device_t *dev, void *out, void *saved, const void *qkv, const int *pos, int B, int T,
                        int C, int NH, int NKV) {
    if (dev->ops->dtype == DT_DTYPE_BF16)
        fa_forward<dt_bf16>(dev, out, saved, qkv, pos, B, T, C, NH, NKV);
    else
        fa_forward<float>(dev, out, saved, qkv, pos, B, T, C, NH, NKV);
}

void dt_cuda_fa_backward(dt_device_t *dev, void *dqkv, void *scratch, const void *dout, const void *qkv,
                         const void *saved, const int *pos, int B, int T, int C, int NH, int NKV) {
    if (dev->ops->dtype == DT_DTYPE_BF16)
        fa_backward<dt_bf16>(dev, dqkv, scratch, dout, qkv, saved, pos, B, T, C, NH, NKV);
    else
        fa_backward<float>(dev, dqkv, scratch, dout, qkv, saved, pos, B, T, C, NH, NKV);
}
