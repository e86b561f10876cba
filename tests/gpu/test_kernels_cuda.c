/*
 * test_kernels_cuda.c - the CUDA backend's core ops (device memory, matmul,
 * elementwise, AdamW, gradient norm) against the CPU backend on the same inputs,
 * for both CUDA compute dtypes (fp32 and bf16). Every test skips when no CUDA
 * device is visible; it runs on a GPU machine (scripts/gpu_check.sh) and under the
 * CPU emulator (make emu-test).
 *
 * Method: random fp32 inputs are uploaded with upload_f32 and downloaded again, so
 * the CPU op sees exactly the (bf16-rounded) values the GPU op sees. Outputs an op
 * writes are poisoned first (0xFF bytes: NaN in fp32 and bf16) and the bytes past
 * the end must stay poisoned; gradients an op accumulates into are pre-filled with
 * non-zero values. No result may be NaN or infinite.
 *
 * Tolerances, per element, |gpu - cpu| <= R * |cpu| + E * S where S is the sum of
 * the magnitudes that went into the element (for a matmul S = |a| @ |b| + |prefill|
 * + |bias|, computed by the CPU op on absolute values):
 *   R: the bf16 output rounding, one round-to-nearest = at most 2^-9 relative; we
 *      allow 2^-8 (BF16_R). 0 for fp32 outputs.
 *   E: fp32 arithmetic. Elementwise: 1e-5 (a few ulps of expf and of the formula).
 *      Sums of K products: 8 sqrt(K) 2^-24 (rounding errors of fp32 accumulation
 *      grow like sqrt(K) for random signs; 8 leaves room for the GPU and OpenBLAS
 *      summing in different orders).
 * Ops that compute the same IEEE operations on both sides (relu, residual, scale in
 * fp32) must match exactly.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/status.h"
#include "kernels/kernels.h"

#define BF16_R (1.0 / 256.0)
#define EW_E 1e-5

static int have_cuda(void) { return dt_device_count(DT_DEVICE_CUDA) > 0; }
#define NEED_CUDA()                                                                    \
    do {                                                                               \
        if (!have_cuda()) cr_skip_test("no CUDA device visible");                      \
    } while (0)

typedef struct ctx {
    dt_device_t *g; /* CUDA */
    dt_device_t *c; /* CPU reference, one thread */
    dt_dtype_t dt;
    size_t es; /* bytes per GPU element */
    uint64_t rng;
} ctx;

static void ctx_open(ctx *x, dt_dtype_t dt) {
    memset(x, 0, sizeof *x);
    dt_device_opts_t o = {.kind = DT_DEVICE_CUDA, .nthreads = 1, .ordinal = 0, .dtype = dt};
    cr_assert_eq(dt_device_open(&x->g, &o), DT_STATUS_OK, "open cuda: %s", dt_error_detail());
    cr_assert_eq(dt_device_init(&x->c, DT_DEVICE_CPU, 1), DT_STATUS_OK);
    x->dt = dt;
    x->es = dt_dtype_size(dt);
    x->rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)dt;
    cr_assert_str_eq(x->g->ops->name, "cuda");
    cr_assert_eq(x->g->ops->dtype, dt);
}

static void ctx_close(ctx *x) {
    cr_assert_eq(x->g->ops->synchronize(x->g), DT_STATUS_OK, "%s", dt_error_detail());
    dt_device_free(x->g);
    dt_device_free(x->c);
}

static float urand(ctx *x) { /* uniform in [-1, 1) */
    x->rng ^= x->rng << 13;
    x->rng ^= x->rng >> 7;
    x->rng ^= x->rng << 17;
    return (float)((x->rng >> 40) * (1.0 / (1 << 23))) - 1.0f;
}

static float *host_rand(ctx *x, size_t n, float scale) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = scale * urand(x);
    return h;
}

/* A device buffer of n elements (+ pad poisoned elements after them). */
static void *dev_alloc(ctx *x, size_t n, size_t pad) {
    void *d = NULL;
    cr_assert_eq(x->g->ops->alloc(x->g, DT_MEM_OTHER, (n + pad) * x->es, &d), DT_STATUS_OK, "%s",
                 dt_error_detail());
    if (pad)
        cr_assert_eq(x->g->ops->set(x->g, (char *)d + n * x->es, 0xFF, pad * x->es), DT_STATUS_OK);
    return d;
}

/* Uploads h (n) into d and replaces h by the values the device holds (bf16-rounded). */
static void upload_round(ctx *x, void *d, float *h, size_t n) {
    cr_assert_eq(x->g->ops->upload_f32(x->g, d, h, n), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(x->g->ops->download_f32(x->g, h, d, n), DT_STATUS_OK, "%s", dt_error_detail());
}

static void *dev_from(ctx *x, float *h, size_t n) {
    void *d = dev_alloc(x, n, 0);
    upload_round(x, d, h, n);
    return d;
}

static void poison(ctx *x, void *d, size_t n) {
    cr_assert_eq(x->g->ops->set(x->g, d, 0xFF, n * x->es), DT_STATUS_OK);
}

static float *dev_read(ctx *x, const void *d, size_t n) {
    cr_assert_eq(x->g->ops->synchronize(x->g), DT_STATUS_OK, "synchronize: %s", dt_error_detail());
    float *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert_eq(x->g->ops->download_f32(x->g, h, d, n), DT_STATUS_OK, "%s", dt_error_detail());
    return h;
}

/* The pad elements after d[n] still hold 0xFF bytes. */
static void check_guard(ctx *x, const void *d, size_t n, size_t pad, const char *what) {
    size_t bytes = pad * x->es;
    unsigned char *b = malloc(bytes);
    cr_assert_eq(x->g->ops->copy(x->g, b, (const char *)d + n * x->es, bytes, DT_COPY_DEVICE_TO_HOST),
                 DT_STATUS_OK);
    for (size_t i = 0; i < bytes; i++) cr_assert_eq(b[i], 0xFF, "%s: byte %zu past the end was written", what, i);
    free(b);
}

/* |got - ref| <= r * |ref| + e * scale[i] (scale NULL: |ref|), and got finite. */
static void check_close(const char *what, const float *got, const float *ref, const float *scale, size_t n,
                        double r, double e) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(isfinite(got[i]), "%s[%zu] = %g is not finite (ref %g)", what, i, got[i], ref[i]);
        cr_assert(isfinite(ref[i]), "%s: reference [%zu] = %g is not finite", what, i, ref[i]);
        double s = scale ? scale[i] : fabs(ref[i]);
        double tol = r * fabs(ref[i]) + e * s;
        double d = fabs((double)got[i] - ref[i]);
        cr_assert(d <= tol, "%s[%zu]: gpu %.9g cpu %.9g |diff| %.3g > tol %.3g", what, i, got[i], ref[i], d, tol);
        if (tol > 0 && d / tol > worst) worst = d / tol;
    }
    (void)worst;
}

static float round_bf16(float f) { /* round to nearest even, as __float2bfloat16 */
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7f800000u) == 0x7f800000u) return f;
    b += 0x7fffu + ((b >> 16) & 1u);
    b &= 0xffff0000u;
    memcpy(&f, &b, 4);
    return f;
}

static float *absdup(const float *h, size_t n) {
    float *a = malloc((n ? n : 1) * sizeof *a);
    for (size_t i = 0; i < n; i++) a[i] = fabsf(h[i]);
    return a;
}

#ifdef DT_USE_CUDA

/* ---- device ----------------------------------------------------------------------- */

static void device_basics(dt_dtype_t dt) {
    NEED_CUDA();
    ctx x;
    ctx_open(&x, dt);
    const dt_ops_t *o = x.g->ops;
    cr_assert(o->alloc && o->free && o->copy && o->set && o->synchronize && o->upload_f32 && o->download_f32 &&
              o->peak_flops);
    cr_assert(o->matmul_forward && o->matmul_backward && o->gelu_forward && o->gelu_backward && o->relu_forward &&
              o->relu_backward && o->residual_forward && o->residual_backward && o->adamw && o->grad_sq_norm &&
              o->scale);
    cr_assert_geq(o->peak_flops(x.g), 0.0);
    /* alloc: zero-filled and accounted under its category, un-accounted by free */
    size_t bytes = 1000003;
    int64_t before = dt_mem_current(DT_MEM_ACTIVATIONS);
    void *d = NULL;
    cr_assert_eq(o->alloc(x.g, DT_MEM_ACTIVATIONS, bytes, &d), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_mem_current(DT_MEM_ACTIVATIONS) - before, (int64_t)bytes);
    unsigned char *h = malloc(bytes);
    memset(h, 0x5a, bytes);
    cr_assert_eq(o->copy(x.g, h, d, bytes, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK);
    for (size_t i = 0; i < bytes; i++) cr_assert_eq(h[i], 0, "byte %zu of a fresh allocation is %d", i, h[i]);
    o->free(x.g, d);
    o->free(x.g, NULL);
    cr_assert_eq(dt_mem_current(DT_MEM_ACTIVATIONS), before);
    /* more than any GPU has: NOMEM naming the size, nothing accounted, device still fine */
    d = (void *)1;
    cr_assert_eq(o->alloc(x.g, DT_MEM_ACTIVATIONS, (size_t)1 << 50, &d), DT_STATUS_NOMEM);
    cr_assert_null(d);
    cr_assert(strstr(dt_error_detail(), "1125899906842624 bytes") && strstr(dt_error_detail(), "out of GPU memory"),
              "detail: %s", dt_error_detail());
    cr_assert_eq(dt_mem_current(DT_MEM_ACTIVATIONS), before);
    cr_assert_eq(o->synchronize(x.g), DT_STATUS_OK, "%s", dt_error_detail());
    free(h);
    ctx_close(&x);
}
Test(cuda_device, basics_alloc_zero_filled_and_accounted_f32) { device_basics(DT_DTYPE_F32); }
Test(cuda_device, basics_alloc_zero_filled_and_accounted_bf16) { device_basics(DT_DTYPE_BF16); }

Test(cuda_device, bad_ordinal_is_unsupported_and_named) {
    NEED_CUDA();
    dt_device_t *d = NULL;
    dt_device_opts_t o = {.kind = DT_DEVICE_CUDA, .nthreads = 1, .ordinal = 1000, .dtype = DT_DTYPE_BF16};
    cr_assert_eq(dt_device_open(&d, &o), DT_STATUS_UNSUPPORTED);
    cr_assert_null(d);
    cr_assert(strstr(dt_error_detail(), "1000") && strstr(dt_error_detail(), "visible"), "detail: %s",
              dt_error_detail());
}

/* copy_2d on the device: rows of odd width between odd pitches at odd offsets land
 * as the CPU's memcpy loop puts them, the bytes between rows untouched; a pitch
 * below the width is INVALID. */
Test(cuda_device, copy_2d_matches_a_row_loop) {
    NEED_CUDA();
    ctx x;
    ctx_open(&x, DT_DTYPE_BF16);
    const dt_ops_t *o = x.g->ops;
    enum { W = 301, H = 37, SP = 333, DP = 310 };
    size_t sb = (size_t)SP * H + 8, db = (size_t)DP * H + 8;
    unsigned char *src = malloc(sb), *want = malloc(db), *back = malloc(db);
    for (size_t i = 0; i < sb; i++) src[i] = (unsigned char)(i * 131 + 7);
    memset(want, 0x77, db);
    for (int r = 0; r < H; r++) memcpy(want + 5 + (size_t)r * DP, src + 3 + (size_t)r * SP, W);
    void *a = NULL, *b = NULL;
    cr_assert_eq(o->alloc(x.g, DT_MEM_OTHER, sb, &a), DT_STATUS_OK);
    cr_assert_eq(o->alloc(x.g, DT_MEM_OTHER, db, &b), DT_STATUS_OK);
    cr_assert_eq(o->copy(x.g, a, src, sb, DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK);
    cr_assert_eq(o->set(x.g, b, 0x77, db), DT_STATUS_OK);
    cr_assert_eq(o->copy_2d(x.g, (char *)b + 5, DP, (char *)a + 3, SP, W, H), DT_STATUS_OK);
    cr_assert_eq(o->copy(x.g, back, b, db, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK);
    cr_assert_eq(memcmp(back, want, db), 0);
    cr_assert_eq(o->copy_2d(x.g, b, DP, a, W - 1, W, H), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "pitch"), "%s", dt_error_detail());
    cr_assert_eq(o->copy_2d(x.g, b, DP, a, SP, W, 0), DT_STATUS_OK);
    cr_assert_eq(o->synchronize(x.g), DT_STATUS_OK);
    o->free(x.g, a);
    o->free(x.g, b);
    free(src);
    free(want);
    free(back);
    ctx_close(&x);
}

Test(cuda_device, copy_all_four_kinds_round_trip) {
    NEED_CUDA();
    ctx x;
    ctx_open(&x, DT_DTYPE_F32);
    const dt_ops_t *o = x.g->ops;
    size_t bytes = 777777;
    unsigned char *src = malloc(bytes), *back = malloc(bytes), *hh = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) src[i] = (unsigned char)(i * 131 + 7);
    void *a = NULL, *b = NULL;
    cr_assert_eq(o->alloc(x.g, DT_MEM_OTHER, bytes + 16, &a), DT_STATUS_OK);
    cr_assert_eq(o->alloc(x.g, DT_MEM_OTHER, bytes + 16, &b), DT_STATUS_OK);
    /* odd offsets: copies are bytes, not elements */
    cr_assert_eq(o->copy(x.g, (char *)a + 3, src, bytes, DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK);
    cr_assert_eq(o->copy(x.g, (char *)b + 5, (char *)a + 3, bytes, DT_COPY_DEVICE_TO_DEVICE), DT_STATUS_OK);
    cr_assert_eq(o->copy(x.g, back, (char *)b + 5, bytes, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK);
    cr_assert_eq(memcmp(back, src, bytes), 0);
    cr_assert_eq(o->copy(x.g, hh, src, bytes, DT_COPY_HOST_TO_HOST), DT_STATUS_OK);
    cr_assert_eq(memcmp(hh, src, bytes), 0);
    /* set, then bad arguments */
    cr_assert_eq(o->set(x.g, (char *)a + 1, 0x3c, 100), DT_STATUS_OK);
    cr_assert_eq(o->copy(x.g, back, a, 102, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK);
    cr_assert_eq(back[0], 0);
    for (int i = 1; i <= 100; i++) cr_assert_eq(back[i], 0x3c);
    cr_assert_eq(back[101], src[98]);
    cr_assert_eq(o->copy(x.g, NULL, src, 8, DT_COPY_HOST_TO_DEVICE), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "destination"), "%s", dt_error_detail());
    cr_assert_eq(o->copy(x.g, back, a, 8, (dt_copy_kind_t)9), DT_STATUS_INVALID);
    cr_assert_eq(o->copy(x.g, NULL, NULL, 0, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK);
    o->free(x.g, a);
    o->free(x.g, b);
    free(src);
    free(back);
    free(hh);
    ctx_close(&x);
}

/* More than one staging chunk (4 Mi elements), an odd count. */
static void upload_download(dt_dtype_t dt) {
    NEED_CUDA();
    ctx x;
    ctx_open(&x, dt);
    size_t n = ((size_t)4 << 20) + 1001;
    float *h = host_rand(&x, n, 3.0f), *back = malloc(n * sizeof *back);
    h[0] = 1.0f + 1.0f / 256.0f; /* halfway between two bf16: ties to even (1.0) */
    h[1] = 1.0f + 3.0f / 256.0f; /* halfway: ties to even (1 + 4/256) */
    h[2] = -0.0f;
    void *d = dev_alloc(&x, n, 16);
    cr_assert_eq(x.g->ops->upload_f32(x.g, d, h, n), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(x.g->ops->download_f32(x.g, back, d, n), DT_STATUS_OK, "%s", dt_error_detail());
    for (size_t i = 0; i < n; i++) {
        float want = dt == DT_DTYPE_BF16 ? round_bf16(h[i]) : h[i];
        cr_assert(memcmp(&back[i], &want, 4) == 0, "element %zu: %.9g uploaded, %.9g back, want %.9g", i, h[i],
                  back[i], want);
    }
    if (dt == DT_DTYPE_BF16) {
        cr_assert_eq(back[0], 1.0f);
        cr_assert_eq(back[1], 1.0f + 4.0f / 256.0f);
    }
    check_guard(&x, d, n, 16, "upload_f32");
    x.g->ops->free(x.g, d);
    free(h);
    free(back);
    ctx_close(&x);
}
Test(cuda_device, upload_download_round_trip_f32, .timeout = 120) { upload_download(DT_DTYPE_F32); }
Test(cuda_device, upload_download_round_to_nearest_bf16, .timeout = 120) { upload_download(DT_DTYPE_BF16); }

/* An op that cannot run reports at synchronize, naming the op; then the device
 * works again. */
Test(cuda_device, synchronize_reports_failed_op_by_name) {
    NEED_CUDA();
    ctx x;
    ctx_open(&x, DT_DTYPE_BF16);
    void *buf = dev_alloc(&x, 64, 0);
    x.g->ops->matmul_forward(x.g, buf, buf, buf, NULL, -5, 4, 4);
    dt_status_t st = x.g->ops->synchronize(x.g);
    cr_assert_neq(st, DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "matmul_forward"), "detail: %s", dt_error_detail());
    cr_assert_eq(x.g->ops->synchronize(x.g), DT_STATUS_OK, "the error is reported once: %s", dt_error_detail());
    /* bf16 parameters cannot be updated without fp32 master weights */
    dt_adamw_args_t a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1, .grad_scale = 1.0f};
    float *mv = NULL;
    cr_assert_eq(x.g->ops->alloc(x.g, DT_MEM_OPTIM, 64 * 4, (void **)&mv), DT_STATUS_OK);
    x.g->ops->adamw(x.g, buf, NULL, buf, mv, mv, 8, &a, 0);
    cr_assert_neq(x.g->ops->synchronize(x.g), DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "adamw"), "detail: %s", dt_error_detail());
    x.g->ops->free(x.g, mv);
    x.g->ops->free(x.g, buf);
    ctx_close(&x);
}

/* ---- matmul ----------------------------------------------------------------------- */

static void matmul_case(dt_dtype_t dt, int N, int C, int OC, int with_bias, int with_dinp) {
    ctx x;
    ctx_open(&x, dt);
    size_t nin = (size_t)N * C, nw = (size_t)OC * C, nout = (size_t)N * OC;
    float *inp = host_rand(&x, nin, 1.0f), *w = host_rand(&x, nw, 0.5f), *bias = host_rand(&x, OC, 0.5f);
    float *dout = host_rand(&x, nout, 1.0f);
    float *dinp0 = host_rand(&x, nin, 0.5f), *dw0 = host_rand(&x, nw, 0.5f), *db0 = host_rand(&x, OC, 0.5f);
    void *d_inp = dev_from(&x, inp, nin), *d_w = dev_from(&x, w, nw), *d_bias = dev_from(&x, bias, OC);
    void *d_dout = dev_from(&x, dout, nout);
    void *d_out = dev_alloc(&x, nout, 8), *d_dinp = dev_alloc(&x, nin, 8), *d_dw = dev_alloc(&x, nw, 8),
         *d_db = dev_alloc(&x, OC, 8);
    upload_round(&x, d_dinp, dinp0, nin);
    upload_round(&x, d_dw, dw0, nw);
    upload_round(&x, d_db, db0, OC);
    poison(&x, d_out, nout);
    const float *bp = with_bias ? bias : NULL;

    /* forward */
    x.g->ops->matmul_forward(x.g, d_out, d_inp, d_w, with_bias ? d_bias : NULL, N, C, OC);
    float *got = dev_read(&x, d_out, nout);
    float *ref = malloc(nout * sizeof *ref), *scale = malloc(nout * sizeof *scale);
    x.c->ops->matmul_forward(x.c, ref, inp, w, bp, N, C, OC);
    float *ainp = absdup(inp, nin), *aw = absdup(w, nw), *abias = absdup(bias, OC);
    x.c->ops->matmul_forward(x.c, scale, ainp, aw, with_bias ? abias : NULL, N, C, OC);
    double r = dt == DT_DTYPE_BF16 ? BF16_R : 0.0;
    check_close("matmul_forward out", got, ref, scale, nout, r, 8.0 * sqrt((double)C) * 0x1p-24);
    check_guard(&x, d_out, nout, 8, "matmul_forward");
    /* the same call again gives the same bits */
    x.g->ops->matmul_forward(x.g, d_out, d_inp, d_w, with_bias ? d_bias : NULL, N, C, OC);
    float *again = dev_read(&x, d_out, nout);
    cr_assert_eq(memcmp(again, got, nout * sizeof *got), 0, "matmul_forward is not deterministic");

    /* backward, accumulating onto the pre-filled gradients */
    x.g->ops->matmul_backward(x.g, with_dinp ? d_dinp : NULL, d_dw, with_bias ? d_db : NULL, d_dout, d_inp, d_w, N, C,
                              OC);
    float *g_dinp = dev_read(&x, d_dinp, nin), *g_dw = dev_read(&x, d_dw, nw), *g_db = dev_read(&x, d_db, OC);
    float *r_dinp = malloc(nin * sizeof(float)), *r_dw = malloc(nw * sizeof(float)), *r_db = malloc(OC * sizeof(float));
    memcpy(r_dinp, dinp0, nin * sizeof(float));
    memcpy(r_dw, dw0, nw * sizeof(float));
    memcpy(r_db, db0, OC * sizeof(float));
    x.c->ops->matmul_backward(x.c, with_dinp ? r_dinp : NULL, r_dw, with_bias ? r_db : NULL, dout, inp, w, N, C, OC);
    float *s_dinp = absdup(dinp0, nin), *s_dw = absdup(dw0, nw), *s_db = absdup(db0, OC), *adout = absdup(dout, nout);
    x.c->ops->matmul_backward(x.c, s_dinp, s_dw, s_db, adout, ainp, aw, N, C, OC);
    if (with_dinp)
        check_close("matmul_backward dinp", g_dinp, r_dinp, s_dinp, nin, r, 8.0 * sqrt((double)OC) * 0x1p-24);
    else
        cr_assert_eq(memcmp(g_dinp, dinp0, nin * sizeof(float)), 0, "dinp changed though NULL was passed");
    check_close("matmul_backward dweight", g_dw, r_dw, s_dw, nw, r, 8.0 * sqrt((double)N) * 0x1p-24);
    if (with_bias)
        check_close("matmul_backward dbias", g_db, r_db, s_db, OC, r, 8.0 * sqrt((double)N) * 0x1p-24);
    else
        cr_assert_eq(memcmp(g_db, db0, OC * sizeof(float)), 0, "dbias changed though NULL was passed");
    check_guard(&x, d_dinp, nin, 8, "dinp");
    check_guard(&x, d_dw, nw, 8, "dweight");
    check_guard(&x, d_db, OC, 8, "dbias");

    void *bufs[] = {d_inp, d_w, d_bias, d_dout, d_out, d_dinp, d_dw, d_db};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) x.g->ops->free(x.g, bufs[i]);
    float *hs[] = {inp, w, bias, dout, dinp0, dw0, db0, got, ref, scale, ainp, aw, abias, again, g_dinp, g_dw, g_db,
                   r_dinp, r_dw, r_db, s_dinp, s_dw, s_db, adout};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
    ctx_close(&x);
}

/* A bias that does not start on 16 bytes (parameters are packed, so ZeRO/FSDP shards
 * and odd model sizes put biases anywhere): cuBLASLt's BIAS epilogue is not used
 * for it; the result still matches the CPU. */
static void matmul_bias_offset(dt_dtype_t dt) {
    ctx x;
    ctx_open(&x, dt);
    int N = 9, C = 24, OC = 40;
    size_t nin = (size_t)N * C, nw = (size_t)OC * C, nout = (size_t)N * OC, es = dt_dtype_size(dt);
    float *inp = host_rand(&x, nin, 1.0f), *w = host_rand(&x, nw, 0.5f), *bias = host_rand(&x, OC, 0.5f);
    void *d_inp = dev_from(&x, inp, nin), *d_w = dev_from(&x, w, nw), *d_out = dev_alloc(&x, nout, 8);
    void *d_b = dev_alloc(&x, (size_t)OC + 1, 8);
    void *d_bias = (char *)d_b + es; /* 2 or 4 bytes past a 256-byte boundary */
    upload_round(&x, d_bias, bias, OC);
    poison(&x, d_out, nout);
    x.g->ops->matmul_forward(x.g, d_out, d_inp, d_w, d_bias, N, C, OC);
    float *got = dev_read(&x, d_out, nout);
    float *ref = malloc(nout * sizeof *ref), *scale = malloc(nout * sizeof *scale);
    x.c->ops->matmul_forward(x.c, ref, inp, w, bias, N, C, OC);
    float *ainp = absdup(inp, nin), *aw = absdup(w, nw), *abias = absdup(bias, OC);
    x.c->ops->matmul_forward(x.c, scale, ainp, aw, abias, N, C, OC);
    check_close("matmul_forward, bias off 16 bytes", got, ref, scale, nout, dt == DT_DTYPE_BF16 ? BF16_R : 0.0,
                8.0 * sqrt((double)C) * 0x1p-24);
    cr_assert_eq(x.g->ops->synchronize(x.g), DT_STATUS_OK, "%s", dt_error_detail());
    void *bufs[] = {d_inp, d_w, d_out, d_b};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) x.g->ops->free(x.g, bufs[i]);
    float *hs[] = {inp, w, bias, got, ref, scale, ainp, aw, abias};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
    ctx_close(&x);
}
Test(cuda_matmul, bias_not_16_byte_aligned_f32) { NEED_CUDA(); matmul_bias_offset(DT_DTYPE_F32); }
Test(cuda_matmul, bias_not_16_byte_aligned_bf16) { NEED_CUDA(); matmul_bias_offset(DT_DTYPE_BF16); }

Test(cuda_matmul, odd_small_f32) { NEED_CUDA(); matmul_case(DT_DTYPE_F32, 7, 13, 5, 1, 1); }
Test(cuda_matmul, odd_small_bf16) { NEED_CUDA(); matmul_case(DT_DTYPE_BF16, 7, 13, 5, 1, 1); }
Test(cuda_matmul, no_bias_no_dinp_f32) { NEED_CUDA(); matmul_case(DT_DTYPE_F32, 33, 64, 17, 0, 0); }
Test(cuda_matmul, no_bias_no_dinp_bf16) { NEED_CUDA(); matmul_case(DT_DTYPE_BF16, 33, 64, 17, 0, 0); }
Test(cuda_matmul, gpt2_mlp_shape_f32, .timeout = 300) { NEED_CUDA(); matmul_case(DT_DTYPE_F32, 64, 768, 3072, 1, 1); }
Test(cuda_matmul, gpt2_mlp_shape_bf16, .timeout = 300) { NEED_CUDA(); matmul_case(DT_DTYPE_BF16, 64, 768, 3072, 1, 1); }
/* dbias: several row chunks, the last one shorter; 16-byte packs (OC % 8 == 0) or not */
Test(cuda_matmul, many_rows_few_channels_bf16, .timeout = 120) { NEED_CUDA(); matmul_case(DT_DTYPE_BF16, 1001, 24, 3, 1, 1); }
Test(cuda_matmul, many_rows_packed_dbias_f32, .timeout = 120) { NEED_CUDA(); matmul_case(DT_DTYPE_F32, 777, 40, 48, 1, 1); }
Test(cuda_matmul, many_rows_packed_dbias_bf16, .timeout = 120) { NEED_CUDA(); matmul_case(DT_DTYPE_BF16, 777, 40, 48, 1, 1); }

/* The cublasGemmEx path (taken when cuBLASLt's heuristic finds no algorithm), forced
 * for the whole process: the bias comes from our broadcast kernel then. */
Test(cuda_matmul, gemmex_path_f32) {
    NEED_CUDA();
    setenv("DTRUN_CUDA_MATMUL", "gemmex", 1);
    matmul_case(DT_DTYPE_F32, 7, 13, 5, 1, 1);
    matmul_case(DT_DTYPE_F32, 777, 40, 48, 1, 0);
}
Test(cuda_matmul, gemmex_path_bf16) {
    NEED_CUDA();
    setenv("DTRUN_CUDA_MATMUL", "gemmex", 1);
    matmul_case(DT_DTYPE_BF16, 7, 13, 5, 1, 1);
    matmul_case(DT_DTYPE_BF16, 777, 40, 48, 1, 0);
}

/* ---- elementwise -------------------------------------------------------------------- */

enum ew_op { EW_GELU_F, EW_GELU_B, EW_RELU_F, EW_RELU_B, EW_RES_F, EW_RES_B, EW_RES_B_NO_DB, EW_RES_B_NO_DA, EW_SCALE };
static const char *const ew_names[] = {"gelu_forward",      "gelu_backward",          "relu_forward",
                                       "relu_backward",     "residual_forward",       "residual_backward",
                                       "residual_backward (db NULL)", "residual_backward (da NULL)", "scale"};

/* One op on n elements; off shifts every device pointer by that many elements (1:
 * not 16-byte aligned, the one-at-a-time path). */
static void ew_case(ctx *xp, enum ew_op op, size_t n, size_t off) {
    ctx x = *xp; /* a copy: the rng state carries over through *xp below */
    dt_dtype_t dt = x.dt;
    const size_t PAD = 9;
    float *a = host_rand(&x, n, 4.0f), *b = host_rand(&x, n, 2.0f), *acc = host_rand(&x, n, 1.0f),
          *acc2 = host_rand(&x, n, 1.0f);
    if (n > 3) a[3] = 0.0f; /* relu's kink */
    char *ba = dev_alloc(&x, n + off, 0), *bb = dev_alloc(&x, n + off, 0), *bo = dev_alloc(&x, n + off, PAD),
         *bo2 = dev_alloc(&x, n + off, PAD);
    void *da = ba + off * x.es, *db = bb + off * x.es, *dout = bo + off * x.es, *dout2 = bo2 + off * x.es;
    upload_round(&x, da, a, n);
    upload_round(&x, db, b, n);
    int accumulates = op == EW_GELU_B || op == EW_RELU_B || op == EW_RES_B || op == EW_RES_B_NO_DB || op == EW_RES_B_NO_DA;
    if (op == EW_SCALE) {
        memcpy(acc, a, n * sizeof(float));
        upload_round(&x, dout, acc, n);
    } else if (accumulates) {
        upload_round(&x, dout, acc, n);
        upload_round(&x, dout2, acc2, n);
    } else {
        poison(&x, dout, n);
    }
    float *ref = malloc((n ? n : 1) * sizeof(float)), *ref2 = malloc((n ? n : 1) * sizeof(float));
    memcpy(ref, acc, n * sizeof(float));
    memcpy(ref2, acc2, n * sizeof(float));
    const dt_ops_t *g = x.g->ops, *c = x.c->ops;
    double e = EW_E; /* the fp32 math, gelu only */
    switch (op) {
    case EW_GELU_F: g->gelu_forward(x.g, dout, da, n); c->gelu_forward(x.c, ref, a, n); break;
    case EW_GELU_B: g->gelu_backward(x.g, dout, da, db, n); c->gelu_backward(x.c, ref, a, b, n); break;
    case EW_RELU_F: g->relu_forward(x.g, dout, da, n); c->relu_forward(x.c, ref, a, n); e = 0; break;
    case EW_RELU_B: g->relu_backward(x.g, dout, da, db, n); c->relu_backward(x.c, ref, a, b, n); e = 0; break;
    case EW_RES_F: g->residual_forward(x.g, dout, da, db, n); c->residual_forward(x.c, ref, a, b, n); e = 0; break;
    case EW_RES_B: g->residual_backward(x.g, dout, dout2, db, n); c->residual_backward(x.c, ref, ref2, b, n); e = 0; break;
    case EW_RES_B_NO_DB: g->residual_backward(x.g, dout, NULL, db, n); c->residual_backward(x.c, ref, NULL, b, n); e = 0; break;
    case EW_RES_B_NO_DA: g->residual_backward(x.g, NULL, dout2, db, n); c->residual_backward(x.c, NULL, ref2, b, n); e = 0; break;
    case EW_SCALE: g->scale(x.g, dout, -0.37f, n); c->scale(x.c, ref, -0.37f, n); e = 0; break;
    }
    float *got = dev_read(&x, dout, n), *got2 = dev_read(&x, dout2, n);
    /* S: the magnitudes summed into each element: |prefill| + |what the op added|,
     * plus |dout| for gelu's backward, whose derivative cancels near x = -0.75 */
    float *scale = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        scale[i] = accumulates ? fabsf(acc[i]) + fabsf(ref[i] - acc[i]) : fabsf(ref[i]);
        if (op == EW_GELU_B) scale[i] += fabsf(b[i]);
    }
    double r = dt == DT_DTYPE_BF16 ? BF16_R : 0.0;
    char what[96];
    snprintf(what, sizeof what, "%s n=%zu off=%zu", ew_names[op], n, off);
    if (op == EW_RES_B_NO_DA) {
        cr_assert_eq(memcmp(got, acc, n * sizeof(float)), 0, "%s: da changed", what);
    } else {
        check_close(what, got, ref, scale, n, r, e);
    }
    if (op == EW_RES_B || op == EW_RES_B_NO_DA) {
        check_close(what, got2, ref2, NULL, n, r, 0);
    } else if (accumulates) {
        cr_assert_eq(memcmp(got2, acc2, n * sizeof(float)), 0, "%s: the other gradient changed", what);
    }
    check_guard(&x, dout, n, PAD, what);
    check_guard(&x, dout2, n, PAD, what);
    g->free(x.g, ba);
    g->free(x.g, bb);
    g->free(x.g, bo);
    g->free(x.g, bo2);
    float *hs[] = {a, b, acc, acc2, ref, ref2, got, got2, scale};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
    xp->rng = x.rng;
}

/* One device for all sizes (opening one costs a CUDA context and cuBLAS handles). */
static void ew_all_sizes(dt_dtype_t dt, enum ew_op op) {
    NEED_CUDA();
    static const size_t sizes[] = {1, 7, 8, 1000, 4099, 65539};
    ctx x;
    ctx_open(&x, dt);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        ew_case(&x, op, sizes[i], 0);
        ew_case(&x, op, sizes[i], 1);
    }
    ctx_close(&x);
}

Test(cuda_elementwise, gelu_forward_f32) { ew_all_sizes(DT_DTYPE_F32, EW_GELU_F); }
Test(cuda_elementwise, gelu_forward_bf16) { ew_all_sizes(DT_DTYPE_BF16, EW_GELU_F); }
Test(cuda_elementwise, gelu_backward_f32) { ew_all_sizes(DT_DTYPE_F32, EW_GELU_B); }
Test(cuda_elementwise, gelu_backward_bf16) { ew_all_sizes(DT_DTYPE_BF16, EW_GELU_B); }
Test(cuda_elementwise, relu_forward_f32) { ew_all_sizes(DT_DTYPE_F32, EW_RELU_F); }
Test(cuda_elementwise, relu_forward_bf16) { ew_all_sizes(DT_DTYPE_BF16, EW_RELU_F); }
Test(cuda_elementwise, relu_backward_f32) { ew_all_sizes(DT_DTYPE_F32, EW_RELU_B); }
Test(cuda_elementwise, relu_backward_bf16) { ew_all_sizes(DT_DTYPE_BF16, EW_RELU_B); }
Test(cuda_elementwise, residual_forward_f32) { ew_all_sizes(DT_DTYPE_F32, EW_RES_F); }
Test(cuda_elementwise, residual_forward_bf16) { ew_all_sizes(DT_DTYPE_BF16, EW_RES_F); }
Test(cuda_elementwise, residual_backward_f32) {
    ew_all_sizes(DT_DTYPE_F32, EW_RES_B);
    ew_all_sizes(DT_DTYPE_F32, EW_RES_B_NO_DB);
    ew_all_sizes(DT_DTYPE_F32, EW_RES_B_NO_DA);
}
Test(cuda_elementwise, residual_backward_bf16) {
    ew_all_sizes(DT_DTYPE_BF16, EW_RES_B);
    ew_all_sizes(DT_DTYPE_BF16, EW_RES_B_NO_DB);
    ew_all_sizes(DT_DTYPE_BF16, EW_RES_B_NO_DA);
}
Test(cuda_elementwise, scale_f32) { ew_all_sizes(DT_DTYPE_F32, EW_SCALE); }
Test(cuda_elementwise, scale_bf16) { ew_all_sizes(DT_DTYPE_BF16, EW_SCALE); }

/* ---- AdamW ----------------------------------------------------------------------------- */

/* STEPS steps on n elements with fresh gradients each step, GPU vs CPU.
 * use_master: fp32 master weights (with bf16, required); else fp32 params in place.
 * Tolerances: master/params within STEPS * 1e-6 * (|w| + lr) (a few fp32 ulps per step:
 * sqrtf vs the CPU's Newton sqrt, FMA contraction); m within STEPS * 1e-6 * max|g|,
 * v within STEPS * 1e-6 * max|g|^2; bf16 params are exactly the rounded GPU master
 * and within BF16_R of the CPU weights. */
static void adamw_case(dt_dtype_t dt, int use_master, int decay) {
    NEED_CUDA();
    ctx x;
    ctx_open(&x, dt);
    const size_t n = 10007;
    const int STEPS = 5;
    const float gmax = 0.5f;
    float *w0 = host_rand(&x, n, 1.0f);
    float *cw = malloc(n * 4), *cmaster = malloc(n * 4), *cm = calloc(n, 4), *cv = calloc(n, 4);
    void *d_params = dev_alloc(&x, n, 8), *d_grads = dev_alloc(&x, n, 0);
    float *d_master = NULL, *d_m = NULL, *d_v = NULL;
    cr_assert_eq(x.g->ops->alloc(x.g, DT_MEM_MASTER, n * 4, (void **)&d_master), DT_STATUS_OK);
    cr_assert_eq(x.g->ops->alloc(x.g, DT_MEM_OPTIM, n * 4, (void **)&d_m), DT_STATUS_OK);
    cr_assert_eq(x.g->ops->alloc(x.g, DT_MEM_OPTIM, n * 4, (void **)&d_v), DT_STATUS_OK);
    if (use_master) {
        /* master starts as the exact fp32 weights; params receive their compute-dtype copy */
        cr_assert_eq(x.g->ops->copy(x.g, d_master, w0, n * 4, DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK);
        poison(&x, d_params, n); /* write-only with master weights: every element must be written */
    } else {
        upload_round(&x, d_params, w0, n); /* fp32: exact */
    }
    memcpy(cw, w0, n * 4);
    memcpy(cmaster, w0, n * 4);
    dt_adamw_args_t a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                         .grad_scale = 0.8f};
    for (int s = 1; s <= STEPS; s++) {
        float *g = host_rand(&x, n, gmax);
        upload_round(&x, d_grads, g, n);
        a.step = s;
        x.g->ops->adamw(x.g, d_params, use_master ? d_master : NULL, d_grads, d_m, d_v, n, &a, decay);
        x.c->ops->adamw(x.c, cw, use_master ? cmaster : NULL, g, cm, cv, n, &a, decay);
        free(g);
    }
    float *gp = dev_read(&x, d_params, n), *gm = malloc(n * 4), *gv = malloc(n * 4), *gmaster = malloc(n * 4);
    cr_assert_eq(x.g->ops->copy(x.g, gm, d_m, n * 4, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK);
    cr_assert_eq(x.g->ops->copy(x.g, gv, d_v, n * 4, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK);
    cr_assert_eq(x.g->ops->copy(x.g, gmaster, d_master, n * 4, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK);
    float *scale = malloc(n * 4), *ones = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        scale[i] = fabsf(cw[i]) + a.lr;
        ones[i] = 1.0f;
    }
    double e = STEPS * 1e-6;
    check_close("adamw m", gm, cm, ones, n, 0, e * gmax);
    check_close("adamw v", gv, cv, ones, n, 0, e * gmax * gmax);
    if (use_master) {
        check_close("adamw master", gmaster, cmaster, scale, n, 0, e);
        for (size_t i = 0; i < n; i++) {
            float want = dt == DT_DTYPE_BF16 ? round_bf16(gmaster[i]) : gmaster[i];
            cr_assert(memcmp(&gp[i], &want, 4) == 0, "params[%zu] = %.9g is not the master %.9g rounded", i, gp[i],
                      gmaster[i]);
        }
    }
    check_close("adamw params", gp, cw, scale, n, dt == DT_DTYPE_BF16 ? BF16_R : 0, e);
    /* the weights moved: a test that cannot fail is no test */
    double moved = 0;
    for (size_t i = 0; i < n; i++) moved += fabs(cw[i] - w0[i]);
    cr_assert_gt(moved / n, 1e-3);
    check_guard(&x, d_params, n, 8, "adamw params");
    void *bufs[] = {d_params, d_grads, d_master, d_m, d_v};
    for (size_t i = 0; i < 5; i++) x.g->ops->free(x.g, bufs[i]);
    float *hs[] = {w0, cw, cmaster, cm, cv, gp, gm, gv, gmaster, scale, ones};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
    ctx_close(&x);
}

Test(cuda_adamw, fp32_in_place_with_decay) { adamw_case(DT_DTYPE_F32, 0, 1); }
Test(cuda_adamw, fp32_in_place_without_decay) { adamw_case(DT_DTYPE_F32, 0, 0); }
Test(cuda_adamw, fp32_master_copy) { adamw_case(DT_DTYPE_F32, 1, 1); }
Test(cuda_adamw, bf16_master_path_vs_cpu_fp32) { adamw_case(DT_DTYPE_BF16, 1, 1); }
Test(cuda_adamw, bf16_master_path_without_decay) { adamw_case(DT_DTYPE_BF16, 1, 0); }

/* lr = 0 keeps every master weight at v; the bf16 copy is then v rounded. With
 * stochastic rounding each copy is one of v's two bf16 neighbours, up with
 * probability p = (v - lo) / (hi - lo): over n draws the fraction up is p within
 * 5 standard deviations sqrt(p (1-p) / n), and the mean is v within 5 sd too. */
static void sr_run(ctx *x, float v, unsigned seed, int step, size_t n, float *out) {
    float *h = malloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = v;
    void *d_params = dev_alloc(x, n, 0), *d_grads = dev_alloc(x, n, 0);
    float *d_master = NULL, *d_m = NULL, *d_v = NULL;
    cr_assert_eq(x->g->ops->alloc(x->g, DT_MEM_MASTER, n * 4, (void **)&d_master), DT_STATUS_OK);
    cr_assert_eq(x->g->ops->alloc(x->g, DT_MEM_OPTIM, n * 4, (void **)&d_m), DT_STATUS_OK);
    cr_assert_eq(x->g->ops->alloc(x->g, DT_MEM_OPTIM, n * 4, (void **)&d_v), DT_STATUS_OK);
    cr_assert_eq(x->g->ops->copy(x->g, d_master, h, n * 4, DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK);
    dt_adamw_args_t a = {.lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = step,
                         .grad_scale = 1.0f, .sr_seed = seed};
    x->g->ops->adamw(x->g, d_params, d_master, d_grads, d_m, d_v, n, &a, 1);
    float *got = dev_read(x, d_params, n);
    memcpy(out, got, n * 4);
    free(got);
    void *bufs[] = {d_params, d_grads, d_master, d_m, d_v};
    for (size_t i = 0; i < 5; i++) x->g->ops->free(x->g, bufs[i]);
    free(h);
}

static void sr_check(float v) {
    ctx x;
    ctx_open(&x, DT_DTYPE_BF16);
    const size_t n = 1 << 16;
    float *r1 = malloc(n * 4), *r2 = malloc(n * 4), *r3 = malloc(n * 4), *rn = malloc(n * 4);
    float lo = fabsf(v), hi;
    { /* the two bf16 neighbours of |v| */
        uint32_t b;
        memcpy(&b, &lo, 4);
        b &= 0xffff0000u;
        memcpy(&lo, &b, 4);
        b += 0x10000u;
        memcpy(&hi, &b, 4);
    }
    if (v < 0) {
        float t = -lo;
        lo = -hi;
        hi = t;
    }
    double p = ((double)v - lo) / ((double)hi - lo);
    sr_run(&x, v, 1234, 7, n, r1);
    sr_run(&x, v, 1234, 7, n, r2);
    sr_run(&x, v, 99, 7, n, r3);
    sr_run(&x, v, 0, 7, n, rn);
    size_t up = 0, differ = 0;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(r1[i] == lo || r1[i] == hi, "[%zu] %.9g is neither neighbour %.9g / %.9g of %.9g", i, r1[i], lo, hi, v);
        up += r1[i] == hi;
        sum += r1[i];
        differ += r1[i] != r3[i];
        cr_assert_eq(rn[i], round_bf16(v), "seed 0 rounds to nearest");
    }
    cr_assert_eq(memcmp(r1, r2, n * 4), 0, "same seed and step, different bits");
    cr_assert_gt(differ, n / 10, "another seed gives other bits (%zu of %zu differ)", differ, n);
    double sd = sqrt(p * (1 - p) / n);
    cr_assert(fabs((double)up / n - p) <= 5 * sd, "fraction rounded up %.5f, want %.5f +- %.5f", (double)up / n, p,
              5 * sd);
    cr_assert(fabs(sum / n - v) <= 5 * sd * (hi - lo), "mean %.9g, want %.9g", sum / n, v);
    free(r1);
    free(r2);
    free(r3);
    free(rn);
    ctx_close(&x);
}

Test(cuda_adamw, stochastic_rounding_unbiased_and_deterministic) {
    NEED_CUDA();
    sr_check(1.0f + 0.3f / 128.0f);     /* p = 0.3 */
    sr_check(-(2.0f + 1.7f / 64.0f));   /* negative: the magnitude rounds up with p = 0.7 */
    sr_check(0.001f);                   /* small magnitude */
}

/* ---- gradient norm ------------------------------------------------------------------------ */

/* Squares of floats are exact in double, so both sides only round additions: each of
 * two sums of n positive terms is within (n - 1) 2^-53 relative of the exact one. */
static void norm_case(dt_dtype_t dt, size_t n) {
    ctx x;
    ctx_open(&x, dt);
    float *h = host_rand(&x, n, 3.0f);
    void *d = dev_from(&x, h, n);
    double want = 0;
    for (size_t i = 0; i < n; i++) want += (double)h[i] * h[i];
    double got = x.g->ops->grad_sq_norm(x.g, d, n);
    double again = x.g->ops->grad_sq_norm(x.g, d, n);
    if (n > 1) { /* from the second element on: not 16-byte aligned, one element at a time */
        double want1 = want - (double)h[0] * h[0], got1 = x.g->ops->grad_sq_norm(x.g, (char *)d + x.es, n - 1);
        cr_assert(fabs(got1 - want1) <= 2.0 * n * 0x1p-53 * want + 1e-300, "n=%zu, offset 1: gpu %.17g serial %.17g",
                  n - 1, got1, want1);
    }
    cr_assert(isfinite(got), "n=%zu: %g", n, got);
    cr_assert(fabs(got - want) <= 2.0 * n * 0x1p-53 * want, "n=%zu: gpu %.17g serial %.17g", n, got, want);
    cr_assert(memcmp(&got, &again, sizeof got) == 0, "n=%zu: two calls differ", n);
    cr_assert_eq(x.g->ops->grad_sq_norm(x.g, d, 0), 0.0);
    x.g->ops->free(x.g, d);
    free(h);
    ctx_close(&x);
}

Test(cuda_norm, against_serial_double_sum_f32) {
    NEED_CUDA();
    norm_case(DT_DTYPE_F32, 1);
    norm_case(DT_DTYPE_F32, 1000);
    norm_case(DT_DTYPE_F32, ((size_t)1 << 20) + 17);
}
Test(cuda_norm, against_serial_double_sum_bf16) {
    NEED_CUDA();
    norm_case(DT_DTYPE_BF16, 1);
    norm_case(DT_DTYPE_BF16, 1000);
    norm_case(DT_DTYPE_BF16, ((size_t)1 << 20) + 17);
}

#else
Test(cuda_kernels, not_built) { cr_skip_test("built without CUDA"); }
#endif
