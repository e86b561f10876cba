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

void dt_cpu_adamw(dt_device_t *dev, void *params_, float *master, const void *grads_, float *m,
                  float *v, size_t n, const dt_adamw_args_t *a, int decay) {
    float *params = params_;
    const float *grads = grads_;
    float lr = a->lr, b1 = a->beta1, b2 = a->beta2, eps = a->eps, gs = a->grad_scale;
    float wd = decay ? a->weight_decay : 0.0f;
    float bc1 = (float)(1.0 - pow((double)b1, (double)a->step));
    float bc2 = (float)(1.0 - pow((double)b2, (double)a->step));
    /* With fp32 compute and no separate master copy the parameters are the master. */
    float *w = master ? master : params;
    int nt = n < PAR_MIN_ELEMS ? 1 : dev->nthreads;
#pragma omp parallel for simd num_threads(nt) schedule(simd : static)
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * gs;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        float wi = w[i];
        wi -= lr * (mhat / (sqrtf(vhat) + eps) + wd * wi);
        w[i] = wi;
        if (master) params[i] = wi;
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

void dt_cpu_scale(dt_device_t *dev, void *x_, float s, size_t n) {
    float *x = x_;
    int nt = n < PAR_MIN_ELEMS ? 1 : dev->nthreads;
#pragma omp parallel for simd num_threads(nt) schedule(simd : static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}
