/*
 * kernels_harness.h - what the CPU op tests share (test_kernels.c,
 * test_kernels_train.c): a seeded xorshift generator and random / filled buffers,
 * a CPU device, the tolerance check against a double reference, central finite
 * differences of a scalar loss (h = FD_H) and PRE, the value gradient buffers start
 * at to test that a backward accumulates. Each including file has its own generator
 * state.
 */
#ifndef DT_TESTS_KERNELS_HARNESS_H
#define DT_TESTS_KERNELS_HARNESS_H

#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/mem.h"
#include "kernels/kernels.h"


static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static inline void rng_seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ull + 1; }
static inline float rnd(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / (1ull << 24)) * 2.0 - 1.0);
}
static inline float *frand(size_t n, float scale) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = rnd() * scale;
    return x;
}
static inline float *ffill(size_t n, float v) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = v;
    return x;
}
static inline double *todouble(const float *x, size_t n) {
    double *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

static inline dt_device_t *open_cpu(int nthreads) {
    dt_device_t *dev = NULL;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, nthreads), DT_STATUS_OK, "%s",
                 dt_error_detail());
    return dev;
}

/* Checks got (float, minus an offset the buffer started at) against ref. */
static inline void check_close(const char *what, const float *got, float offset,
                               const double *ref, size_t n, double atol, double rtol) {
    for (size_t i = 0; i < n; i++) {
        double g = (double)got[i] - offset;
        double err = fabs(g - ref[i]);
        if (!(err <= atol + rtol * fabs(ref[i])))
            cr_assert_fail("%s[%zu]: got %.9g, want %.9g (err %.3g)", what, i, g, ref[i], err);
    }
}

/* Central finite differences of f with respect to x[idx[k]] (all of x when idx is
 * NULL). */
typedef double (*loss_fn)(void *ctx);
#define FD_H 1e-4
static inline void fd_grad(loss_fn f, void *ctx, double *x, size_t n, double *g) {
    for (size_t i = 0; i < n; i++) {
        double old = x[i];
        x[i] = old + FD_H;
        double fp = f(ctx);
        x[i] = old - FD_H;
        double fm = f(ctx);
        x[i] = old;
        g[i] = (fp - fm) / (2 * FD_H);
    }
}
static inline double dot(const double *a, const float *r, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * r[i];
    return s;
}

#define PRE 0.25f /* value gradient buffers start at, to test accumulation */

#endif /* DT_TESTS_KERNELS_HARNESS_H */
