/*
 * cpu_optim.c - CPU ops over flat ranges of the parameter, gradient and
 * optimizer buffers: the AdamW step, the squared gradient norm and in-place
 * scaling, and AdamW on the host for a GPU whose optimizer state is offloaded
 * (dt_host_adamw: bf16 or fp32 gradients and parameters, fp32 state). Element-wise
 * work is split statically; the norm sums fixed blocks in
 * double and adds the block sums in order, so it does not depend on the thread
 * count at all.
 */
#include <math.h>
#include <omp.h>

#include "kernels/cpu/cpu.h"
#include "kernels/sr_hash.h" /* defines: dt_sr_bits, dt_sr_round_bits */

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

/* ---- AdamW on the host for an offloaded device (kernels.h: dt_host_adamw) ---------- */

static inline float bf16_to_f32(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* Round to nearest even, NaN kept a (quiet) NaN: __float2bfloat16's result. */
static inline uint16_t f32_to_bf16_rne(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    uint32_t nan = (b & 0x7fffffffu) > 0x7f800000u;
    uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    return (uint16_t)(nan ? ((b >> 16) | 0x40u) : r);
}

/* The CUDA adamw's stochastic rounding, bit for bit (kernels/sr_hash.h); infinities
 * and NaN to nearest. */
static inline uint16_t f32_to_bf16_sr(float f, uint32_t key, size_t i) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    if ((b & 0x7f800000u) == 0x7f800000u) return f32_to_bf16_rne(f);
    return (uint16_t)(dt_sr_round_bits(b, dt_sr_bits(key, i)) >> 16);
}

/* One thread's part [i0, i1) with bf16 gradients and parameters. */
static void adamw_range_bf16(uint16_t *params, float *master, const uint16_t *grads, float *m, float *v,
                             size_t i0, size_t i1, size_t index0, const dt_adamw_args_t *a, float wd, float bc1,
                             float bc2, uint32_t key, int sr) {
    float lr = a->lr, b1 = a->beta1, b2 = a->beta2, eps = a->eps, gs = a->grad_scale;
    if (sr) {
        for (size_t i = i0; i < i1; i++) {
            float w = adamw_one(master[i], bf16_to_f32(grads[i]) * gs, &m[i], &v[i], lr, b1, b2, eps, wd, bc1, bc2);
            master[i] = w;
            params[i] = f32_to_bf16_sr(w, key, index0 + i);
        }
        return;
    }
#pragma omp simd
    for (size_t i = i0; i < i1; i++) {
        float w = adamw_one(master[i], bf16_to_f32(grads[i]) * gs, &m[i], &v[i], lr, b1, b2, eps, wd, bc1, bc2);
        master[i] = w;
        params[i] = f32_to_bf16_rne(w);
    }
}

void dt_host_adamw(int nthreads, dt_dtype_t dtype, void *params, float *master, const void *grads, float *m,
                   float *v, size_t n, size_t index0, const dt_adamw_args_t *a, int decay) {
    float wd = decay ? a->weight_decay : 0.0f;
    double t = a->step < 1 ? 1.0 : (double)a->step;
    float bc1 = (float)(1.0 - pow((double)a->beta1, t));
    float bc2 = (float)(1.0 - pow((double)a->beta2, t));
    /* the CUDA adamw's key: the step enters it, so a fixed seed draws fresh bits every step */
    uint32_t key = (uint32_t)a->sr_seed * 0x9e3779b9u + (uint32_t)(a->step < 1 ? 1 : a->step) * 0x632be5abu;
    key = (key ^ (key >> 15)) * 0x2c1b3c6du;
    if (nthreads <= 0) nthreads = omp_get_max_threads();
    int nt = n < PAR_MIN_ELEMS ? 1 : nthreads;
#pragma omp parallel num_threads(nt)
    {
        size_t i0, i1;
        dt_cpu_split(n, omp_get_num_threads(), omp_get_thread_num(), &i0, &i1);
        if (dtype == DT_DTYPE_BF16)
            adamw_range_bf16(params, master, grads, m, v, i0, i1, index0, a, wd, bc1, bc2, key, a->sr_seed != 0);
        else /* fp32: the CPU device's loop, master given */
            adamw_range(params, master, grads, m, v, i0, i1, a->lr, a->beta1, a->beta2, a->eps, wd, a->grad_scale,
                        bc1, bc2);
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
