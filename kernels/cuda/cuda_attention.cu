/*
 * cuda_attention.cu - causal multi-head (and grouped-query) self-attention on the
 * GPU: cuBLAS strided-batched GEMMs around a causal softmax kernel, as llm.c does,
 * but reading q, k, v straight out of qkv (B, T, 3C; with NKV < NH key/value heads,
 * B, T, C + 2*NKV*HS) and writing out (B, T, C) in place of llm.c's
 * permute/unpermute kernels.
 *
 * For one sequence b, head h's q is a (T, HS) matrix at qkv + b*T*3C + h*HS with
 * row stride 3C (k at +C, v at +2C), and its output a (T, HS) matrix at
 * out + b*T*C + h*HS with row stride C: the heads of one sequence are equally
 * strided (HS apart), so one strided-batched GEMM covers the NH heads of a
 * sequence, and the op issues B of them per product (B * NH/NKV with grouped-query
 * attention: see attention_forward). No copies, and no saved
 * q/k/v. The price is B cuBLAS calls per product instead of one (llm.c permutes
 * q, k, v into (B, NH, T, HS) to batch over B*NH): launch cost only, which the
 * stream hides while the host keeps ahead of the GPU; the permutes would cost
 * four extra passes over (B, T, 3C) per layer.
 *
 *   forward, per b:  att = scale q k^T            (NH, T, T)   GEMM
 *                    att = causal_softmax(att)    in place, masked entries 0
 *                    out = att v                  (T, NH*HS)   GEMM
 *   backward, per b: dv += att^T dout             GEMM (beta 1)
 *                    dS = dout v^T                (NH, T, T) in the scratch
 *                    dS = att * (dS - rowsum(att * dS)), 0 above the diagonal
 *                    dq += scale dS k,  dk += scale dS^T q   GEMMs (beta 1)
 *
 * saved = att (B, NH, T, T) in the compute dtype; scratch = dS (NH, T, T) for one
 * sequence at a time (the stream orders the B rounds). GEMMs run in fp32 compute
 * (CUBLAS_COMPUTE_32F) on bf16 or fp32 storage, on the device's cuBLAS handle,
 * which cuda_device.cu binds to the device's stream (not re-bound here:
 * cublasSetStream would also reset the handle's workspace).
 *
 * What a fused flash-style kernel (online softmax over key tiles, recomputing the
 * probabilities in the backward) would save: the saved (B, NH, T, T)
 * probabilities (GPT-2 124M, B=16, T=1024, bf16: 402 MB per layer, 4.8 GB over 12
 * layers) and their trips through memory: here the scores are written, read and
 * rewritten by the softmax and read by the output GEMM (4 passes) in the forward;
 * the backward reads them twice, and dP/dS take ~5 passes of one sequence's
 * (NH, T, T) (25 MB, partly L2-resident): ~10 passes of 402 MB, ~4 GB per layer
 * and step, against ~0.2 GB for q, k, v, out and their gradients. It would also
 * skip the masked upper triangle, which the GEMMs here compute and throw away
 * (half of the attention FLOPs). To beat cuBLAS it needs tensor-core MMA (wmma
 * or mma.sync), which the emulator (tests/cuemu) does not provide yet. Measuring
 * both needs a GPU; this version is the reference the fused one will be tested
 * against.
 *
 * With DTRUN_CUDA_ATTENTION=fused (dt_cuda_impl.attention) and HS <= 128 the four
 * slots below hand over to the fused kernel of cuda_attention_fused.cu.
 */
#include "kernels/cuda/cuda_layers.cuh"

#define SOFTMAX_ROWS_PER_BLOCK 4 /* one warp per row */

/* Rows of `rows` T-long rows; row r is query t = r % T of its (b, h). In place:
 * each element is read and written by the same lane. */
template <typename S> __global__ void causal_softmax_kernel(S *att, int rows, int T) {
    int lane = threadIdx.x % DT_WARP;
    int r = blockIdx.x * SOFTMAX_ROWS_PER_BLOCK + threadIdx.x / DT_WARP;
    if (r >= rows) return;
    int t = r % T;
    S *x = att + (size_t)r * T;
    float m = -INFINITY;
    for (int j = lane; j <= t; j += DT_WARP) m = fmaxf(m, dt_ld(x[j]));
    m = dt_warp_max(m);
    float s = 0.0f;
    for (int j = lane; j <= t; j += DT_WARP) s += expf(dt_ld(x[j]) - m);
    float inv = 1.0f / dt_warp_sum(s);
    for (int j = lane; j < T; j += DT_WARP)
        x[j] = dt_st<S>(j <= t ? expf(dt_ld(x[j]) - m) * inv : 0.0f);
}

/* dS = P * (dP - sum_j P dP) over j <= t, 0 right of the diagonal; in place on dP. */
template <typename S>
__global__ void causal_softmax_backward_kernel(S *dS, const S *att, int rows, int T) {
    int lane = threadIdx.x % DT_WARP;
    int r = blockIdx.x * SOFTMAX_ROWS_PER_BLOCK + threadIdx.x / DT_WARP;
    if (r >= rows) return;
    int t = r % T;
    S *d = dS + (size_t)r * T;
    const S *p = att + (size_t)r * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += DT_WARP) dot += dt_ld(p[j]) * dt_ld(d[j]);
    dot = dt_warp_sum(dot);
    for (int j = lane; j < T; j += DT_WARP)
        d[j] = dt_st<S>(j <= t ? dt_ld(p[j]) * (dt_ld(d[j]) - dot) : 0.0f);
}

template <typename S> static cudaDataType_t blas_type(void);
template <> cudaDataType_t blas_type<float>(void) { return CUDA_R_32F; }
template <> cudaDataType_t blas_type<dt_bf16>(void) { return CUDA_R_16BF; }

/* Column-major C = alpha op(A) op(B) + beta C over `batch` matrices (cuBLAS terms;
 * the row-major mapping is worked out at each call). */
template <typename S>
static void gemm(dt_device_t *dev, const char *op, cublasOperation_t ta, cublasOperation_t tb,
                 int m, int n, int k, float alpha, const S *A, int lda, long long sA, const S *B,
                 int ldb, long long sB, float beta, S *C, int ldc, long long sC, int batch) {
    cudaDataType_t ty = blas_type<S>();
    cublasStatus_t s = cublasGemmStridedBatchedEx(dt_cuda(dev)->blas, ta, tb, m, n, k, &alpha, A, ty,
                                                  lda, sA, B, ty, ldb, sB, &beta, C, ty, ldc, sC,
                                                  batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) dt_cuda_note_blas(dev, op, s);
}

template <typename S>
static size_t attention_saved_bytes(const dt_device_t *dev, int B, int T, int C, int NH, int NKV) {
    if (dt_cuda_attention_fused(dev, C, NH)) return dt_cuda_fa_saved_bytes(B, T, C, NH, sizeof(S));
    return sizeof(S) * (size_t)B * NH * T * T;
}

template <typename S>
static size_t attention_scratch_bytes(const dt_device_t *dev, int B, int T, int C, int NH, int NKV) {
    if (dt_cuda_attention_fused(dev, C, NH)) return dt_cuda_fa_scratch_bytes(B, T, C, NH);
    return sizeof(S) * (size_t)NH * T * T;
}

/* Grouped-query attention: query head h = g*rep + r (rep = NH/NKV) reads key/value
 * head g. For a fixed r the query heads g*rep + r are rep*HS apart and their
 * key/value heads HS apart, both equal strides, so each product is rep
 * strided-batched GEMMs of NKV heads per sequence (one of NH heads when NKV == NH). */
template <typename S>
static void attention_forward(dt_device_t *dev, void *out_, void *saved, const void *qkv_, int B,
                              int T, int C, int NH, int NKV) {
    if (dt_cuda_attention_fused(dev, C, NH)) {
        dt_cuda_fa_forward(dev, out_, saved, qkv_, B, T, C, NH, NKV);
        return;
    }
    S *out = (S *)out_, *att = (S *)saved;
    const S *qkv = (const S *)qkv_;
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV, rep = NH / NKV;
    long long TT = (long long)T * T;
    float scale = 1.0f / sqrtf((float)HS);
    for (int b = 0; b < B; b++) {
        const S *k = qkv + (size_t)b * T * C3 + C;
        for (int r = 0; r < rep; r++) {
            const S *q = qkv + (size_t)b * T * C3 + r * HS;
            /* att[h][t][j] = scale sum_d q[t][d] k[j][d]: column-major (T x T) with j
             * fastest is op(A) = k^T-as-stored (A = k, lda C3), B = q (ldb C3). */
            gemm<S>(dev, __func__, CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, scale, k, C3, HS, q, C3,
                    (long long)rep * HS, 0.0f, att + ((size_t)b * NH + r) * TT, T, rep * TT, NKV);
        }
    }
    int rows = B * NH * T;
    DT_LAUNCH(causal_softmax_kernel<S>, dt_blocks(rows, SOFTMAX_ROWS_PER_BLOCK),
              SOFTMAX_ROWS_PER_BLOCK * DT_WARP, 0, dt_cuda_stream(dev))
    (att, rows, T);
    DT_CUDA_LAUNCHED(dev);
    for (int b = 0; b < B; b++) {
        const S *v = qkv + (size_t)b * T * C3 + C + KV;
        for (int r = 0; r < rep; r++) {
            /* out[t][d] = sum_j att[t][j] v[j][d]: column-major (HS x T), ldc C, is
             * v (HS x T, lda C3) times att-as-stored (T x T, ldb T). */
            gemm<S>(dev, __func__, CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T, 1.0f, v, C3, HS,
                    att + ((size_t)b * NH + r) * TT, T, rep * TT, 0.0f, out + (size_t)b * T * C + r * HS, C,
                    (long long)rep * HS, NKV);
        }
    }
}

/* The rep GEMMs that add into the shared dk and dv run one after the other on the
 * stream, so each key/value head sums its group's query heads in order r = 0, 1, ... */
template <typename S>
static void attention_backward(dt_device_t *dev, void *dqkv_, void *scratch, const void *dout_,
                               const void *qkv_, const void *saved, int B, int T, int C, int NH, int NKV) {
    if (dt_cuda_attention_fused(dev, C, NH)) {
        dt_cuda_fa_backward(dev, dqkv_, scratch, dout_, qkv_, saved, B, T, C, NH, NKV);
        return;
    }
    S *dqkv = (S *)dqkv_, *dS = (S *)scratch;
    const S *dout = (const S *)dout_, *qkv = (const S *)qkv_, *att = (const S *)saved;
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV, rep = NH / NKV;
    long long TT = (long long)T * T, sq = (long long)rep * HS, sP = rep * TT;
    float scale = 1.0f / sqrtf((float)HS);
    int rows = NH * T;
    for (int b = 0; b < B; b++) {
        size_t base = (size_t)b * T * C3;
        const S *k = qkv + base + C, *v = k + KV;
        S *dk = dqkv + base + C, *dv = dk + KV;
        const S *P = att + (size_t)b * NH * TT;
        for (int r = 0; r < rep; r++) {
            const S *dO = dout + (size_t)b * T * C + r * HS;
            /* dv[j][d] += sum_t P[t][j] dO[t][d]: (HS x T) = dO (HS x T) . P-as-stored^T */
            gemm<S>(dev, __func__, CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T, 1.0f, dO, C, sq, P + r * TT, T, sP,
                    1.0f, dv, C3, HS, NKV);
            /* dP[t][j] = sum_d dO[t][d] v[j][d]: (T x T), j fastest = v^T-as-stored . dO */
            gemm<S>(dev, __func__, CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, 1.0f, v, C3, HS, dO, C, sq, 0.0f,
                    dS + r * TT, T, sP, NKV);
        }
        DT_LAUNCH(causal_softmax_backward_kernel<S>, dt_blocks(rows, SOFTMAX_ROWS_PER_BLOCK),
                  SOFTMAX_ROWS_PER_BLOCK * DT_WARP, 0, dt_cuda_stream(dev))
        (dS, P, rows, T);
        DT_CUDA_LAUNCHED(dev);
        for (int r = 0; r < rep; r++) {
            const S *q = qkv + base + r * HS;
            S *dq = dqkv + base + r * HS;
            /* dq[t][d] += scale sum_j dS[t][j] k[j][d]: (HS x T) = k (HS x T) . dS-as-stored */
            gemm<S>(dev, __func__, CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T, scale, k, C3, HS, dS + r * TT, T, sP,
                    1.0f, dq, C3, sq, NKV);
            /* dk[j][d] += scale sum_t dS[t][j] q[t][d]: (HS x T) = q (HS x T) . dS-as-stored^T */
            gemm<S>(dev, __func__, CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T, scale, q, C3, sq, dS + r * TT, T, sP,
                    1.0f, dk, C3, HS, NKV);
        }
    }
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
