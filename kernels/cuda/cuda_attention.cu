/*
 * cuda_attention.cu - causal multi-head (and grouped-query) self-attention on the
 * GPU: cuBLAS strided-batched GEMMs around a causal softmax kernel, as llm.c does,
 * but reading q, k, v straight out of qkv (B, T, 3C; with NKV < NH key/value heads,
 * B, T, C + 2*NKV*HS) and writing out (B, T, C) in place of llm.c's
 * permute/unpermute kernels.
 *
 * For sequence b, head h's q is a (T, HS) matrix at qkv + b*T*3C + h*HS with row
 * stride 3C (k at +C, v at +2C), and its output a (T, HS) matrix at out + b*T*C +
 * h*HS with row stride C. The B*NH heads are not equally strided (HS apart within a
 * sequence, T*3C across), so each product is one cublasGemmBatchedEx over all of
 * them, its pointer arrays built on the device by a small kernel (gemm_ptrs_kernel,
 * in the device's shared scratch): one cuBLAS call per product, where a
 * strided-batched GEMM per sequence took B (B * NH/NKV with grouped-query
 * attention). No copies, and no saved q/k/v (llm.c permutes q, k, v into
 * (B, NH, T, HS) to batch over B*NH: four extra passes over (B, T, 3C) per layer).
 *
 *   forward:   att = scale q k^T            (B, NH, T, T)   GEMM
 *              att = causal_softmax(att)    in place, masked entries 0
 *              out = att v                  (B, T, NH*HS)   GEMM
 *   backward:  dv += att^T dout             GEMM (beta 1)
 *              dS = dout v^T                (B, NH, T, T) in the scratch
 *              dS = att * (dS - rowsum(att * dS)), 0 above the diagonal
 *              dq += scale dS k,  dk += scale dS^T q   GEMMs (beta 1)
 *
 * saved = att (B, NH, T, T) in the compute dtype; scratch = dS (B, NH, T, T), the
 * size of one layer's saved att (it held one sequence's (NH, T, T) when the
 * backward went sequence by sequence; batching over B needs all of them). GEMMs run
 * in fp32 compute (CUBLAS_COMPUTE_32F) on bf16 or fp32 storage, on the device's
 * cuBLAS handle, which cuda_device.cu binds to the device's stream (not re-bound
 * here: cublasSetStream would also reset the handle's workspace).
 *
 * What a fused flash-style kernel (online softmax over key tiles, recomputing the
 * probabilities in the backward) would save: the saved (B, NH, T, T)
 * probabilities (GPT-2 124M, B=16, T=1024, bf16: 402 MB per layer, 4.8 GB over 12
 * layers) and their trips through memory: here the scores are written, read and
 * rewritten by the softmax and read by the output GEMM (4 passes) in the forward;
 * the backward reads them twice, and dP/dS take ~5 passes of (B, NH, T, T):
 * ~10 passes of 402 MB, ~4 GB per layer and step, against ~0.2 GB for q, k, v, out and their gradients. It would also
 * skip the masked upper triangle, which the GEMMs here compute and throw away
 * (half of the attention FLOPs). To beat cuBLAS it needs tensor-core MMA (wmma
 * or mma.sync), which the emulator (tests/cuemu) does not provide yet. Measuring
 * both needs a GPU; this version is the reference the fused one will be tested
 * against.
 *
 * Packed sequences (kernels.h: pos): the GEMMs stay whole (T x T per head); the
 * softmax kernels mask row t to its document, keys [t - pos[b,t], t], and write 0
 * elsewhere, so the products that follow add nothing across documents.
 *
 * With DTRUN_CUDA_ATTENTION=fused (dt_cuda_impl.attention) and HS <= 128 the four
 * slots below hand over to the fused kernel of cuda_attention_fused.cu.
 */
#include "kernels/cuda/cuda_layers.cuh"

#define SOFTMAX_ROWS_PER_BLOCK 4 /* one warp per row */

/* The first key of row r (query t = r % T of (b, h), r / (NH T) = b): its
 * document's start with pos, else 0. */
static __device__ __forceinline__ int row_key_lo(const int *pos, int r, int T, int NH) {
    int t = r % T;
    return pos ? t - pos[(size_t)(r / T / NH) * T + t] : 0;
}

/* Rows of `rows` T-long rows; row r is query t = r % T of its (b, h), over keys
 * lo <= j <= t (row_key_lo). In place: each element is read and written by the same
 * lane. */
template <typename S> __global__ void causal_softmax_kernel(S *att, const int *pos, int rows, int T, int NH) {
    int lane = threadIdx.x % DT_WARP;
    int r = blockIdx.x * SOFTMAX_ROWS_PER_BLOCK + threadIdx.x / DT_WARP;
    if (r >= rows) return;
    int t = r % T, lo = row_key_lo(pos, r, T, NH);
    S *x = att + (size_t)r * T;
    float m = -INFINITY;
    for (int j = lo + lane; j <= t; j += DT_WARP) m = fmaxf(m, dt_ld(x[j]));
    m = dt_warp_max(m);
    float s = 0.0f;
    for (int j = lo + lane; j <= t; j += DT_WARP) s += expf(dt_ld(x[j]) - m);
    float inv = 1.0f / dt_warp_sum(s);
    for (int j = lane; j < T; j += DT_WARP)
        x[j] = dt_st<S>(j >= lo && j <= t ? expf(dt_ld(x[j]) - m) * inv : 0.0f);
}

/* dS = P * (dP - sum_j P dP) over lo <= j <= t, 0 elsewhere; in place on dP. */
template <typename S>
__global__ void causal_softmax_backward_kernel(S *dS, const S *att, const int *pos, int rows, int T, int NH) {
    int lane = threadIdx.x % DT_WARP;
    int r = blockIdx.x * SOFTMAX_ROWS_PER_BLOCK + threadIdx.x / DT_WARP;
    if (r >= rows) return;
    int t = r % T, lo = row_key_lo(pos, r, T, NH);
    S *d = dS + (size_t)r * T;
    const S *p = att + (size_t)r * T;
    float dot = 0.0f;
    for (int j = lo + lane; j <= t; j += DT_WARP) dot += dt_ld(p[j]) * dt_ld(d[j]);
    dot = dt_warp_sum(dot);
    for (int j = lane; j < T; j += DT_WARP)
        d[j] = dt_st<S>(j >= lo && j <= t ? dt_ld(p[j]) * (dt_ld(d[j]) - dot) : 0.0f);
}

template <typename S> static cudaDataType_t blas_type(void);
template <> cudaDataType_t blas_type<float>(void) { return CUDA_R_32F; }
template <> cudaDataType_t blas_type<dt_bf16>(void) { return CUDA_R_16BF; }

/* Where the matrices of one batched product start. Member i of the batch is
 * (b, g, r): sequence b < B, key/value head g < NKV, group member r in [r0, r0 + nr)
 * (query head h = g*rep + r), i = (b*NKV + g)*nr + (r - r0); operand o's matrix
 * starts at base[o] + b*sb[o] + g*sg[o] + r*sr[o] elements. Operands: A, B, C. */
struct gemm_ptrs {
    const char *base[3];
    long long sb[3], sg[3], sr[3];
};

/* Fills the three pointer arrays (A's n, then B's, then C's) of a batch of n. */
__global__ void gemm_ptrs_kernel(const char **out, gemm_ptrs p, int es, int NKV, int r0, int nr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long r = r0 + i % nr, g = (i / nr) % NKV, b = i / (nr * NKV);
    for (int o = 0; o < 3; o++) out[(size_t)o * n + i] = p.base[o] + (b * p.sb[o] + g * p.sg[o] + r * p.sr[o]) * es;
}

/* An operand's place: base, then strides per sequence, key/value head and group member. */
template <typename S> static void at(gemm_ptrs *p, int o, const S *base, long long sb, long long sg, long long sr) {
    p->base[o] = (const char *)base;
    p->sb[o] = sb;
    p->sg[o] = sg;
    p->sr[o] = sr;
}

/* Column-major C = alpha op(A) op(B) + beta C for every (b, g, r) of p (cuBLAS terms;
 * the row-major mapping is worked out at each call): one cuBLAS call, its pointer
 * arrays built on the device (in the device's shared scratch) by one small kernel.
 * The members' C matrices must be distinct: they run concurrently. */
template <typename S>
static void gemm(dt_device_t *dev, const char *op, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                 float alpha, int lda, int ldb, float beta, int ldc, const gemm_ptrs &p, int B, int NKV, int r0,
                 int nr) {
    int cnt = B * NKV * nr;
    const char **arr = (const char **)dt_cuda_layer_scratch(dev, 3 * (size_t)cnt * sizeof(void *), op);
    if (!arr) return;
    DT_LAUNCH(gemm_ptrs_kernel, dt_blocks(cnt, 128), 128, 0, dt_cuda_stream(dev))(arr, p, (int)sizeof(S), NKV, r0, nr,
                                                                                  cnt);
    dt_cuda_note_launch(dev, op);
    cudaDataType_t ty = blas_type<S>();
    cublasStatus_t s = cublasGemmBatchedEx(dt_cuda(dev)->blas, ta, tb, m, n, k, &alpha, (const void *const *)arr, ty,
                                           lda, (const void *const *)(arr + cnt), ty, ldb, &beta,
                                           (void *const *)(arr + 2 * (size_t)cnt), ty, ldc, cnt, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT);
    dt_cuda_note_blas(dev, op, s);
}

template <typename S>
static size_t attention_saved_bytes(const dt_device_t *dev, int B, int T, int C, int NH, int NKV) {
    if (dt_cuda_attention_fused(dev, C, NH)) return dt_cuda_fa_saved_bytes(B, T, C, NH, sizeof(S));
    return sizeof(S) * (size_t)B * NH * T * T;
}

template <typename S>
static size_t attention_scratch_bytes(const dt_device_t *dev, int B, int T, int C, int NH, int NKV) {
    if (dt_cuda_attention_fused(dev, C, NH)) return dt_cuda_fa_scratch_bytes(B, T, C, NH);
    return sizeof(S) * (size_t)B * NH * T * T;
}

/* Grouped-query attention: query head h = g*rep + r (rep = NH/NKV) reads key/value
 * head g. Query-side products cover all B*NH heads in one call. */
template <typename S>
static void attention_forward(dt_device_t *dev, void *out_, void *saved, const void *qkv_, const int *pos,
                              int B, int T, int C, int NH, int NKV) {
    if (dt_cuda_attention_fused(dev, C, NH)) {
        dt_cuda_fa_forward(dev, out_, saved, qkv_, pos, B, T, C, NH, NKV);
        return;
    }
    S *out = (S *)out_, *att = (S *)saved;
    const S *qkv = (const S *)qkv_;
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV, rep = NH / NKV;
    long long TT = (long long)T * T, sq = (long long)T * C3, hq = (long long)rep * HS;
    float scale = 1.0f / sqrtf((float)HS);
    gemm_ptrs p;
    /* att[h][t][j] = scale sum_d q[t][d] k[j][d]: column-major (T x T) with j fastest
     * is op(A) = k^T-as-stored (A = k, lda C3), B = q (ldb C3). */
    at<S>(&p, 0, qkv + C, sq, HS, 0);
    at<S>(&p, 1, qkv, sq, hq, HS);
    at<S>(&p, 2, att, NH * TT, rep * TT, TT);
    gemm<S>(dev, __func__, CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, scale, C3, C3, 0.0f, T, p, B, NKV, 0, rep);
    int rows = B * NH * T;
    DT_LAUNCH(causal_softmax_kernel<S>, dt_blocks(rows, SOFTMAX_ROWS_PER_BLOCK),
              SOFTMAX_ROWS_PER_BLOCK * DT_WARP, 0, dt_cuda_stream(dev))
    (att, pos, rows, T, NH);
    DT_CUDA_LAUNCHED(dev);
    /* out[t][d] = sum_j att[t][j] v[j][d]: column-major (HS x T), ldc C, is v (HS x T,
     * lda C3) times att-as-stored (T x T, ldb T). */
    at<S>(&p, 0, qkv + C + KV, sq, HS, 0);
    at<S>(&p, 1, att, NH * TT, rep * TT, TT);
    at<S>(&p, 2, out, (long long)T * C, hq, HS);
    gemm<S>(dev, __func__, CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T, 1.0f, C3, T, 0.0f, C, p, B, NKV, 0, rep);
}

/* dk and dv are shared by a group's rep query heads, which would write the same
 * matrix concurrently in one batch: those products are rep calls, one per group
 * member r = 0, 1, ... in order, each adding into all B*NKV key/value heads. */
template <typename S>
static void attention_backward(dt_device_t *dev, void *dqkv_, void *scratch, const void *dout_,
                               const void *qkv_, const void *saved, const int *pos, int B, int T, int C, int NH,
                               int NKV) {
    if (dt_cuda_attention_fused(dev, C, NH)) {
        dt_cuda_fa_backward(dev, dqkv_, scratch, dout_, qkv_, saved, pos, B, T, C, NH, NKV);
        return;
    }
    S *dqkv = (S *)dqkv_, *dS = (S *)scratch;
    const S *dout = (const S *)dout_, *qkv = (const S *)qkv_, *att = (const S *)saved;
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV, rep = NH / NKV;
    long long TT = (long long)T * T, sq = (long long)T * C3, hq = (long long)rep * HS, so = (long long)T * C;
    float scale = 1.0f / sqrtf((float)HS);
    gemm_ptrs p;
    /* dv[j][d] += sum_t P[t][j] dO[t][d]: (HS x T) = dO (HS x T) . P-as-stored^T */
    at<S>(&p, 0, dout, so, hq, HS);
    at<S>(&p, 1, att, NH * TT, rep * TT, TT);
    at<S>(&p, 2, dqkv + C + KV, sq, HS, 0);
    for (int r = 0; r < rep; r++)
        gemm<S>(dev, __func__, CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T, 1.0f, C, T, 1.0f, C3, p, B, NKV, r, 1);
    /* dP[t][j] = sum_d dO[t][d] v[j][d]: (T x T), j fastest = v^T-as-stored . dO */
    at<S>(&p, 0, qkv + C + KV, sq, HS, 0);
    at<S>(&p, 1, dout, so, hq, HS);
    at<S>(&p, 2, dS, NH * TT, rep * TT, TT);
    gemm<S>(dev, __func__, CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, 1.0f, C3, C, 0.0f, T, p, B, NKV, 0, rep);
    int rows = B * NH * T;
    DT_LAUNCH(causal_softmax_backward_kernel<S>, dt_blocks(rows, SOFTMAX_ROWS_PER_BLOCK),
              SOFTMAX_ROWS_PER_BLOCK * DT_WARP, 0, dt_cuda_stream(dev))
    (dS, att, pos, rows, T, NH);
    DT_CUDA_LAUNCHED(dev);
    /* dq[t][d] += scale sum_j dS[t][j] k[j][d]: (HS x T) = k (HS x T) . dS-as-stored */
    at<S>(&p, 0, qkv + C, sq, HS, 0);
    at<S>(&p, 1, dS, NH * TT, rep * TT, TT);
    at<S>(&p, 2, dqkv, sq, hq, HS);
    gemm<S>(dev, __func__, CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T, scale, C3, T, 1.0f, C3, p, B, NKV, 0, rep);
    /* dk[j][d] += scale sum_t dS[t][j] q[t][d]: (HS x T) = q (HS x T) . dS-as-stored^T */
    at<S>(&p, 0, qkv, sq, hq, HS);
    at<S>(&p, 2, dqkv + C, sq, HS, 0);
    for (int r = 0; r < rep; r++)
        gemm<S>(dev, __func__, CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T, scale, C3, T, 1.0f, C3, p, B, NKV, r, 1);
}

void dt_cuda_fill_attention_ops(dt_ops_t *ops, dt_dtype_t dtype) {
    if (dtype == DT_DTYPE_BF16) {
        ops->attention_saved_bytes = attention_saved_bytes<dt_bf16>;
        ops->attention_scratch_bytes = attention_scratch_bytes<dt_bf16>;
        ops->attention_forward = attention_forward<dt_bf16>;
        ops->attention_backward = attention_backward<dt_bf16>;
    } else {
        ops->attention_saved_bytes = attention_saved_bytes<float>;
        ops->attention_scratch_bytes = attention_scratch_bytes<float>;
        ops->attention_forward = attention_forward<float>;
        ops->attention_backward = attention_backward<float>;
    }
}
