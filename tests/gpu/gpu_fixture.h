/*
 * gpu_fixture.h - what the CUDA-vs-CPU op tests share (tests/gpu/test_*.c): a
 * context holding a CUDA device of one compute dtype and the CPU reference device,
 * GPU buffers freed at close, uploads that round the host copy to what the GPU
 * holds, poisoning, and a small deterministic RNG. Every test skips when no CUDA
 * device is visible (these binaries also run under the CPU emulator in make test).
 */
#ifndef DT_TESTS_GPU_FIXTURE_H
#define DT_TESTS_GPU_FIXTURE_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/status.h"
#include "kernels/kernels.h"

#define BF_ULP (1.0 / 256.0)
#define MAX_BUFS 256

typedef struct ctx {
    dt_device_t *gpu, *cpu;
    const dt_ops_t *g, *c;
    dt_dtype_t dtype;
    int bf16;
    void *bufs[MAX_BUFS]; /* GPU allocations, freed by ctx_close */
    int nbufs;
} ctx_t;

/* attention: the DTRUN_CUDA_ATTENTION value the device is opened with (NULL: as set). */
static inline void ctx_open_attention(ctx_t *x, dt_dtype_t dtype, const char *attention) {
    memset(x, 0, sizeof *x);
    if (dt_device_count(DT_DEVICE_CUDA) == 0) cr_skip_test("no CUDA device");
    if (attention) cr_assert_eq(setenv("DTRUN_CUDA_ATTENTION", attention, 1), 0);
    dt_device_opts_t o = {.kind = DT_DEVICE_CUDA, .nthreads = 1, .ordinal = 0, .dtype = dtype};
    cr_assert_eq(dt_device_open(&x->gpu, &o), DT_STATUS_OK, "open cuda: %s", dt_error_detail());
    cr_assert_eq(dt_device_init(&x->cpu, DT_DEVICE_CPU, 2), DT_STATUS_OK, "open cpu: %s", dt_error_detail());
    x->g = x->gpu->ops;
    x->c = x->cpu->ops;
    x->dtype = dtype;
    x->bf16 = dtype == DT_DTYPE_BF16;
    cr_assert_eq(x->g->dtype, dtype);
}

static inline void ctx_open(ctx_t *x, dt_dtype_t dtype) { ctx_open_attention(x, dtype, NULL); }

static inline void ctx_sync(ctx_t *x) {
    cr_assert_eq(x->g->synchronize(x->gpu), DT_STATUS_OK, "synchronize: %s", dt_error_detail());
}

static inline void ctx_close(ctx_t *x) {
    ctx_sync(x);
    for (int i = 0; i < x->nbufs; i++) x->g->free(x->gpu, x->bufs[i]);
    dt_device_free(x->gpu);
    dt_device_free(x->cpu);
}

static inline void *gpu_alloc(ctx_t *x, size_t bytes) {
    void *p = NULL;
    cr_assert_lt(x->nbufs, MAX_BUFS);
    cr_assert_eq(x->g->alloc(x->gpu, DT_MEM_OTHER, bytes ? bytes : 1, &p), DT_STATUS_OK, "alloc: %s",
                 dt_error_detail());
    x->bufs[x->nbufs++] = p;
    return p;
}

static inline void upload(ctx_t *x, void *d, const float *host, size_t n) {
    cr_assert_eq(x->g->upload_f32(x->gpu, d, host, n), DT_STATUS_OK, "%s", dt_error_detail());
}

/* A tensor of n elements in the GPU's dtype holding `host`; `host` is overwritten
 * with what the GPU holds (bf16-rounded), so both ops see the same inputs. */
static inline void *gpu_tensor(ctx_t *x, float *host, size_t n) {
    void *d = gpu_alloc(x, n * dt_dtype_size(x->dtype));
    upload(x, d, host, n);
    cr_assert_eq(x->g->download_f32(x->gpu, host, d, n), DT_STATUS_OK, "%s", dt_error_detail());
    return d;
}

static inline void poison(ctx_t *x, void *d, size_t bytes) {
    cr_assert_eq(x->g->set(x->gpu, d, 0xFF, bytes), DT_STATUS_OK, "%s", dt_error_detail());
}

/* n elements of the GPU's dtype, as fp32 (malloc'd); synchronises first. */
static inline float *fetch(ctx_t *x, const void *d, size_t n) {
    ctx_sync(x);
    float *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert_eq(x->g->download_f32(x->gpu, h, d, n), DT_STATUS_OK, "%s", dt_error_detail());
    return h;
}

static uint64_t rng_state;
static inline void rng_seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ull + 1; }
static inline uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static inline float rnd(void) { return (float)((rng_next() >> 40) * (1.0 / (1ull << 24)) * 2.0 - 1.0); }
/* n values offset + scale * uniform(-1, 1) (malloc'd) */
static inline float *frand(size_t n, float scale, float offset) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = offset + scale * rnd();
    return h;
}
static inline float *fcopy(const float *a, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    memcpy(h, a, n * sizeof *h);
    return h;
}

/* Positions of packed sequences (kernels.h: pos), (B, T): row b cut into documents
 * of 13, 32, 1, 40, 7, 19, 64, 3 tokens in turn from the (b % 8)-th on, the last cut
 * at T: documents inside a 32-row tile, across tiles, starting on a tile boundary,
 * of one token. */
static inline int *packed_positions(int B, int T) {
    static const int lens[8] = {13, 32, 1, 40, 7, 19, 64, 3};
    int *pos = malloc(sizeof(int) * ((size_t)B * T + 1));
    for (int b = 0; b < B; b++)
        for (int t = 0, k = b % 8, left = lens[k]; t < T; t++, left--) {
            if (left == 0) k = (k + 1) % 8, left = lens[k];
            pos[b * T + t] = left == lens[k] ? 0 : pos[b * T + t - 1] + 1;
        }
    return pos;
}

/* pos (B, T) on the GPU (int, device memory); NULL for NULL. */
static inline int *gpu_positions(ctx_t *x, const int *pos, int B, int T) {
    if (!pos) return NULL;
    int *d = gpu_alloc(x, sizeof(int) * (size_t)B * T);
    cr_assert_eq(x->g->copy(x->gpu, d, pos, sizeof(int) * (size_t)B * T, DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK,
                 "%s", dt_error_detail());
    return d;
}

#endif /* DT_TESTS_GPU_FIXTURE_H */
