/*
 * test_attention_fused.c - the fused (flash-style) CUDA attention
 * (kernels/cuda/cuda_attention_fused.cu, chosen with DTRUN_CUDA_ATTENTION=fused)
 * against the CPU op, in both compute dtypes; and the choice itself.
 *
 * Runs on a real GPU (scripts/gpu_check.sh) and on the CPU emulator (make test);
 * skipped where no CUDA device is visible. Each test sets DTRUN_CUDA_ATTENTION
 * before it opens the device (Criterion runs every test in its own process).
 * Shapes: T = 5, 33, 37, 64, 100 (one to four 32-row tiles, most not a multiple of
 * 32); HS = 4, 12, 16, 20, 32, 48, 64, 80, 112 and 128 (the largest the fused
 * kernel takes): in bf16 the tensor-core backward is built for 1 to 4 accumulator
 * fragments per warp (HS 16 and 32: 1; 48 and 64: 2; 80: 3; 112 and 128: 4, with
 * warps left without a fragment at 16, 80 and 112), each count is run here;
 * HS = 136 checks the fallback to the cuBLAS path. As in test_kernels_cuda_layers:
 * inputs are uploaded in the device dtype and downloaded again so both ops see the
 * same values; outputs, saved and scratch are poisoned (NaN) first; dqkv is
 * pre-filled with random values (+= is checked); each op runs twice and must give
 * the same bits.
 *
 * Tolerances, |gpu - cpu| <= rtol |cpu| + atol rms(cpu) + atol_abs:
 *  fp32: sums over <= 128 terms (dot products) and <= 100 keys in another order
 *    than the CPU's, and expf against the CPU's expf: 1e-5 relative plus 1e-6 rms
 *    forward (seen: 2e-7 of rms), 1e-5 relative plus 1e-5 rms backward (dk/dq are
 *    differences of O(1) terms: where they cancel the error is absolute).
 *  bf16: the scores stay fp32; the forward on tensor cores (HS a multiple of 16)
 *    rounds P to bf16 for the P V product (2^-9 relative per weight, so at most
 *    2^-9 max|v| = 2^-9 absolute on out, |v| <= 1 here), then out is rounded once
 *    (2^-9 relative): 2^-8 relative plus 2^-8 absolute plus 1e-5 rms (seen: 8e-4
 *    at |out| 0.2; the scalar kernel for other HS keeps P in fp32). Backward:
 *    D = rowsum(dout * out) reads the bf16-rounded out (error <= 2^-9 sum |dout
 *    out|), which shifts every dS = P (dP - D) of its row; on tensor cores P and
 *    dS are rounded to bf16 for the products (2^-9 relative per term, as the
 *    cuBLAS path rounds them); the sum dqkv0 + gradient is rounded once (2^-9
 *    relative). 2^-8 relative plus 2^-8 rms plus 2^-6 absolute, the cuBLAS path's
 *    absolute bound (test_kernels_cuda_layers) for the same roundings (seen:
 *    0.0054 at rms 0.31, a third of the bound).
 * Packed sequences (kernels.h: pos; gpu_fixture.h's positions: documents inside a
 * tile, across tiles, on a tile boundary, of one token) with the same tolerances:
 * the key tiles of earlier documents skipped in the forward and the dq pass, the
 * dk/dv pass stopping early, rows meeting key tiles with none of their keys.
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

/* |got - want| <= rtol |want| + atol rms(want) + atol_abs for every element; no NaN. */
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
    cr_log_info("%s: %zu values, max abs err %.3g (%.3g of rms %.3g)", what, n, worst, rms ? worst / rms : 0,
                rms);
}

static void check(const char *what, const float *got, const float *want, size_t n, double rtol, double atol) {
    check_tol(what, got, want, n, rtol, atol, 0.0);
}

static void check_same_bits(const char *what, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        cr_assert(memcmp(&a[i], &b[i], sizeof a[i]) == 0, "%s[%zu]: run 1 %.9g, run 2 %.9g", what, i, a[i], b[i]);
}

/* Fused forward and backward against the CPU op for one shape: poisoned outputs,
 * += into pre-filled dqkv, two runs bitwise equal; packed: with positions. */
static void run_fused_pos(dt_dtype_t dtype, int B, int T, int C, int NH, int packed, uint64_t seed) {
    ctx_t x;
    ctx_open_attention(&x, dtype, "fused");
    rng_seed(seed);
    int HS = C / NH;
    size_t es = dt_dtype_size(dtype), n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C;
    size_t saved_b = x.g->attention_saved_bytes(x.gpu, B, T, C, NH, NH);
    size_t scratch_b = x.g->attention_scratch_bytes(x.gpu, B, T, C, NH, NH);
    if (HS <= DT_ATTENTION_FUSED_MAX_HS) { /* out and the log-sum-exp only */
        cr_assert_eq(saved_b, 4 * (size_t)B * NH * T + es * n1, "HS %d: saved %zu", HS, saved_b);
        cr_assert_eq(scratch_b, 4 * (size_t)B * NH * T);
    } else { /* falls back to the cuBLAS path: the probabilities */
        cr_assert_eq(saved_b, es * (size_t)B * NH * T * T, "HS %d: saved %zu", HS, saved_b);
    }
    float *qkv = frand(n3, 1.0f, 0.0f), *dout = frand(n1, 1.0f, 0.0f), *dqkv0 = frand(n3, 0.5f, 0.0f);
    void *d_qkv = gpu_tensor(&x, qkv, n3), *d_dout = gpu_tensor(&x, dout, n1), *d_dqkv = gpu_tensor(&x, dqkv0, n3);
    void *d_out = gpu_alloc(&x, n1 * es), *d_saved = gpu_alloc(&x, saved_b), *d_scratch = gpu_alloc(&x, scratch_b);
    int *pos = packed ? packed_positions(B, T) : NULL, *d_pos = gpu_positions(&x, pos, B, T);

    float *want = malloc(n1 * sizeof *want);
    float *att = malloc(x.c->attention_saved_bytes(x.cpu, B, T, C, NH, NH));
    float *cscratch = malloc(x.c->attention_scratch_bytes(x.cpu, B, T, C, NH, NH));
    x.c->attention_forward(x.cpu, want, att, qkv, pos, B, T, C, NH, NH);
    float *got[2];
    for (int run = 0; run < 2; run++) {
        poison(&x, d_out, n1 * es);
        poison(&x, d_saved, saved_b);
        x.g->attention_forward(x.gpu, d_out, d_saved, d_qkv, d_pos, B, T, C, NH, NH);
        got[run] = fetch(&x, d_out, n1);
    }
    char what[96];
    snprintf(what, sizeof what, "%s B%d T%d C%d NH%d%s forward out", dt_dtype_name(dtype), B, T, C, NH,
             packed ? " packed" : "");
    if (x.bf16)
        check_tol(what, got[0], want, n1, BF_ULP, 1e-5, BF_ULP);
    else
        check(what, got[0], want, n1, 1e-5, 1e-6);
    check_same_bits(what, got[0], got[1], n1);

    float *want_d = fcopy(dqkv0, n3);
    x.c->attention_backward(x.cpu, want_d, cscratch, dout, qkv, att, pos, B, T, C, NH, NH);
    float *got_d[2];
    for (int run = 0; run < 2; run++) {
        upload(&x, d_dqkv, dqkv0, n3);
        poison(&x, d_scratch, scratch_b);
        x.g->attention_backward(x.gpu, d_dqkv, d_scratch, d_dout, d_qkv, d_saved, d_pos, B, T, C, NH, NH);
        got_d[run] = fetch(&x, d_dqkv, n3);
    }
    snprintf(what, sizeof what, "%s B%d T%d C%d NH%d%s backward dqkv", dt_dtype_name(dtype), B, T, C, NH,
             packed ? " packed" : "");
    if (x.bf16)
        check_tol(what, got_d[0], want_d, n3, BF_ULP, BF_ULP, 4 * BF_ULP);
    else
        check(what, got_d[0], want_d, n3, 1e-5, 1e-5);
    check_same_bits(what, got_d[0], got_d[1], n3);

    for (int run = 0; run < 2; run++) free(got[run]), free(got_d[run]);
    free(want), free(att), free(cscratch), free(want_d), free(qkv), free(dout), free(dqkv0), free(pos);
    ctx_close(&x);
}

static void run_fused(dt_dtype_t dtype, int B, int T, int C, int NH, uint64_t seed) {
    run_fused_pos(dtype, B, T, C, NH, 0, seed);
}

/* (B, T, C, NH): the shapes of test_kernels_cuda_layers, then T not a multiple of
 * the 32-row tile with HS = 64, odd head sizes, HS = 128, then HS = 16, 80 and 112
 * (fragment counts per warp 1 with two warps idle, 3, and 4 with one short). */
static const int shapes[][4] = {
    {2, 5, 12, 3},  {2, 64, 128, 4}, {1, 33, 40, 2},  {2, 37, 128, 2},
    {1, 100, 64, 1}, {1, 37, 12, 1}, {2, 45, 96, 2}, {1, 40, 256, 2},
    {1, 50, 32, 2}, {1, 37, 160, 2}, {1, 70, 224, 2},
};

Test(cuda_attention_fused, matches_cpu_f32) {
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        run_fused(DT_DTYPE_F32, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], 31 + i);
}

Test(cuda_attention_fused, matches_cpu_bf16) {
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        run_fused(DT_DTYPE_BF16, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], 31 + i);
}

/* Packed: HS 64 (the 64-row tensor-core forward in bf16, 2 fragments a warp
 * backward), 112 (32 rows, 4 fragments), 12 (scalar), over up to four tiles. */
static const int packed_shapes[][4] = {{3, 100, 128, 2}, {2, 70, 224, 2}, {2, 45, 12, 1}};

Test(cuda_attention_fused, packed_matches_cpu) {
    for (size_t i = 0; i < sizeof packed_shapes / sizeof *packed_shapes; i++)
        for (int bf = 0; bf < 2; bf++)
            run_fused_pos(bf ? DT_DTYPE_BF16 : DT_DTYPE_F32, packed_shapes[i][0], packed_shapes[i][1],
                          packed_shapes[i][2], packed_shapes[i][3], 1, 51 + i);
}

Test(cuda_attention_fused, head_size_over_128_falls_back_to_cublas) {
    run_fused(DT_DTYPE_F32, 1, 9, 272, 2, 7);
}

/* Changing the keys and values of positions >= T0 leaves the outputs of queries
 * before T0, and their dq, bitwise unchanged: masked keys have no influence. */
static void run_masked(dt_dtype_t dtype) {
    ctx_t x;
    ctx_open_attention(&x, dtype, "fused");
    rng_seed(99);
    int B = 2, T = 70, C = 128, NH = 2, T0 = 35; /* T0 inside the second tile */
    size_t es = dt_dtype_size(dtype), n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C;
    size_t saved_b = x.g->attention_saved_bytes(x.gpu, B, T, C, NH, NH);
    size_t scratch_b = x.g->attention_scratch_bytes(x.gpu, B, T, C, NH, NH);
    float *qkv = frand(n3, 1.0f, 0.0f), *dout = frand(n1, 1.0f, 0.0f), *zero = calloc(n3, sizeof(float));
    void *d_qkv = gpu_tensor(&x, qkv, n3), *d_dout = gpu_tensor(&x, dout, n1), *d_dqkv = gpu_alloc(&x, n3 * es);
    void *d_out = gpu_alloc(&x, n1 * es), *d_saved = gpu_alloc(&x, saved_b), *d_scratch = gpu_alloc(&x, scratch_b);
    float *out[2], *dq[2];
    for (int run = 0; run < 2; run++) {
        if (run == 1) { /* perturb k and v of the future positions */
            for (int b = 0; b < B; b++)
                for (int t = T0; t < T; t++)
                    for (int c = C; c < 3 * C; c++) qkv[((size_t)b * T + t) * 3 * C + c] += 3.0f;
            upload(&x, d_qkv, qkv, n3);
        }
        poison(&x, d_out, n1 * es);
        x.g->attention_forward(x.gpu, d_out, d_saved, d_qkv, NULL, B, T, C, NH, NH);
        upload(&x, d_dqkv, zero, n3);
        x.g->attention_backward(x.gpu, d_dqkv, d_scratch, d_dout, d_qkv, d_saved, NULL, B, T, C, NH, NH);
        out[run] = fetch(&x, d_out, n1);
        dq[run] = fetch(&x, d_dqkv, n3);
    }
    size_t changed = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                size_t i = ((size_t)b * T + t) * C + c, iq = ((size_t)b * T + t) * 3 * C + c;
                if (t < T0) {
                    cr_assert(memcmp(&out[0][i], &out[1][i], 4) == 0, "out[b%d t%d c%d] moved: %g -> %g", b, t, c,
                              out[0][i], out[1][i]);
                    cr_assert(memcmp(&dq[0][iq], &dq[1][iq], 4) == 0, "dq[b%d t%d c%d] moved: %g -> %g", b, t, c,
                              dq[0][iq], dq[1][iq]);
                } else {
                    changed += out[0][i] != out[1][i];
                }
            }
    cr_assert_gt(changed, (size_t)(B * (T - T0) * C / 2), "the perturbation must show after T0 (%zu changed)",
                 changed);
    for (int run = 0; run < 2; run++) free(out[run]), free(dq[run]);
    free(qkv), free(dout), free(zero);
    ctx_close(&x);
}

Test(cuda_attention_fused, masked_keys_have_no_influence_f32) { run_masked(DT_DTYPE_F32); }
Test(cuda_attention_fused, masked_keys_have_no_influence_bf16) { run_masked(DT_DTYPE_BF16); }

Test(cuda_attention_fused, choice_and_sizes) {
    if (dt_device_count(DT_DEVICE_CUDA) == 0) cr_skip_test("no CUDA device");
    dt_device_opts_t o = {.kind = DT_DEVICE_CUDA, .nthreads = 1, .ordinal = 0, .dtype = DT_DTYPE_BF16};
    dt_device_t *dev = NULL;
    /* A value that is neither kind is refused by name. */
    cr_assert_eq(setenv("DTRUN_CUDA_ATTENTION", "flash", 1), 0);
    cr_assert_eq(dt_device_open(&dev, &o), DT_STATUS_INVALID);
    cr_assert_null(dev);
    cr_assert(strstr(dt_error_detail(), "DTRUN_CUDA_ATTENTION='flash'") != NULL, "%s", dt_error_detail());
    /* GPT-2 124M, B=4: fused saves lse + out (bytes), cuBLAS the probabilities. */
    const char *kinds[] = {"fused", "cublas", ""};
    size_t want_saved[] = {4 * 4 * 12 * 1024 + 2 * 4 * 1024 * 768, 2ull * 4 * 12 * 1024 * 1024,
                           2ull * 4 * 12 * 1024 * 1024};
    /* scratch: fused D (fp32 per row); cuBLAS the score gradients of all B sequences */
    size_t want_scratch[] = {4 * 4 * 12 * 1024, 2ull * 4 * 12 * 1024 * 1024, 2ull * 4 * 12 * 1024 * 1024};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(setenv("DTRUN_CUDA_ATTENTION", kinds[i], 1), 0);
        cr_assert_eq(dt_device_open(&dev, &o), DT_STATUS_OK, "%s", dt_error_detail());
        cr_assert_eq(dev->ops->attention_saved_bytes(dev, 4, 1024, 768, 12, 12), want_saved[i], "'%s'", kinds[i]);
        cr_assert_eq(dev->ops->attention_scratch_bytes(dev, 4, 1024, 768, 12, 12), want_scratch[i], "'%s'", kinds[i]);
        dt_device_free(dev);
    }
}

/* The tensor-core build loads 16-byte vectors when qkv and dout are 16-byte
 * aligned, else element by element: both give the same bits (inputs placed one
 * bf16 element past an aligned address take the second path). */
Test(cuda_attention_fused, unaligned_inputs_same_bits_bf16) {
    ctx_t x;
    ctx_open_attention(&x, DT_DTYPE_BF16, "fused");
    rng_seed(5);
    int B = 2, T = 45, C = 128, NH = 2;
    size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C;
    size_t saved_b = x.g->attention_saved_bytes(x.gpu, B, T, C, NH, NH);
    size_t scratch_b = x.g->attention_scratch_bytes(x.gpu, B, T, C, NH, NH);
    float *qkv = frand(n3, 1.0f, 0.0f), *dout = frand(n1, 1.0f, 0.0f), *zero = calloc(n3, sizeof(float));
    char *qkv_buf = gpu_alloc(&x, (n3 + 1) * 2), *dout_buf = gpu_alloc(&x, (n1 + 1) * 2);
    void *d_dqkv = gpu_alloc(&x, n3 * 2), *d_out = gpu_alloc(&x, n1 * 2);
    void *d_saved = gpu_alloc(&x, saved_b), *d_scratch = gpu_alloc(&x, scratch_b);
    float *out[2], *dq[2];
    for (int run = 0; run < 2; run++) {
        void *d_qkv = qkv_buf + 2 * run, *d_dout = dout_buf + 2 * run; /* run 1: 2 bytes off */
        upload(&x, d_qkv, qkv, n3);
        upload(&x, d_dout, dout, n1);
        upload(&x, d_dqkv, zero, n3);
        poison(&x, d_out, n1 * 2);
        x.g->attention_forward(x.gpu, d_out, d_saved, d_qkv, NULL, B, T, C, NH, NH);
        x.g->attention_backward(x.gpu, d_dqkv, d_scratch, d_dout, d_qkv, d_saved, NULL, B, T, C, NH, NH);
        out[run] = fetch(&x, d_out, n1);
        dq[run] = fetch(&x, d_dqkv, n3);
    }
    check_same_bits("out, aligned vs unaligned inputs", out[0], out[1], n1);
    check_same_bits("dqkv, aligned vs unaligned inputs", dq[0], dq[1], n3);
    for (int run = 0; run < 2; run++) free(out[run]), free(dq[run]);
    free(qkv), free(dout), free(zero);
    ctx_close(&x);
}
