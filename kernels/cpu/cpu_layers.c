/*
 * cpu_layers.c - CPU forward and backward of the layer ops: token + position
 * embedding, layernorm, matmul with bias (OpenBLAS sgemm), GELU, ReLU, residual.
 *
 * Work is split statically over dev->nthreads OpenMP threads; each thread owns a
 * block of rows or of channels and writes only there, so no reduction order
 * depends on scheduling. Small problems run on one thread (the split depends on
 * the shape only, so results stay reproducible).
 */
#include <math.h>
#include <omp.h>

#include "kernels/cpu/cpu.h"

#define LN_EPS 1e-5f
/* Below this many multiply-adds (or elements) a parallel region costs more than it saves. */
#define PAR_MIN_FLOPS (1 << 18)
#define PAR_MIN_ELEMS (1 << 15)

static int threads_for(const dt_device_t *dev, size_t work, size_t min_work) {
    return work < min_work ? 1 : dev->nthreads;
}

/* ---- encoder ------------------------------------------------------------- */

void dt_cpu_encoder_forward(dt_device_t *dev, void *out_, const int *inp, const void *wte_,
                            const void *wpe_, const int *pos, int B, int T, int C) {
    float *out = out_;
    const float *wte = wte_, *wpe = wpe_;
    int nt = threads_for(dev, (size_t)B * T * C, PAR_MIN_ELEMS);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        float *o = out + (size_t)bt * C;
        const float *p = wpe ? wpe + (size_t)(pos ? pos[bt] : bt % T) * C : NULL;
        if (inp[bt] < 0) { /* another rank's vocabulary row (tensor parallelism) */
            if (p) memcpy(o, p, sizeof(float) * (size_t)C);
            else memset(o, 0, sizeof(float) * (size_t)C);
            continue;
        }
        const float *e = wte + (size_t)inp[bt] * C;
        if (!p) {
            memcpy(o, e, sizeof(float) * (size_t)C);
            continue;
        }
#pragma omp simd
        for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
    }
}

void dt_cpu_encoder_backward(dt_device_t *dev, void *dwte_, void *dwpe_, const void *dout_,
                             const int *inp, const int *pos, int B, int T, int C) {
    float *dwte = dwte_, *dwpe = dwpe_;
    const float *dout = dout_;
    int nt = threads_for(dev, (size_t)B * T * C, PAR_MIN_ELEMS);
    /* Each thread owns a slice of channels and walks all positions in order:
     * repeated tokens accumulate in the same order on every run. */
#pragma omp parallel num_threads(nt)
    {
        size_t c0, c1;
        dt_cpu_split((size_t)C, omp_get_num_threads(), omp_get_thread_num(), &c0, &c1);
        for (int bt = 0; bt < B * T && c1 > c0; bt++) {
            const float *d = dout + (size_t)bt * C;
            if (inp[bt] >= 0) {
                float *e = dwte + (size_t)inp[bt] * C;
#pragma omp simd
                for (size_t i = c0; i < c1; i++) e[i] += d[i];
            }
            if (dwpe) {
                float *p = dwpe + (size_t)(pos ? pos[bt] : bt % T) * C;
#pragma omp simd
                for (size_t i = c0; i < c1; i++) p[i] += d[i];
            }
        }
    }
}

/* ---- layernorm ----------------------------------------------------------- */

void dt_cpu_layernorm_forward(dt_device_t *dev, void *out_, float *mean, float *rstd,
                              const void *inp_, const void *weight_, const void *bias_, int N,
                              int C) {
    float *out = out_;
    const float *inp = inp_, *w = weight_, *b = bias_;
    int nt = threads_for(dev, (size_t)N * C, PAR_MIN_ELEMS);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < C; i++) sum += x[i];
        float m = sum / (float)C;
        float var = 0.0f;
#pragma omp simd reduction(+ : var)
        for (int i = 0; i < C; i++) {
            float d = x[i] - m;
            var += d * d;
        }
        float s = 1.0f / sqrtf(var / (float)C + LN_EPS);
#pragma omp simd
        for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + b[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void dt_cpu_layernorm_backward(dt_device_t *dev, void *dinp_, void *dweight_, void *dbias_,
                               const void *dout_, const void *inp_, const void *weight_,
                               const float *mean, const float *rstd, int N, int C) {
    float *dinp = dinp_, *dw = dweight_, *db = dbias_;
    const float *dout = dout_, *inp = inp_, *w = weight_;
    int nt = threads_for(dev, (size_t)N * C, PAR_MIN_ELEMS);
#pragma omp parallel num_threads(nt)
    {
        /* Input gradient: rows are independent. */
        if (dinp) {
#pragma omp for schedule(static)
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
                float *dx = dinp + (size_t)n * C;
                float m = mean[n], s = rstd[n];
                float dmean = 0.0f, dnmean = 0.0f;
#pragma omp simd reduction(+ : dmean, dnmean)
                for (int i = 0; i < C; i++) {
                    float dnorm = w[i] * d[i];
                    dmean += dnorm;
                    dnmean += dnorm * (x[i] - m) * s;
                }
                dmean /= (float)C;
                dnmean /= (float)C;
#pragma omp simd
                for (int i = 0; i < C; i++) {
                    float norm = (x[i] - m) * s;
                    dx[i] += (w[i] * d[i] - dmean - norm * dnmean) * s;
                }
            }
        }
        /* Parameter gradients: each thread owns a slice of channels and sums the
         * rows in order. */
        size_t c0, c1;
        dt_cpu_split((size_t)C, omp_get_num_threads(), omp_get_thread_num(), &c0, &c1);
        for (int n = 0; n < N && c1 > c0; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            float m = mean[n], s = rstd[n];
            if (dw) {
#pragma omp simd
                for (size_t i = c0; i < c1; i++) dw[i] += d[i] * (x[i] - m) * s;
            }
            if (db) {
#pragma omp simd
                for (size_t i = c0; i < c1; i++) db[i] += d[i];
            }
        }
    }
}

/* ---- matmul -------------------------------------------------------------- */

void dt_cpu_matmul_forward(dt_device_t *dev, void *out_, const void *inp_, const void *weight_,
                           const void *bias_, int N, int C, int OC) {
    float *out = out_;
    const float *inp = inp_, *w = weight_, *bias = bias_;
    int nt = threads_for(dev, (size_t)N * C * OC, PAR_MIN_FLOPS);
    /* Split rows when there are enough of them, else output channels (few rows:
     * sampling one position, small MLP batches). Either way each output element
     * is computed by one sgemm call of a shape that depends only on nt. */
    int by_rows = N >= 32 * nt;
#pragma omp parallel num_threads(nt)
    {
        size_t r0 = 0, r1 = (size_t)N, o0 = 0, o1 = (size_t)OC;
        if (by_rows)
            dt_cpu_split((size_t)N, omp_get_num_threads(), omp_get_thread_num(), &r0, &r1);
        else
            dt_cpu_split((size_t)OC, omp_get_num_threads(), omp_get_thread_num(), &o0, &o1);
        if (r1 > r0 && o1 > o0) {
            float beta = 0.0f;
            if (bias) {
                for (size_t r = r0; r < r1; r++)
                    memcpy(out + r * OC + o0, bias + o0, sizeof(float) * (o1 - o0));
                beta = 1.0f;
            }
            dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), (int)(o1 - o0), C,
                        1.0f, inp + r0 * C, C, w + o0 * C, C, beta, out + r0 * OC + o0, OC);
        }
    }
}

void dt_cpu_matmul_backward(dt_device_t *dev, void *dinp_, void *dweight_, void *dbias_,
                            const void *dout_, const void *inp_, const void *weight_, int N,
                            int C, int OC) {
    float *dinp = dinp_, *dw = dweight_, *db = dbias_;
    const float *dout = dout_, *inp = inp_, *w = weight_;
    int nt = threads_for(dev, (size_t)N * C * OC, PAR_MIN_FLOPS);
#pragma omp parallel num_threads(nt)
    {
        int nth = omp_get_num_threads(), tid = omp_get_thread_num();
        size_t r0, r1, o0, o1;
        /* dinp += dout @ W, split by rows. */
        dt_cpu_split((size_t)N, nth, tid, &r0, &r1);
        if (dinp && r1 > r0)
            dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(r1 - r0), C, OC, 1.0f,
                        dout + r0 * OC, OC, w, C, 1.0f, dinp + r0 * C, C);
        /* dW += dout^T @ inp and db += column sums of dout, split by output channel. */
        dt_cpu_split((size_t)OC, nth, tid, &o0, &o1);
        if (o1 > o0) {
            if (dw)
                dt_cpu_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(o1 - o0), C, N, 1.0f,
                            dout + o0, OC, inp, C, 1.0f, dw + o0 * C, C);
            if (db) {
                for (int n = 0; n < N; n++) {
                    const float *d = dout + (size_t)n * OC;
#pragma omp simd
                    for (size_t o = o0; o < o1; o++) db[o] += d[o];
                }
            }
        }
    }
}

/* ---- elementwise --------------------------------------------------------- */

#define GELU_K0 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_K1 0.044715f

/* 0.5 x (1 + tanh(u)) = x * sigmoid(2u): one exp instead of a tanh. */
void dt_cpu_gelu_forward(dt_device_t *dev, void *out_, const void *inp_, size_t n) {
    float *out = out_;
    const float *inp = inp_;
    int nt = threads_for(dev, n, PAR_MIN_ELEMS);
#pragma omp parallel for simd num_threads(nt) schedule(simd : static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K0 * (x + GELU_K1 * x * x * x);
        out[i] = x / (1.0f + dt_cpu_expf(-2.0f * u));
    }
}

void dt_cpu_gelu_backward(dt_device_t *dev, void *dinp_, const void *inp_, const void *dout_,
                          size_t n) {
    float *dinp = dinp_;
    const float *inp = inp_, *dout = dout_;
    int nt = threads_for(dev, n, PAR_MIN_ELEMS);
#pragma omp parallel for simd num_threads(nt) schedule(simd : static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K0 * (x + GELU_K1 * x * x * x);
        float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * x * x);
        float s = 1.0f / (1.0f + dt_cpu_expf(-2.0f * u));
        dinp[i] += (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
    }
}

void dt_cpu_relu_forward(dt_device_t *dev, void *out_, const void *inp_, size_t n) {
    float *out = out_;
    const float *inp = inp_;
    int nt = threads_for(dev, n, PAR_MIN_ELEMS);
#pragma omp parallel for simd num_threads(nt) schedule(simd : static)
    for (size_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void dt_cpu_relu_backward(dt_device_t *dev, void *dinp_, const void *inp_, const void *dout_,
                          size_t n) {
    float *dinp = dinp_;
    const float *inp = inp_, *dout = dout_;
    int nt = threads_for(dev, n, PAR_MIN_ELEMS);
#pragma omp parallel for simd num_threads(nt) schedule(simd : static)
    for (size_t i = 0; i < n; i++) dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f;
}

void dt_cpu_residual_forward(dt_device_t *dev, void *out_, const void *a_, const void *b_,
                             size_t n) {
    float *out = out_;
    const float *a = a_, *b = b_;
    int nt = threads_for(dev, n, PAR_MIN_ELEMS);
#pragma omp parallel for simd num_threads(nt) schedule(simd : static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void dt_cpu_residual_backward(dt_device_t *dev, void *da_, void *db_, const void *dout_,
                              size_t n) {
    float *da = da_, *db = db_;
    const float *dout = dout_;
    int nt = threads_for(dev, n, PAR_MIN_ELEMS);
    if (da) {
#pragma omp parallel for simd num_threads(nt) schedule(simd : static)
        for (size_t i = 0; i < n; i++) da[i] += dout[i];
    }
    if (db) {
#pragma omp parallel for simd num_threads(nt) schedule(simd : static)
        for (size_t i = 0; i < n; i++) db[i] += dout[i];
    }
}
