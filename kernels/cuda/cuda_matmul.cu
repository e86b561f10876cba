/*
 * cuda_matmul.cu - matmul_forward/backward through cuBLASLt, plus our own
 * deterministic kernel for the bias gradient.
 *
 * Row-major vs column-major: cuBLAS(Lt) is column-major, and a row-major (R, C)
 * matrix is the column-major (C, R) matrix, its transpose. So with m, n, k in
 * cuBLAS's sense:
 *   forward  out (N,OC) = inp (N,C) @ W^T       is  out^T (OC,N)  = W^T[T] . inp^T       m=OC n=N  k=C
 *   dinp     (N,C)     += dout (N,OC) @ W       is  dinp^T (C,N) += W^T . dout^T         m=C  n=N  k=OC
 *   dweight  (OC,C)    += dout^T @ inp (N,C)    is  dW^T (C,OC)  += inp^T . dout^T[T]    m=C  n=OC k=N
 * where X^T is how the row-major X already sits in memory and [T] asks cuBLAS to
 * transpose. The bias is added by the BIAS epilogue (a vector over D's rows = OC).
 *
 * Inputs bf16 (or fp32), accumulation and scaling in fp32 (CUBLAS_COMPUTE_32F; no
 * TF32 for the fp32 table). Split-K partial sums, when cuBLASLt chooses them, are
 * kept in fp32 (reduction scheme COMPUTE_TYPE only), so a bf16 result is rounded
 * once. Plans (descriptor, layouts, heuristic's algorithm) are cached per shape
 * and pointer alignment; when the heuristic finds nothing (unusual alignments) the
 * product goes through cublasGemmEx instead.
 */
#include "kernels/cuda/cuda_common.cuh"

#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_vec.cuh"

#define MM_CACHE_MAX 64
#define DB_ROWG 8 /* warps per dbias block, each summing every DB_ROWG-th row */

typedef struct mm_key {
    cudaDataType_t type;
    int transa, transb;
    int m, n, k, lda, ldb, ldd;
    int has_bias, beta_nonzero;
    int align_a, align_b, align_d, align_bias;
} mm_key;

typedef struct mm_plan {
    mm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    int have_algo; /* 0: the heuristic found none; use cublasGemmEx */
} mm_plan;

struct dt_cuda_mm_cache {
    mm_plan plans[MM_CACHE_MAX];
    int n;
    int next_evict;
};

/* Alignment in bytes that cuBLASLt may assume for p: the largest power of two
 * dividing the address, at most 256. */
static int ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 1;
    while (al < 256 && (a & (uintptr_t)(2 * al - 1)) == 0) al *= 2;
    return al;
}

static void plan_release(mm_plan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
    memset(p, 0, sizeof *p);
}

void dt_cuda_matmul_cache_free(dt_cuda_impl *impl) {
    if (!impl || !impl->mm_cache) return;
    for (int i = 0; i < impl->mm_cache->n; i++) plan_release(&impl->mm_cache->plans[i]);
    free(impl->mm_cache);
    impl->mm_cache = NULL;
}

/* Builds the descriptor, layouts and algorithm for key; returns a cuBLAS status. */
static cublasStatus_t plan_build(dt_cuda_impl *c, mm_plan *p, const mm_key *key, const void *bias) {
    cublasStatus_t s;
    cublasLtMatmulPreference_t pref = NULL;
    memset(p, 0, sizeof *p);
    p->key = *key;
    cublasOperation_t ta = key->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = key->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if ((s = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) != CUBLAS_STATUS_SUCCESS) goto out_release;
    if ((s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) != CUBLAS_STATUS_SUCCESS) goto out_release;
    if ((s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) != CUBLAS_STATUS_SUCCESS) goto out_release;
    if (key->has_bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        if ((s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)) != CUBLAS_STATUS_SUCCESS) goto out_release;
        /* The heuristic reads the pointer's alignment. */
        if ((s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)) != CUBLAS_STATUS_SUCCESS) goto out_release;
    }
    /* Column-major storage: A is (m,k) or, transposed, (k,m); B is (k,n) or (n,k). */
    if ((s = cublasLtMatrixLayoutCreate(&p->la, key->type, key->transa ? key->k : key->m, key->transa ? key->m : key->k, key->lda)) != CUBLAS_STATUS_SUCCESS) goto out_release;
    if ((s = cublasLtMatrixLayoutCreate(&p->lb, key->type, key->transb ? key->n : key->k, key->transb ? key->k : key->n, key->ldb)) != CUBLAS_STATUS_SUCCESS) goto out_release;
    if ((s = cublasLtMatrixLayoutCreate(&p->ld, key->type, key->m, key->n, key->ldd)) != CUBLAS_STATUS_SUCCESS) goto out_release;

    if ((s = cublasLtMatmulPreferenceCreate(&pref)) != CUBLAS_STATUS_SUCCESS) goto out_release;
    {
        uint64_t ws = c->workspace_bytes;
        if ((s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) != CUBLAS_STATUS_SUCCESS)
            goto out_release;
    }
    {
        uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE; /* split-K partials in fp32 */
        uint32_t al_a = (uint32_t)key->align_a, al_b = (uint32_t)key->align_b, al_d = (uint32_t)key->align_d;
        if ((s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof reduction)) != CUBLAS_STATUS_SUCCESS ||
            (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a)) != CUBLAS_STATUS_SUCCESS ||
            (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b)) != CUBLAS_STATUS_SUCCESS ||
            (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d)) != CUBLAS_STATUS_SUCCESS ||
            (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d)) != CUBLAS_STATUS_SUCCESS)
            goto out_release;
    }
    if (!c->matmul_gemmex) {
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        memset(&res, 0, sizeof res);
        s = cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->la, p->lb, p->ld, p->ld, pref, 1, &res, &found);
        if (s == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
            p->algo = res.algo;
            p->have_algo = 1;
        } else {
            DT_LOG_DEBUG("cuBLASLt has no algorithm for m=%d n=%d k=%d (alignments %d/%d/%d, bias %d); using cublasGemmEx",
                         key->m, key->n, key->k, key->align_a, key->align_b, key->align_d, key->align_bias);
        }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return CUBLAS_STATUS_SUCCESS;

out_release:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    plan_release(p);
    return s;
}

static mm_plan *plan_get(dt_device_t *dev, const mm_key *key, const void *bias, cublasStatus_t *st) {
    dt_cuda_impl *c = dt_cuda(dev);
    if (!c->mm_cache) c->mm_cache = (struct dt_cuda_mm_cache *)dt_xcalloc(1, sizeof *c->mm_cache);
    struct dt_cuda_mm_cache *mc = c->mm_cache;
    for (int i = 0; i < mc->n; i++)
        if (memcmp(&mc->plans[i].key, key, sizeof *key) == 0) return &mc->plans[i];
    mm_plan *p;
    if (mc->n < MM_CACHE_MAX) {
        p = &mc->plans[mc->n++];
    } else {
        p = &mc->plans[mc->next_evict];
        mc->next_evict = (mc->next_evict + 1) % MM_CACHE_MAX;
        plan_release(p);
    }
    *st = plan_build(c, p, key, bias);
    if (*st != CUBLAS_STATUS_SUCCESS) {
        /* leave an empty slot at the end rather than a half-built plan */
        *p = mc->plans[--mc->n];
        memset(&mc->plans[mc->n], 0, sizeof mc->plans[mc->n]);
        return NULL;
    }
    return p;
}

/* D (m,n) [col-major, ld ldd] = bias broadcast along columns; for the GemmEx path. */
template <typename T> __global__ void bias_fill_kernel(T *d, const T *bias, int m, int n, int ldd) {
    size_t total = (size_t)m * n;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t col = i / (size_t)m, row = i % (size_t)m;
        d[col * ldd + row] = bias[row];
    }
}

/* D = op(A) op(B) (+ bias over rows) (+ beta D), column-major; bias only with beta 0. */
template <typename T>
static void gemm(dt_device_t *dev, const char *op, int transa, int transb, int m, int n, int k, const T *A,
                 int lda, const T *B, int ldb, T *D, int ldd, const T *bias, float beta) {
    dt_cuda_impl *c = dt_cuda(dev);
    if (m < 0 || n < 0 || k < 0) {
        dt_cuda_note_blas(dev, op, CUBLAS_STATUS_INVALID_VALUE);
        return;
    }
    if (m == 0 || n == 0) return;
    cudaDataType_t type = sizeof(T) == 2 ? CUDA_R_16BF : CUDA_R_32F;
    /* cuBLASLt's BIAS epilogue wants a 16-byte aligned bias and has no preference
     * attribute to say otherwise (llm.c requires the same): a bias packed at another
     * offset is written into D first and accumulated with beta = 1. */
    int filled = 0;
    if (bias && ptr_align(bias) < 16) {
        DT_LAUNCH(bias_fill_kernel<T>, dt_cuda_grid(dev, (size_t)m * n, 256), 256, 0, c->stream)(D, (const T *)bias,
                                                                                              m, n, ldd);
        dt_cuda_note_launch(dev, op);
        bias = NULL, beta = 1.0f, filled = 1;
    }
    mm_key key;
    memset(&key, 0, sizeof key); /* compared with memcmp: no stray padding bytes */
    key.type = type;
    key.transa = transa;
    key.transb = transb;
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldd = ldd;
    key.has_bias = bias != NULL;
    key.beta_nonzero = beta != 0.0f;
    key.align_a = ptr_align(A), key.align_b = ptr_align(B), key.align_d = ptr_align(D);
    key.align_bias = bias ? ptr_align(bias) : 0;
    float alpha = 1.0f;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    mm_plan *p = plan_get(dev, &key, bias, &s);
    if (!p) {
        dt_cuda_note_blas(dev, op, s);
        return;
    }
    if (p->have_algo) {
        if (bias) {
            s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
            if (s != CUBLAS_STATUS_SUCCESS) {
                dt_cuda_note_blas(dev, op, s);
                return;
            }
        }
        s = cublasLtMatmul(c->lt, p->desc, &alpha, A, p->la, B, p->lb, &beta, D, p->ld, D, p->ld, &p->algo,
                           c->workspace, c->workspace_bytes, c->stream);
        if (s == CUBLAS_STATUS_SUCCESS) return;
        /* Declined at run time (an algorithm the heuristic offered but this call's
         * pointers or sizes do not suit): cuBLAS's GEMM below does it, from now on too. */
        DT_LOG_WARN("%s: cuBLASLt declined a %dx%dx%d %s GEMM (%s); using cublasGemmEx for this shape", op, m, n, k,
                    sizeof(T) == 2 ? "bf16" : "fp32", cublasGetStatusString(s));
        p->have_algo = 0;
    }
    if (bias && !filled) {
        DT_LAUNCH(bias_fill_kernel<T>, dt_cuda_grid(dev, (size_t)m * n, 256), 256, 0, c->stream)(D, (const T *)bias,
                                                                                              m, n, ldd);
        dt_cuda_note_launch(dev, op);
        beta = 1.0f;
    }
    s = cublasGemmEx(c->blas, transa ? CUBLAS_OP_T : CUBLAS_OP_N, transb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha,
                     A, type, lda, B, type, ldb, &beta, D, type, ldd, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    dt_cuda_note_blas(dev, op, s);
}

/* dbias (OC) += column sums of dout (N, OC), in two deterministic stages.
 * Stage 1: the rows are cut into R chunks of `chunk` rows; block (x, y) sums chunk y
 * of 32 * V columns: each of its DB_ROWG warps takes every DB_ROWG-th row, each lane V
 * adjacent columns (one 16-byte pack when V > 1), in fp32; warp 0 then adds the
 * DB_ROWG sums in order and writes partial[y][col].
 * Stage 2: one thread per column adds the R partial sums in order to dbias.
 * Partial sums live in the cuBLASLt workspace: every user of it runs on the device's
 * one stream, so the dweight matmul before is done with it. */
template <typename T, int V>
__global__ void dbias_partial_kernel(float *partial, const T *dout, int N, int OC, int chunk) {
    __shared__ float sh[DB_ROWG][32 * V];
    int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
    int col0 = (blockIdx.x * 32 + lane) * V;
    int r0 = blockIdx.y * chunk, r1 = r0 + chunk < N ? r0 + chunk : N;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; k++) acc[k] = 0.0f;
    if (col0 < OC) {
        for (int r = r0 + g; r < r1; r += DB_ROWG) {
            const T *row = dout + (size_t)r * OC + col0;
            if (V > 1) {
                dt_pack<T> p = dt_pack_load(row);
#pragma unroll
                for (int k = 0; k < V; k++) acc[k] += dt_ld(p.e[k]);
            } else {
                acc[0] += dt_ld(row[0]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < V; k++) sh[g][lane * V + k] = acc[k];
    __syncthreads();
    if (g == 0 && col0 < OC) {
#pragma unroll
        for (int k = 0; k < V; k++) {
            float t = 0.0f;
            for (int j = 0; j < DB_ROWG; j++) t += sh[j][lane * V + k];
            partial[(size_t)blockIdx.y * OC + col0 + k] = t;
        }
    }
}

template <typename T> __global__ void dbias_final_kernel(T *dbias, const float *partial, int OC, int R) {
    for (int col = blockIdx.x * blockDim.x + threadIdx.x; col < OC; col += gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int r = 0; r < R; r++) s += partial[(size_t)r * OC + col];
        dbias[col] = dt_st<T>(dt_ld(dbias[col]) + s);
    }
}

template <typename T> static void dbias_accumulate(dt_device_t *dev, T *dbias, const T *dout, int N, int OC) {
    dt_cuda_impl *c = dt_cuda(dev);
    if (OC <= 0 || N <= 0) return;
    /* about 256 rows per chunk, at most 256 chunks, and R * OC floats must fit the
     * workspace: a function of the shape only, so the summation order is too */
    size_t max_r = c->workspace_bytes / ((size_t)OC * sizeof(float));
    int R = (N + 255) / 256;
    if (R > 256) R = 256;
    if ((size_t)R > max_r) R = (int)(max_r ? max_r : 1);
    int chunk = (N + R - 1) / R;
    R = (N + chunk - 1) / chunk;
    float *partial = (float *)c->workspace;
    constexpr int V = dt_pack<T>::N;
    if (OC % V == 0 && dt_cuda_aligned16(dout)) {
        dim3 grid((unsigned)((OC / V + 31) / 32), (unsigned)R);
        DT_LAUNCH((dbias_partial_kernel<T, V>), grid, 32 * DB_ROWG, 0, c->stream)(partial, dout, N, OC, chunk);
    } else {
        dim3 grid((unsigned)((OC + 31) / 32), (unsigned)R);
        DT_LAUNCH((dbias_partial_kernel<T, 1>), grid, 32 * DB_ROWG, 0, c->stream)(partial, dout, N, OC, chunk);
    }
    dt_cuda_note_launch(dev, "matmul_backward");
    DT_LAUNCH(dbias_final_kernel<T>, dt_cuda_grid(dev, (size_t)OC, 256), 256, 0, c->stream)(dbias, partial, OC, R);
    dt_cuda_note_launch(dev, "matmul_backward");
}

template <typename T>
static void matmul_forward(dt_device_t *dev, void *out, const void *inp, const void *weight, const void *bias, int N,
                           int C, int OC) {
    gemm<T>(dev, "matmul_forward", 1, 0, OC, N, C, (const T *)weight, C, (const T *)inp, C, (T *)out, OC,
            (const T *)bias, 0.0f);
}

template <typename T>
static void matmul_backward(dt_device_t *dev, void *dinp, void *dweight, void *dbias, const void *dout,
                            const void *inp, const void *weight, int N, int C, int OC) {
    if (dinp)
        gemm<T>(dev, "matmul_backward", 0, 0, C, N, OC, (const T *)weight, C, (const T *)dout, OC, (T *)dinp, C, NULL,
                1.0f);
    if (dweight)
        gemm<T>(dev, "matmul_backward", 0, 1, C, OC, N, (const T *)inp, C, (const T *)dout, OC, (T *)dweight, C,
                NULL, 1.0f);
    if (dbias) dbias_accumulate<T>(dev, (T *)dbias, (const T *)dout, N, OC);
}

void dt_cuda_fill_matmul_ops(dt_ops_t *ops, dt_dtype_t dtype) {
    if (dtype == DT_DTYPE_BF16) {
        ops->matmul_forward = matmul_forward<dt_bf16>;
        ops->matmul_backward = matmul_backward<dt_bf16>;
    } else {
        ops->matmul_forward = matmul_forward<float>;
        ops->matmul_backward = matmul_backward<float>;
    }
}
