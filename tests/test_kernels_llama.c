/*
 * test_kernels_llama.c - the CPU ops Llama-family models add (RMSNorm, RoPE,
 * SwiGLU, grouped-query attention, KV-cache decode attention) against
 * double-precision references written here.
 *
 * As in test_kernels.c: forward ops are compared with straightforward double
 * implementations; backward ops with central finite differences of the scalar
 * L = sum(out * R) for fixed random R (the float op runs with dout = R), on
 * gradient buffers pre-filled with PRE to check that they accumulate. RoPE's
 * reference builds cos and sin as transformers' LlamaRotaryEmbedding does
 * (emb = cat(freqs, freqs), x * cos + rotate_half(x) * sin), in double. Grouped-query
 * attention is also checked against the op's own multi-head attention on key/value
 * heads repeated as transformers' repeat_kv does. Every op is run with one and
 * with three threads on shapes large enough to be split, and must agree bitwise.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

/* ---- helpers --------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static void rng_seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ull + 1; }
static float rnd(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / (1ull << 24)) * 2.0 - 1.0);
}
static float *frand(size_t n, float scale) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = rnd() * scale;
    return x;
}
static float *ffill(size_t n, float v) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = v;
    return x;
}
static float *fcopy(const float *x, size_t n) {
    float *y = malloc(n * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}
static double *todouble(const float *x, size_t n) {
    double *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
static dt_device_t *open_cpu(int nthreads) {
    dt_device_t *dev = NULL;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, nthreads), DT_STATUS_OK, "%s", dt_error_detail());
    return dev;
}

/* |got - offset - ref| <= atol + rtol |ref| for every element. */
static void check_close(const char *what, const float *got, float offset, const double *ref, size_t n,
                        double atol, double rtol) {
    for (size_t i = 0; i < n; i++) {
        double g = (double)got[i] - offset, err = fabs(g - ref[i]);
        if (!(err <= atol + rtol * fabs(ref[i])))
            cr_assert_fail("%s[%zu]: got %.9g, want %.9g (err %.3g)", what, i, g, ref[i], err);
    }
}
static void check_same_bits(const char *what, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof *a) != 0)
            cr_assert_fail("%s[%zu]: %.9g with 1 thread, %.9g with 3", what, i, a[i], b[i]);
}

typedef double (*loss_fn)(void *ctx);
#define FD_H 1e-4
#define PRE 0.25f /* value gradient buffers start at, to test accumulation */
/* Central finite differences of f w.r.t. x[i] at `samples` random i (all when 0),
 * checked against got[i] - offset. */
static void fd_check(const char *what, loss_fn f, void *ctx, double *x, size_t n, const float *got,
                     float offset, size_t samples, double atol, double rtol) {
    size_t count = samples == 0 || samples >= n ? n : samples;
    for (size_t s = 0; s < count; s++) {
        size_t i = count == n ? s : (size_t)((rnd() * 0.5f + 0.5f) * (float)n) % n;
        double old = x[i];
        x[i] = old + FD_H;
        double fp = f(ctx);
        x[i] = old - FD_H;
        double fm = f(ctx);
        x[i] = old;
        double g = (fp - fm) / (2 * FD_H);
        check_close(what, got + i, offset, &g, 1, atol, rtol);
    }
}
static double dot(const double *a, const float *r, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * r[i];
    return s;
}

/* ---- RMSNorm ---------------------------------------------------------------- */

typedef struct rms_ctx {
    int N, C;
    double eps, *x, *w;
    const float *R;
} rms_ctx;

static void rms_ref(const rms_ctx *c, double *out, double *rstd) {
    for (int n = 0; n < c->N; n++) {
        const double *x = c->x + (size_t)n * c->C;
        double ss = 0;
        for (int i = 0; i < c->C; i++) ss += x[i] * x[i];
        double s = 1.0 / sqrt(ss / c->C + c->eps);
        for (int i = 0; i < c->C; i++) out[(size_t)n * c->C + i] = x[i] * s * c->w[i];
        if (rstd) rstd[n] = s;
    }
}
static double rms_loss(void *p) {
    rms_ctx *c = p;
    size_t n = (size_t)c->N * c->C;
    double *out = malloc(n * sizeof *out);
    rms_ref(c, out, NULL);
    double l = dot(out, c->R, n);
    free(out);
    return l;
}

/* Row 0 is scaled by `small` so that eps weighs in its rstd. */
static void rmsnorm_case(int N, int C, float eps, float small, size_t samples) {
    dt_device_t *dev = open_cpu(1);
    size_t n = (size_t)N * C;
    float *x = frand(n, 2), *w = frand(C, 1.5f), *R = frand(n, 1), *out = ffill(n, 9), *rstd = ffill(N, 9);
    for (int i = 0; i < C; i++) x[i] *= small;
    dev->ops->rmsnorm_forward(dev, out, rstd, x, w, N, C, eps);
    rms_ctx c = {N, C, eps, todouble(x, n), todouble(w, C), R};
    double *ref = malloc(n * sizeof *ref), *ref_rstd = malloc(N * sizeof *ref_rstd);
    rms_ref(&c, ref, ref_rstd);
    check_close("rmsnorm out", out, 0, ref, n, 1e-6, 1e-5);
    check_close("rmsnorm rstd", rstd, 0, ref_rstd, N, 0, 1e-5);
    float *dx = ffill(n, PRE), *dw = ffill(C, PRE);
    dev->ops->rmsnorm_backward(dev, dx, dw, R, x, w, rstd, N, C);
    fd_check("rmsnorm dinp", rms_loss, &c, c.x, n, dx, PRE, samples, 1e-4, 1e-4);
    fd_check("rmsnorm dweight", rms_loss, &c, c.w, C, dw, PRE, samples, 1e-4, 1e-4);
    /* NULL gradients are skipped; the other one is still produced. */
    float *dw2 = ffill(C, PRE);
    dev->ops->rmsnorm_backward(dev, NULL, dw2, R, x, w, rstd, N, C);
    check_same_bits("rmsnorm dweight alone", dw, dw2, C);
    free(x), free(w), free(R), free(out), free(rstd), free(c.x), free(c.w), free(ref), free(ref_rstd);
    free(dx), free(dw), free(dw2);
    dt_device_free(dev);
}

Test(rmsnorm, forward_and_backward) {
    rng_seed(1);
    rmsnorm_case(5, 16, 1e-3f, 0.05f, 0); /* eps is a third of row 0's mean square */
    rmsnorm_case(3, 7, 1e-6f, 1, 0);      /* odd width */
}

/* ---- RoPE --------------------------------------------------------------------- */

/* inv_freq in double, after transformers' formulas (no fp32 rounding). */
static void ref_inv_freq(const dt_rope_args_t *a, int HS, double *f) {
    for (int i = 0; i < HS / 2; i++) {
        double inv = 1.0 / pow(a->theta, (double)(2 * i) / HS);
        if (a->factor > 0) {
            double low_wl = a->original_max_pos / a->low_freq_factor;
            double high_wl = a->original_max_pos / a->high_freq_factor;
            double wl = 2 * M_PI / inv;
            if (wl > low_wl) {
                inv = inv / a->factor;
            } else if (wl >= high_wl) {
                double s = (a->original_max_pos / wl - a->low_freq_factor) /
                           (a->high_freq_factor - a->low_freq_factor);
                inv = (1 - s) * inv / a->factor + s * inv;
            }
        }
        f[i] = inv;
    }
}

/* x (B, T, stride): emb = cat(freqs, freqs), x * cos(emb) + rotate_half(x) * sin(emb)
 * on the first n_heads heads; rotate_half(x) = cat(-x2, x1). */
static void rope_ref(const double *x, double *out, int B, int T, int stride, int n_heads, int HS, int pos0,
                     const dt_rope_args_t *a) {
    double f[DT_ROPE_MAX_HS / 2], cs[DT_ROPE_MAX_HS], sn[DT_ROPE_MAX_HS], rot[DT_ROPE_MAX_HS];
    int half = HS / 2;
    ref_inv_freq(a, HS, f);
    memcpy(out, x, sizeof(double) * (size_t)B * T * stride);
    for (int bt = 0; bt < B * T; bt++) {
        double pos = pos0 + bt % T;
        for (int i = 0; i < HS; i++) {
            cs[i] = cos(pos * f[i % half]);
            sn[i] = sin(pos * f[i % half]);
        }
        for (int h = 0; h < n_heads; h++) {
            const double *xh = x + (size_t)bt * stride + (size_t)h * HS;
            for (int i = 0; i < HS; i++) rot[i] = i < half ? -xh[i + half] : xh[i - half];
            for (int i = 0; i < HS; i++) out[(size_t)bt * stride + (size_t)h * HS + i] = xh[i] * cs[i] + rot[i] * sn[i];
        }
    }
}

static const dt_rope_args_t ROPE_PLAIN = {.theta = 10000};
static const dt_rope_args_t ROPE_LLAMA3 = {
    .theta = 10000, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_pos = 64};

/* Llama's embedding: encoder_forward without a position table gives each token's
 * row of wte exactly, on any thread count. */
Test(embedding, no_position_table_is_the_token_row) {
    int B = 3, T = 70, C = 40, V = 11;
    for (int nt = 1; nt <= 3; nt += 2) {
        dt_device_t *dev = open_cpu(nt);
        float *wte = frand((size_t)V * C, 1), *out = ffill((size_t)B * T * C, 9);
        int *tok = malloc(sizeof(int) * (size_t)B * T);
        for (int i = 0; i < B * T; i++) tok[i] = (i * 7 + 3) % V;
        dev->ops->encoder_forward(dev, out, tok, wte, NULL, NULL, B, T, C);
        for (int i = 0; i < B * T; i++)
            cr_assert(memcmp(out + (size_t)i * C, wte + (size_t)tok[i] * C, sizeof(float) * (size_t)C) == 0,
                      "row %d (token %d), %d threads", i, tok[i], nt);
        free(wte), free(out), free(tok);
        dt_device_free(dev);
    }
}

Test(rope, inv_freq_matches_transformers_formulas) {
    /* HS 16, theta 1e4: wavelengths 2 pi 10^(i/2) = 6.3, 19.9, 62.8, 199, ...; with
     * original_max_pos 64 (high_wl 16, low_wl 64) frequency 0 is kept, 1 and 2 are
     * blended, the rest divided by 8: every branch of llama3 is taken. */
    float f[8], g[8];
    double want[8];
    dt_rope_inv_freq(&ROPE_PLAIN, 16, f);
    ref_inv_freq(&ROPE_PLAIN, 16, want);
    for (int i = 0; i < 8; i++) cr_assert(fabs(f[i] - want[i]) <= 1e-6 * want[i], "plain %d: %g vs %g", i, f[i], want[i]);
    dt_rope_inv_freq(&ROPE_LLAMA3, 16, g);
    ref_inv_freq(&ROPE_LLAMA3, 16, want);
    for (int i = 0; i < 8; i++) cr_assert(fabs(g[i] - want[i]) <= 1e-6 * want[i], "llama3 %d: %g vs %g", i, g[i], want[i]);
    cr_assert_eq(g[0], f[0], "high frequency kept");
    cr_assert(g[1] < f[1] && g[1] > f[1] / 8 && g[2] < f[2] && g[2] > f[2] / 8, "medium blended");
    for (int i = 3; i < 8; i++) cr_assert_eq(g[i], f[i] / 8, "low frequency %d divided", i);
    /* Llama 3.1's own numbers: theta 5e5, head 128, factor 8 over 8192 positions. */
    dt_rope_args_t l31 = {.theta = 500000, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                          .original_max_pos = 8192};
    float h[64];
    double want64[64];
    dt_rope_inv_freq(&l31, 128, h);
    ref_inv_freq(&l31, 128, want64);
    for (int i = 0; i < 64; i++) cr_assert(fabs(h[i] - want64[i]) <= 2e-6 * want64[i], "llama3.1 %d", i);
}

static void rope_case(int B, int T, int NH, int NKV, int HS, int pos0, const dt_rope_args_t *a) {
    dt_device_t *dev = open_cpu(1);
    int stride = (NH + 2 * NKV) * HS, nrot = NH + NKV;
    size_t n = (size_t)B * T * stride;
    float *x = frand(n, 1), *y = fcopy(x, n);
    dev->ops->rope_forward(dev, y, B, T, stride, nrot, HS, pos0, NULL, a);
    double *xd = todouble(x, n), *ref = malloc(n * sizeof *ref);
    rope_ref(xd, ref, B, T, stride, nrot, HS, pos0, a);
    /* Angles up to ~pos: fp32 inv_freq and angles give ~pos * 1e-7 of error. */
    check_close("rope out", y, 0, ref, n, 1e-6 + (pos0 + T) * 2e-7, 1e-5);
    /* The v heads are not touched. */
    for (int bt = 0; bt < B * T; bt++)
        cr_assert_eq(memcmp(y + (size_t)bt * stride + nrot * HS, x + (size_t)bt * stride + nrot * HS,
                            sizeof(float) * NKV * HS), 0, "v of row %d changed", bt);
    /* backward is the transpose: <R x, g> == <x, R^T g> ... */
    float *g = frand(n, 1), *gt = fcopy(g, n);
    dev->ops->rope_backward(dev, gt, B, T, stride, nrot, HS, pos0, NULL, a);
    double lhs = 0, rhs = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        lhs += (double)y[i] * g[i];
        rhs += (double)x[i] * gt[i];
        norm += fabs((double)y[i] * g[i]);
    }
    cr_assert(fabs(lhs - rhs) <= 1e-6 * norm, "<Rx,g> %.9g vs <x,R^T g> %.9g", lhs, rhs);
    /* ... and, the rotation being orthogonal, undoes the forward. */
    dev->ops->rope_backward(dev, y, B, T, stride, nrot, HS, pos0, NULL, a);
    check_close("rope R^T R x", y, 0, xd, n, 1e-6, 1e-6);
    free(x), free(y), free(xd), free(ref), free(g), free(gt);
    dt_device_free(dev);
}

Test(rope, plain_matches_rotate_half_reference) {
    rng_seed(2);
    rope_case(2, 5, 4, 2, 16, 0, &ROPE_PLAIN);
    rope_case(1, 3, 2, 2, 8, 0, &ROPE_PLAIN); /* NKV == NH */
}

Test(rope, from_a_later_position) {
    rng_seed(3);
    rope_case(2, 4, 4, 1, 32, 37, &ROPE_PLAIN);
    dt_rope_args_t big = {.theta = 1e6};
    rope_case(1, 2, 2, 1, 64, 3000, &big);
}

Test(rope, llama3_scaled) {
    rng_seed(4);
    rope_case(2, 6, 2, 1, 16, 11, &ROPE_LLAMA3);
    dt_rope_args_t l31 = {.theta = 500000, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                          .original_max_pos = 8192};
    rope_case(1, 3, 2, 2, 128, 9000, &l31);
}

Test(rope, position_zero_is_identity) {
    rng_seed(5);
    dt_device_t *dev = open_cpu(1);
    float *x = frand(48, 1), *y = fcopy(x, 48);
    dev->ops->rope_forward(dev, y, 1, 1, 48, 3, 16, 0, NULL, &ROPE_LLAMA3);
    cr_assert_eq(memcmp(x, y, sizeof(float) * 48), 0);
    free(x), free(y);
    dt_device_free(dev);
}

/* ---- SwiGLU --------------------------------------------------------------------- */

typedef struct swiglu_ctx {
    int N, I;
    double *x;
    const float *R;
} swiglu_ctx;

static void swiglu_ref(const swiglu_ctx *c, double *out) {
    for (int n = 0; n < c->N; n++)
        for (int i = 0; i < c->I; i++) {
            double g = c->x[(size_t)n * 2 * c->I + i], u = c->x[(size_t)n * 2 * c->I + c->I + i];
            out[(size_t)n * c->I + i] = g / (1 + exp(-g)) * u;
        }
}
static double swiglu_loss(void *p) {
    swiglu_ctx *c = p;
    size_t n = (size_t)c->N * c->I;
    double *out = malloc(n * sizeof *out);
    swiglu_ref(c, out);
    double l = dot(out, c->R, n);
    free(out);
    return l;
}

Test(swiglu, forward_and_backward) {
    rng_seed(6);
    int N = 4, I = 9;
    size_t n = (size_t)N * I;
    float *x = frand(2 * n, 4), *R = frand(n, 1), *out = ffill(n, 9), *dx = ffill(2 * n, PRE);
    x[0] = -95.0f; /* exp(-gate) overflows: silu is -0 and its gradient 0 */
    x[1] = 95.0f;
    dt_device_t *dev = open_cpu(1);
    dev->ops->swiglu_forward(dev, out, x, N, I);
    swiglu_ctx c = {N, I, todouble(x, 2 * n), R};
    double *ref = malloc(n * sizeof *ref);
    swiglu_ref(&c, ref);
    check_close("swiglu out", out, 0, ref, n, 1e-6, 1e-6);
    dev->ops->swiglu_backward(dev, dx, x, R, N, I);
    fd_check("swiglu dinp", swiglu_loss, &c, c.x, 2 * n, dx, PRE, 0, 1e-5, 1e-5);
    free(x), free(R), free(out), free(dx), free(c.x), free(ref);
    dt_device_free(dev);
}

/* ---- grouped-query attention ---------------------------------------------------- */

typedef struct att_ctx {
    int B, T, C, NH, NKV;
    double *qkv;
    const float *R;
} att_ctx;

static void att_ref(const att_ctx *c, double *out) {
    int B = c->B, T = c->T, C = c->C, NH = c->NH, HS = C / NH, KV = c->NKV * HS, C3 = C + 2 * KV;
    double *p = malloc((size_t)T * sizeof *p);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int g = h / (NH / c->NKV);
            for (int t = 0; t < T; t++) {
                const double *q = c->qkv + ((size_t)b * T + t) * C3 + h * HS;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const double *k = c->qkv + ((size_t)b * T + j) * C3 + C + g * HS;
                    double s = 0;
                    for (int i = 0; i < HS; i++) s += q[i] * k[i];
                    p[j] = s / sqrt((double)HS);
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
                for (int i = 0; i < HS; i++) {
                    double o = 0;
                    for (int j = 0; j <= t; j++) o += p[j] / sum * c->qkv[((size_t)b * T + j) * C3 + C + KV + g * HS + i];
                    out[((size_t)b * T + t) * C + h * HS + i] = o;
                }
            }
        }
    free(p);
}
static double att_loss(void *p) {
    att_ctx *c = p;
    size_t n = (size_t)c->B * c->T * c->C;
    double *out = malloc(n * sizeof *out);
    att_ref(c, out);
    double l = dot(out, c->R, n);
    free(out);
    return l;
}

/* Runs forward and backward (into dqkv pre-filled with PRE); returns out. */
static float *att_run(dt_device_t *dev, const float *qkv, const float *R, float *dqkv, int B, int T, int C, int NH,
                      int NKV) {
    float *out = ffill((size_t)B * T * C, 9);
    float *saved = malloc(dev->ops->attention_saved_bytes(dev, B, T, C, NH, NKV));
    float *scratch = malloc(dev->ops->attention_scratch_bytes(dev, B, T, C, NH, NKV));
    dev->ops->attention_forward(dev, out, saved, qkv, NULL, B, T, C, NH, NKV);
    dev->ops->attention_backward(dev, dqkv, scratch, R, qkv, saved, NULL, B, T, C, NH, NKV);
    free(saved), free(scratch);
    return out;
}

/* qkv (B, T, C + 2 KV) -> (B, T, 3C) with each key/value head repeated NH/NKV times. */
static float *repeat_kv(const float *qkv, int B, int T, int C, int NH, int NKV) {
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV, rep = NH / NKV;
    float *e = malloc(sizeof(float) * (size_t)B * T * 3 * C);
    for (int bt = 0; bt < B * T; bt++) {
        const float *r = qkv + (size_t)bt * C3;
        float *o = e + (size_t)bt * 3 * C;
        memcpy(o, r, sizeof(float) * C);
        for (int h = 0; h < NH; h++) {
            memcpy(o + C + h * HS, r + C + (h / rep) * HS, sizeof(float) * HS);
            memcpy(o + 2 * C + h * HS, r + C + KV + (h / rep) * HS, sizeof(float) * HS);
        }
    }
    return e;
}

static void gqa_case(int B, int T, int C, int NH, int NKV, size_t samples) {
    dt_device_t *dev = open_cpu(1);
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV, rep = NH / NKV;
    size_t nqkv = (size_t)B * T * C3, nout = (size_t)B * T * C;
    float *qkv = frand(nqkv, 1.5f), *R = frand(nout, 1), *dqkv = ffill(nqkv, PRE);
    float *out = att_run(dev, qkv, R, dqkv, B, T, C, NH, NKV);
    att_ctx c = {B, T, C, NH, NKV, todouble(qkv, nqkv), R};
    double *ref = malloc(nout * sizeof *ref);
    att_ref(&c, ref);
    check_close("gqa out", out, 0, ref, nout, 2e-6, 2e-5);
    fd_check("gqa dqkv", att_loss, &c, c.qkv, nqkv, dqkv, PRE, samples, 2e-5, 1e-4);
    /* The same as multi-head attention on repeated k/v heads; the gradient of a
     * shared head is the sum over its group. */
    float *e = repeat_kv(qkv, B, T, C, NH, NKV), *de = ffill((size_t)B * T * 3 * C, 0);
    float *out_e = att_run(dev, e, R, de, B, T, C, NH, NH);
    double *want = todouble(out_e, nout);
    check_close("gqa out vs repeat_kv", out, 0, want, nout, 1e-6, 1e-6);
    double *dwant = malloc(nqkv * sizeof *dwant);
    for (int bt = 0; bt < B * T; bt++) {
        const float *d = de + (size_t)bt * 3 * C;
        double *w = dwant + (size_t)bt * C3;
        for (int i = 0; i < C; i++) w[i] = d[i];
        for (int i = 0; i < 2 * KV; i++) w[C + i] = 0;
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HS; i++) {
                w[C + (h / rep) * HS + i] += d[C + h * HS + i];
                w[C + KV + (h / rep) * HS + i] += d[2 * C + h * HS + i];
            }
    }
    check_close("gqa dqkv vs repeat_kv group sums", dqkv, PRE, dwant, nqkv, 1e-5, 1e-5);
    free(qkv), free(R), free(dqkv), free(out), free(c.qkv), free(ref), free(e), free(de), free(out_e);
    free(want), free(dwant);
    dt_device_free(dev);
}

Test(gqa, two_query_heads_per_kv_head) {
    rng_seed(7);
    gqa_case(2, 5, 16, 4, 2, 0);
}

Test(gqa, one_kv_head_for_all) {
    rng_seed(8);
    gqa_case(1, 6, 12, 3, 1, 0); /* multi-query attention */
}

Test(gqa, several_row_blocks) {
    rng_seed(9);
    gqa_case(1, 70, 16, 4, 2, 300); /* T = 70 > the CPU's 64-row block */
}

/* ---- KV-cache decode ---------------------------------------------------------------- */

/* attention_decode at position pos over a cache built from qkv's k|v tails equals
 * row pos of the full causal attention; cache rows past pos hold NaN, which must
 * not be read. */
static void decode_case(int B, int T, int C, int NH, int NKV, int max_T) {
    dt_device_t *dev = open_cpu(1);
    int HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV;
    size_t nqkv = (size_t)B * T * C3, nout = (size_t)B * T * C;
    float *qkv = frand(nqkv, 1.5f), *full = ffill(nout, 9);
    float *saved = malloc(dev->ops->attention_saved_bytes(dev, B, T, C, NH, NKV));
    dev->ops->attention_forward(dev, full, saved, qkv, NULL, B, T, C, NH, NKV);
    float *kv = ffill((size_t)B * max_T * 2 * KV, NAN), *out = ffill((size_t)B * C, 9);
    for (int pos = 0; pos < T; pos++) {
        for (int b = 0; b < B; b++)
            memcpy(kv + ((size_t)b * max_T + pos) * 2 * KV, qkv + ((size_t)b * T + pos) * C3 + C,
                   sizeof(float) * 2 * KV);
        /* q: row pos of each sequence, rows T * C3 apart. */
        dev->ops->attention_decode(dev, out, qkv + (size_t)pos * C3, T * C3, kv, max_T, pos, B, C, NH, NKV);
        for (int b = 0; b < B; b++) {
            double *want = todouble(full + ((size_t)b * T + pos) * C, C);
            check_close("decode out", out + (size_t)b * C, 0, want, C, 1e-6, 1e-5);
            free(want);
        }
    }
    free(qkv), free(full), free(saved), free(kv), free(out);
    dt_device_free(dev);
}

Test(decode, matches_full_attention_row) {
    rng_seed(10);
    decode_case(2, 7, 16, 4, 2, 12);
    decode_case(3, 4, 12, 3, 3, 4); /* NKV == NH, a full cache */
    decode_case(1, 5, 8, 2, 1, 9);
}

/* ---- threads ------------------------------------------------------------------------- */

/* Every op with 1 and with 3 threads on shapes past the parallel thresholds. */
Test(threads, every_op_bitwise_equal_across_thread_counts) {
    int N = 256, C = 160, IC = 128, B = 2, T = 70, NH = 8, NKV = 2, HS = 32, Ca = NH * HS;
    int C3 = Ca + 2 * NKV * HS, maxT = 300;
    size_t nx = (size_t)N * C, ng = (size_t)N * 2 * IC, nqkv = (size_t)B * T * C3;
    rng_seed(11);
    float *x = frand(nx, 2), *w = frand(C, 1), *R = frand(nx, 1), *gu = frand(ng, 3), *Rg = frand(ng / 2, 1);
    float *qkv = frand(nqkv, 1.5f), *Ra = frand((size_t)B * T * Ca, 1), *kv = frand((size_t)B * maxT * 2 * NKV * HS, 1);
    float *res[2][12];
    for (int k = 0; k < 2; k++) {
        dt_device_t *dev = open_cpu(k == 0 ? 1 : 3);
        const dt_ops_t *o = dev->ops;
        float **r = res[k];
        r[0] = ffill(nx, 0), r[1] = ffill(N, 0), r[2] = ffill(nx, PRE), r[3] = ffill(C, PRE);
        o->rmsnorm_forward(dev, r[0], r[1], x, w, N, C, 1e-6f);
        o->rmsnorm_backward(dev, r[2], r[3], R, x, w, r[1], N, C);
        r[4] = fcopy(qkv, nqkv), r[5] = fcopy(qkv, nqkv);
        o->rope_forward(dev, r[4], B, T, C3, NH + NKV, HS, 5, NULL, &ROPE_LLAMA3);
        o->rope_backward(dev, r[5], B, T, C3, NH + NKV, HS, 5, NULL, &ROPE_LLAMA3);
        r[6] = ffill(ng / 2, 0), r[7] = ffill(ng, PRE);
        o->swiglu_forward(dev, r[6], gu, N, IC);
        o->swiglu_backward(dev, r[7], gu, Rg, N, IC);
        r[8] = ffill(nqkv, PRE);
        r[9] = att_run(dev, qkv, Ra, r[8], B, T, Ca, NH, NKV);
        r[10] = ffill((size_t)B * Ca, 0);
        o->attention_decode(dev, r[10], qkv, C3, kv, maxT, maxT - 1, B, Ca, NH, NKV);
        dt_device_free(dev);
    }
    const char *names[] = {"rmsnorm out", "rmsnorm rstd", "rmsnorm dinp", "rmsnorm dweight", "rope fwd",
                           "rope bwd", "swiglu out", "swiglu dinp", "gqa dqkv", "gqa out", "decode out"};
    size_t sizes[] = {nx, N, nx, C, nqkv, nqkv, ng / 2, ng, nqkv, (size_t)B * T * Ca, (size_t)B * Ca};
    for (int i = 0; i < 11; i++) {
        check_same_bits(names[i], res[0][i], res[1][i], sizes[i]);
        free(res[0][i]), free(res[1][i]);
    }
    free(x), free(w), free(R), free(gu), free(Rg), free(qkv), free(Ra), free(kv);
}
