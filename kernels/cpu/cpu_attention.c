/*
 * cpu_attention.c - causal self-attention on the CPU: multi-head, grouped-query
 * (NKV key/value heads shared by groups of NH / NKV query heads) and the one-query
 * KV-cache decode step.
 *
 * One (batch, head) pair at a time per thread, with single-threaded sgemm for
 * Q K^T, P V and their gradients. The T x T score matrix is processed in row
 * blocks of BLK rows: block [r0, r1) only needs key columns [0, r1), so most of
 * the masked upper triangle is never computed. The forward saves the
 * probabilities P (B, NH, T, T) with zeros above the diagonal; the backward needs
 * one BLK x T block of dS per thread as scratch. The backward splits the work over
 * (batch, key/value head) and walks the query heads of a group in order, so the
 * shared dK and dV are summed in a fixed order by one thread.
 *
 * Packed sequences (kernels.h: pos): row t attends to keys [t - pos[t], t], its
 * document. That lower bound never decreases with t, so block [r0, r1) needs key
 * columns [k0, r1) with k0 = r0 - pos[r0]: the products start at column k0 (the
 * documents before the block's first are skipped), and each row's softmax covers
 * its own [lo, t]. Without pos, k0 = lo = 0: the plain causal path.
 */
#include <math.h>
#include <omp.h>

#include "kernels/cpu/cpu.h"

#define BLK 64

size_t dt_cpu_attention_saved_bytes(const dt_device_t *dev, int B, int T, int C, int NH, int NKV) {
    return sizeof(float) * (size_t)B * NH * T * T;
}

size_t dt_cpu_attention_scratch_bytes(const dt_device_t *dev, int B, int T, int C, int NH, int NKV) {
    size_t rows = T < BLK ? (size_t)T : BLK;
    return sizeof(float) * (size_t)(dev->nthreads > 0 ? dev->nthreads : 1) * rows * T;
}

/* The first key row t of a sequence attends to: its document's start with pos (the
 * sequence's (T) positions), else 0. */
static inline int key_lo(const int *pos, int t) { return pos ? t - pos[t] : 0; }

/* Softmax of rows [r0, r1) of S (row stride T) over their part lo <= j <= t, in
 * place; every other entry of the row, up to column T, becomes 0. */
static void causal_softmax_rows(float *S, const int *pos, int T, int r0, int r1) {
    for (int t = r0; t < r1; t++) {
        float *row = S + (size_t)t * T;
        int lo = key_lo(pos, t);
        dt_cpu_softmax_row(row + lo, t - lo + 1);
        memset(row, 0, sizeof(float) * (size_t)lo);
        memset(row + t + 1, 0, sizeof(float) * (size_t)(T - t - 1));
    }
}

void dt_cpu_attention_forward(dt_device_t *dev, void *out_, void *saved, const void *qkv_,
                              const int *pos, int B, int T, int C, int NH, int NKV) {
    float *out = out_, *att = saved;
    const float *qkv = qkv_;
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV, rep = NH / NKV;
    float scale = 1.0f / sqrtf((float)HS);
    int nt = (size_t)B * NH * T * T * HS < (1u << 18) ? 1 : dev->nthreads;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * C3 + h * HS;
        const float *k = qkv + (size_t)b * T * C3 + C + (h / rep) * HS;
        const float *v = k + KV;
        float *P = att + (size_t)bh * T * T;
        float *o = out + (size_t)b * T * C + h * HS;
        const int *pb = pos ? pos + (size_t)b * T : NULL;
        for (int r0 = 0; r0 < T; r0 += BLK) {
            int r1 = r0 + BLK < T ? r0 + BLK : T, k0 = key_lo(pb, r0);
            /* S[r0:r1, k0:r1] = scale * Q[r0:r1] K[k0:r1]^T */
            dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1 - k0, HS, scale,
                        q + (size_t)r0 * C3, C3, k + (size_t)k0 * C3, C3, 0.0f,
                        P + (size_t)r0 * T + k0, T);
            causal_softmax_rows(P, pb, T, r0, r1);
            /* O[r0:r1] = P[r0:r1, k0:r1] V[k0:r1] */
            dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, HS, r1 - k0, 1.0f,
                        P + (size_t)r0 * T + k0, T, v + (size_t)k0 * C3, C3, 0.0f,
                        o + (size_t)r0 * C, C);
        }
    }
}

void dt_cpu_attention_backward(dt_device_t *dev, void *dqkv_, void *scratch, const void *dout_,
                               const void *qkv_, const void *saved, const int *pos, int B, int T,
                               int C, int NH, int NKV) {
    float *dqkv = dqkv_;
    const float *dout = dout_, *qkv = qkv_, *att = saved;
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV, rep = NH / NKV;
    float scale = 1.0f / sqrtf((float)HS);
    int nt = (size_t)B * NH * T * T * HS < (1u << 18) ? 1 : dev->nthreads;
#pragma omp parallel num_threads(nt)
    {
        /* Threads beyond dev->nthreads never exist, so the scratch holds them all. */
        size_t rows = T < BLK ? (size_t)T : BLK;
        float *dS = (float *)scratch + (size_t)omp_get_thread_num() * rows * T;
#pragma omp for schedule(static)
        for (int bg = 0; bg < B * NKV; bg++) {
            int b = bg / NKV, g = bg % NKV;
            size_t row0 = (size_t)b * T * C3;
            const float *k = qkv + row0 + C + g * HS, *v = k + KV;
            float *dk = dqkv + row0 + C + g * HS, *dv = dk + KV;
            const int *pb = pos ? pos + (size_t)b * T : NULL;
            for (int h = g * rep; h < (g + 1) * rep; h++) {
                const float *q = qkv + row0 + h * HS;
                float *dq = dqkv + row0 + h * HS;
                const float *P = att + ((size_t)b * NH + h) * T * T;
                const float *dO = dout + (size_t)b * T * C + h * HS;
                for (int r0 = 0; r0 < T; r0 += BLK) {
                    int r1 = r0 + BLK < T ? r0 + BLK : T, m = r1 - r0;
                    int k0 = key_lo(pb, r0), n = r1 - k0; /* key columns [k0, r1) */
                    const float *Pb = P + (size_t)r0 * T + k0;
                    /* dV[k0:r1] += P[r0:r1, k0:r1]^T dO[r0:r1] */
                    dt_cpu_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, HS, m, 1.0f, Pb, T,
                                dO + (size_t)r0 * C, C, 1.0f, dv + (size_t)k0 * C3, C3);
                    /* dP[r0:r1, k0:r1] = dO[r0:r1] V[k0:r1]^T, into dS (rows r0..r1, stride T;
                     * column j - k0 for key j) */
                    dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, HS, 1.0f,
                                dO + (size_t)r0 * C, C, v + (size_t)k0 * C3, C3, 0.0f, dS, T);
                    /* dS = P * (dP - sum_j P dP), row by row over the row's keys [lo, t];
                     * 0 at the block's other columns. */
                    for (int t = r0; t < r1; t++) {
                        const float *p = P + (size_t)t * T + k0; /* columns j - k0, as dS */
                        float *d = dS + (size_t)(t - r0) * T;
                        int lo = key_lo(pb, t) - k0, hi = t - k0;
                        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                        for (int j = lo; j <= hi; j++) dot += p[j] * d[j];
#pragma omp simd
                        for (int j = lo; j <= hi; j++) d[j] = p[j] * (d[j] - dot);
                        for (int j = 0; j < lo; j++) d[j] = 0.0f;
                        for (int j = hi + 1; j < r1 - k0; j++) d[j] = 0.0f;
                    }
                    /* dQ[r0:r1] += scale dS[r0:r1, k0:r1] K[k0:r1] */
                    dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, n, scale, dS, T,
                                k + (size_t)k0 * C3, C3, 1.0f, dq + (size_t)r0 * C3, C3);
                    /* dK[k0:r1] += scale dS[r0:r1, k0:r1]^T Q[r0:r1] */
                    dt_cpu_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, HS, m, scale, dS, T,
                                q + (size_t)r0 * C3, C3, 1.0f, dk + (size_t)k0 * C3, C3);
                }
            }
        }
    }
}

/* One query per (sequence, head) against the cached keys and values 0..pos, in two
 * passes over the cache (the maximum score, then the exponentials summed into the
 * output row), so no workspace is needed whatever max_T is. */
void dt_cpu_attention_decode(dt_device_t *dev, void *out_, const void *q_, int q_stride,
                             const void *kv_, int max_T, int pos, int B, int C, int NH, int NKV) {
    float *out = out_;
    const float *qs = q_, *kv = kv_;
    int HS = C / NH, KV = NKV * HS, rep = NH / NKV;
    float scale = 1.0f / sqrtf((float)HS);
    int nt = (size_t)B * NH * (pos + 1) * HS < (1u << 16) ? 1 : dev->nthreads;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qs + (size_t)b * q_stride + h * HS;
        const float *k0 = kv + (size_t)b * max_T * 2 * KV + (h / rep) * HS;
        float *o = out + (size_t)b * C + h * HS;
        float mx = -INFINITY;
        for (int t = 0; t <= pos; t++) {
            const float *k = k0 + (size_t)t * 2 * KV;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int i = 0; i < HS; i++) s += q[i] * k[i];
            s *= scale;
            mx = s > mx ? s : mx;
        }
        float sum = 0.0f;
        memset(o, 0, sizeof(float) * (size_t)HS);
        for (int t = 0; t <= pos; t++) {
            const float *k = k0 + (size_t)t * 2 * KV, *v = k + KV;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int i = 0; i < HS; i++) s += q[i] * k[i];
            float e = dt_cpu_expf(s * scale - mx);
            sum += e;
#pragma omp simd
            for (int i = 0; i < HS; i++) o[i] += e * v[i];
        }
        float inv = 1.0f / sum;
#pragma omp simd
        for (int i = 0; i < HS; i++) o[i] *= inv;
    }
}
