/*
 * cpu_attention_block.c - attention of a rank's local query rows against one
 * key/value block at a time (kernels.h: context parallelism, ring attention): the
 * forward merges each block into a running (output, log-sum-exp), the backward
 * recomputes the probabilities from the final log-sum-exp as flash-attention's does.
 *
 * The forward splits the work over (batch, head), the backward over (batch,
 * key/value head) walking the group's query heads in order (as cpu_attention.c), so
 * every sum has one order whatever the thread count, and each thread calls
 * single-threaded sgemm on its own tiles. Query rows go in tiles of BLK; a tile's
 * products cover only the key columns [j0, j1) from the first to the last key whose
 * global index lies in the tile's envelope [min qlo, max qidx] (a tile with none,
 * say a block wholly in its future, is skipped), and each entry is masked by its own
 * row's [qlo, qidx]. Scratch per thread: two BLK x Tk score tiles, a BLK x HS output
 * tile and two BLK row statistics.
 */
#include <limits.h>
#include <math.h>
#include <omp.h>

#include "kernels/cpu/cpu.h"

#define BLK 64

static inline int tile_rows(int Tq) { return Tq < BLK ? Tq : BLK; }

/* Floats of one thread's scratch. */
static inline size_t thread_floats(int Tq, int Tk, int HS) {
    return (size_t)tile_rows(Tq) * (2 * (size_t)Tk + (size_t)HS + 2);
}

size_t dt_cpu_attention_block_scratch_bytes(const dt_device_t *dev, int B, int Tq, int Tk, int C, int NH,
                                            int NKV) {
    return sizeof(float) * (size_t)(dev->nthreads > 0 ? dev->nthreads : 1) * thread_floats(Tq, Tk, C / NH);
}

/* Threads for n multiply-adds of the products: one below a size where OpenMP's
 * start costs more than it saves. */
static inline int threads_for(const dt_device_t *dev, size_t n) { return n < (1u << 18) ? 1 : dev->nthreads; }

static inline int sees(int lo, int hi, int k) { return lo <= k && k <= hi; }

/* [*j0, *j1): the key columns from the first to the last whose index lies in the
 * envelope of the rows [r0, r1) (qidx, qlo, kidx of one sequence); empty when none. */
static void tile_keys(const int *qidx, const int *qlo, const int *kidx, int r0, int r1, int Tk, int *j0,
                      int *j1) {
    int lo = INT_MAX, hi = INT_MIN;
    for (int t = r0; t < r1; t++) {
        lo = qlo[t] < lo ? qlo[t] : lo;
        hi = qidx[t] > hi ? qidx[t] : hi;
    }
    int a = 0, b = Tk;
    while (a < Tk && !sees(lo, hi, kidx[a])) a++;
    while (b > a && !sees(lo, hi, kidx[b - 1])) b--;
    *j0 = a, *j1 = b;
}

void dt_cpu_attention_kv_pack(dt_device_t *dev, void *kv_, const void *qkv_, int B, int T, int C, int NH,
                              int NKV) {
    float *kv = kv_;
    const float *qkv = qkv_;
    int KV = NKV * (C / NH), C3 = C + 2 * KV;
    for (size_t r = 0; r < (size_t)B * T; r++)
        memcpy(kv + r * 2 * KV, qkv + r * C3 + C, sizeof(float) * 2 * (size_t)KV);
}

void dt_cpu_attention_block_forward(dt_device_t *dev, float *o, float *lse, void *scratch, const void *qkv_,
                                    const void *kv_, const int *qidx, const int *qlo, const int *kidx,
                                    int first, int B, int Tq, int Tk, int C, int NH, int NKV) {
    const float *qkv = qkv_, *kv = kv_;
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV, KV2 = 2 * KV, rep = NH / NKV, rows = tile_rows(Tq);
    float scale = 1.0f / sqrtf((float)HS);
    int nt = threads_for(dev, (size_t)B * NH * Tq * Tk * HS);
#pragma omp parallel num_threads(nt)
    {
        float *S = (float *)scratch + (size_t)omp_get_thread_num() * thread_floats(Tq, Tk, HS);
        float *Ob = S + 2 * (size_t)rows * Tk, *mx = Ob + (size_t)rows * HS, *sum = mx + rows;
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            const float *q = qkv + (size_t)b * Tq * C3 + h * HS;
            const float *k = kv + (size_t)b * Tk * KV2 + (h / rep) * HS, *v = k + KV;
            const int *qi = qidx + (size_t)b * Tq, *ql = qlo + (size_t)b * Tq, *ki = kidx + (size_t)b * Tk;
            float *ob = o + (size_t)b * Tq * C + h * HS, *lb = lse + (size_t)bh * Tq;
            if (first)
                for (int t = 0; t < Tq; t++) {
                    memset(ob + (size_t)t * C, 0, sizeof(float) * (size_t)HS);
                    lb[t] = -INFINITY;
                }
            for (int r0 = 0; r0 < Tq; r0 += BLK) {
                int r1 = r0 + BLK < Tq ? r0 + BLK : Tq, m = r1 - r0, j0, j1;
                tile_keys(qi, ql, ki, r0, r1, Tk, &j0, &j1);
                if (j0 >= j1) continue;
                int n = j1 - j0;
                /* S (m, n) = scale Q[r0:r1] K[j0:j1]^T */
                dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, HS, scale, q + (size_t)r0 * C3, C3,
                             k + (size_t)j0 * KV2, KV2, 0.0f, S, n);
                /* Each row's exponentials against its own maximum over the keys it
                 * sees, 0 elsewhere (a row that sees none: all 0, maximum -inf). */
                for (int t = r0; t < r1; t++) {
                    float *row = S + (size_t)(t - r0) * n;
                    int lo = ql[t], hi = qi[t];
                    const int *kj = ki + j0;
                    float m1 = -INFINITY, s1 = 0.0f;
                    for (int j = 0; j < n; j++)
                        if (sees(lo, hi, kj[j]) && row[j] > m1) m1 = row[j];
                    mx[t - r0] = m1, sum[t - r0] = 0.0f;
                    if (m1 == -INFINITY) {
                        memset(row, 0, sizeof(float) * (size_t)n);
                        continue;
                    }
#pragma omp simd reduction(+ : s1)
                    for (int j = 0; j < n; j++) {
                        float e = dt_cpu_expf(row[j] - m1);
                        row[j] = sees(lo, hi, kj[j]) ? e : 0.0f;
                        s1 += row[j];
                    }
                    sum[t - r0] = s1;
                }
                /* Ob (m, HS) = exp(S - max) V[j0:j1], unnormalised */
                dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, n, 1.0f, S, n,
                             v + (size_t)j0 * KV2, KV2, 0.0f, Ob, HS);
                /* The merge: with the block's lse_b = max + log(sum), its normalised
                 * output times exp(lse_b - new) is Ob exp(max - new). */
                for (int t = r0; t < r1; t++) {
                    float m1 = mx[t - r0];
                    if (m1 == -INFINITY) continue; /* no key of this block: unchanged */
                    float l0 = lb[t], l1 = m1 + logf(sum[t - r0]), *orow = ob + (size_t)t * C;
                    const float *brow = Ob + (size_t)(t - r0) * HS;
                    if (l0 == -INFINITY) {
                        float c = 1.0f / sum[t - r0];
#pragma omp simd
                        for (int i = 0; i < HS; i++) orow[i] = brow[i] * c;
                        lb[t] = l1;
                        continue;
                    }
                    float l = (l0 > l1 ? l0 : l1) + log1pf(expf(-fabsf(l0 - l1)));
                    float a = expf(l0 - l), c = expf(m1 - l);
#pragma omp simd
                    for (int i = 0; i < HS; i++) orow[i] = orow[i] * a + brow[i] * c;
                    lb[t] = l;
                }
            }
        }
    }
}

void dt_cpu_attention_block_finish(dt_device_t *dev, void *out, const float *o, int B, int Tq, int C) {
    memcpy(out, o, sizeof(float) * (size_t)B * Tq * C);
}

void dt_cpu_attention_block_delta(dt_device_t *dev, float *delta, const void *dout_, const void *out_, int B,
                                  int Tq, int C, int NH) {
    const float *dout = dout_, *out = out_;
    int HS = C / NH;
#pragma omp parallel for num_threads(dev->nthreads) schedule(static) if ((size_t)B * Tq * C > 65536)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        for (int t = 0; t < Tq; t++) {
            const float *d = dout + ((size_t)b * Tq + t) * C + h * HS, *y = out + ((size_t)b * Tq + t) * C + h * HS;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int i = 0; i < HS; i++) s += d[i] * y[i];
            delta[(size_t)bh * Tq + t] = s;
        }
    }
}

void dt_cpu_attention_block_backward(dt_device_t *dev, void *dqkv_, float *dkv, void *scratch, const void *dout_,
                                     const void *qkv_, const void *kv_, const float *lse, const float *delta,
                                     const int *qidx, const int *qlo, const int *kidx, int B, int Tq, int Tk,
                                     int C, int NH, int NKV) {
    float *dqkv = dqkv_;
    const float *dout = dout_, *qkv = qkv_, *kv = kv_;
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV, KV2 = 2 * KV, rep = NH / NKV, rows = tile_rows(Tq);
    float scale = 1.0f / sqrtf((float)HS);
    int nt = threads_for(dev, (size_t)B * NH * Tq * Tk * HS);
#pragma omp parallel num_threads(nt)
    {
        float *P = (float *)scratch + (size_t)omp_get_thread_num() * thread_floats(Tq, Tk, HS);
        float *dS = P + (size_t)rows * Tk;
#pragma omp for schedule(static)
        for (int bg = 0; bg < B * NKV; bg++) {
            int b = bg / NKV, g = bg % NKV;
            const float *k = kv + (size_t)b * Tk * KV2 + g * HS, *v = k + KV;
            float *dk = dkv + (size_t)b * Tk * KV2 + g * HS, *dv = dk + KV;
            const int *qi = qidx + (size_t)b * Tq, *ql = qlo + (size_t)b * Tq, *ki = kidx + (size_t)b * Tk;
            for (int h = g * rep; h < (g + 1) * rep; h++) {
                const float *q = qkv + (size_t)b * Tq * C3 + h * HS, *dO = dout + (size_t)b * Tq * C + h * HS;
                const float *lb = lse + ((size_t)b * NH + h) * Tq, *db = delta + ((size_t)b * NH + h) * Tq;
                float *dq = dqkv + (size_t)b * Tq * C3 + h * HS;
                for (int r0 = 0; r0 < Tq; r0 += BLK) {
                    int r1 = r0 + BLK < Tq ? r0 + BLK : Tq, m = r1 - r0, j0, j1;
                    tile_keys(qi, ql, ki, r0, r1, Tk, &j0, &j1);
                    if (j0 >= j1) continue;
                    int n = j1 - j0;
                    /* P (m, n) = exp(scale Q K^T - lse) on the keys each row sees, else 0 */
                    dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, HS, scale, q + (size_t)r0 * C3,
                                 C3, k + (size_t)j0 * KV2, KV2, 0.0f, P, n);
                    /* dP (m, n) = dO V^T, into dS */
                    dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, HS, 1.0f, dO + (size_t)r0 * C, C,
                                 v + (size_t)j0 * KV2, KV2, 0.0f, dS, n);
                    for (int t = r0; t < r1; t++) {
                        float *p = P + (size_t)(t - r0) * n, *d = dS + (size_t)(t - r0) * n;
                        int lo = ql[t], hi = qi[t];
                        const int *kj = ki + j0;
                        /* lse -inf: the row saw no key anywhere, so none here either */
                        float l = lb[t] == -INFINITY ? INFINITY : lb[t], dl = db[t];
#pragma omp simd
                        for (int j = 0; j < n; j++) {
                            float e = sees(lo, hi, kj[j]) ? dt_cpu_expf(p[j] - l) : 0.0f;
                            p[j] = e;
                            d[j] = e * (d[j] - dl);
                        }
                    }
                    /* dV[j0:j1] += P^T dO */
                    dt_cpu_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, HS, m, 1.0f, P, n,
                                 dO + (size_t)r0 * C, C, 1.0f, dv + (size_t)j0 * KV2, KV2);
                    /* dQ[r0:r1] += scale dS K */
                    dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, n, scale, dS, n,
                                 k + (size_t)j0 * KV2, KV2, 1.0f, dq + (size_t)r0 * C3, C3);
                    /* dK[j0:j1] += scale dS^T Q */
                    dt_cpu_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, HS, m, scale, dS, n,
                                 q + (size_t)r0 * C3, C3, 1.0f, dk + (size_t)j0 * KV2, KV2);
                }
            }
        }
    }
}

void dt_cpu_attention_kv_grad_add(dt_device_t *dev, void *dqkv_, const float *dkv, int B, int T, int C, int NH,
                                  int NKV) {
    float *dqkv = dqkv_;
    int KV2 = 2 * NKV * (C / NH), C3 = C + KV2;
    for (size_t r = 0; r < (size_t)B * T; r++) {
        float *d = dqkv + r * C3 + C;
        const float *s = dkv + r * KV2;
#pragma omp simd
        for (int i = 0; i < KV2; i++) d[i] += s[i];
    }
}
