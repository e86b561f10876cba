/*
 * cpu.h - the CPU backend's own declarations: the op functions that fill the
 * dt_ops_t table (kernels.h), the OpenBLAS set-up, and small inline helpers
 * (a vectorisable expf) shared by the op files. Only kernels/ includes this.
 *
 * Threading model: OpenBLAS always runs single-threaded; all parallelism is
 * OpenMP with dev->nthreads threads, each thread calling sgemm on its own static
 * block. One thread pool, no oversubscription, and a fixed split of the work for a
 * fixed thread count, hence bitwise-reproducible results.
 */
#ifndef DT_KERNELS_CPU_CPU_H
#define DT_KERNELS_CPU_CPU_H

#include <cblas.h> /* types only: OpenBLAS is loaded at run time (cpu_blas.c) */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

/* The filled op table of the CPU backend. */
const dt_ops_t *dt_cpu_ops(void);
/* Sets dev->nthreads (<= 0: omp_get_max_threads()) and prepares OpenBLAS. */
dt_status_t dt_cpu_device_init(dt_device_t *dev, int nthreads);
void dt_cpu_device_free(dt_device_t *dev);
/* OpenBLAS (cpu_blas.c) is loaded with dlopen when the first CPU device opens, not
 * linked: the agent and every process that never computes on the CPU (the
 * launcher, `config`, GPU workers) skip its start-up, which spawns a thread per
 * core. Once per process it loads libopenblas.so.0, makes OpenBLAS single-threaded
 * and, when its runtime CPU detection fell back to a generic core on a CPU with
 * AVX-512 or AVX2 (it does so on unknown models such as Sapphire Rapids under a
 * hypervisor: "Prescott", 4x slower sgemm), switches it to the matching kernels. OPENBLAS_CORETYPE set by the user
 * is respected. A missing library is one error naming it. */
dt_status_t dt_cpu_blas_load(void);
/* The OpenBLAS kernel set in use ("SkylakeX", "Haswell", ...); loads OpenBLAS
 * ("unavailable" when it cannot be loaded). */
const char *dt_cpu_blas_core(void);
/* cblas_sgemm of the loaded OpenBLAS (row-major calls only here). Valid after
 * dt_cpu_blas_load() succeeded, which every CPU device's open ensures. */
typedef void (*dt_cpu_sgemm_fn)(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,
                                 blasint m, blasint n, blasint k, float alpha, const float *a, blasint lda,
                                 const float *b, blasint ldb, float beta, float *c, blasint ldc);
extern dt_cpu_sgemm_fn dt_cpu_sgemm;

/* [begin, end) of the i-th of n near-equal parts of [0, total). */
static inline void dt_cpu_split(size_t total, int n, int i, size_t *begin, size_t *end) {
    size_t q = total / (size_t)n, r = total % (size_t)n, ui = (size_t)i;
    *begin = ui * q + (ui < r ? ui : r);
    *end = *begin + q + (ui < r ? 1 : 0);
}

/* expf for finite x, relative error ~2e-7, written so that loops calling it
 * vectorise (no branches, no libm call). Underflows to 0 below -87.3, saturates
 * at e^88. */
static inline float dt_cpu_expf(float x) {
    /* NaN clamps to -87.3 (no NaN reaches the int conversion, which would be UB) and
     * comes back out as NaN below: a poisoned logit stays visible. */
    float xc = x > -87.3f ? (x < 88.0f ? x : 88.0f) : -87.3f;
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round */
    float r = xc - n * 0.693145751953125f;   /* ln2 split in a high part ... */
    r = r - n * 1.428606765330187e-06f;      /* ... and a low part */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    return x < -87.3f ? 0.0f : (x == x ? y : x);
}

/* In place: row[0:n] = softmax(row[0:n]) with max subtraction. Vectorised. */
static inline void dt_cpu_softmax_row(float *row, int n) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < n; j++) mx = row[j] > mx ? row[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
        float e = dt_cpu_expf(row[j] - mx);
        row[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j < n; j++) row[j] *= inv;
}

/* ---- ops, defined in kernels/cpu/cpu_{layers,llama,attention,loss,optim}.c ---- */
void dt_cpu_encoder_forward(dt_device_t *dev, void *out, const int *inp, const void *wte,
                            const void *wpe, const int *pos, int B, int T, int C);
void dt_cpu_encoder_backward(dt_device_t *dev, void *dwte, void *dwpe, const void *dout,
                             const int *inp, const int *pos, int B, int T, int C);
void dt_cpu_layernorm_forward(dt_device_t *dev, void *out, float *mean, float *rstd,
                              const void *inp, const void *weight, const void *bias, int N,
                              int C);
void dt_cpu_layernorm_backward(dt_device_t *dev, void *dinp, void *dweight, void *dbias,
                               const void *dout, const void *inp, const void *weight,
                               const float *mean, const float *rstd, int N, int C);
/* cpu_lora.c */
void dt_cpu_gemm(dt_device_t *dev, int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A,
                 int lda, const void *B, int ldb, float beta, void *C, int ldc);
void dt_cpu_matmul_forward_q8(dt_device_t *dev, void *out, const void *inp, const int8_t *wq, const float *scale,
                              const void *bias, int N, int C, int OC);
void dt_cpu_matmul_backward_q8(dt_device_t *dev, void *dinp, const void *dout, const int8_t *wq,
                               const float *scale, int N, int C, int OC);
void dt_cpu_matmul_forward(dt_device_t *dev, void *out, const void *inp, const void *weight,
                           const void *bias, int N, int C, int OC);
void dt_cpu_matmul_backward(dt_device_t *dev, void *dinp, void *dweight, void *dbias,
                            const void *dout, const void *inp, const void *weight, int N,
                            int C, int OC);
size_t dt_cpu_attention_saved_bytes(const dt_device_t *dev, int B, int T, int C, int NH, int NKV);
size_t dt_cpu_attention_scratch_bytes(const dt_device_t *dev, int B, int T, int C, int NH, int NKV);
void dt_cpu_attention_forward(dt_device_t *dev, void *out, void *saved, const void *qkv,
                              const int *pos, int B, int T, int C, int NH, int NKV);
void dt_cpu_attention_backward(dt_device_t *dev, void *dqkv, void *scratch, const void *dout,
                               const void *qkv, const void *saved, const int *pos, int B, int T,
                               int C, int NH, int NKV);
void dt_cpu_attention_decode(dt_device_t *dev, void *out, const void *q, int q_stride,
                             const void *kv, int max_T, int pos, int B, int C, int NH, int NKV);
/* cpu_attention_block.c: context parallelism (kernels.h, attention_block_*) */
size_t dt_cpu_attention_block_scratch_bytes(const dt_device_t *dev, int B, int Tq, int Tk, int C, int NH,
                                            int NKV);
void dt_cpu_attention_kv_pack(dt_device_t *dev, void *kv, const void *qkv, int B, int T, int C, int NH,
                              int NKV);
void dt_cpu_attention_block_forward(dt_device_t *dev, float *o, float *lse, void *scratch, const void *qkv,
                                    const void *kv, const int *qidx, const int *qlo, const int *kidx,
                                    int first, int B, int Tq, int Tk, int C, int NH, int NKV);
void dt_cpu_attention_block_finish(dt_device_t *dev, void *out, const float *o, int B, int Tq, int C);
void dt_cpu_attention_block_delta(dt_device_t *dev, float *delta, const void *dout, const void *out, int B,
                                  int Tq, int C, int NH);
void dt_cpu_attention_block_backward(dt_device_t *dev, void *dqkv, float *dkv, void *scratch, const void *dout,
                                     const void *qkv, const void *kv, const float *lse, const float *delta,
                                     const int *qidx, const int *qlo, const int *kidx, int B, int Tq, int Tk,
                                     int C, int NH, int NKV);
void dt_cpu_attention_kv_grad_add(dt_device_t *dev, void *dqkv, const float *dkv, int B, int T, int C, int NH,
                                  int NKV);
void dt_cpu_rmsnorm_forward(dt_device_t *dev, void *out, float *rstd, const void *inp,
                            const void *weight, int N, int C, float eps);
void dt_cpu_rmsnorm_backward(dt_device_t *dev, void *dinp, void *dweight, const void *dout,
                             const void *inp, const void *weight, const float *rstd, int N,
                             int C);
void dt_cpu_rope_forward(dt_device_t *dev, void *x, int B, int T, int row_stride, int n_heads,
                         int HS, int pos0, const int *pos, const dt_rope_args_t *rope);
void dt_cpu_rope_backward(dt_device_t *dev, void *dx, int B, int T, int row_stride, int n_heads,
                          int HS, int pos0, const int *pos, const dt_rope_args_t *rope);
void dt_cpu_swiglu_forward(dt_device_t *dev, void *out, const void *inp, int N, int IC);
void dt_cpu_swiglu_backward(dt_device_t *dev, void *dinp, const void *inp, const void *dout,
                            int N, int IC);
void dt_cpu_gelu_forward(dt_device_t *dev, void *out, const void *inp, size_t n);
void dt_cpu_gelu_backward(dt_device_t *dev, void *dinp, const void *inp, const void *dout,
                          size_t n);
void dt_cpu_relu_forward(dt_device_t *dev, void *out, const void *inp, size_t n);
void dt_cpu_relu_backward(dt_device_t *dev, void *dinp, const void *inp, const void *dout,
                          size_t n);
void dt_cpu_residual_forward(dt_device_t *dev, void *out, const void *a, const void *b,
                             size_t n);
void dt_cpu_residual_backward(dt_device_t *dev, void *da, void *db, const void *dout,
                              size_t n);
void dt_cpu_softmax_xent_forward(dt_device_t *dev, float *losses, const void *logits,
                                 const int *targets, int N, int V, int Vp);
void dt_cpu_softmax_xent_backward(dt_device_t *dev, void *dlogits, float *losses,
                                  const void *logits, const int *targets, float dscale, int N,
                                  int V, int Vp);
void dt_cpu_xent_vp_max(dt_device_t *dev, float *stats, const void *logits, int N, int Vl, int v0,
                        int V);
void dt_cpu_xent_vp_sums(dt_device_t *dev, float *stats, const void *logits, const int *targets,
                         int N, int Vl, int v0, int V);
void dt_cpu_xent_vp_loss(dt_device_t *dev, float *losses, const float *stats, const int *targets,
                         int N);
void dt_cpu_xent_vp_backward(dt_device_t *dev, void *dlogits, const void *logits,
                             const int *targets, const float *stats, float dscale, int N, int Vl,
                             int v0, int V);
void dt_cpu_mse_forward(dt_device_t *dev, float *losses, const void *pred, const float *target,
                        int N, int D);
void dt_cpu_mse_backward(dt_device_t *dev, void *dpred, const void *pred, const float *target,
                         float dscale, int N, int D);
void dt_cpu_adamw(dt_device_t *dev, void *params, float *master, const void *grads, float *m,
                  float *v, size_t n, const dt_adamw_args_t *args, int decay);
double dt_cpu_grad_sq_norm(dt_device_t *dev, const void *grads, size_t n);
double dt_cpu_grad_sq_norm_ranges(dt_device_t *dev, const void *const *grads, const size_t *counts, int n);
void dt_cpu_scale(dt_device_t *dev, void *x, float s, size_t n);

#endif /* DT_KERNELS_CPU_CPU_H */
