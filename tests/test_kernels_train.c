/*
 * test_kernels_train.c - the CPU op table's losses, optimizer and gradient tools
 * against double-precision references (same method and tolerances as
 * test_kernels.c): softmax + cross-entropy over a padded vocabulary, mean squared
 * error, AdamW (with and without weight decay, into a master copy), the gradient
 * norm and scale against a serial sum, and bitwise determinism of a whole
 * transformer-ish pass over two threads. Shared helpers: kernels_harness.h.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/mem.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"
#include "kernels_harness.h"

/* ---- softmax + cross-entropy ---------------------------------------------------------- */

typedef struct xent_ctx {
    int N, V, Vp;
    double *logits;
    const int *tgt;
    double dscale;
} xent_ctx;

static double xent_ref_row(const double *x, int V, int tgt) {
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < V; j++)
        mx = x[j] > mx ? x[j] : mx;
    for (int j = 0; j < V; j++)
        s += exp(x[j] - mx);
    return log(s) + mx - x[tgt];
}
static double xent_loss(void *p) {
    xent_ctx *c = p;
    double l = 0;
    for (int n = 0; n < c->N; n++)
        if (c->tgt[n] >= 0) l += xent_ref_row(c->logits + (size_t)n * c->Vp, c->V, c->tgt[n]);
    return l * c->dscale;
}

Test(xent, forward_backward_padded_vocab) {
    rng_seed(14);
    int N = 10, V = 13, Vp = 16;
    dt_device_t *dev = open_cpu(2);
    float *logits = frand((size_t)N * Vp, 3);
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++)
            logits[n * Vp + j] = 1e4f; /* padding must be ignored */
    int tgt[10] = {0, 12, 5, 5, -1, 3, 7, 12, 1, 9};
    float *losses = ffill(N, 5), dscale = 1.0f / 9.0f;
    dev->ops->softmax_xent_forward(dev, losses, logits, tgt, N, V, Vp);
    xent_ctx c = {N, V, Vp, todouble(logits, (size_t)N * Vp), tgt, dscale};
    for (int n = 0; n < N; n++) {
        double want = tgt[n] < 0 ? 0 : xent_ref_row(c.logits + (size_t)n * Vp, V, tgt[n]);
        cr_assert_float_eq(losses[n], want, 2e-6 * (1 + want), "row %d: %g vs %g", n, losses[n],
                           want);
    }
    float *dl = ffill((size_t)N * Vp, 9), *losses2 = ffill(N, 5);
    dev->ops->softmax_xent_backward(dev, dl, losses2, logits, tgt, dscale, N, V, Vp);
    cr_assert_eq(memcmp(losses, losses2, sizeof(float) * N), 0, "fused losses equal forward");
    double *g = malloc(sizeof(double) * N * Vp);
    fd_grad(xent_loss, &c, c.logits, (size_t)N * Vp, g);
    check_close("dlogits", dl, 0, g, (size_t)N * Vp, 1e-6, 1e-4);
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++)
            cr_assert_eq(dl[n * Vp + j], 0.0f);
    /* In place: dlogits over the logits gives the same gradient. */
    dev->ops->softmax_xent_backward(dev, logits, NULL, logits, tgt, dscale, N, V, Vp);
    cr_assert_eq(memcmp(logits, dl, sizeof(float) * N * Vp), 0);
    dt_device_free(dev);
}

Test(xent, uniform_logits_give_ln_v) {
    int N = 6, V = 50257, Vp = 50304;
    dt_device_t *dev = open_cpu(2);
    float *logits = ffill((size_t)N * Vp, 0.37f), *losses = ffill(N, 0);
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++)
            logits[(size_t)n * Vp + j] = (float)(n * 100 + j); /* junk */
    int tgt[6] = {0, 1, 50256, 77, 4000, 31};
    dev->ops->softmax_xent_forward(dev, losses, logits, tgt, N, V, Vp);
    for (int n = 0; n < N; n++)
        cr_assert_float_eq(losses[n], log((double)V), 2e-6, "row %d: %.9g vs ln V %.9g", n,
                           losses[n], log((double)V));
    /* Gradient at uniform logits: (1/V - onehot) * dscale. */
    float *dl = ffill((size_t)N * Vp, 1);
    dev->ops->softmax_xent_backward(dev, dl, NULL, logits, tgt, 2.0f, N, V, Vp);
    cr_assert_float_eq(dl[5], 2.0 / V, 1e-9);
    cr_assert_float_eq(dl[0], 2.0 / V - 2.0, 1e-6);
    dt_device_free(dev);
}

/* ---- mean squared error ------------------------------------------------------------- */

typedef struct mse_ctx {
    int N, D;
    double *pred;
    const float *y;
} mse_ctx;
static double mse_loss(void *p) {
    mse_ctx *c = p;
    double l = 0;
    for (int i = 0; i < c->N * c->D; i++)
        l += (c->pred[i] - c->y[i]) * (c->pred[i] - c->y[i]);
    return 0.5 * l / c->D; /* dscale 0.5 */
}

Test(mse, forward_and_backward) {
    rng_seed(15);
    int N = 5, D = 7;
    dt_device_t *dev = open_cpu(1);
    float *pred = frand(N * D, 2), *y = frand(N * D, 2), *losses = ffill(N, 0);
    dev->ops->mse_forward(dev, losses, pred, y, N, D);
    for (int n = 0; n < N; n++) {
        double s = 0;
        for (int d = 0; d < D; d++)
            s +=
                ((double)pred[n * D + d] - y[n * D + d]) * ((double)pred[n * D + d] - y[n * D + d]);
        cr_assert_float_eq(losses[n], s / D, 1e-6);
    }
    float *dp = ffill(N * D, 3);
    dev->ops->mse_backward(dev, dp, pred, y, 0.5f, N, D);
    mse_ctx c = {N, D, todouble(pred, N * D), y};
    double *g = malloc(sizeof(double) * N * D);
    fd_grad(mse_loss, &c, c.pred, N * D, g);
    check_close("dpred", dp, 0, g, N * D, 1e-6, 1e-5);
    dt_device_free(dev);
}

/* ---- optimizer -------------------------------------------------------------------------- */

static void adamw_case(int decay, int use_master) {
    rng_seed(16);
    size_t n = 40000 + 17; /* above the threading threshold, odd split */
    dt_device_t *dev = open_cpu(2);
    float *p = frand(n, 1), *m = ffill(n, 0), *v = ffill(n, 0), *master = NULL;
    double *rp = todouble(p, n), *rm = calloc(n, sizeof(double)), *rv = calloc(n, sizeof(double));
    if (use_master) {
        master = malloc(n * sizeof *master);
        memcpy(master, p, n * sizeof *master);
        for (size_t i = 0; i < n; i++)
            p[i] = 0; /* params get the copy */
    }
    dt_adamw_args_t a = {.lr = 1e-2f,
                         .beta1 = 0.9f,
                         .beta2 = 0.95f,
                         .eps = 1e-8f,
                         .weight_decay = 0.1f,
                         .grad_scale = 0.5f};
    for (int step = 1; step <= 5; step++) {
        float *g = frand(n, 1);
        a.step = step;
        dev->ops->adamw(dev, p, master, g, m, v, n, &a, decay);
        /* Hand-written AdamW (torch.optim.AdamW semantics) in double. */
        double bc1 = 1 - pow(0.9, step), bc2 = 1 - pow(0.95, step);
        for (size_t i = 0; i < n; i++) {
            double gi = (double)g[i] * 0.5;
            rm[i] = 0.9 * rm[i] + 0.1 * gi;
            rv[i] = 0.95 * rv[i] + 0.05 * gi * gi;
            rp[i] -= (double)1e-2f * (rm[i] / bc1 / (sqrt(rv[i] / bc2) + 1e-8) +
                                      (decay ? (double)0.1f : 0.0) * rp[i]);
        }
        free(g);
    }
    check_close("params", p, 0, rp, n, 2e-6, 2e-5);
    if (master) check_close("master", master, 0, rp, n, 2e-6, 2e-5);
    check_close("m", m, 0, rm, n, 1e-7, 1e-5);
    check_close("v", v, 0, rv, n, 1e-8, 1e-5);
    dt_device_free(dev);
}

Test(adamw, with_weight_decay) { adamw_case(1, 0); }
Test(adamw, without_weight_decay) { adamw_case(0, 0); }
Test(adamw, master_copy_into_params) { adamw_case(1, 1); }

Test(adamw, first_step_moves_by_lr_times_sign) {
    /* Bias correction: at step 1 the update is lr * g / (|g| + eps) = lr * sign(g). */
    dt_device_t *dev = open_cpu(1);
    float p[3] = {1, 1, 1}, g[3] = {0.3f, -2.0f, 1e-3f}, m[3] = {0}, v[3] = {0};
    dt_adamw_args_t a = {
        .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-12f, .step = 1, .grad_scale = 1};
    dev->ops->adamw(dev, p, NULL, g, m, v, 3, &a, 1);
    cr_assert_float_eq(p[0], 0.9f, 1e-6);
    cr_assert_float_eq(p[1], 1.1f, 1e-6);
    cr_assert_float_eq(p[2], 0.9f, 1e-5);
    dt_device_free(dev);
}

Test(grad, norm_and_scale_against_serial) {
    rng_seed(17);
    size_t n = 1000003;
    float *g = frand(n, 3);
    double want = 0;
    for (size_t i = 0; i < n; i++)
        want += (double)g[i] * g[i];
    dt_device_t *d2 = open_cpu(2), *d1 = open_cpu(1);
    double got2 = d2->ops->grad_sq_norm(d2, g, n), got1 = d1->ops->grad_sq_norm(d1, g, n);
    cr_assert_float_eq(got2, want, 1e-10 * want);
    cr_assert_eq(memcmp(&got1, &got2, sizeof got1), 0, "norm independent of thread count");
    cr_assert_float_eq(d2->ops->grad_sq_norm(d2, g, 5),
                       (double)g[0] * g[0] + (double)g[1] * g[1] + (double)g[2] * g[2] +
                           (double)g[3] * g[3] + (double)g[4] * g[4],
                       1e-12);
    cr_assert_eq(d2->ops->grad_sq_norm(d2, g, 0), 0.0);
    float *h = malloc(n * sizeof *h);
    memcpy(h, g, n * sizeof *h);
    d2->ops->scale(d2, h, 0.37f, n);
    for (size_t i = 0; i < n; i++)
        if (h[i] != g[i] * 0.37f) cr_assert_fail("scale[%zu]: %g vs %g", i, h[i], g[i] * 0.37f);
    dt_device_free(d1);
    dt_device_free(d2);
}

/* ---- determinism ------------------------------------------------------------------------- */

/* One transformer-ish pass: every op that splits work over threads. Returns a
 * buffer holding all outputs and gradients. */
static float *pipeline_once(uint64_t seed, size_t *len) {
    rng_seed(seed);
    int B = 2, T = 67, C = 48, NH = 4, V = 61, Vp = 64, N = B * T;
    dt_device_t *dev = open_cpu(2);
    int *tok = malloc(sizeof(int) * N);
    for (int i = 0; i < N; i++)
        tok[i] = (int)((rnd() * 0.5f + 0.5f) * V) % V;
    float *wte = frand((size_t)Vp * C, 1), *wpe = frand((size_t)T * C, 1);
    float *lnw = frand(C, 1), *lnb = frand(C, 1), *wqkv = frand((size_t)3 * C * C, 0.2f);
    float *bqkv = frand(3 * C, 0.1f);
    size_t total = (size_t)N * C * 6 + (size_t)N * 3 * C * 2 + (size_t)Vp * C * 2 + 3 * C * C + N +
                   (size_t)N * Vp + 8;
    float *all = calloc(total, sizeof(float)), *cur = all;
#define TAKE(n) (cur += (n), cur - (n))
    float *x = TAKE((size_t)N * C), *ln = TAKE((size_t)N * C), *qkv = TAKE((size_t)N * 3 * C);
    float *att = TAKE((size_t)N * C), *mean = TAKE(N), *rstd = TAKE(N);
    float *logits = TAKE((size_t)N * Vp), *losses = TAKE(N);
    float *dx = TAKE((size_t)N * C), *dln = TAKE((size_t)N * C), *dqkv = TAKE((size_t)N * 3 * C);
    float *dwte = TAKE((size_t)Vp * C), *dwqkv = TAKE((size_t)3 * C * C),
          *datt = TAKE((size_t)N * C);
    float *dlnw = TAKE(C), *dlnb = TAKE(C), *dbqkv = TAKE(3 * C);
    cr_assert_leq((size_t)(cur - all), total);
    float *saved = malloc(dev->ops->attention_saved_bytes(dev, B, T, C, NH, NH));
    float *scratch = malloc(dev->ops->attention_scratch_bytes(dev, B, T, C, NH, NH));
    const dt_ops_t *o = dev->ops;
    o->encoder_forward(dev, x, tok, wte, wpe, NULL, B, T, C);
    o->layernorm_forward(dev, ln, mean, rstd, x, lnw, lnb, N, C);
    o->matmul_forward(dev, qkv, ln, wqkv, bqkv, N, C, 3 * C);
    o->attention_forward(dev, att, saved, qkv, NULL, B, T, C, NH, NH);
    o->matmul_forward(dev, logits, att, wte, NULL, N, C, Vp);
    o->softmax_xent_backward(dev, logits, losses, logits, tok, 1.0f / N, N, V, Vp);
    o->matmul_backward(dev, datt, dwte, NULL, logits, att, wte, N, C, Vp);
    o->attention_backward(dev, dqkv, scratch, datt, qkv, saved, NULL, B, T, C, NH, NH);
    o->matmul_backward(dev, dln, dwqkv, dbqkv, dqkv, ln, wqkv, N, C, 3 * C);
    o->layernorm_backward(dev, dx, dlnw, dlnb, dln, x, lnw, mean, rstd, N, C);
    o->encoder_backward(dev, dwte, NULL, dx, tok, NULL, B, T, C);
    o->gelu_forward(dev, ln, x, (size_t)N * C);
#undef TAKE
    *len = total;
    dt_device_free(dev);
    return all;
}

Test(determinism, two_runs_bitwise_identical_with_two_threads) {
    size_t n1, n2;
    float *a = pipeline_once(42, &n1), *b = pipeline_once(42, &n2);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(a, b, n1 * sizeof(float)), 0, "outputs differ between runs");
    /* The comparison is not vacuous: another seed gives other numbers. */
    float *c = pipeline_once(43, &n2);
    cr_assert_neq(memcmp(a, c, n1 * sizeof(float)), 0);
    int nonzero = 0;
    for (size_t i = 0; i < n1; i++)
        nonzero += a[i] != 0.0f;
    cr_assert_gt(nonzero, (int)(n1 / 2));
}
