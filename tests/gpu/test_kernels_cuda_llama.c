/*
 * test_kernels_cuda_llama.c - the CUDA ops Llama-family models add (RMSNorm, RoPE,
 * SwiGLU, grouped-query attention in both attention kinds, KV-cache decode)
 * against the CPU ops (tests/test_kernels_llama.c checks those against double
 * references), in both compute dtypes.
 *
 * As test_kernels_cuda_layers.c: skipped where no CUDA device is visible (runs on
 * a real GPU in scripts/gpu_check.sh and on the CPU emulator in make test); inputs
 * are uploaded in the device dtype and downloaded again so both ops see the same
 * values; outputs are poisoned (NaN) first; gradients are pre-filled with random
 * values (+= is checked); each GPU op runs twice and must give the same bits.
 * |gpu - cpu| <= rtol |cpu| + atol rms(cpu) + atol_abs, tolerances justified per op.
 * Attention tests set DTRUN_CUDA_ATTENTION before opening the device (Criterion
 * runs each test in its own process), as test_attention_fused.c does.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/status.h"
#include "kernels/kernels.h"
#include "tests/gpu/gpu_fixture.h"

static void check_tol(const char *what, const float *got, const float *want, size_t n, double rtol, double atol,
                      double atol_abs) {
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) ss += (double)want[i] * want[i];
    double rms = n ? sqrt(ss / (double)n) : 0.0, worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(!isnan(want[i]), "%s[%zu]: the CPU reference is NaN", what, i);
        cr_assert(isfinite(got[i]), "%s[%zu]: got %g (unwritten or overflow)", what, i, got[i]);
        double err = fabs((double)got[i] - want[i]), tol = rtol * fabs(want[i]) + atol * rms + atol_abs;
        cr_assert(err <= tol, "%s[%zu]: got %.9g, want %.9g (err %.3g > tol %.3g; rms %.3g)", what, i, got[i],
                  want[i], err, tol, rms);
        if (err > worst) worst = err;
    }
    cr_log_info("%s: %zu values, max abs err %.3g (%.3g of rms %.3g)", what, n, worst, rms ? worst / rms : 0, rms);
}

static void check_same_bits(const char *what, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        cr_assert(memcmp(&a[i], &b[i], sizeof a[i]) == 0, "%s[%zu]: %.9g vs %.9g", what, i, a[i], b[i]);
}

static float *fetch_f32(ctx_t *x, const float *d, size_t n) {
    ctx_sync(x);
    float *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert_eq(x->g->copy(x->gpu, h, d, n * sizeof *h, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK, "%s",
                 dt_error_detail());
    return h;
}

/* ---- RMSNorm --------------------------------------------------------------------
 * rstd: fp32 on both sides, sums of C <= 768 squares in another order: 1e-5
 * relative. out and dinp: fp32 1e-5 relative plus 1e-5 rms (dinp is a difference of
 * O(1) terms); bf16 one rounding of the result (2^-8) plus 1e-3 rms for the fp32
 * terms near 0. dweight sums N <= 128 rows in two stages: the same bounds. */

static void run_rmsnorm(dt_dtype_t dtype, int N, int C, uint64_t seed) {
    ctx_t x;
    ctx_open(&x, dtype);
    rng_seed(seed);
    size_t NC = (size_t)N * C, es = dt_dtype_size(dtype);
    float eps = 1e-5f;
    float *inp = frand(NC, 2.0f, 0.3f), *w = frand(C, 1.0f, 1.0f), *dout = frand(NC, 1.0f, 0.0f);
    float *dinp0 = frand(NC, 0.5f, 0.0f), *dw0 = frand(C, 0.5f, 0.0f);
    void *d_inp = gpu_tensor(&x, inp, NC), *d_w = gpu_tensor(&x, w, C), *d_dout = gpu_tensor(&x, dout, NC);
    void *d_dinp = gpu_tensor(&x, dinp0, NC), *d_dw = gpu_tensor(&x, dw0, C), *d_out = gpu_alloc(&x, NC * es);
    float *d_rstd = gpu_alloc(&x, N * sizeof(float));

    float *want = malloc(NC * sizeof *want), *rstd = malloc(N * sizeof *rstd);
    x.c->rmsnorm_forward(x.cpu, want, rstd, inp, w, N, C, eps);
    float *got[2], *got_rstd = NULL;
    for (int run = 0; run < 2; run++) {
        poison(&x, d_out, NC * es);
        poison(&x, d_rstd, N * sizeof(float));
        x.g->rmsnorm_forward(x.gpu, d_out, d_rstd, d_inp, d_w, N, C, eps);
        got[run] = fetch(&x, d_out, NC);
        if (run == 0) got_rstd = fetch_f32(&x, d_rstd, N);
    }
    check_tol("rmsnorm_forward rstd", got_rstd, rstd, N, 1e-5, 0.0, 0.0);
    check_tol("rmsnorm_forward out", got[0], want, NC, x.bf16 ? BF_ULP : 1e-5, x.bf16 ? 1e-3 : 1e-5, 0.0);
    check_same_bits("rmsnorm_forward out", got[0], got[1], NC);

    /* backward from the CPU's rstd, given to both */
    float *d_crstd = gpu_alloc(&x, N * sizeof(float));
    cr_assert_eq(x.g->copy(x.gpu, d_crstd, rstd, N * sizeof(float), DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK);
    float *want_dinp = fcopy(dinp0, NC), *want_dw = fcopy(dw0, C);
    x.c->rmsnorm_backward(x.cpu, want_dinp, want_dw, dout, inp, w, rstd, N, C);
    float *g_dinp[2], *g_dw[2];
    for (int run = 0; run < 2; run++) {
        upload(&x, d_dinp, dinp0, NC);
        upload(&x, d_dw, dw0, C);
        x.g->rmsnorm_backward(x.gpu, d_dinp, d_dw, d_dout, d_inp, d_w, d_crstd, N, C);
        g_dinp[run] = fetch(&x, d_dinp, NC);
        g_dw[run] = fetch(&x, d_dw, C);
    }
    check_tol("rmsnorm_backward dinp", g_dinp[0], want_dinp, NC, x.bf16 ? BF_ULP : 1e-5, x.bf16 ? 1e-3 : 1e-5, 0);
    check_tol("rmsnorm_backward dweight", g_dw[0], want_dw, C, x.bf16 ? BF_ULP : 1e-5, x.bf16 ? 1e-3 : 1e-5, 0);
    check_same_bits("rmsnorm_backward dinp", g_dinp[0], g_dinp[1], NC);
    check_same_bits("rmsnorm_backward dweight", g_dw[0], g_dw[1], C);
    /* NULL dweight: dinp alone, the same bits. */
    upload(&x, d_dinp, dinp0, NC);
    x.g->rmsnorm_backward(x.gpu, d_dinp, NULL, d_dout, d_inp, d_w, d_crstd, N, C);
    float *only = fetch(&x, d_dinp, NC);
    check_same_bits("rmsnorm_backward dinp alone", only, g_dinp[0], NC);

    for (int run = 0; run < 2; run++) free(got[run]), free(g_dinp[run]), free(g_dw[run]);
    free(only), free(got_rstd), free(want), free(rstd), free(want_dinp), free(want_dw);
    free(inp), free(w), free(dout), free(dinp0), free(dw0);
    ctx_close(&x);
}

Test(cuda_llama, rmsnorm_f32) {
    run_rmsnorm(DT_DTYPE_F32, 10, 12, 1);
    run_rmsnorm(DT_DTYPE_F32, 128, 128, 2);
    run_rmsnorm(DT_DTYPE_F32, 9, 13, 3); /* C not a whole number of 16-byte packs */
    run_rmsnorm(DT_DTYPE_F32, 5, 768, 4); /* several packs per lane */
}
Test(cuda_llama, rmsnorm_bf16) {
    run_rmsnorm(DT_DTYPE_BF16, 10, 12, 1);
    run_rmsnorm(DT_DTYPE_BF16, 128, 128, 2);
    run_rmsnorm(DT_DTYPE_BF16, 9, 13, 3);
    run_rmsnorm(DT_DTYPE_BF16, 5, 768, 4);
}

/* ---- RoPE -------------------------------------------------------------------------
 * Both sides take inv_freq from dt_rope_inv_freq and cos/sin of the same fp32 angle
 * in double; what may differ is the contraction of a c - b s into an FMA: 1e-6
 * relative plus 1e-6 rms in fp32. bf16: one rounding of each result, 2^-8 relative
 * (plus 1e-3 rms near 0). The v heads (past n_heads) must keep their bits. pos
 * (host, (B, T), or NULL): packed sequences, each row at its own position. */

static void run_rope(dt_dtype_t dtype, int B, int T, int NH, int NKV, int HS, int pos0, const int *pos,
                     const dt_rope_args_t *a, uint64_t seed) {
    ctx_t x;
    ctx_open(&x, dtype);
    rng_seed(seed);
    int stride = (NH + 2 * NKV) * HS, nrot = NH + NKV;
    size_t n = (size_t)B * T * stride;
    double rtol = x.bf16 ? BF_ULP : 1e-6, atol = x.bf16 ? 1e-3 : 1e-6;
    float *x0 = frand(n, 1.0f, 0.0f);
    void *d_x = gpu_tensor(&x, x0, n);
    int *d_pos = NULL;
    if (pos) {
        d_pos = gpu_alloc(&x, (size_t)B * T * sizeof(int));
        cr_assert_eq(x.g->copy(x.gpu, d_pos, pos, (size_t)B * T * sizeof(int), DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK);
    }
    for (int dir = 0; dir < 2; dir++) {
        const char *what = dir ? "rope_backward" : "rope_forward";
        float *want = fcopy(x0, n), *got[2];
        (dir ? x.c->rope_backward : x.c->rope_forward)(x.cpu, want, B, T, stride, nrot, HS, pos0, pos, a);
        for (int run = 0; run < 2; run++) {
            upload(&x, d_x, x0, n);
            (dir ? x.g->rope_backward : x.g->rope_forward)(x.gpu, d_x, B, T, stride, nrot, HS, pos0, d_pos, a);
            got[run] = fetch(&x, d_x, n);
        }
        check_tol(what, got[0], want, n, rtol, atol, 0.0);
        check_same_bits(what, got[0], got[1], n);
        for (int bt = 0; bt < B * T; bt++)
            check_same_bits("rope v heads", got[0] + (size_t)bt * stride + nrot * HS,
                            x0 + (size_t)bt * stride + nrot * HS, (size_t)NKV * HS);
        free(want), free(got[0]), free(got[1]);
    }
    free(x0);
    ctx_close(&x);
}

static const dt_rope_args_t rope_plain = {.theta = 10000};
static const dt_rope_args_t rope_l31 = {
    .theta = 500000, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_pos = 8192};
static const dt_rope_args_t rope_qwen = {.theta = 1e6};

/* Packed (2, 5) rows: documents of 2 and 3, then 1, 3 and 1 (pos0 7 is ignored). */
static const int rope_pos[] = {0, 1, 0, 1, 2, 0, 0, 1, 2, 0};

Test(cuda_llama, rope_f32) {
    run_rope(DT_DTYPE_F32, 2, 5, 4, 2, 16, 0, NULL, &rope_plain, 5);
    run_rope(DT_DTYPE_F32, 1, 7, 2, 1, 64, 100, NULL, &rope_l31, 6);
    run_rope(DT_DTYPE_F32, 2, 3, 3, 3, 128, 9000, NULL, &rope_qwen, 7);
    run_rope(DT_DTYPE_F32, 2, 5, 4, 2, 16, 7, rope_pos, &rope_l31, 8);
}
Test(cuda_llama, rope_bf16) {
    run_rope(DT_DTYPE_BF16, 2, 5, 4, 2, 16, 0, NULL, &rope_plain, 5);
    run_rope(DT_DTYPE_BF16, 1, 7, 2, 1, 64, 100, NULL, &rope_l31, 6);
    run_rope(DT_DTYPE_BF16, 2, 3, 3, 3, 128, 9000, NULL, &rope_qwen, 7);
    run_rope(DT_DTYPE_BF16, 2, 5, 4, 2, 16, 7, rope_pos, &rope_l31, 8);
}

/* ---- SwiGLU ------------------------------------------------------------------------
 * expf on the GPU against libm's: a few ulp on silu; fp32 1e-5 relative plus 1e-6
 * rms. bf16: one rounding of each result (2^-8 relative) plus 1e-3 rms. Gates span
 * [-12, 12], so both tails of the sigmoid are exercised. */

static void run_swiglu(dt_dtype_t dtype, int N, int IC, uint64_t seed) {
    ctx_t x;
    ctx_open(&x, dtype);
    rng_seed(seed);
    size_t n2 = (size_t)N * 2 * IC, n1 = (size_t)N * IC, es = dt_dtype_size(dtype);
    double rtol = x.bf16 ? BF_ULP : 1e-5, atol = x.bf16 ? 1e-3 : 1e-6;
    float *inp = frand(n2, 12.0f, 0.0f), *dout = frand(n1, 1.0f, 0.0f), *dinp0 = frand(n2, 0.5f, 0.0f);
    void *d_inp = gpu_tensor(&x, inp, n2), *d_dout = gpu_tensor(&x, dout, n1), *d_dinp = gpu_tensor(&x, dinp0, n2);
    void *d_out = gpu_alloc(&x, n1 * es);
    float *want = malloc(n1 * sizeof *want), *want_d = fcopy(dinp0, n2), *got[2], *got_d[2];
    x.c->swiglu_forward(x.cpu, want, inp, N, IC);
    x.c->swiglu_backward(x.cpu, want_d, inp, dout, N, IC);
    for (int run = 0; run < 2; run++) {
        poison(&x, d_out, n1 * es);
        x.g->swiglu_forward(x.gpu, d_out, d_inp, N, IC);
        got[run] = fetch(&x, d_out, n1);
        upload(&x, d_dinp, dinp0, n2);
        x.g->swiglu_backward(x.gpu, d_dinp, d_inp, d_dout, N, IC);
        got_d[run] = fetch(&x, d_dinp, n2);
    }
    check_tol("swiglu_forward", got[0], want, n1, rtol, atol, 0.0);
    check_tol("swiglu_backward", got_d[0], want_d, n2, rtol, atol, 0.0);
    check_same_bits("swiglu_forward", got[0], got[1], n1);
    check_same_bits("swiglu_backward", got_d[0], got_d[1], n2);
    for (int run = 0; run < 2; run++) free(got[run]), free(got_d[run]);
    free(inp), free(dout), free(dinp0), free(want), free(want_d);
    ctx_close(&x);
}

Test(cuda_llama, swiglu_f32) {
    run_swiglu(DT_DTYPE_F32, 4, 9, 8);    /* one element at a time */
    run_swiglu(DT_DTYPE_F32, 16, 64, 9);  /* 16-byte packs */
    run_swiglu(DT_DTYPE_F32, 3, 1000, 10);
}
Test(cuda_llama, swiglu_bf16) {
    run_swiglu(DT_DTYPE_BF16, 4, 9, 8);
    run_swiglu(DT_DTYPE_BF16, 16, 64, 9);
    run_swiglu(DT_DTYPE_BF16, 3, 1000, 10);
}

/* ---- grouped-query attention ----------------------------------------------------------
 * The CPU op (itself checked against repeat_kv and finite differences) is the
 * reference. Tolerances are those of the NKV == NH tests (test_kernels_cuda_layers
 * for cuBLAS, test_attention_fused for fused), the backward's times NH/NKV for the
 * absolute parts: a key/value head's gradient sums that many query heads' terms,
 * each carrying the same rounding. The saved and scratch sizes do not depend on
 * NKV (neither path expands k or v). packed: with positions (gpu_fixture.h). */

static void run_gqa(dt_dtype_t dtype, const char *kind, int B, int T, int C, int NH, int NKV, int packed,
                    uint64_t seed) {
    ctx_t x;
    ctx_open_attention(&x, dtype, kind);
    rng_seed(seed);
    int HS = C / NH, C3 = C + 2 * NKV * HS, rep = NH / NKV, fused = strcmp(kind, "fused") == 0;
    size_t es = dt_dtype_size(dtype), n3 = (size_t)B * T * C3, n1 = (size_t)B * T * C;
    size_t saved_b = x.g->attention_saved_bytes(x.gpu, B, T, C, NH, NKV);
    size_t scratch_b = x.g->attention_scratch_bytes(x.gpu, B, T, C, NH, NKV);
    cr_assert_eq(saved_b, x.g->attention_saved_bytes(x.gpu, B, T, C, NH, NH));
    cr_assert_eq(scratch_b, x.g->attention_scratch_bytes(x.gpu, B, T, C, NH, NH));
    float *qkv = frand(n3, 1.0f, 0.0f), *dout = frand(n1, 1.0f, 0.0f), *dqkv0 = frand(n3, 0.5f, 0.0f);
    void *d_qkv = gpu_tensor(&x, qkv, n3), *d_dout = gpu_tensor(&x, dout, n1), *d_dqkv = gpu_tensor(&x, dqkv0, n3);
    void *d_out = gpu_alloc(&x, n1 * es), *d_saved = gpu_alloc(&x, saved_b), *d_scratch = gpu_alloc(&x, scratch_b);
    int *pos = packed ? packed_positions(B, T) : NULL, *d_pos = gpu_positions(&x, pos, B, T);

    float *want = malloc(n1 * sizeof *want);
    float *att = malloc(x.c->attention_saved_bytes(x.cpu, B, T, C, NH, NKV));
    float *cscratch = malloc(x.c->attention_scratch_bytes(x.cpu, B, T, C, NH, NKV));
    x.c->attention_forward(x.cpu, want, att, qkv, pos, B, T, C, NH, NKV);
    float *got[2], *got_d[2];
    for (int run = 0; run < 2; run++) {
        poison(&x, d_out, n1 * es);
        poison(&x, d_saved, saved_b);
        x.g->attention_forward(x.gpu, d_out, d_saved, d_qkv, d_pos, B, T, C, NH, NKV);
        got[run] = fetch(&x, d_out, n1);
    }
    char what[128];
    snprintf(what, sizeof what, "%s %s B%d T%d C%d NH%d NKV%d%s forward", kind, dt_dtype_name(dtype), B, T, C, NH,
             NKV, packed ? " packed" : "");
    if (!x.bf16)
        check_tol(what, got[0], want, n1, 1e-5, 1e-5, 0.0);
    else if (fused)
        check_tol(what, got[0], want, n1, BF_ULP, 1e-5, BF_ULP);
    else
        check_tol(what, got[0], want, n1, 2 * BF_ULP, 0.0, 2 * BF_ULP);
    check_same_bits(what, got[0], got[1], n1);

    float *want_d = fcopy(dqkv0, n3);
    x.c->attention_backward(x.cpu, want_d, cscratch, dout, qkv, att, pos, B, T, C, NH, NKV);
    for (int run = 0; run < 2; run++) {
        upload(&x, d_dqkv, dqkv0, n3);
        poison(&x, d_scratch, scratch_b);
        x.g->attention_backward(x.gpu, d_dqkv, d_scratch, d_dout, d_qkv, d_saved, d_pos, B, T, C, NH, NKV);
        got_d[run] = fetch(&x, d_dqkv, n3);
    }
    snprintf(what, sizeof what, "%s %s B%d T%d C%d NH%d NKV%d%s backward", kind, dt_dtype_name(dtype), B, T, C, NH,
             NKV, packed ? " packed" : "");
    if (!x.bf16)
        check_tol(what, got_d[0], want_d, n3, 1e-4, 1e-5 * rep, 0.0);
    else if (fused)
        check_tol(what, got_d[0], want_d, n3, BF_ULP, BF_ULP * rep, 4 * BF_ULP * rep);
    else
        check_tol(what, got_d[0], want_d, n3, 4 * BF_ULP, 0.0, 4 * BF_ULP * rep);
    check_same_bits(what, got_d[0], got_d[1], n3);

    for (int run = 0; run < 2; run++) free(got[run]), free(got_d[run]);
    free(want), free(att), free(cscratch), free(want_d), free(qkv), free(dout), free(dqkv0), free(pos);
    ctx_close(&x);
}

/* (B, T, C, NH, NKV): two query heads per kv head; multi-query (NKV 1) over two
 * 32-row tiles; HS 16 (tensor cores in fused bf16) with three per group and T not a
 * multiple of 32; an odd head size (10); NKV == NH through the same code. */
static const int gqa_shapes[][5] = {
    {2, 5, 16, 4, 2}, {2, 64, 128, 4, 1}, {1, 37, 96, 6, 2}, {1, 33, 40, 4, 2}, {1, 20, 32, 2, 2},
};

static void run_gqa_all(dt_dtype_t dtype, const char *kind) {
    for (size_t i = 0; i < sizeof gqa_shapes / sizeof gqa_shapes[0]; i++) {
        const int *s = gqa_shapes[i];
        run_gqa(dtype, kind, s[0], s[1], s[2], s[3], s[4], 0, 30 + i);
    }
}

Test(cuda_llama, gqa_cublas_f32) { run_gqa_all(DT_DTYPE_F32, "cublas"); }
Test(cuda_llama, gqa_cublas_bf16) { run_gqa_all(DT_DTYPE_BF16, "cublas"); }
Test(cuda_llama, gqa_fused_f32) { run_gqa_all(DT_DTYPE_F32, "fused"); }
Test(cuda_llama, gqa_fused_bf16) { run_gqa_all(DT_DTYPE_BF16, "fused"); }

/* Packed sequences, grouped query heads (3 per group; multi-query), both paths. */
Test(cuda_llama, gqa_packed) {
    const char *kinds[] = {"cublas", "fused"};
    for (int k = 0; k < 2; k++)
        for (int bf = 0; bf < 2; bf++) {
            dt_dtype_t dt = bf ? DT_DTYPE_BF16 : DT_DTYPE_F32;
            run_gqa(dt, kinds[k], 2, 70, 96, 6, 2, 1, 61);
            run_gqa(dt, kinds[k], 2, 45, 128, 4, 1, 1, 62);
        }
}

/* ---- KV-cache decode -------------------------------------------------------------------
 * GPU decode against CPU decode on the same q and cache; cache rows past pos are
 * NaN on the GPU (they must not be read). fp32: dot products over HS and a softmax
 * over pos + 1 <= 300 keys in another order: 1e-5 relative plus 1e-5 rms. bf16:
 * the scores and weights stay fp32; one rounding of out (2^-8 relative) plus 1e-3
 * rms for outputs near 0. */

static void run_decode(dt_dtype_t dtype, int B, int max_T, int pos, int C, int NH, int NKV, int q_pad,
                       uint64_t seed) {
    ctx_t x;
    ctx_open(&x, dtype);
    rng_seed(seed);
    int HS = C / NH, KV = NKV * HS, q_stride = C + q_pad;
    size_t es = dt_dtype_size(dtype), nq = (size_t)B * q_stride, nkv = (size_t)B * max_T * 2 * KV;
    float *q = frand(nq, 1.5f, 0.0f), *kv = frand(nkv, 1.0f, 0.0f);
    void *d_q = gpu_tensor(&x, q, nq), *d_kv = gpu_tensor(&x, kv, nkv), *d_out = gpu_alloc(&x, (size_t)B * C * es);
    for (int b = 0; b < B; b++) /* rows past pos: NaN */
        poison(&x, (char *)d_kv + ((size_t)b * max_T + pos + 1) * 2 * KV * es, (size_t)(max_T - pos - 1) * 2 * KV * es);
    float *want = malloc((size_t)B * C * sizeof *want), *got[2];
    x.c->attention_decode(x.cpu, want, q, q_stride, kv, max_T, pos, B, C, NH, NKV);
    for (int run = 0; run < 2; run++) {
        poison(&x, d_out, (size_t)B * C * es);
        x.g->attention_decode(x.gpu, d_out, d_q, q_stride, d_kv, max_T, pos, B, C, NH, NKV);
        got[run] = fetch(&x, d_out, (size_t)B * C);
    }
    char what[96];
    snprintf(what, sizeof what, "decode %s B%d pos%d C%d NH%d NKV%d", dt_dtype_name(dtype), B, pos, C, NH, NKV);
    check_tol(what, got[0], want, (size_t)B * C, x.bf16 ? BF_ULP : 1e-5, x.bf16 ? 1e-3 : 1e-5, 0.0);
    check_same_bits(what, got[0], got[1], (size_t)B * C);
    free(got[0]), free(got[1]), free(want), free(q), free(kv);
    ctx_close(&x);
}

static void run_decode_all(dt_dtype_t dtype) {
    run_decode(dtype, 2, 12, 0, 16, 4, 2, 0, 50);       /* the first position */
    run_decode(dtype, 2, 12, 6, 16, 4, 2, 8, 51);       /* q rows wider than C */
    run_decode(dtype, 3, 40, 39, 48, 3, 1, 0, 52);      /* a full cache, multi-query */
    run_decode(dtype, 1, 300, 298, 512, 2, 2, 0, 53);   /* HS 256, many positions per warp */
    run_decode(dtype, 2, 9, 4, 40, 4, 4, 24, 54);       /* odd head size, NKV == NH */
}

Test(cuda_llama, decode_f32) { run_decode_all(DT_DTYPE_F32); }
Test(cuda_llama, decode_bf16) { run_decode_all(DT_DTYPE_BF16); }

/* Both tables fill every new slot. */
Test(cuda_llama, table_slots) {
    for (int k = 0; k < 2; k++) {
        ctx_t x;
        ctx_open(&x, k ? DT_DTYPE_BF16 : DT_DTYPE_F32);
        const dt_ops_t *o = x.g;
        cr_assert(o->rmsnorm_forward && o->rmsnorm_backward && o->rope_forward && o->rope_backward &&
                  o->swiglu_forward && o->swiglu_backward && o->attention_decode);
        ctx_close(&x);
    }
}

/* A head wider than the decode kernel holds is an error naming the op, reported
 * once at synchronize; nothing is written. */
Test(cuda_llama, decode_head_too_wide_is_an_error) {
    ctx_t x;
    ctx_open(&x, DT_DTYPE_F32);
    int HS = DT_ROPE_MAX_HS + 16, C = 2 * HS;
    void *d_q = gpu_alloc(&x, sizeof(float) * C), *d_kv = gpu_alloc(&x, sizeof(float) * 2 * 2 * HS);
    void *d_out = gpu_alloc(&x, sizeof(float) * C);
    x.g->attention_decode(x.gpu, d_out, d_q, C, d_kv, 1, 0, 1, C, 2, 2);
    cr_assert_neq(x.g->synchronize(x.gpu), DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "attention_decode"), "%s", dt_error_detail());
    ctx_close(&x); /* reported once: the device is usable again */
}
