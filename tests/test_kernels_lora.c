/*
 * test_kernels_lora.c - the CPU ops LoRA adds (kernels.h): the strided gemm against
 * a double-precision loop over every transpose combination and a column block of a
 * wider output (how the adapters write their rows of a fused output); the int8
 * matmuls against dequantize-then-matmul (matmul_forward / matmul_backward on the
 * dequantized fp32 weight), with a bias, accumulation into a pre-filled dinp, shapes
 * that are not multiples of the dequantization tile, and bitwise agreement between
 * one and three threads. Also the host quantization (lora.h): per-row absmax, every
 * element within half a step of its row's scale.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "runtime/model/lora.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rnd(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / (1ull << 24)) * 2.0 - 1.0);
}
static float *frand(size_t n) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = rnd();
    return x;
}

static dt_device_t *cpu(int threads) {
    dt_device_t *d;
    cr_assert_eq(dt_device_init(&d, DT_DEVICE_CPU, threads), DT_STATUS_OK);
    return d;
}

Test(lora_ops, gemm_strided_all_transposes) {
    dt_device_t *d = cpu(3);
    int M = 37, N = 5, K = 70, ldc = N + 9;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2;
            float *A = frand((size_t)(ta ? K : M) * lda), *B = frand((size_t)(tb ? N : K) * ldb);
            float *C = frand((size_t)M * ldc), *C0 = malloc((size_t)M * ldc * sizeof *C0);
            memcpy(C0, C, (size_t)M * ldc * sizeof *C);
            d->ops->gemm(d, ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 1.0f, C + 4, ldc);
            for (int m = 0; m < M; m++)
                for (int c = 0; c < ldc; c++) {
                    double want = C0[(size_t)m * ldc + c];
                    if (c >= 4 && c < 4 + N) {
                        int n = c - 4;
                        double s = 0;
                        for (int k = 0; k < K; k++)
                            s += (double)(ta ? A[(size_t)k * lda + m] : A[(size_t)m * lda + k]) *
                                 (tb ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n]);
                        want += 0.5 * s;
                    }
                    cr_assert(fabs(C[(size_t)m * ldc + c] - want) < 1e-4, "ta %d tb %d (%d, %d): %g vs %g", ta, tb, m,
                              c, C[(size_t)m * ldc + c], want);
                }
            free(A), free(B), free(C), free(C0);
        }
    dt_device_free(d);
}

/* A NaN or infinite weight cannot be quantized ((int8_t)NaN is undefined): the first such
 * row is reported, its values zero. */
Test(lora_ops, quantize_rows_reports_non_finite) {
    size_t rows = 4, cols = 5;
    float *w = frand(rows * cols), s[4];
    w[2 * cols + 1] = NAN;
    w[3 * cols] = INFINITY;
    int8_t q[20];
    cr_assert_eq(dt_lora_quantize_rows(w, rows, cols, q, s), 2);
    for (size_t c = 0; c < cols; c++) cr_assert_eq(q[2 * cols + c], 0);
    cr_assert_eq(s[2], 1.0f);
    free(w);
}

Test(lora_ops, quantize_rows_absmax) {
    size_t rows = 9, cols = 33;
    float *w = frand(rows * cols), s[9];
    for (size_t c = 0; c < cols; c++) w[3 * cols + c] = 0; /* a zero row */
    int8_t *q = malloc(rows * cols);
    cr_assert_eq(dt_lora_quantize_rows(w, rows, cols, q, s), -1, "every weight is finite");
    for (size_t r = 0; r < rows; r++) {
        float m = 0;
        for (size_t c = 0; c < cols; c++) m = fmaxf(m, fabsf(w[r * cols + c]));
        cr_assert(r == 3 ? s[r] == 1.0f : fabsf(s[r] - m / 127) < 1e-9f, "row %zu scale %g", r, s[r]);
        for (size_t c = 0; c < cols; c++)
            cr_assert(fabsf(q[r * cols + c] * s[r] - w[r * cols + c]) <= 0.5f * s[r] * 1.0001f, "(%zu, %zu)", r, c);
    }
    free(w), free(q);
}

/* out and dinp of the int8 ops on nt threads. */
static void run_q8(int nt, int N, int C, int OC, const float *x, const int8_t *q, const float *s, const float *bias,
                   const float *dout, float *out, float *dinp) {
    dt_device_t *d = cpu(nt);
    d->ops->matmul_forward_q8(d, out, x, q, s, bias, N, C, OC);
    d->ops->matmul_backward_q8(d, dinp, dout, q, s, N, C, OC);
    dt_device_free(d);
}

Test(lora_ops, int8_matmul_equals_dequantize_then_matmul) {
    int N = 70, C = 45, OC = 150; /* OC not a multiple of the 64-row tile */
    float *w = frand((size_t)OC * C), *x = frand((size_t)N * C), *bias = frand((size_t)OC);
    float *dout = frand((size_t)N * OC), s[150];
    int8_t *q = malloc((size_t)OC * C);
    dt_lora_quantize_rows(w, (size_t)OC, (size_t)C, q, s);
    float *wd = malloc((size_t)OC * C * sizeof *wd);
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) wd[(size_t)o * C + c] = (float)q[(size_t)o * C + c] * s[o];
    float *want = calloc((size_t)N * OC, sizeof *want), *dwant = malloc((size_t)N * C * sizeof *dwant);
    float *out1 = calloc((size_t)N * OC, sizeof *out1), *out3 = calloc((size_t)N * OC, sizeof *out3);
    float *d1 = malloc((size_t)N * C * sizeof *d1), *d3 = malloc((size_t)N * C * sizeof *d3);
    for (size_t i = 0; i < (size_t)N * C; i++) dwant[i] = d1[i] = d3[i] = 0.25f; /* accumulates */
    dt_device_t *d = cpu(1);
    d->ops->matmul_forward(d, want, x, wd, bias, N, C, OC);
    d->ops->matmul_backward(d, dwant, NULL, NULL, dout, x, wd, N, C, OC);
    dt_device_free(d);
    run_q8(1, N, C, OC, x, q, s, bias, dout, out1, d1);
    run_q8(3, N, C, OC, x, q, s, bias, dout, out3, d3);
    for (size_t i = 0; i < (size_t)N * OC; i++) {
        cr_assert(fabsf(out1[i] - want[i]) < 1e-5f, "out[%zu] %g vs %g", i, out1[i], want[i]);
        cr_assert(out1[i] == out3[i], "out[%zu]: 1 and 3 threads differ", i);
    }
    for (size_t i = 0; i < (size_t)N * C; i++) {
        cr_assert(fabsf(d1[i] - dwant[i]) < 1e-5f, "dinp[%zu] %g vs %g", i, d1[i], dwant[i]);
        cr_assert(d1[i] == d3[i], "dinp[%zu]: 1 and 3 threads differ", i);
    }
    free(w), free(x), free(bias), free(dout), free(q), free(wd), free(want), free(dwant);
    free(out1), free(out3), free(d1), free(d3);
}
