/*
 * cpu_attention.c - causal multi-head self-attention on the CPU.
 *
 * One (batch, head) pair at a time per thread, with single-threaded sgemm for
 * Q K^T, P V and their gradients. The T x T score matrix is processed in row
 * blocks of BLK rows: block [r0, r1) only needs key columns [0, r1), so most of
 * the masked upper triangle is never computed. The forward saves the
 * probabilities P (B, NH, T, T) with zeros above the diagonal; the backward needs
 * one BLK x T block of dS per thread as scratch.
 */
#include <math.h>
#include <omp.h>

#include "kernels/cpu/cpu.h"

#define BLK 64

size_t dt_cpu_attention_saved_bytes(const dt_device_t *dev, int B, int T, int C, int NH) {
    return sizeof(float) * (size_t)B * NH * T * T;
}

size_t dt_cpu_attention_scratch_bytes(const dt_device_t *dev, int B, int T, int C, int NH) {
    size_t rows = T < BLK ? (size_t)T : BLK;
    return sizeof(float) * (size_t)(dev->nthreads > 0 ? dev->nthreads : 1) * rows * T;
}

/* Softmax of rows [r0, r1) of S (row stride T) over their causal part j <= t, in
 * place; entries right of the diagonal, up to column T, become 0. */
static void causal_softmax_rows(float *S, int T, int r0, int r1) {
    for (int t = r0; t < r1; t++) {
        float *row = S + (size_t)t * T;
        dt_cpu_softmax_row(row, t + 1);
        memset(row + t + 1, 0, sizeof(float) * (size_t)(T - t - 1));
    }
}

void dt_cpu_attention_forward(dt_device_t *dev, void *out_, void *saved, const void *qkv_,
                              int B, int T, int C, int NH) {
    float *out = out_, *att = saved;
    const float *qkv = qkv_;
    int HS = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)HS);
    int nt = (size_t)B * NH * T * T * HS < (1u << 18) ? 1 : dev->nthreads;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * C3 + h * HS;
        const float *k = q + C;
        const float *v = q + 2 * C;
        float *P = att + (size_t)bh * T * T;
        float *o = out + (size_t)b * T * C + h * HS;
        for (int r0 = 0; r0 < T; r0 += BLK) {
            int r1 = r0 + BLK < T ? r0 + BLK : T;
            /* S[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T */
            dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, HS, scale,
                        q + (size_t)r0 * C3, C3, k, C3, 0.0f, P + (size_t)r0 * T, T);
            causal_softmax_rows(P, T, r0, r1);
            /* O[r0:r1] = P[r0:r1, 0:r1] V[0:r1] */
            dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, HS, r1, 1.0f,
                        P + (size_t)r0 * T, T, v, C3, 0.0f, o + (size_t)r0 * C, C);
        }
    }
}

void dt_cpu_attention_backward(dt_device_t *dev, void *dqkv_, void *scratch, const void *dout_,
                               const void *qkv_, const void *saved, int B, int T, int C,
                               int NH) {
    float *dqkv = dqkv_;
    const float *dout = dout_, *qkv = qkv_, *att = saved;
    int HS = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)HS);
    int nt = (size_t)B * NH * T * T * HS < (1u << 18) ? 1 : dev->nthreads;
#pragma omp parallel num_threads(nt)
    {
        /* Threads beyond dev->nthreads never exist, so the scratch holds them all. */
        size_t rows = T < BLK ? (size_t)T : BLK;
        float *dS = (float *)scratch + (size_t)omp_get_thread_num() * rows * T;
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            size_t base = (size_t)b * T * C3 + h * HS;
            const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + base, *dk = dq + C, *dv = dq + 2 * C;
            const float *P = att + (size_t)bh * T * T;
            const float *dO = dout + (size_t)b * T * C + h * HS;
            for (int r0 = 0; r0 < T; r0 += BLK) {
                int r1 = r0 + BLK < T ? r0 + BLK : T, m = r1 - r0;
                const float *Pb = P + (size_t)r0 * T;
                float *dSb = dS; /* rows r0..r1 of dS, stride T */
                /* dV[0:r1] += P[r0:r1, 0:r1]^T dO[r0:r1] */
                dt_cpu_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, HS, m, 1.0f, Pb, T,
                            dO + (size_t)r0 * C, C, 1.0f, dv, C3);
                /* dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T */
                dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, HS, 1.0f,
                            dO + (size_t)r0 * C, C, v, C3, 0.0f, dSb, T);
                /* dS = P * (dP - sum_j P dP), row by row; 0 right of the diagonal. */
                for (int t = r0; t < r1; t++) {
                    const float *p = P + (size_t)t * T;
                    float *d = dS + (size_t)(t - r0) * T;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int j = 0; j <= t; j++) dot += p[j] * d[j];
#pragma omp simd
                    for (int j = 0; j <= t; j++) d[j] = p[j] * (d[j] - dot);
                    for (int j = t + 1; j < r1; j++) d[j] = 0.0f;
                }
                /* dQ[r0:r1] += scale dS[r0:r1, 0:r1] K[0:r1] */
                dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, r1, scale, dSb, T,
                            k, C3, 1.0f, dq + (size_t)r0 * C3, C3);
                /* dK[0:r1] += scale dS[r0:r1, 0:r1]^T Q[r0:r1] */
                dt_cpu_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, HS, m, scale, dSb, T,
                            q + (size_t)r0 * C3, C3, 1.0f, dk, C3);
            }
        }
    }
}
