/*
 * cpu_llama.c - CPU forward and backward of the ops Llama-family models add to
 * GPT's: RMSNorm, rotary position embedding (RoPE) and SwiGLU.
 *
 * Work is split statically over dev->nthreads OpenMP threads as in cpu_layers.c:
 * each thread owns a block of rows (or, for the RMSNorm weight gradient, of
 * channels) and writes only there, so results do not depend on scheduling.
 */
#include <math.h>
#include <omp.h>

#include "kernels/cpu/cpu.h"

/* glibc's libmvec has vector expf variants (linked with -lmvec); declaring them lets
 * `omp simd` loops call 8 or 16 lanes at once (math.h does so only under
 * -ffast-math). Each lane's result depends only on its input, and a row's elements
 * take the same path whatever the thread split, so results stay reproducible. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((__simd__("notinbranch"))) extern float expf(float);
#endif

/* Below this many elements a parallel region costs more than it saves. */
#define PAR_MIN_ELEMS (1 << 15)

static int threads_for(const dt_device_t *dev, size_t work) {
    return work < PAR_MIN_ELEMS ? 1 : dev->nthreads;
}

/* ---- RMSNorm ------------------------------------------------------------- */

void dt_cpu_rmsnorm_forward(dt_device_t *dev, void *out_, float *rstd, const void *inp_,
                            const void *weight_, int N, int C, float eps) {
    float *out = out_;
    const float *inp = inp_, *w = weight_;
    int nt = threads_for(dev, (size_t)N * C);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int i = 0; i < C; i++) ss += x[i] * x[i];
        float s = 1.0f / sqrtf(ss / (float)C + eps);
        /* (x * rstd) * weight, the order of transformers' LlamaRMSNorm. */
#pragma omp simd
        for (int i = 0; i < C; i++) o[i] = (x[i] * s) * w[i];
        rstd[n] = s;
    }
}

/* With y = w * x * s and s = (mean(x^2) + eps)^(-1/2):
 * dx = s * (w dy - x s^2 mean(w dy x)), dw = sum over rows of dy x s. */
void dt_cpu_rmsnorm_backward(dt_device_t *dev, void *dinp_, void *dweight_, const void *dout_,
                             const void *inp_, const void *weight_, const float *rstd, int N,
                             int C) {
    float *dinp = dinp_, *dw = dweight_;
    const float *dout = dout_, *inp = inp_, *w = weight_;
    int nt = threads_for(dev, (size_t)N * C);
#pragma omp parallel num_threads(nt)
    {
        if (dinp) {
#pragma omp for schedule(static)
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
                float *dx = dinp + (size_t)n * C;
                float s = rstd[n], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int i = 0; i < C; i++) dot += w[i] * d[i] * x[i];
                float c = dot / (float)C * s * s;
#pragma omp simd
                for (int i = 0; i < C; i++) dx[i] += s * (w[i] * d[i] - x[i] * c);
            }
        }
        if (dw) {
            /* Each thread owns a slice of channels and sums the rows in order. */
            size_t c0, c1;
            dt_cpu_split((size_t)C, omp_get_num_threads(), omp_get_thread_num(), &c0, &c1);
            for (int n = 0; n < N && c1 > c0; n++) {
                const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
                float s = rstd[n];
#pragma omp simd
                for (size_t i = c0; i < c1; i++) dw[i] += d[i] * (x[i] * s);
            }
        }
    }
}

/* ---- RoPE ---------------------------------------------------------------- */

/* Turns each pair (x[i], x[i + HS/2]) of the first n_heads heads of every row by
 * +angle (dir 1, forward) or -angle (dir -1, the transpose for the backward). The
 * angle is pos * inv_freq[i] in fp32 as transformers forms it; its cosine and sine
 * are taken in double and rounded, once per position for all its rows and heads
 * (with pos, packed sequences: once per row, at the row's own position; the same
 * arithmetic). */
static void rope_apply(dt_device_t *dev, float *x, int B, int T, int row_stride, int n_heads,
                       int HS, int pos0, const int *pos, const dt_rope_args_t *rope, float dir) {
    int half = HS / 2;
    float inv_freq[DT_ROPE_MAX_HS / 2];
    dt_rope_inv_freq(rope, HS, inv_freq);
    int nt = threads_for(dev, (size_t)B * T * n_heads * HS);
    /* Over positions: a position's angles serve all B rows at it; with pos, over rows. */
    int outer = pos ? B * T : T, inner = pos ? 1 : B;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < outer; t++) {
        float cs[DT_ROPE_MAX_HS / 2], sn[DT_ROPE_MAX_HS / 2];
        float p = (float)(pos ? pos[t] : pos0 + t);
        for (int i = 0; i < half; i++) {
            double a = (double)(p * inv_freq[i]);
            cs[i] = (float)cos(a);
            sn[i] = dir * (float)sin(a);
        }
        for (int b = 0; b < inner; b++) {
            float *row = x + ((size_t)b * T + t) * row_stride;
            for (int h = 0; h < n_heads; h++) {
                float *x1 = row + (size_t)h * HS, *x2 = x1 + half;
#pragma omp simd
                for (int i = 0; i < half; i++) {
                    float a = x1[i], c = x2[i];
                    x1[i] = a * cs[i] - c * sn[i];
                    x2[i] = c * cs[i] + a * sn[i];
                }
            }
        }
    }
}

void dt_cpu_rope_forward(dt_device_t *dev, void *x, int B, int T, int row_stride, int n_heads,
                         int HS, int pos0, const int *pos, const dt_rope_args_t *rope) {
    rope_apply(dev, x, B, T, row_stride, n_heads, HS, pos0, pos, rope, 1.0f);
}

void dt_cpu_rope_backward(dt_device_t *dev, void *dx, int B, int T, int row_stride, int n_heads,
                          int HS, int pos0, const int *pos, const dt_rope_args_t *rope) {
    rope_apply(dev, dx, B, T, row_stride, n_heads, HS, pos0, pos, rope, -1.0f);
}

/* ---- SwiGLU -------------------------------------------------------------- */

void dt_cpu_swiglu_forward(dt_device_t *dev, void *out_, const void *inp_, int N, int IC) {
    float *out = out_;
    const float *inp = inp_;
    int nt = threads_for(dev, (size_t)N * IC);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * IC, *u = g + IC;
        float *o = out + (size_t)n * IC;
#pragma omp simd
        for (int i = 0; i < IC; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* d gate = dout * up * silu'(gate), silu'(x) = sig(x) (1 + x (1 - sig(x)));
 * d up = dout * silu(gate). */
void dt_cpu_swiglu_backward(dt_device_t *dev, void *dinp_, const void *inp_, const void *dout_,
                            int N, int IC) {
    float *dinp = dinp_;
    const float *inp = inp_, *dout = dout_;
    int nt = threads_for(dev, (size_t)N * IC);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * IC, *u = g + IC, *d = dout + (size_t)n * IC;
        float *dg = dinp + (size_t)n * 2 * IC, *du = dg + IC;
#pragma omp simd
        for (int i = 0; i < IC; i++) {
            float sig = 1.0f / (1.0f + expf(-g[i]));
            dg[i] += d[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
            du[i] += d[i] * g[i] * sig;
        }
    }
}
