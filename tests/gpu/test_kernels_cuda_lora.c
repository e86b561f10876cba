/*
 * test_kernels_cuda_lora.c - the CUDA ops LoRA adds (kernels.h: gemm,
 * matmul_forward_q8, matmul_backward_q8) against the CPU ops (tests/test_kernels_lora.c
 * checks those against double references and dequantize-then-matmul), in both
 * compute dtypes: the gemm on a column block of a wider output with every transpose
 * combination, the int8 matmuls with a bias, accumulation into a pre-filled dinp and
 * an OC spanning several dequantization tiles' worth of rows for a wide C.
 *
 * As the other tests/gpu files: skipped where no CUDA device is visible (the CPU
 * emulator in make test, a real GPU in scripts/gpu_check.sh); inputs round-tripped
 * through the device dtype so both sides see the same values; each GPU op runs twice
 * and must give the same bits. Tolerances: fp32 1e-5 relative + 1e-5 rms (sums of up
 * to a few hundred products in another order); bf16 one rounding of the result (2^-8
 * relative) + 1e-2 rms (bf16 inputs to the products of the CPU reference are the
 * same, the GPU rounds the output, and a += output rounds twice).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "runtime/model/lora.h" /* defines: dt_lora_quantize_rows */
#include "tests/gpu/gpu_fixture.h"

static void check(ctx_t *x, const char *what, const float *got, const float *want, size_t n) {
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)want[i] * want[i];
    double rms = sqrt(ss / (double)n), rtol = x->bf16 ? BF_ULP : 1e-5, atol = x->bf16 ? 1e-2 : 1e-5;
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs((double)got[i] - want[i]) <= rtol * fabs(want[i]) + atol * rms, "%s[%zu]: %.9g vs %.9g", what,
                  i, got[i], want[i]);
}

static void gemm_case(dt_dtype_t dtype) {
    ctx_t x;
    ctx_open(&x, dtype);
    rng_seed(1);
    int M = 33, N = 6, K = 70, ldc = N + 10;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = ta ? M : K, ldb = tb ? K : N;
            size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
            float *A = frand(na, 1, 0), *B = frand(nb, 1, 0), *C = frand(nc, 1, 0);
            void *dA = gpu_tensor(&x, A, na), *dB = gpu_tensor(&x, B, nb), *dC = gpu_tensor(&x, C, nc);
            void *dC2 = gpu_alloc(&x, nc * dt_dtype_size(dtype));
            cr_assert_eq(x.g->copy(x.gpu, dC2, dC, nc * dt_dtype_size(dtype), DT_COPY_DEVICE_TO_DEVICE), DT_STATUS_OK);
            x.c->gemm(x.cpu, ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 1.0f, C + 3, ldc);
            x.g->gemm(x.gpu, ta, tb, M, N, K, 0.5f, dA, lda, dB, ldb, 1.0f, (char *)dC + 3 * dt_dtype_size(dtype),
                      ldc);
            x.g->gemm(x.gpu, ta, tb, M, N, K, 0.5f, dA, lda, dB, ldb, 1.0f, (char *)dC2 + 3 * dt_dtype_size(dtype),
                      ldc);
            float *g = fetch(&x, dC, nc), *g2 = fetch(&x, dC2, nc);
            check(&x, "gemm", g, C, nc);
            cr_assert(memcmp(g, g2, nc * sizeof *g) == 0, "gemm: two runs differ");
            free(A), free(B), free(C), free(g), free(g2);
        }
    ctx_close(&x);
}
Test(cuda_lora, gemm_fp32) { gemm_case(DT_DTYPE_F32); }
Test(cuda_lora, gemm_bf16) { gemm_case(DT_DTYPE_BF16); }

static void q8_case(dt_dtype_t dtype) {
    ctx_t x;
    ctx_open(&x, dtype);
    rng_seed(2);
    int N = 24, C = 96, OC = 140;
    size_t nw = (size_t)OC * C;
    float *w = frand(nw, 1, 0), *s = malloc(OC * sizeof *s);
    int8_t *q = malloc(nw);
    dt_lora_quantize_rows(w, (size_t)OC, (size_t)C, q, s);
    float *in = frand((size_t)N * C, 1, 0), *bias = frand((size_t)OC, 1, 0), *dout = frand((size_t)N * OC, 1, 0);
    float *dinp = frand((size_t)N * C, 1, 0);
    void *din = gpu_tensor(&x, in, (size_t)N * C), *db = gpu_tensor(&x, bias, (size_t)OC);
    void *ddo = gpu_tensor(&x, dout, (size_t)N * OC), *ddi = gpu_tensor(&x, dinp, (size_t)N * C);
    int8_t *dq = gpu_alloc(&x, nw);
    float *ds = gpu_alloc(&x, OC * sizeof(float));
    cr_assert_eq(x.g->copy(x.gpu, dq, q, nw, DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK);
    cr_assert_eq(x.g->copy(x.gpu, ds, s, OC * sizeof(float), DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK);
    void *dout_g = gpu_alloc(&x, (size_t)N * OC * dt_dtype_size(dtype));
    poison(&x, dout_g, (size_t)N * OC * dt_dtype_size(dtype));
    float *want = malloc((size_t)N * OC * sizeof *want);
    x.c->matmul_forward_q8(x.cpu, want, in, q, s, bias, N, C, OC);
    x.g->matmul_forward_q8(x.gpu, dout_g, din, dq, ds, db, N, C, OC);
    float *got = fetch(&x, dout_g, (size_t)N * OC);
    check(&x, "matmul_forward_q8", got, want, (size_t)N * OC);
    x.g->matmul_forward_q8(x.gpu, dout_g, din, dq, ds, db, N, C, OC);
    float *got2 = fetch(&x, dout_g, (size_t)N * OC);
    cr_assert(memcmp(got, got2, (size_t)N * OC * sizeof *got) == 0, "matmul_forward_q8: two runs differ");
    x.c->matmul_backward_q8(x.cpu, dinp, dout, q, s, N, C, OC);
    x.g->matmul_backward_q8(x.gpu, ddi, ddo, dq, ds, N, C, OC);
    float *gd = fetch(&x, ddi, (size_t)N * C);
    check(&x, "matmul_backward_q8", gd, dinp, (size_t)N * C);
    free(w), free(s), free(q), free(in), free(bias), free(dout), free(dinp), free(want), free(got), free(got2), free(gd);
    ctx_close(&x);
}
Test(cuda_lora, int8_matmuls_fp32) { q8_case(DT_DTYPE_F32); }
Test(cuda_lora, int8_matmuls_bf16) { q8_case(DT_DTYPE_BF16); }
