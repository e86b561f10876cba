/*
 * test_kernels.c - the CPU op table against double-precision references.
 *
 * Forward ops are compared with straightforward double implementations written
 * here. Backward ops are compared with central finite differences of those double
 * references: for an op out = f(x) and fixed random weights R, the scalar
 * L = sum(out * R) is differentiated numerically (h = 1e-4, error ~1e-8) and the
 * float op is run with dout = R. Float results must match within
 * |got - ref| <= atol + rtol |ref| (tolerances stated per test; fp32 rounding of
 * O(1) values accumulated over O(100) terms gives ~1e-5). Every backward is run on
 * gradient buffers pre-filled with a known value to check that it accumulates.
 *
 * This file: device and memory, encoder, layernorm, matmul, attention and the
 * elementwise ops; test_kernels_train.c has the losses, the optimizer, the gradient
 * norm and determinism. Shared helpers: kernels_harness.h.
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

/* ---- device and memory ------------------------------------------------------ */

Test(device, cpu_table_is_complete_and_reports_threads) {
    dt_device_t *dev = open_cpu(2);
    cr_assert_eq(dev->kind, DT_DEVICE_CPU);
    cr_assert_eq(dev->nthreads, 2);
    cr_assert_str_eq(dev->ops->name, "cpu");
    cr_assert_eq(dev->ops->dtype, DT_DTYPE_F32);
    /* The CPU backend fills every slot. */
    /* Every member from alloc on is a function pointer. */
    const void *const *slot =
        (const void *const *)((const char *)dev->ops + offsetof(dt_ops_t, alloc));
    size_t nslots = (sizeof(dt_ops_t) - offsetof(dt_ops_t, alloc)) / sizeof(void *);
    cr_assert_gt(nslots, 30);
    for (size_t i = 0; i < nslots; i++)
        cr_assert_not_null(slot[i], "slot %zu is NULL", i);
    /* mem_info: what the host can still give, within its physical memory */
    size_t fb = 0, tb = 0;
    cr_assert_eq(dev->ops->mem_info(dev, &fb, &tb), DT_STATUS_OK);
    cr_assert_gt(tb, 0);
    cr_assert_gt(fb, 0);
    cr_assert_leq(fb, tb);
    dt_device_free(dev);
    /* nthreads <= 0 takes OpenMP's default (OMP_NUM_THREADS). */
    dev = open_cpu(0);
    cr_assert_geq(dev->nthreads, 1);
    dt_device_free(dev);
}

Test(device, cuda_unavailable_and_kind_names) {
    dt_device_t *dev = (dt_device_t *)1;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CUDA, 1), DT_STATUS_UNSUPPORTED);
    cr_assert_null(dev);
    cr_assert(strstr(dt_error_detail(), "cuda") != NULL, "detail: %s", dt_error_detail());
    dt_device_kind_t k;
    cr_assert_eq(dt_device_kind_parse("cpu", &k), DT_STATUS_OK);
    cr_assert_eq(k, DT_DEVICE_CPU);
    cr_assert_eq(dt_device_kind_parse("tpu", &k), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "tpu") != NULL);
    cr_assert_str_eq(dt_device_kind_name(DT_DEVICE_CUDA), "cuda");
    cr_assert_eq(dt_dtype_size(DT_DTYPE_BF16), 2);
    cr_assert_eq(dt_dtype_size(DT_DTYPE_F32), 4);
    cr_assert_eq(dt_device_built(DT_DEVICE_CPU), 1);
}

Test(device, alloc_is_accounted_copy_and_set) {
    dt_device_t *dev = open_cpu(1);
    int64_t before = dt_mem_current(DT_MEM_ACTIVATIONS);
    void *p = NULL, *q = NULL;
    cr_assert_eq(dev->ops->alloc(dev, DT_MEM_ACTIVATIONS, 4096, &p), DT_STATUS_OK);
    cr_assert_eq(dev->ops->alloc(dev, DT_MEM_ACTIVATIONS, 4096, &q), DT_STATUS_OK);
    cr_assert_eq(dt_mem_current(DT_MEM_ACTIVATIONS) - before, 8192);
    cr_assert_eq((uintptr_t)p % 64, 0);
    cr_assert_eq(((unsigned char *)p)[100], 0, "zero-filled");
    cr_assert_eq(dev->ops->set(dev, p, 0x5a, 4096), DT_STATUS_OK);
    cr_assert_eq(dev->ops->copy(dev, q, p, 4096, DT_COPY_DEVICE_TO_DEVICE), DT_STATUS_OK);
    cr_assert_eq(((unsigned char *)q)[4095], 0x5a);
    cr_assert_eq(dev->ops->copy(dev, q, NULL, 16, DT_COPY_HOST_TO_DEVICE), DT_STATUS_INVALID);
    float host[3] = {1.5f, -2.0f, 3.25f}, back[3];
    cr_assert_eq(dev->ops->upload_f32(dev, p, host, 3), DT_STATUS_OK);
    cr_assert_eq(dev->ops->download_f32(dev, back, p, 3), DT_STATUS_OK);
    cr_assert_eq(memcmp(host, back, sizeof host), 0);
    cr_assert_eq(dev->ops->synchronize(dev), DT_STATUS_OK);
    dev->ops->free(dev, p);
    dev->ops->free(dev, q);
    dev->ops->free(dev, NULL);
    cr_assert_eq(dt_mem_current(DT_MEM_ACTIVATIONS), before);
    dt_device_free(dev);
}

/* copy_2d: rows at their pitches, the bytes between rows untouched; bad pitches
 * and NULLs are INVALID; nothing to copy is OK. */
Test(device, copy_2d_copies_rows_between_pitches) {
    dt_device_t *dev = open_cpu(1);
    enum { W = 13, H = 7, SP = 20, DP = 17 };
    unsigned char src[SP * H], dst[DP * H], want[DP * H];
    for (int i = 0; i < SP * H; i++) src[i] = (unsigned char)(i * 37 + 1);
    memset(dst, 0xee, sizeof dst);
    memcpy(want, dst, sizeof want);
    for (int r = 0; r < H; r++) memcpy(want + r * DP, src + r * SP, W);
    cr_assert_eq(dev->ops->copy_2d(dev, dst, DP, src, SP, W, H), DT_STATUS_OK);
    cr_assert_eq(memcmp(dst, want, sizeof dst), 0);
    cr_assert_eq(dev->ops->copy_2d(dev, dst, W - 1, src, SP, W, H), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "pitch"), "%s", dt_error_detail());
    cr_assert_eq(dev->ops->copy_2d(dev, NULL, DP, src, SP, W, H), DT_STATUS_INVALID);
    cr_assert_eq(dev->ops->copy_2d(dev, NULL, 0, NULL, 0, 0, H), DT_STATUS_OK);
    cr_assert_eq(dev->ops->copy_2d(dev, dst, DP, src, SP, W, 0), DT_STATUS_OK);
    cr_assert_eq(memcmp(dst, want, sizeof dst), 0);
    dt_device_free(dev);
}

Test(device, openblas_uses_vector_kernels_when_cpu_has_them) {
    dt_device_t *dev = open_cpu(1);
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && !getenv("OPENBLAS_CORETYPE"))
        cr_assert_str_neq(dt_cpu_blas_core(), "Prescott", "OpenBLAS left on generic kernels");
    dt_device_free(dev);
}

Test(device, peak_flops_probe_is_plausible_and_cached) {
    dt_device_t *dev = open_cpu(1);
    double t0 = dt_now_s();
    double f = dev->ops->peak_flops(dev);
    /* The probe times itself for 0.1 s plus a warm-up product; 3 s leaves room for a
     * loaded one-core machine (it was 1 s) and still catches an unbounded probe. */
    cr_assert_lt(dt_now_s() - t0, 3.0, "probe took too long");
    cr_assert_gt(f, 1e9, "peak %g FLOP/s", f); /* any CPU with a vector unit */
    cr_assert_lt(f, 1e13);
    cr_assert_eq(dev->ops->peak_flops(dev), f, "second call returns the cached value");
    dt_device_free(dev);
}

Test(device, fast_expf_accuracy) {
    cr_assert_eq(dt_cpu_expf(0.0f), 1.0f);
    cr_assert_eq(dt_cpu_expf(-100.0f), 0.0f);
    cr_assert_eq(dt_cpu_expf(-INFINITY), 0.0f);
    double worst = 0;
    for (float x = -87.0f; x < 88.0f; x += 0.00731f) {
        double rel = fabs((double)dt_cpu_expf(x) / exp((double)x) - 1.0);
        if (rel > worst) worst = rel;
    }
    cr_assert_lt(worst, 4e-7, "worst relative error %g", worst);
}

/* ---- encoder ------------------------------------------------------------------ */

typedef struct enc_ctx {
    int B, T, C;
    const int *tok;
    double *wte, *wpe;
    const float *R;
} enc_ctx;

static void enc_ref(const enc_ctx *c, double *out) {
    for (int bt = 0; bt < c->B * c->T; bt++)
        for (int i = 0; i < c->C; i++)
            out[bt * c->C + i] = c->wte[c->tok[bt] * c->C + i] + c->wpe[(bt % c->T) * c->C + i];
}
static double enc_loss(void *p) {
    enc_ctx *c = p;
    size_t n = (size_t)c->B * c->T * c->C;
    double *out = malloc(n * sizeof *out);
    enc_ref(c, out);
    double l = dot(out, c->R, n);
    free(out);
    return l;
}

Test(encoder, forward_and_backward) {
    rng_seed(1);
    int B = 2, T = 5, C = 12, V = 7, maxT = 8;
    dt_device_t *dev = open_cpu(2);
    int tok[10] = {3, 1, 3, 6, 0, 3, 3, 2, 6, 1}; /* repeats: accumulation */
    float *wte = frand((size_t)V * C, 1), *wpe = frand((size_t)maxT * C, 1);
    float *out = ffill((size_t)B * T * C, 0), *R = frand((size_t)B * T * C, 1);
    dev->ops->encoder_forward(dev, out, tok, wte, wpe, NULL, B, T, C);
    enc_ctx c = {B, T, C, tok, todouble(wte, (size_t)V * C), todouble(wpe, (size_t)maxT * C), R};
    double *ref = malloc(sizeof(double) * B * T * C);
    enc_ref(&c, ref);
    check_close("out", out, 0, ref, (size_t)B * T * C, 1e-6, 1e-6);

    float *dwte = ffill((size_t)V * C, PRE), *dwpe = ffill((size_t)maxT * C, PRE);
    dev->ops->encoder_backward(dev, dwte, dwpe, R, tok, NULL, B, T, C);
    double *g = malloc(sizeof(double) * maxT * C);
    fd_grad(enc_loss, &c, c.wte, (size_t)V * C, g);
    check_close("dwte", dwte, PRE, g, (size_t)V * C, 1e-5, 1e-5);
    fd_grad(enc_loss, &c, c.wpe, (size_t)maxT * C, g);
    check_close("dwpe", dwpe, PRE, g, (size_t)maxT * C, 1e-5, 1e-5);
    dt_device_free(dev);
}

/* ---- layernorm ------------------------------------------------------------------ */

typedef struct ln_ctx {
    int N, C;
    double *x, *w, *b;
    const float *R;
} ln_ctx;

static void ln_ref(const ln_ctx *c, double *out, double *mean, double *rstd) {
    for (int n = 0; n < c->N; n++) {
        const double *x = c->x + n * c->C;
        double m = 0, v = 0;
        for (int i = 0; i < c->C; i++)
            m += x[i];
        m /= c->C;
        for (int i = 0; i < c->C; i++)
            v += (x[i] - m) * (x[i] - m);
        v /= c->C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int i = 0; i < c->C; i++)
            out[n * c->C + i] = (x[i] - m) * s * c->w[i] + c->b[i];
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = s;
    }
}
static double ln_loss(void *p) {
    ln_ctx *c = p;
    size_t n = (size_t)c->N * c->C;
    double *out = malloc(n * sizeof *out);
    ln_ref(c, out, NULL, NULL);
    double l = dot(out, c->R, n);
    free(out);
    return l;
}

static void layernorm_case(int N, int C, int nthreads, int fd) {
    dt_device_t *dev = open_cpu(nthreads);
    size_t nc = (size_t)N * C;
    float *x = frand(nc, 2), *w = frand(C, 1), *b = frand(C, 1), *R = frand(nc, 1);
    for (size_t i = 0; i < nc; i++)
        x[i] += 0.5f; /* nonzero mean */
    float *out = ffill(nc, 0), *mean = ffill(N, 0), *rstd = ffill(N, 0);
    dev->ops->layernorm_forward(dev, out, mean, rstd, x, w, b, N, C);
    ln_ctx c = {N, C, todouble(x, nc), todouble(w, C), todouble(b, C), R};
    double *ref = malloc(nc * sizeof *ref), *rm = malloc(N * sizeof *rm),
           *rs = malloc(N * sizeof *rs);
    ln_ref(&c, ref, rm, rs);
    check_close("out", out, 0, ref, nc, 2e-5, 2e-5);
    check_close("mean", mean, 0, rm, N, 1e-6, 1e-6);
    check_close("rstd", rstd, 0, rs, N, 1e-6, 1e-5);

    float *dx = ffill(nc, PRE), *dw = ffill(C, PRE), *db = ffill(C, PRE);
    dev->ops->layernorm_backward(dev, dx, dw, db, R, x, w, mean, rstd, N, C);
    if (fd) {
        double *g = malloc(nc * sizeof *g);
        fd_grad(ln_loss, &c, c.x, nc, g);
        check_close("dinp", dx, PRE, g, nc, 2e-5, 1e-4);
        fd_grad(ln_loss, &c, c.w, C, g);
        check_close("dweight", dw, PRE, g, C, 2e-5, 1e-4);
        fd_grad(ln_loss, &c, c.b, C, g);
        check_close("dbias", db, PRE, g, C, 2e-5, 1e-4);
    } else {
        /* Threaded shape: same numbers as a single-threaded device. */
        dt_device_t *one = open_cpu(1);
        float *dx1 = ffill(nc, PRE), *dw1 = ffill(C, PRE), *db1 = ffill(C, PRE);
        one->ops->layernorm_backward(one, dx1, dw1, db1, R, x, w, mean, rstd, N, C);
        double *r1 = todouble(dx1, nc);
        check_close("dinp 2 vs 1 thread", dx, 0, r1, nc, 1e-6, 1e-6);
        free(r1);
        r1 = todouble(dw1, C);
        check_close("dweight 2 vs 1 thread", dw, 0, r1, C, 1e-5, 1e-5);
        free(r1);
        dt_device_free(one);
    }
    dt_device_free(dev);
}

Test(layernorm, forward_and_backward_small) {
    rng_seed(2);
    layernorm_case(10, 12, 2, 1);
}

Test(layernorm, threaded_shape_matches_one_thread) {
    rng_seed(3);
    layernorm_case(256, 200, 2, 0);
}

/* ---- matmul ----------------------------------------------------------------------- */

typedef struct mm_ctx {
    int N, C, OC;
    double *x, *w, *b; /* b may be NULL */
    const float *R;
} mm_ctx;

static void mm_ref(const mm_ctx *c, double *out) {
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->OC; o++) {
            double s = c->b ? c->b[o] : 0;
            for (int i = 0; i < c->C; i++)
                s += c->x[n * c->C + i] * c->w[o * c->C + i];
            out[n * c->OC + o] = s;
        }
}
static double mm_loss(void *p) {
    mm_ctx *c = p;
    size_t n = (size_t)c->N * c->OC;
    double *out = malloc(n * sizeof *out);
    mm_ref(c, out);
    double l = dot(out, c->R, n);
    free(out);
    return l;
}

/* Finite differences at `samples` random positions of x (all when 0). */
static void fd_check_sampled(const char *what, loss_fn f, void *ctx, double *x, size_t n,
                             const float *got, float offset, size_t samples, double atol,
                             double rtol) {
    if (samples == 0 || samples >= n) {
        double *g = malloc(n * sizeof *g);
        fd_grad(f, ctx, x, n, g);
        check_close(what, got, offset, g, n, atol, rtol);
        free(g);
        return;
    }
    for (size_t s = 0; s < samples; s++) {
        size_t i = (size_t)((rnd() * 0.5f + 0.5f) * (float)n) % n;
        double g;
        fd_grad(f, ctx, x + i, 1, &g);
        check_close(what, got + i, offset, &g, 1, atol, rtol);
    }
}

static void matmul_case(int N, int C, int OC, int with_bias, int with_dinp, int nthreads,
                        size_t samples) {
    dt_device_t *dev = open_cpu(nthreads);
    float *x = frand((size_t)N * C, 1), *w = frand((size_t)OC * C, 1);
    float *b = with_bias ? frand(OC, 1) : NULL, *R = frand((size_t)N * OC, 1);
    float *out = ffill((size_t)N * OC, 7);
    dev->ops->matmul_forward(dev, out, x, w, b, N, C, OC);
    mm_ctx c = {N,
                C,
                OC,
                todouble(x, (size_t)N * C),
                todouble(w, (size_t)OC * C),
                b ? todouble(b, OC) : NULL,
                R};
    double *ref = malloc(sizeof(double) * N * OC);
    mm_ref(&c, ref);
    check_close("out", out, 0, ref, (size_t)N * OC, 1e-5, 1e-5);

    float *dx = with_dinp ? ffill((size_t)N * C, PRE) : NULL;
    float *dw = ffill((size_t)OC * C, PRE), *db = with_bias ? ffill(OC, PRE) : NULL;
    dev->ops->matmul_backward(dev, dx, dw, db, R, x, w, N, C, OC);
    if (dx) fd_check_sampled("dinp", mm_loss, &c, c.x, (size_t)N * C, dx, PRE, samples, 1e-4, 1e-4);
    fd_check_sampled("dweight", mm_loss, &c, c.w, (size_t)OC * C, dw, PRE, samples, 1e-4, 1e-4);
    if (db) fd_check_sampled("dbias", mm_loss, &c, c.b, OC, db, PRE, samples, 1e-4, 1e-4);
    dt_device_free(dev);
}

Test(matmul, forward_and_backward_with_bias) {
    rng_seed(4);
    matmul_case(10, 12, 20, 1, 1, 2, 0);
}

Test(matmul, no_bias_no_dinp) {
    rng_seed(5);
    matmul_case(7, 9, 5, 0, 0, 1, 0);
}

Test(matmul, threaded_few_rows_split_by_channel) {
    rng_seed(19);
    /* 3 rows, 4099 output channels: threads split the channels. */
    matmul_case(3, 70, 4099, 1, 1, 2, 200);
}

Test(matmul, threaded_odd_shape) {
    rng_seed(6);
    /* 67 * 72 * 81 multiply-adds: above the threading threshold, odd splits. */
    matmul_case(67, 72, 81, 1, 1, 2, 150);
}

/* ---- attention ---------------------------------------------------------------------- */

typedef struct att_ctx {
    int B, T, C, NH;
    double *qkv;
    const float *R;
} att_ctx;

static void att_ref(const att_ctx *c, double *out) {
    int T = c->T, C = c->C, NH = c->NH, HS = C / NH;
    double *p = malloc(sizeof(double) * T);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = c->qkv + ((size_t)b * T + t) * 3 * C + h * HS;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const double *k = c->qkv + ((size_t)b * T + j) * 3 * C + C + h * HS;
                    double s = 0;
                    for (int i = 0; i < HS; i++)
                        s += q[i] * k[i];
                    p[j] = s / sqrt((double)HS);
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = 0; j <= t; j++)
                    sum += (p[j] = exp(p[j] - mx));
                for (int i = 0; i < HS; i++) {
                    double o = 0;
                    for (int j = 0; j <= t; j++)
                        o += p[j] / sum * c->qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * HS + i];
                    out[((size_t)b * T + t) * C + h * HS + i] = o;
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

static void attention_case(int B, int T, int C, int NH, int nthreads, size_t samples) {
    dt_device_t *dev = open_cpu(nthreads);
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    float *qkv = frand(nqkv, 1.5f), *R = frand(nout, 1), *out = ffill(nout, 9);
    float *saved = malloc(dev->ops->attention_saved_bytes(dev, B, T, C, NH, NH));
    float *scratch = malloc(dev->ops->attention_scratch_bytes(dev, B, T, C, NH, NH));
    dev->ops->attention_forward(dev, out, saved, qkv, NULL, B, T, C, NH, NH);
    att_ctx c = {B, T, C, NH, todouble(qkv, nqkv), R};
    double *ref = malloc(nout * sizeof *ref);
    att_ref(&c, ref);
    check_close("out", out, 0, ref, nout, 2e-6, 2e-5);
    /* Saved probabilities: rows sum to 1, zero above the diagonal. */
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++) {
            double s = 0;
            for (int j = 0; j < T; j++) {
                float pv = saved[((size_t)bh * T + t) * T + j];
                if (j > t) cr_assert_eq(pv, 0.0f, "P above diagonal at (%d,%d)", t, j);
                s += pv;
            }
            cr_assert_float_eq(s, 1.0, 1e-5);
        }
    float *dqkv = ffill(nqkv, PRE);
    dev->ops->attention_backward(dev, dqkv, scratch, R, qkv, saved, NULL, B, T, C, NH, NH);
    fd_check_sampled("dqkv", att_loss, &c, c.qkv, nqkv, dqkv, PRE, samples, 2e-5, 1e-4);
    dt_device_free(dev);
}

Test(attention, forward_and_backward_small) {
    rng_seed(7);
    attention_case(2, 5, 12, 3, 2, 0);
}

Test(attention, single_position_and_single_head) {
    rng_seed(18);
    attention_case(3, 1, 5, 1, 2, 0); /* T = 1: output is v itself */
    attention_case(1, 3, 7, 1, 1, 0); /* one head of odd width */
}

Test(attention, several_row_blocks) {
    rng_seed(8);
    /* T = 70 > the 64-row block: the second block sees the whole first one. */
    attention_case(1, 70, 8, 2, 1, 0);
}

Test(attention, threaded_shape) {
    rng_seed(9);
    attention_case(2, 70, 32, 4, 2, 300);
}

/* ---- elementwise ----------------------------------------------------------------------- */

typedef struct ew_ctx {
    size_t n;
    double *x, *y;
    const float *R;
    int op; /* 0 gelu, 1 relu, 2 residual */
} ew_ctx;

static double gelu_d(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
static void ew_ref(const ew_ctx *c, double *out) {
    for (size_t i = 0; i < c->n; i++) {
        double x = c->x[i];
        out[i] = c->op == 0 ? gelu_d(x) : c->op == 1 ? (x > 0 ? x : 0) : x + c->y[i];
    }
}
static double ew_loss(void *p) {
    ew_ctx *c = p;
    double *out = malloc(c->n * sizeof *out);
    ew_ref(c, out);
    double l = dot(out, c->R, c->n);
    free(out);
    return l;
}

static void elementwise_case(int op, size_t n, int fd) {
    dt_device_t *dev = open_cpu(2);
    float *x = frand(n, 4), *y = frand(n, 1), *R = frand(n, 1), *out = ffill(n, 3);
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) < 1e-2f) x[i] = 0.5f; /* keep FD away from ReLU's kink */
    x[0] = 12.0f;                             /* tails of GELU */
    x[1] = -12.0f;
    if (op == 0) dev->ops->gelu_forward(dev, out, x, n);
    if (op == 1) dev->ops->relu_forward(dev, out, x, n);
    if (op == 2) dev->ops->residual_forward(dev, out, x, y, n);
    ew_ctx c = {n, todouble(x, n), todouble(y, n), R, op};
    double *ref = malloc(n * sizeof *ref);
    ew_ref(&c, ref);
    check_close("out", out, 0, ref, n, 1e-6, 1e-6);
    float *dx = ffill(n, PRE), *dy = ffill(n, PRE);
    if (op == 0) dev->ops->gelu_backward(dev, dx, x, R, n);
    if (op == 1) dev->ops->relu_backward(dev, dx, x, R, n);
    if (op == 2) dev->ops->residual_backward(dev, dx, dy, R, n);
    fd_check_sampled("dinp", ew_loss, &c, c.x, n, dx, PRE, fd ? 0 : 200, 1e-5, 1e-4);
    if (op == 2) fd_check_sampled("dinp2", ew_loss, &c, c.y, n, dy, PRE, fd ? 0 : 200, 1e-5, 1e-4);
    dt_device_free(dev);
}

Test(elementwise, gelu) {
    rng_seed(10);
    elementwise_case(0, 301, 1);
}
Test(elementwise, gelu_threaded) {
    rng_seed(11);
    elementwise_case(0, 100003, 0);
}
Test(elementwise, relu) {
    rng_seed(12);
    elementwise_case(1, 301, 1);
}
Test(elementwise, residual_threaded) {
    rng_seed(13);
    elementwise_case(2, 100003, 0);
}

Test(elementwise, residual_backward_null_side) {
    dt_device_t *dev = open_cpu(1);
    float d[4] = {1, 2, 3, 4}, a[4] = {1, 1, 1, 1};
    dev->ops->residual_backward(dev, a, NULL, d, 4);
    cr_assert_eq(a[3], 5.0f);
    dt_device_free(dev);
}
