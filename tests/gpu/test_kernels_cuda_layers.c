/*
 * test_kernels_cuda_layers.c - the CUDA layer ops (encoder, layernorm, attention,
 * softmax + cross-entropy, MSE) against the CPU ops, in both compute dtypes.
 *
 * Every test opens a CUDA device (fp32 or bf16 compute) and a CPU device; it is
 * skipped where dt_device_count(DT_DEVICE_CUDA) == 0 (it runs on a real GPU in
 * scripts/gpu_check.sh, and on the CPU emulator under `make emu-test`). Inputs are
 * random, uploaded to the GPU in its dtype and downloaded again, so the CPU op sees
 * exactly the (bf16-rounded) values the GPU op sees. Then:
 *  - outputs that an op writes are poisoned first (set to 0xFF bytes: NaN in fp32
 *    and bf16), so an element left unwritten shows up as NaN;
 *  - gradients that an op accumulates into are pre-filled with random values, and
 *    the CPU op starts from the same values: += is checked, not =;
 *  - |gpu - cpu| <= rtol |cpu| + atol rms(cpu), element by element, NaN never
 *    passes; the tolerances are stated and justified at each op;
 *  - the GPU op runs twice on the same inputs and must give the same bits.
 * Shapes include odd sizes (C = 12, NH = 3, V = 13 padded to 16, rows not a
 * multiple of 16 bytes) and larger ones (B = 2, T = 64, C = 128, NH = 4, V = 1000
 * padded to 1024; C = 768 and V = 5000 so that each lane or thread loops).
 *
 * bf16 has 8 significant bits: one rounding of a result is a relative error of at
 * most 2^-9; BF_ULP below is 2^-8, two of those roundings.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/status.h"
#include "kernels/kernels.h"
#include "tests/gpu/gpu_fixture.h"

/* ---- fixture: tests/gpu/gpu_fixture.h; the extras this file needs -------------- */

/* Raw bytes (fp32 tensors, int ids) to the GPU. */
static void *gpu_raw(ctx_t *x, const void *host, size_t bytes) {
    void *d = gpu_alloc(x, bytes);
    cr_assert_eq(x->g->copy(x->gpu, d, host, bytes, DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK, "%s",
                 dt_error_detail());
    return d;
}




/* n fp32 values (losses, mean, rstd). */
static float *fetch_f32(ctx_t *x, const float *d, size_t n) {
    ctx_sync(x);
    float *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert_eq(x->g->copy(x->gpu, h, d, n * sizeof *h, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK, "%s",
                 dt_error_detail());
    return h;
}


/* |got - want| <= rtol |want| + atol_abs + atol rms(want) for every element; no NaN. */
static void check_tol(const char *what, const float *got, const float *want, size_t n, double rtol,
                      double atol, double atol_abs) {
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) ss += (double)want[i] * want[i];
    double rms = n ? sqrt(ss / (double)n) : 0.0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(!isnan(want[i]), "%s[%zu]: the CPU reference is NaN", what, i);
        cr_assert(!isnan(got[i]) && !isinf(got[i]), "%s[%zu]: got %g (unwritten or overflow)", what, i,
                  got[i]);
        double err = fabs((double)got[i] - want[i]);
        double tol = rtol * fabs(want[i]) + atol * rms + atol_abs;
        cr_assert(err <= tol, "%s[%zu]: got %.9g, want %.9g (err %.3g > tol %.3g; rms %.3g)", what, i,
                  got[i], want[i], err, tol, rms);
        if (err > worst) worst = err;
    }
    cr_log_info("%s: %zu values, max abs err %.3g (rms %.3g)", what, n, worst, rms);
}

static void check(const char *what, const float *got, const float *want, size_t n, double rtol,
                  double atol) {
    check_tol(what, got, want, n, rtol, atol, 0.0);
}

static void check_same_bits(const char *what, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        cr_assert(memcmp(&a[i], &b[i], sizeof a[i]) == 0, "%s[%zu]: run 1 %.9g, run 2 %.9g", what, i,
                  a[i], b[i]);
}

/* ---- encoder ------------------------------------------------------------------
 * Forward: one addition of two identical inputs on both sides: fp32 exact up to
 * the CPU's and GPU's identical fp32 add (rtol 1e-6); bf16 one rounding of the sum.
 * Backward: a sum over the (at most B*T) positions holding a token, in position
 * order on both sides but the GPU adds the prefill last: fp32 reassociation of
 * O(1) values over <= 128 terms, ~1e-6 of the rms (atol 1e-5); bf16 one rounding of
 * the result (rtol 2^-8) plus the same reassociation. Packed sequences (pos): the
 * same sums, each row's wpe row its position. */

typedef struct enc_shape {
    int B, T, C, V, maxT;
    int repeat; /* force the first half of the positions to one token */
    int collide; /* tokens only from {1, 1+2^16, 1+2^17, 2}: they share hash buckets */
    int foreign; /* tensor parallelism: 3 of 4 positions hold id -1 (another rank's row) */
    int packed;  /* positions of packed sequences (gpu_fixture.h: packed_positions) */
} enc_shape_t;

static void run_encoder(dt_dtype_t dtype, enc_shape_t s, uint64_t seed) {
    ctx_t x;
    ctx_open(&x, dtype);
    rng_seed(seed);
    size_t BT = (size_t)s.B * s.T, BTC = BT * s.C, VC = (size_t)s.V * s.C, TC = (size_t)s.maxT * s.C;
    int *inp = malloc(BT * sizeof *inp);
    static const int collide[4] = {1, 1 + 65536, 1 + 131072, 2};
    for (size_t i = 0; i < BT; i++) {
        inp[i] = (int)(rng_next() % (uint64_t)s.V);
        if (s.collide) inp[i] = collide[rng_next() % 4];
        if (s.repeat && i < BT / 2) inp[i] = 3 % s.V;
        if (s.foreign && rng_next() % 4 != 0) inp[i] = -1;
        if (s.foreign && i % 16 == 1) inp[i] = 65535; /* -1 & (HBUCKETS - 1): the same hash bucket */
    }
    float *wte = frand(VC, 1.0f, 0.0f), *wpe = frand(TC, 1.0f, 0.0f);
    float *dout = frand(BTC, 1.0f, 0.0f);
    float *dwte0 = frand(VC, 0.5f, 0.0f), *dwpe0 = frand(TC, 0.5f, 0.0f);
    void *d_wte = gpu_tensor(&x, wte, VC), *d_wpe = gpu_tensor(&x, wpe, TC);
    void *d_dout = gpu_tensor(&x, dout, BTC);
    void *d_dwte = gpu_tensor(&x, dwte0, VC), *d_dwpe = gpu_tensor(&x, dwpe0, TC);
    int *d_inp = gpu_raw(&x, inp, BT * sizeof *inp);
    void *d_out = gpu_alloc(&x, BTC * dt_dtype_size(dtype));
    int *pos = s.packed ? packed_positions(s.B, s.T) : NULL, *d_pos = gpu_positions(&x, pos, s.B, s.T);

    /* forward */
    float *want = malloc(BTC * sizeof *want);
    x.c->encoder_forward(x.cpu, want, inp, wte, wpe, pos, s.B, s.T, s.C);
    float *got[2];
    for (int run = 0; run < 2; run++) {
        poison(&x, d_out, BTC * dt_dtype_size(dtype));
        x.g->encoder_forward(x.gpu, d_out, d_inp, d_wte, d_wpe, d_pos, s.B, s.T, s.C);
        got[run] = fetch(&x, d_out, BTC);
    }
    check("encoder_forward out", got[0], want, BTC, x.bf16 ? BF_ULP : 1e-6, 0.0);
    check_same_bits("encoder_forward out", got[0], got[1], BTC);

    /* backward */
    float *want_dwte = fcopy(dwte0, VC), *want_dwpe = fcopy(dwpe0, TC);
    x.c->encoder_backward(x.cpu, want_dwte, want_dwpe, dout, inp, pos, s.B, s.T, s.C);
    float *got_dwte[2], *got_dwpe[2];
    for (int run = 0; run < 2; run++) {
        upload(&x, d_dwte, dwte0, VC);
        upload(&x, d_dwpe, dwpe0, TC);
        x.g->encoder_backward(x.gpu, d_dwte, d_dwpe, d_dout, d_inp, d_pos, s.B, s.T, s.C);
        got_dwte[run] = fetch(&x, d_dwte, VC);
        got_dwpe[run] = fetch(&x, d_dwpe, TC);
    }
    check("encoder_backward dwte", got_dwte[0], want_dwte, VC, x.bf16 ? BF_ULP : 1e-6, 1e-5);
    check("encoder_backward dwpe", got_dwpe[0], want_dwpe, TC, x.bf16 ? BF_ULP : 1e-6, 1e-5);
    check_same_bits("encoder_backward dwte", got_dwte[0], got_dwte[1], VC);
    check_same_bits("encoder_backward dwpe", got_dwpe[0], got_dwpe[1], TC);

    /* dwpe may be NULL: dwte alone, the same result */
    upload(&x, d_dwte, dwte0, VC);
    x.g->encoder_backward(x.gpu, d_dwte, NULL, d_dout, d_inp, d_pos, s.B, s.T, s.C);
    float *alone = fetch(&x, d_dwte, VC);
    check_same_bits("encoder_backward dwte (dwpe NULL)", alone, got_dwte[0], VC);

    for (int run = 0; run < 2; run++) free(got[run]), free(got_dwte[run]), free(got_dwpe[run]);
    free(alone), free(want), free(want_dwte), free(want_dwpe), free(inp), free(wte), free(wpe), free(pos);
    free(dout), free(dwte0), free(dwpe0);
    ctx_close(&x);
}

static const enc_shape_t enc_small = {2, 5, 12, 7, 8, 0, 0, 0, 0};
static const enc_shape_t enc_large = {2, 64, 160, 1000, 64, 1, 0, 0, 0}; /* C > one block of 128 channels */
static const enc_shape_t enc_collide = {2, 5, 12, 131080, 5, 0, 1, 0, 0};
static const enc_shape_t enc_foreign = {2, 64, 160, 65537, 64, 0, 0, 1, 0}; /* and the real token 65535's bucket */
static const enc_shape_t enc_packed = {3, 70, 160, 1000, 80, 1, 0, 0, 1}; /* 3 rows of documents */
static const enc_shape_t enc_packed_foreign = {2, 20, 12, 65537, 20, 0, 0, 1, 1};

Test(cuda_layers, encoder_f32) {
    run_encoder(DT_DTYPE_F32, enc_small, 1);
    run_encoder(DT_DTYPE_F32, enc_large, 2);
    run_encoder(DT_DTYPE_F32, enc_collide, 3);
    run_encoder(DT_DTYPE_F32, enc_foreign, 4);
}
Test(cuda_layers, encoder_bf16) {
    run_encoder(DT_DTYPE_BF16, enc_small, 1);
    run_encoder(DT_DTYPE_BF16, enc_large, 2);
    run_encoder(DT_DTYPE_BF16, enc_collide, 3);
    run_encoder(DT_DTYPE_BF16, enc_foreign, 4);
}
Test(cuda_layers, encoder_packed) {
    run_encoder(DT_DTYPE_F32, enc_packed, 5);
    run_encoder(DT_DTYPE_F32, enc_packed_foreign, 6);
    run_encoder(DT_DTYPE_BF16, enc_packed, 5);
}

/* ---- layernorm ----------------------------------------------------------------
 * Forward: mean and rstd are fp32 on both sides from the same inputs; the sums over
 * C <= 200 terms differ in order only: 1e-5 relative for both dtypes. out: fp32
 * 1e-5 (rstd's error carried through); bf16 one rounding of out (2^-8) plus the
 * fp32 differences near 0 (atol 1e-4 rms).
 * Backward: dinp is a difference of O(1) terms (atol 1e-5 rms fp32); dweight and
 * dbias sum N <= 128 rows in a different order (two stages): fp32 1e-5; bf16 one
 * rounding of each result (2^-8) plus 1e-3 rms for the fp32 terms near 0. */

static void run_layernorm(dt_dtype_t dtype, int N, int C, uint64_t seed) {
    ctx_t x;
    ctx_open(&x, dtype);
    rng_seed(seed);
    size_t NC = (size_t)N * C, es = dt_dtype_size(dtype);
    float *inp = frand(NC, 2.0f, 0.5f), *w = frand(C, 1.0f, 1.0f), *b = frand(C, 0.5f, 0.0f);
    float *dout = frand(NC, 1.0f, 0.0f);
    float *dinp0 = frand(NC, 0.5f, 0.0f), *dw0 = frand(C, 0.5f, 0.0f), *db0 = frand(C, 0.5f, 0.0f);
    void *d_inp = gpu_tensor(&x, inp, NC), *d_w = gpu_tensor(&x, w, C), *d_b = gpu_tensor(&x, b, C);
    void *d_dout = gpu_tensor(&x, dout, NC);
    void *d_dinp = gpu_tensor(&x, dinp0, NC), *d_dw = gpu_tensor(&x, dw0, C);
    void *d_db = gpu_tensor(&x, db0, C);
    void *d_out = gpu_alloc(&x, NC * es);
    float *d_mean = gpu_alloc(&x, N * sizeof(float)), *d_rstd = gpu_alloc(&x, N * sizeof(float));

    float *want = malloc(NC * sizeof *want), *mean = malloc(N * sizeof *mean);
    float *rstd = malloc(N * sizeof *rstd);
    x.c->layernorm_forward(x.cpu, want, mean, rstd, inp, w, b, N, C);
    float *got[2], *got_mean = NULL, *got_rstd = NULL;
    for (int run = 0; run < 2; run++) {
        poison(&x, d_out, NC * es);
        poison(&x, d_mean, N * sizeof(float));
        poison(&x, d_rstd, N * sizeof(float));
        x.g->layernorm_forward(x.gpu, d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
        got[run] = fetch(&x, d_out, NC);
        if (run == 0) {
            got_mean = fetch_f32(&x, d_mean, N);
            got_rstd = fetch_f32(&x, d_rstd, N);
        }
    }
    check("layernorm_forward mean", got_mean, mean, N, 1e-5, 1e-6);
    check("layernorm_forward rstd", got_rstd, rstd, N, 1e-5, 0.0);
    check("layernorm_forward out", got[0], want, NC, x.bf16 ? BF_ULP : 1e-5, x.bf16 ? 1e-4 : 1e-5);
    check_same_bits("layernorm_forward out", got[0], got[1], NC);

    /* backward from the CPU's mean and rstd, given to both */
    float *d_cmean = gpu_raw(&x, mean, N * sizeof(float)), *d_crstd = gpu_raw(&x, rstd, N * sizeof(float));
    float *want_dinp = fcopy(dinp0, NC), *want_dw = fcopy(dw0, C), *want_db = fcopy(db0, C);
    x.c->layernorm_backward(x.cpu, want_dinp, want_dw, want_db, dout, inp, w, mean, rstd, N, C);
    float *g_dinp[2], *g_dw[2], *g_db[2];
    for (int run = 0; run < 2; run++) {
        upload(&x, d_dinp, dinp0, NC);
        upload(&x, d_dw, dw0, C);
        upload(&x, d_db, db0, C);
        x.g->layernorm_backward(x.gpu, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_cmean, d_crstd, N, C);
        g_dinp[run] = fetch(&x, d_dinp, NC);
        g_dw[run] = fetch(&x, d_dw, C);
        g_db[run] = fetch(&x, d_db, C);
    }
    check("layernorm_backward dinp", g_dinp[0], want_dinp, NC, x.bf16 ? BF_ULP : 1e-5,
          x.bf16 ? 1e-3 : 1e-5);
    check("layernorm_backward dweight", g_dw[0], want_dw, C, x.bf16 ? BF_ULP : 1e-5, x.bf16 ? 1e-3 : 1e-5);
    check("layernorm_backward dbias", g_db[0], want_db, C, x.bf16 ? BF_ULP : 1e-5, x.bf16 ? 1e-3 : 1e-5);
    check_same_bits("layernorm_backward dinp", g_dinp[0], g_dinp[1], NC);
    check_same_bits("layernorm_backward dweight", g_dw[0], g_dw[1], C);
    check_same_bits("layernorm_backward dbias", g_db[0], g_db[1], C);

    /* NULL gradients are skipped: dinp alone leaves the others, and vice versa */
    upload(&x, d_dinp, dinp0, NC);
    upload(&x, d_dw, dw0, C);
    x.g->layernorm_backward(x.gpu, d_dinp, NULL, NULL, d_dout, d_inp, d_w, d_cmean, d_crstd, N, C);
    float *only_dinp = fetch(&x, d_dinp, NC), *untouched = fetch(&x, d_dw, C);
    check_same_bits("layernorm_backward dinp alone", only_dinp, g_dinp[0], NC);
    float *dw0r = fcopy(dw0, C);
    check_same_bits("layernorm_backward dweight untouched", untouched, dw0r, C);
    upload(&x, d_dw, dw0, C);
    x.g->layernorm_backward(x.gpu, NULL, d_dw, NULL, d_dout, d_inp, d_w, d_cmean, d_crstd, N, C);
    float *only_dw = fetch(&x, d_dw, C);
    check_same_bits("layernorm_backward dweight alone", only_dw, g_dw[0], C);

    for (int run = 0; run < 2; run++) free(got[run]), free(g_dinp[run]), free(g_dw[run]), free(g_db[run]);
    free(only_dinp), free(untouched), free(dw0r), free(only_dw), free(got_mean), free(got_rstd);
    free(want), free(mean), free(rstd), free(want_dinp), free(want_dw), free(want_db);
    free(inp), free(w), free(b), free(dout), free(dinp0), free(dw0), free(db0);
    ctx_close(&x);
}

Test(cuda_layers, layernorm_f32) {
    run_layernorm(DT_DTYPE_F32, 10, 12, 11);
    run_layernorm(DT_DTYPE_F32, 128, 128, 12);
    run_layernorm(DT_DTYPE_F32, 67, 200, 13);
    run_layernorm(DT_DTYPE_F32, 9, 13, 14); /* C not a whole number of 16-byte packs */
    run_layernorm(DT_DTYPE_F32, 5, 768, 15); /* several packs per lane */
}
Test(cuda_layers, layernorm_bf16) {
    run_layernorm(DT_DTYPE_BF16, 10, 12, 11);
    run_layernorm(DT_DTYPE_BF16, 128, 128, 12);
    run_layernorm(DT_DTYPE_BF16, 67, 200, 13);
    run_layernorm(DT_DTYPE_BF16, 9, 13, 14); /* C not a whole number of 16-byte packs */
    run_layernorm(DT_DTYPE_BF16, 5, 768, 15); /* several packs per lane */
}

/* ---- attention ----------------------------------------------------------------
 * fp32: GEMMs over HS <= 32 and T <= 64 terms in another order than OpenBLAS, and
 * expf against the CPU's polynomial (2e-7): 1e-5 relative plus 1e-5 rms forward;
 * the backward chains three GEMMs and the softmax backward's dot products:
 * 1e-4 relative plus 1e-5 rms.
 * bf16: the scores (|s| < 1.5 here) and the probabilities are rounded to bf16, so
 * each P_j is off by up to ~(1.5 + 1) 2^-9 relative; an output y = sum_j P_j v_j
 * with |v| <= 1 carries every term's error, so where the terms cancel (y near 0)
 * the error is absolute, up to ~2.5 2^-9 sum_j P_j |v_j| < 2^-7: forward 2^-7
 * absolute plus 2^-7 relative for y's own rounding (seen: 0.0035). The backward
 * adds the rounding of dP and dS and chains two more GEMMs: 2^-6 absolute plus
 * 2^-6 relative (seen: 0.0044). Packed sequences (packed: gpu_fixture.h's
 * positions): the same tolerances, the probabilities 0 outside each row's document. */

static void run_attention(dt_dtype_t dtype, int B, int T, int C, int NH, int packed, uint64_t seed) {
    ctx_t x;
    ctx_open(&x, dtype);
    rng_seed(seed);
    size_t es = dt_dtype_size(dtype), n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C;
    size_t natt = (size_t)B * NH * T * T;
    float *qkv = frand(n3, 1.0f, 0.0f), *dout = frand(n1, 1.0f, 0.0f), *dqkv0 = frand(n3, 0.5f, 0.0f);
    void *d_qkv = gpu_tensor(&x, qkv, n3), *d_dout = gpu_tensor(&x, dout, n1);
    void *d_dqkv = gpu_tensor(&x, dqkv0, n3);
    void *d_out = gpu_alloc(&x, n1 * es);
    size_t saved_b = x.g->attention_saved_bytes(x.gpu, B, T, C, NH, NH);
    size_t scratch_b = x.g->attention_scratch_bytes(x.gpu, B, T, C, NH, NH);
    cr_assert_geq(saved_b, natt * es, "the probabilities are saved");
    void *d_saved = gpu_alloc(&x, saved_b), *d_scratch = gpu_alloc(&x, scratch_b);
    int *pos = packed ? packed_positions(B, T) : NULL, *d_pos = gpu_positions(&x, pos, B, T);

    float *want = malloc(n1 * sizeof *want);
    float *att = malloc(x.c->attention_saved_bytes(x.cpu, B, T, C, NH, NH));
    float *cscratch = malloc(x.c->attention_scratch_bytes(x.cpu, B, T, C, NH, NH));
    x.c->attention_forward(x.cpu, want, att, qkv, pos, B, T, C, NH, NH);
    float *got[2], *got_att = NULL;
    for (int run = 0; run < 2; run++) {
        poison(&x, d_out, n1 * es);
        poison(&x, d_saved, saved_b);
        x.g->attention_forward(x.gpu, d_out, d_saved, d_qkv, d_pos, B, T, C, NH, NH);
        got[run] = fetch(&x, d_out, n1);
        if (run == 0) got_att = fetch(&x, d_saved, natt); /* saved starts with (B, NH, T, T) */
    }
    /* Masked entries are exactly 0 on both sides: rtol and atol cover the rest. */
    for (size_t i = 0; i < natt; i++) {
        size_t t = (i / T) % T, j = i % T, b = i / ((size_t)NH * T * T);
        if (j > t) cr_assert(got_att[i] == 0.0f, "att[%zu] above the diagonal: %g", i, got_att[i]);
        if (pos && j + pos[b * T + t] < t)
            cr_assert(got_att[i] == 0.0f, "att[%zu] before its document: %g", i, got_att[i]);
    }
    check("attention_forward att", got_att, att, natt, x.bf16 ? 2 * BF_ULP : 1e-5, x.bf16 ? 1e-3 : 1e-6);
    if (x.bf16)
        check_tol("attention_forward out", got[0], want, n1, 2 * BF_ULP, 0.0, 2 * BF_ULP);
    else
        check("attention_forward out", got[0], want, n1, 1e-5, 1e-5);
    check_same_bits("attention_forward out", got[0], got[1], n1);

    float *want_d = fcopy(dqkv0, n3);
    x.c->attention_backward(x.cpu, want_d, cscratch, dout, qkv, att, pos, B, T, C, NH, NH);
    float *got_d[2];
    for (int run = 0; run < 2; run++) {
        upload(&x, d_dqkv, dqkv0, n3);
        poison(&x, d_scratch, scratch_b);
        x.g->attention_backward(x.gpu, d_dqkv, d_scratch, d_dout, d_qkv, d_saved, d_pos, B, T, C, NH, NH);
        got_d[run] = fetch(&x, d_dqkv, n3);
    }
    if (x.bf16)
        check_tol("attention_backward dqkv", got_d[0], want_d, n3, 4 * BF_ULP, 0.0, 4 * BF_ULP);
    else
        check("attention_backward dqkv", got_d[0], want_d, n3, 1e-4, 1e-5);
    check_same_bits("attention_backward dqkv", got_d[0], got_d[1], n3);

    for (int run = 0; run < 2; run++) free(got[run]), free(got_d[run]);
    free(got_att), free(want), free(att), free(cscratch), free(want_d), free(qkv), free(dout), free(dqkv0);
    free(pos);
    ctx_close(&x);
}

Test(cuda_layers, attention_f32) {
    run_attention(DT_DTYPE_F32, 2, 5, 12, 3, 0, 21);
    run_attention(DT_DTYPE_F32, 2, 64, 128, 4, 0, 22);
    run_attention(DT_DTYPE_F32, 1, 33, 40, 2, 0, 23);
}
Test(cuda_layers, attention_bf16) {
    run_attention(DT_DTYPE_BF16, 2, 5, 12, 3, 0, 21);
    run_attention(DT_DTYPE_BF16, 2, 64, 128, 4, 0, 22);
    run_attention(DT_DTYPE_BF16, 1, 33, 40, 2, 0, 23);
}
Test(cuda_layers, attention_packed) {
    run_attention(DT_DTYPE_F32, 3, 64, 128, 4, 1, 24);
    run_attention(DT_DTYPE_BF16, 3, 64, 128, 4, 1, 24);
    run_attention(DT_DTYPE_F32, 2, 50, 12, 3, 1, 25);
}

/* ---- softmax + cross-entropy --------------------------------------------------
 * Losses are fp32 on both sides from the same logits; the sums of exp over V <= 1000
 * terms differ in order and expf differs by 2e-7: 1e-5 relative plus 1e-6 rms, in
 * both dtypes. dlogits: fp32 1e-5 relative plus 1e-6 rms (the target's entry
 * p - 1 cancels); bf16 one rounding of each (2^-8) plus 1e-3 rms.
 * Padded columns hold 1e4 in the logits: read into a sum, they would swamp it. */

static void run_xent(dt_dtype_t dtype, int N, int V, int Vp, uint64_t seed) {
    ctx_t x;
    ctx_open(&x, dtype);
    rng_seed(seed);
    size_t es = dt_dtype_size(dtype), NV = (size_t)N * Vp;
    float *logits = frand(NV, 4.0f, 0.0f);
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++) logits[(size_t)n * Vp + j] = 1e4f;
    int *tg = malloc(N * sizeof *tg);
    for (int n = 0; n < N; n++) tg[n] = (int)(rng_next() % (uint64_t)V);
    tg[1 % N] = -1;                /* ignored rows */
    if (N > 3) tg[N - 1] = V - 1;  /* the last real column */
    if (N > 4) tg[N - 2] = -1;
    float dscale = 1.0f / (float)N;
    void *d_logits = gpu_tensor(&x, logits, NV);
    int *d_tg = gpu_raw(&x, tg, N * sizeof *tg);
    float *d_losses = gpu_alloc(&x, N * sizeof(float));
    void *d_dlogits = gpu_alloc(&x, NV * es);

    float *want_l = malloc(N * sizeof *want_l), *want_d = malloc(NV * sizeof *want_d);
    x.c->softmax_xent_forward(x.cpu, want_l, logits, tg, N, V, Vp);
    float *want_l2 = malloc(N * sizeof *want_l2);
    x.c->softmax_xent_backward(x.cpu, want_d, want_l2, logits, tg, dscale, N, V, Vp);

    float *gl[2];
    for (int run = 0; run < 2; run++) {
        poison(&x, d_losses, N * sizeof(float));
        x.g->softmax_xent_forward(x.gpu, d_losses, d_logits, d_tg, N, V, Vp);
        gl[run] = fetch_f32(&x, d_losses, N);
    }
    check("softmax_xent_forward losses", gl[0], want_l, N, 1e-5, 1e-6);
    check_same_bits("softmax_xent_forward losses", gl[0], gl[1], N);
    for (int n = 0; n < N; n++)
        if (tg[n] < 0) cr_assert(gl[0][n] == 0.0f, "ignored row %d: loss %g", n, gl[0][n]);

    float *gd[2], *gl2 = NULL;
    for (int run = 0; run < 2; run++) {
        poison(&x, d_dlogits, NV * es);
        poison(&x, d_losses, N * sizeof(float));
        x.g->softmax_xent_backward(x.gpu, d_dlogits, d_losses, d_logits, d_tg, dscale, N, V, Vp);
        gd[run] = fetch(&x, d_dlogits, NV);
        if (run == 0) gl2 = fetch_f32(&x, d_losses, N);
    }
    check("softmax_xent_backward dlogits", gd[0], want_d, NV, x.bf16 ? BF_ULP : 1e-5, x.bf16 ? 1e-3 : 1e-6);
    check("softmax_xent_backward losses", gl2, want_l2, N, 1e-5, 1e-6);
    check_same_bits("softmax_xent_backward dlogits", gd[0], gd[1], NV);
    for (int n = 0; n < N; n++) {
        for (int j = V; j < Vp; j++)
            cr_assert(gd[0][(size_t)n * Vp + j] == 0.0f, "padded dlogits[%d][%d] = %g", n, j,
                      gd[0][(size_t)n * Vp + j]);
        if (tg[n] < 0)
            for (int j = 0; j < V; j++)
                cr_assert(gd[0][(size_t)n * Vp + j] == 0.0f, "ignored row %d: dlogits[%d] = %g", n, j,
                          gd[0][(size_t)n * Vp + j]);
    }

    /* In place: dlogits == logits (consumed), losses NULL: the same gradient bits. */
    void *d_inplace = gpu_tensor(&x, logits, NV);
    x.g->softmax_xent_backward(x.gpu, d_inplace, NULL, d_inplace, d_tg, dscale, N, V, Vp);
    float *gi = fetch(&x, d_inplace, NV);
    check_same_bits("softmax_xent_backward in place", gi, gd[0], NV);

    for (int run = 0; run < 2; run++) free(gl[run]), free(gd[run]);
    free(gl2), free(gi), free(want_l), free(want_l2), free(want_d), free(logits), free(tg);
    ctx_close(&x);
}

Test(cuda_layers, softmax_xent_f32) {
    run_xent(DT_DTYPE_F32, 10, 13, 16, 31);
    run_xent(DT_DTYPE_F32, 6, 1000, 1024, 32);
    run_xent(DT_DTYPE_F32, 5, 11, 13, 33); /* rows not 16-byte aligned: the scalar path */
    run_xent(DT_DTYPE_F32, 3, 5000, 5008, 34); /* several packs per thread */
}
Test(cuda_layers, softmax_xent_bf16) {
    run_xent(DT_DTYPE_BF16, 10, 13, 16, 31);
    run_xent(DT_DTYPE_BF16, 6, 1000, 1024, 32);
    run_xent(DT_DTYPE_BF16, 5, 11, 13, 33);
    run_xent(DT_DTYPE_BF16, 3, 5000, 5008, 34); /* several packs per thread */
}

/* ---- mse ----------------------------------------------------------------------
 * Forward: fp32 sums over D <= 1000 squared differences of the same inputs in
 * another order: 1e-5 relative, both dtypes. Backward: one multiply of the same
 * difference: fp32 1e-6 relative; bf16 one rounding (2^-8). */

static void run_mse(dt_dtype_t dtype, int N, int D, uint64_t seed) {
    ctx_t x;
    ctx_open(&x, dtype);
    rng_seed(seed);
    size_t es = dt_dtype_size(dtype), ND = (size_t)N * D;
    float *pred = frand(ND, 1.0f, 0.0f), *tgt = frand(ND, 1.0f, 0.2f);
    float dscale = 0.25f;
    void *d_pred = gpu_tensor(&x, pred, ND);
    float *d_tgt = gpu_raw(&x, tgt, ND * sizeof(float));
    float *d_losses = gpu_alloc(&x, N * sizeof(float));
    void *d_dpred = gpu_alloc(&x, ND * es);
    float *want_l = malloc(N * sizeof *want_l), *want_d = malloc(ND * sizeof *want_d);
    x.c->mse_forward(x.cpu, want_l, pred, tgt, N, D);
    x.c->mse_backward(x.cpu, want_d, pred, tgt, dscale, N, D);
    cr_assert_not_null(x.g->mse_forward);
    cr_assert_not_null(x.g->mse_backward);
    float *gl[2], *gd[2];
    for (int run = 0; run < 2; run++) {
        poison(&x, d_losses, N * sizeof(float));
        poison(&x, d_dpred, ND * es);
        x.g->mse_forward(x.gpu, d_losses, d_pred, d_tgt, N, D);
        x.g->mse_backward(x.gpu, d_dpred, d_pred, d_tgt, dscale, N, D);
        gl[run] = fetch_f32(&x, d_losses, N);
        gd[run] = fetch(&x, d_dpred, ND);
    }
    check("mse_forward losses", gl[0], want_l, N, 1e-5, 0.0);
    check("mse_backward dpred", gd[0], want_d, ND, x.bf16 ? BF_ULP : 1e-6, 0.0);
    check_same_bits("mse_forward losses", gl[0], gl[1], N);
    check_same_bits("mse_backward dpred", gd[0], gd[1], ND);
    for (int run = 0; run < 2; run++) free(gl[run]), free(gd[run]);
    free(pred), free(tgt), free(want_l), free(want_d);
    ctx_close(&x);
}

Test(cuda_layers, mse_f32) {
    run_mse(DT_DTYPE_F32, 10, 12, 41);
    run_mse(DT_DTYPE_F32, 33, 1000, 42);
}
Test(cuda_layers, mse_bf16) {
    run_mse(DT_DTYPE_BF16, 10, 12, 41);
    run_mse(DT_DTYPE_BF16, 33, 1000, 42);
}

/* The table is filled for both dtypes and reports sizes in the compute dtype. */
Test(cuda_layers, table_slots_and_attention_sizes) {
    for (int k = 0; k < 2; k++) {
        ctx_t x;
        ctx_open(&x, k ? DT_DTYPE_BF16 : DT_DTYPE_F32);
        const dt_ops_t *o = x.g;
        cr_assert(o->encoder_forward && o->encoder_backward && o->layernorm_forward &&
                  o->layernorm_backward && o->attention_saved_bytes && o->attention_scratch_bytes &&
                  o->attention_forward && o->attention_backward && o->softmax_xent_forward &&
                  o->softmax_xent_backward && o->mse_forward && o->mse_backward);
        size_t es = dt_dtype_size(x.dtype);
        cr_assert_eq(o->attention_saved_bytes(x.gpu, 4, 1024, 768, 12, 12), es * 4 * 12 * 1024 * 1024);
        /* the score gradients of all B sequences: the backward batches over them */
        cr_assert_eq(o->attention_scratch_bytes(x.gpu, 4, 1024, 768, 12, 12), es * 4 * 12 * 1024 * 1024);
        ctx_close(&x);
    }
}
