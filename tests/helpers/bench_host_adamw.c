/*
 * bench_host_adamw.c - the host AdamW step of optimizer offload (kernels.h:
 * dt_host_adamw) in GB/s of optimizer state touched, against what the same threads
 * move in a plain streaming kernel (the memory bandwidth they can get), so the note
 * can say whether the CPU step is the bottleneck.
 *
 * usage: bench_host_adamw [--threads N] [--elems M] [--iters K] [--dtype bf16|fp32]
 * Bytes touched per element and step (bf16): gradient 2 read, master 4 + m 4 + v 4
 * read and written, parameter 2 written = 28 (fp32: 32). The streaming reference is
 * a[i] = b[i] * s + c[i] over fp32 arrays of the same total size (3 x 4 bytes per
 * element touched, STREAM's triad). Prints the median of K timed steps after one
 * warm-up.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/mem.h"
#include "kernels/kernels.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

int main(int argc, char **argv) {
    int threads = 2, iters = 7;
    size_t n = (size_t)8 << 20;
    dt_dtype_t dt = DT_DTYPE_BF16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--elems") && i + 1 < argc) n = (size_t)atoll(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dt = strcmp(argv[++i], "fp32") ? DT_DTYPE_BF16 : DT_DTYPE_F32;
        else {
            fprintf(stderr, "usage: %s [--threads N] [--elems M] [--iters K] [--dtype bf16|fp32]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 1 || threads < 1 || n < 1) return 2;
    size_t es = dt_dtype_size(dt);
    char *p = dt_xcalloc(n, es), *g = dt_xcalloc(n, es);
    float *master = dt_xcalloc(n, 4), *m = dt_xcalloc(n, 4), *v = dt_xcalloc(n, 4);
    for (size_t i = 0; i < n; i++) master[i] = (float)(i % 1000) * 1e-3f - 0.5f;
    if (dt == DT_DTYPE_BF16)
        for (size_t i = 0; i < n; i++) ((uint16_t *)g)[i] = 0x3c00 + (uint16_t)(i % 200); /* ~0.008 .. 0.02 */
    else
        for (size_t i = 0; i < n; i++) ((float *)g)[i] = 1e-2f + (float)(i % 200) * 1e-4f;
    dt_adamw_args_t a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                         .grad_scale = 1.0f};
    double *t = dt_xcalloc((size_t)iters, sizeof *t);
    for (int k = -1; k < iters; k++) {
        a.step = k + 2;
        double t0 = dt_now_s();
        dt_host_adamw(threads, dt, p, master, g, m, v, n, 0, &a, 1);
        if (k >= 0) t[k] = dt_now_s() - t0;
    }
    double step_s = median(t, iters);
    double touched = (double)n * (double)(es + 3 * 8 + es); /* grad in, master/m/v in+out, param out */

    /* streaming reference over the same number of bytes: triad on fp32 arrays */
    size_t sn = (size_t)(touched / 12.0);
    float *x = dt_xcalloc(sn, 4), *y = dt_xcalloc(sn, 4), *z = dt_xcalloc(sn, 4);
    for (int k = -1; k < iters; k++) {
        double t0 = dt_now_s();
#pragma omp parallel for simd num_threads(threads) schedule(static)
        for (size_t i = 0; i < sn; i++) x[i] = y[i] * 1.0001f + z[i];
        if (k >= 0) t[k] = dt_now_s() - t0;
    }
    double triad_s = median(t, iters);
    double adam_gbs = touched / step_s / 1e9, triad_gbs = (double)sn * 12.0 / triad_s / 1e9;
    printf("host AdamW (%s), %d thread(s), %zu elements (%.0f MB of state touched per step):\n",
           dt_dtype_name(dt), threads, n, touched / 1e6);
    printf("  step %.2f ms = %.2f GB/s of state, %.1f M elements/s\n", step_s * 1e3, adam_gbs, n / step_s / 1e6);
    printf("  streaming triad on the same threads: %.2f GB/s; AdamW reaches %.0f%% of it\n", triad_gbs,
           100.0 * adam_gbs / triad_gbs);
    free(p), free(g), free(master), free(m), free(v), free(x), free(y), free(z), free(t);
    return 0;
}
