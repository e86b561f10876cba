/*
 * cpu_loss.c - CPU loss ops: fused softmax + cross-entropy over a padded
 * vocabulary (the LM head of the GPT, the classifier of the MLP), its
 * vocabulary-parallel form (each tensor-parallel rank holds a column slice of the
 * logits; the caller all-reduces the per-row stats between the ops) and mean
 * squared error. Rows are independent and split statically over the threads.
 */
#include <math.h>
#include <omp.h>

#include "kernels/cpu/cpu.h"

/* Max and sum of exp(x - max) over the first V entries of one row. */
static void row_logsumexp(const float *x, int V, float *mx_out, float *sum_out) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; j++) sum += dt_cpu_expf(x[j] - mx);
    *mx_out = mx;
    *sum_out = sum;
}

static int rows_threads(const dt_device_t *dev, int N, int Vp) {
    return (size_t)N * Vp < (1u << 15) ? 1 : dev->nthreads;
}

void dt_cpu_softmax_xent_forward(dt_device_t *dev, float *losses, const void *logits_,
                                 const int *targets, int N, int V, int Vp) {
    const float *logits = logits_;
#pragma omp parallel for num_threads(rows_threads(dev, N, Vp)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        int tgt = targets[n];
        if (tgt < 0) {
            losses[n] = 0.0f;
            continue;
        }
        float mx, sum;
        row_logsumexp(x, V, &mx, &sum);
        losses[n] = (float)(log((double)sum) + (double)mx - (double)x[tgt]);
    }
}

void dt_cpu_softmax_xent_backward(dt_device_t *dev, void *dlogits_, float *losses,
                                  const void *logits_, const int *targets, float dscale, int N,
                                  int V, int Vp) {
    /* No restrict: dlogits may be the logits themselves; each element is read
     * before it is written at the same index. */
    float *dlogits = dlogits_;
    const float *logits = logits_;
#pragma omp parallel for num_threads(rows_threads(dev, N, Vp)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        float *d = dlogits + (size_t)n * Vp;
        int tgt = targets[n];
        if (tgt < 0) {
            if (losses) losses[n] = 0.0f;
            for (int j = 0; j < Vp; j++) d[j] = 0.0f;
            continue;
        }
        float mx, sum;
        row_logsumexp(x, V, &mx, &sum);
        float xt = x[tgt];
        if (losses) losses[n] = (float)(log((double)sum) + (double)mx - (double)xt);
        float k = dscale / sum;
#pragma omp simd
        for (int j = 0; j < V; j++) d[j] = dt_cpu_expf(x[j] - mx) * k;
        d[tgt] -= dscale;
        for (int j = V; j < Vp; j++) d[j] = 0.0f;
    }
}

/* ---- vocabulary-parallel softmax + cross-entropy (kernels.h: xent_vp_*) ------
 * A rank's slice holds columns [v0, v0 + Vl) of the padded vocabulary; of those,
 * the first vp_real() are real (global index < V), the rest padding. */

static int vp_real(int Vl, int v0, int V) {
    int r = V - v0;
    return r < 0 ? 0 : (r > Vl ? Vl : r);
}

void dt_cpu_xent_vp_max(dt_device_t *dev, float *stats, const void *logits_, int N, int Vl, int v0,
                        int V) {
    const float *logits = logits_;
    int R = vp_real(Vl, v0, V);
#pragma omp parallel for num_threads(rows_threads(dev, N, Vl)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vl;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < R; j++) mx = x[j] > mx ? x[j] : mx;
        stats[n] = mx;
    }
}

void dt_cpu_xent_vp_sums(dt_device_t *dev, float *stats, const void *logits_, const int *targets,
                         int N, int Vl, int v0, int V) {
    const float *logits = logits_;
    int R = vp_real(Vl, v0, V);
#pragma omp parallel for num_threads(rows_threads(dev, N, Vl)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vl;
        int tgt = targets[n];
        float sum = 0.0f, xt = 0.0f;
        if (tgt >= 0) {
            float mx = stats[n];
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < R; j++) sum += dt_cpu_expf(x[j] - mx);
            if (tgt >= v0 && tgt - v0 < R) xt = x[tgt - v0];
        }
        stats[N + n] = sum;
        stats[2 * (size_t)N + n] = xt;
    }
}

void dt_cpu_xent_vp_loss(dt_device_t *dev, float *losses, const float *stats, const int *targets,
                         int N) {
    (void)dev; /* N floats: not worth threads */
    for (int n = 0; n < N; n++) {
        if (targets[n] < 0) {
            losses[n] = 0.0f;
            continue;
        }
        double mx = stats[n], sum = stats[N + n], xt = stats[2 * (size_t)N + n];
        losses[n] = (float)(log(sum) + mx - xt);
    }
}

void dt_cpu_xent_vp_backward(dt_device_t *dev, void *dlogits_, const void *logits_,
                             const int *targets, const float *stats, float dscale, int N, int Vl,
                             int v0, int V) {
    /* No restrict: dlogits may be the logits themselves; each element is read
     * before it is written at the same index. */
    float *dlogits = dlogits_;
    const float *logits = logits_;
    int R = vp_real(Vl, v0, V);
#pragma omp parallel for num_threads(rows_threads(dev, N, Vl)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vl;
        float *d = dlogits + (size_t)n * Vl;
        int tgt = targets[n];
        if (tgt < 0) {
            for (int j = 0; j < Vl; j++) d[j] = 0.0f;
            continue;
        }
        float mx = stats[n], k = dscale / stats[N + n];
#pragma omp simd
        for (int j = 0; j < R; j++) d[j] = dt_cpu_expf(x[j] - mx) * k;
        if (tgt >= v0 && tgt - v0 < R) d[tgt - v0] -= dscale;
        for (int j = R; j < Vl; j++) d[j] = 0.0f;
    }
}

void dt_cpu_mse_forward(dt_device_t *dev, float *losses, const void *pred_, const float *target,
                        int N, int D) {
    const float *pred = pred_;
#pragma omp parallel for num_threads(rows_threads(dev, N, D)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *p = pred + (size_t)n * D, *y = target + (size_t)n * D;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < D; j++) sum += (p[j] - y[j]) * (p[j] - y[j]);
        losses[n] = sum / (float)D;
    }
}

void dt_cpu_mse_backward(dt_device_t *dev, void *dpred_, const void *pred_, const float *target,
                         float dscale, int N, int D) {
    float *dpred = dpred_;
    const float *pred = pred_;
    float k = 2.0f * dscale / (float)D;
#pragma omp parallel for num_threads(rows_threads(dev, N, D)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *p = pred + (size_t)n * D, *y = target + (size_t)n * D;
        float *d = dpred + (size_t)n * D;
#pragma omp simd
        for (int j = 0; j < D; j++) d[j] = k * (p[j] - y[j]);
    }
}
