/*
 * cpu_optim.c - CPU ops over flat ranges of the parameter, gradient and
 * optimizer buffers: the AdamW step, the squared gradient norm and in-place
 * scaling. Element-wise work is split statically; the norm sums fixed blocks in
 * double and adds the block sums in order, so it does not depend on the thread
 * count at all.
 */
#include <math.h>
#include <omp.h>

#include "kernels/cpu/cpu.h"

#define NORM_BLOCKS 256
#define PAR_MIN_ELEMS (1 << 15)

/* sqrt of x >= 0 within 1 ulp for normal x (subnormals: within 10 %, far below any
 * eps added to it), branch-free so that loops calling it vectorise
 * (libm's sqrtf keeps an errno path that stops GCC's vectoriser): an initial
 * guess from the exponent bits (error < 4 %) and three Newton steps. */
static inline float sqrt_nonneg(float x) {
    int32_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits = (bits >> 1) + 0x1fbd1df5;
    float y;
    memcpy(&y, &bits, sizeof y);
    y = 0.5f * (y + x / y);
    y = 0.5f * (y + x / y);
    y = 0.5f * (y + x / y);
    return x > 0.0f ? y : 0.0f;
}

/* AdamW on one element; returns the new weight. */
static inline float adamw_one(float w, float g, float *m, float *v, float lr, float b1, float b2,
                              float eps, float wd, float bc1, float bc2) {
    float mi = b1 * *m + (1.0f - b1) * g;
    float vi = b2 * *v + (1.0f - b2) * g * g;
    *m = mi;
    *v = vi;
    float mhat = mi / bc1, vhat = vi / bc2;
    return w - lr * (mhat / (sqrt_nonneg(vhat) + eps) + wd * w);
}

/* One thread's part [i0, i1) of the AdamW step. */
static void adamw_range(
    float *params, float *master, const float *grads, float *m, float *v, size_t i0, size_t i1,
    float lr, float b1, float b2, float eps, float wd, float gs, float bc1, float bc2) {
    if (master) {
#pragma omp simd
        for (size_t i = i0; i < i1; i++) {
            float w = adamw_one(master[i], grads[i] * gs, &m[i], &v[i], lr, b1, b2, eps, wd, bc1,
                                bc2);
            master[i] = w;
            params[i] = w;
        }
    } else {
        /* With fp32 compute and no separate master copy the parameters are the master. */
#pragma omp simd
        for (size_t i = i0; i < i1; i++)
            params[i] = adamw_one(params[i], grads[i] * gs, &m[i], &v[i], lr, b1, b2, eps, wd,
                                  bc1, bc2);
    }
}

void dt_cpu_adamw(dt_device_t *dev, void *params, float *master, const void *grads, float *m,
                  float *v, size_t n, const dt_adamw_args_t *a, int decay) {
    float wd = decay ? a->weight_decay : 0.0f;
    double t = a->step < 1 ? 1.0 : (double)a->step; /* step 0 would divide by 0 */
    float bc1 = (float)(1.0 - pow((double)a->beta1, t));
    float bc2 = (float)(1.0 - pow((double)a->beta2, t));
    int nt = n < PAR_MIN_ELEMS ? 1 : dev->nthreads;
#pragma omp parallel num_threads(nt)
    {
        size_t i0, i1;
        dt_cpu_split(n, omp_get_num_threads(), omp_get_thread_num(), &i0, &i1);
        adamw_range(params, master, grads, m, v, i0, i1, a->lr, a->beta1, a->beta2, a->eps, wd,
                    a->grad_scale, bc1, bc2);
    }
}

double dt_cpu_grad_sq_norm(dt_device_t *dev, const void *grads_, size_t n) {
    const float *g = grads_;
    double part[NORM_BLOCKS];
    int nt = n < PAR_MIN_ELEMS ? 1 : dev->nthreads;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int b = 0; b < NORM_BLOCKS; b++) {
        size_t i0, i1;
        dt_cpu_split(n, NORM_BLOCKS, b, &i0, &i1);
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = i0; i < i1; i++) s += (double)g[i] * (double)g[i];
        part[b] = s;
    }
    double total = 0.0;
    for (int b = 0; b < NORM_BLOCKS; b++) total += part[b];
    return total;
}

double dt_cpu_grad_sq_norm_ranges(dt_device_t *dev, const void *const *grads, const size_t *counts, int n) {
    double total = 0.0;
    for (int i = 0; i < n; i++) total += dt_cpu_grad_sq_norm(dev, grads[i], counts[i]);
    return total;
}

void dt_cpu_scale(dt_device_t *dev, void *x_, float s, size_t n) {
    float *x = x_;
    int nt = n < PAR_MIN_ELEMS ? 1 : dev->nthreads;
#pragma omp parallel for simd num_threads(nt) schedule(simd : static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}
