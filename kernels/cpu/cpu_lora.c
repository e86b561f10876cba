/*
 * cpu_lora.c - the CPU ops LoRA needs (kernels.h): a strided GEMM for the adapters'
 * small products, and matmuls against an int8 weight quantized per output row,
 * dequantized on the fly a tile of rows at a time (the fp32 weight never exists
 * whole; a tile is a few KiB to a few hundred KiB per thread).
 *
 * As the other ops: OpenBLAS single-threaded, OpenMP splits the output, and a
 * fixed thread count gives a fixed split (bitwise-reproducible results).
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/mem.h" /* defines: dt_xmalloc */
#include "kernels/cpu/cpu.h"

#define PAR_MIN_FLOPS (1 << 18)
/* Output rows of an int8 weight dequantized at once (per thread). */
#define Q8_TILE 64

static int threads_for(const dt_device_t *dev, size_t work) { return work < PAR_MIN_FLOPS ? 1 : dev->nthreads; }

void dt_cpu_gemm(dt_device_t *dev, int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A_,
                 int lda, const void *B_, int ldb, float beta, void *C_, int ldc) {
    const float *A = A_, *B = B_;
    float *C = C_;
    int nt = threads_for(dev, (size_t)M * N * K);
    /* Each thread its rows of C: row m of op(A) is row m of A, or column m (A + m). */
#pragma omp parallel num_threads(nt)
    {
        size_t m0, m1;
        dt_cpu_split((size_t)M, omp_get_num_threads(), omp_get_thread_num(), &m0, &m1);
        if (m1 > m0) {
            const float *a = trans_a ? A + m0 : A + m0 * (size_t)lda;
            dt_cpu_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                         (int)(m1 - m0), N, K, alpha, a, lda, B, ldb, beta, C + m0 * (size_t)ldc, ldc);
        }
    }
}

/* rows [o0, o1) of an int8 weight as fp32 into w ((o1 - o0) x C). */
static void dequant_rows(float *w, const int8_t *wq, const float *scale, size_t o0, size_t o1, int C) {
    for (size_t o = o0; o < o1; o++) {
        const int8_t *q = wq + o * (size_t)C;
        float s = scale[o], *d = w + (o - o0) * (size_t)C;
#pragma omp simd
        for (int c = 0; c < C; c++) d[c] = (float)q[c] * s;
    }
}

void dt_cpu_matmul_forward_q8(dt_device_t *dev, void *out_, const void *inp_, const int8_t *wq, const float *scale,
                              const void *bias_, int N, int C, int OC) {
    float *out = out_;
    const float *inp = inp_, *bias = bias_;
    int nt = threads_for(dev, (size_t)N * C * OC);
    /* Each thread its output channels, a tile of weight rows at a time. */
#pragma omp parallel num_threads(nt)
    {
        size_t o0, o1;
        dt_cpu_split((size_t)OC, omp_get_num_threads(), omp_get_thread_num(), &o0, &o1);
        /* a tile of dequantized rows (dt_xmalloc: out of memory aborts, never skips the tile) */
        float *w = o1 > o0 ? dt_xmalloc(sizeof(float) * Q8_TILE * (size_t)C) : NULL;
        for (size_t t0 = o0; w && t0 < o1; t0 += Q8_TILE) {
            size_t t1 = t0 + Q8_TILE < o1 ? t0 + Q8_TILE : o1;
            dequant_rows(w, wq, scale, t0, t1, C);
            float beta = 0.0f;
            if (bias) {
                for (int r = 0; r < N; r++) memcpy(out + (size_t)r * OC + t0, bias + t0, sizeof(float) * (t1 - t0));
                beta = 1.0f;
            }
            dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, (int)(t1 - t0), C, 1.0f, inp, C, w, C, beta,
                         out + t0, OC);
        }
        free(w);
    }
}

void dt_cpu_matmul_backward_q8(dt_device_t *dev, void *dinp_, const void *dout_, const int8_t *wq,
                               const float *scale, int N, int C, int OC) {
    float *dinp = dinp_;
    const float *dout = dout_;
    int nt = threads_for(dev, (size_t)N * C * OC);
    /* Each thread its rows of dinp, adding the tiles of output channels in order. */
#pragma omp parallel num_threads(nt)
    {
        size_t r0, r1;
        dt_cpu_split((size_t)N, omp_get_num_threads(), omp_get_thread_num(), &r0, &r1);
        float *w = r1 > r0 ? dt_xmalloc(sizeof(float) * Q8_TILE * (size_t)C) : NULL;
        for (size_t t0 = 0; w && t0 < (size_t)OC; t0 += Q8_TILE) {
            size_t t1 = t0 + Q8_TILE < (size_t)OC ? t0 + Q8_TILE : (size_t)OC;
            dequant_rows(w, wq, scale, t0, t1, C);
            dt_cpu_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(r1 - r0), C, (int)(t1 - t0), 1.0f,
                         dout + r0 * (size_t)OC + t0, OC, w, C, 1.0f, dinp + r0 * (size_t)C, C);
        }
        free(w);
    }
}
