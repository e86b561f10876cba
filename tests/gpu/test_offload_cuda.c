/*
 * test_offload_cuda.c - what optimizer offload needs from the CUDA device (real GPU
 * or the emulator): pinned host memory (host_alloc: zero-filled, accounted under its
 * category, freed), asynchronous copies down and up through it that land by
 * copy_async_wait, and dt_host_adamw (the host's AdamW over bf16 or fp32 parameters)
 * against the CUDA adamw op on the same inputs: m and v within a few fp32 ulps per
 * step, and the parameters the bf16 rounding of the host's masters, to nearest or
 * stochastically with the same bits as the GPU for the same seed and step.
 */
#include <math.h>

#include "tests/gpu/gpu_fixture.h"

#define NEED_GPU(x) ctx_t x; ctx_open(&x, DT_DTYPE_BF16)

Test(offload_cuda, pinned_host_memory_is_accounted_and_copies_land_after_the_wait) {
    NEED_GPU(x);
    const size_t n = 5000;
    int64_t before = dt_mem_current(DT_MEM_OFFLOAD);
    float *h = NULL, *back = NULL;
    cr_assert_eq(x.g->host_alloc(x.gpu, DT_MEM_OFFLOAD, n * 4, (void **)&h), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(x.g->host_alloc(x.gpu, DT_MEM_OFFLOAD, n * 4, (void **)&back), DT_STATUS_OK);
    cr_assert_eq(dt_mem_current(DT_MEM_OFFLOAD) - before, (int64_t)(2 * n * 4), "accounted under offload");
    for (size_t i = 0; i < n; i++) cr_assert_eq(h[i], 0.0f, "zero-filled");
    for (size_t i = 0; i < n; i++) h[i] = (float)i * 0.5f;
    void *d = gpu_alloc(&x, n * 4);
    cr_assert_eq(x.g->copy_async(x.gpu, d, h, n * 4, DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK, "%s", dt_error_detail());
    /* the copy back follows the copy up (both after the ops issued before them) */
    cr_assert_eq(x.g->copy_async(x.gpu, back, d, n * 4, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK);
    cr_assert_eq(x.g->copy_async_wait(x.gpu), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(memcmp(back, h, n * 4), 0, "the bytes went up and came back");
    cr_assert_neq(x.g->copy_async(x.gpu, back, h, 4, DT_COPY_HOST_TO_HOST), DT_STATUS_OK, "host to host is refused");
    x.g->host_free(x.gpu, h);
    x.g->host_free(x.gpu, back);
    cr_assert_eq(dt_mem_current(DT_MEM_OFFLOAD), before, "released");
    ctx_close(&x);
}

/* bf16 bits of fp32 x rounded to nearest even (x finite). */
static uint16_t bf16_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

static void host_vs_gpu(unsigned sr_seed) {
    NEED_GPU(x);
    rng_seed(7 + sr_seed);
    const size_t n = 40007; /* above the host op's threading threshold */
    const int STEPS = 4;
    float *w0 = frand(n, 1.0f, 0.0f);
    /* the GPU: bf16 params, fp32 master, m, v on the device */
    void *dp = gpu_alloc(&x, n * 2), *dg = gpu_alloc(&x, n * 2);
    float *dmaster = gpu_alloc(&x, n * 4), *dm = gpu_alloc(&x, n * 4), *dv = gpu_alloc(&x, n * 4);
    cr_assert_eq(x.g->copy(x.gpu, dmaster, w0, n * 4, DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK);
    /* the host: the same state in host memory, gradients arriving as bf16 bits */
    uint16_t *hp = calloc(n, 2), *hg = calloc(n, 2);
    float *hmaster = fcopy(w0, n), *hm = calloc(n, 4), *hv = calloc(n, 4);
    dt_adamw_args_t a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                         .grad_scale = 0.8f, .sr_seed = sr_seed};
    for (int s = 1; s <= STEPS; s++) {
        float *g = frand(n, 0.5f, 0.0f);
        upload(&x, dg, g, n); /* rounds to bf16 on the device ... */
        cr_assert_eq(x.g->copy(x.gpu, hg, dg, n * 2, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK); /* ... the same bits */
        a.step = s;
        x.g->adamw(x.gpu, dp, dmaster, dg, dm, dv, n, &a, 1);
        dt_host_adamw(2, DT_DTYPE_BF16, hp, hmaster, hg, hm, hv, n, 0, &a, 1);
        free(g);
    }
    ctx_sync(&x);
    uint16_t *gp = malloc(n * 2);
    float *gmaster = malloc(n * 4), *gm = malloc(n * 4);
    cr_assert_eq(x.g->copy(x.gpu, gp, dp, n * 2, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK);
    cr_assert_eq(x.g->copy(x.gpu, gmaster, dmaster, n * 4, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK);
    cr_assert_eq(x.g->copy(x.gpu, gm, dm, n * 4, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK);
    size_t same_bits = 0, moved = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert_leq(fabsf(hmaster[i] - gmaster[i]), STEPS * 1e-6f * (fabsf(gmaster[i]) + a.lr), "master[%zu]", i);
        cr_assert_leq(fabsf(hm[i] - gm[i]), STEPS * 1e-6f * 0.5f, "m[%zu]", i);
        if (!sr_seed)
            cr_assert_eq(hp[i], bf16_bits(hmaster[i]), "params[%zu]: the host master rounded to nearest", i);
        same_bits += hp[i] == gp[i];
        moved += hmaster[i] != w0[i];
    }
    /* the masters differ by an ulp here and there, which can flip a rounding: nearly all agree */
    cr_assert_geq(same_bits, n - n / 100, "%zu of %zu bf16 parameters equal the GPU's", same_bits, n);
    cr_assert_eq(moved, n, "every weight moved");
    free(w0), free(hp), free(hg), free(hmaster), free(hm), free(hv), free(gp), free(gmaster), free(gm);
    ctx_close(&x);
}

Test(offload_cuda, host_adamw_matches_the_gpu_rounding_to_nearest) { host_vs_gpu(0); }
Test(offload_cuda, host_adamw_matches_the_gpu_stochastic_rounding) { host_vs_gpu(12345); }

/* fp32 parameters: the host's step with master weights equals the CPU device's op
 * (the same code), whatever the thread count, and params == grads may alias. */
Test(offload_cuda, host_adamw_fp32_is_the_cpu_op_for_any_thread_count) {
    dt_device_t *cpu;
    cr_assert_eq(dt_device_init(&cpu, DT_DEVICE_CPU, 1), DT_STATUS_OK);
    rng_seed(3);
    const size_t n = 70001;
    float *w = frand(n, 1.0f, 0.0f), *g = frand(n, 0.3f, 0.0f);
    float *pc = fcopy(w, n), *mc = calloc(n, 4), *vc = calloc(n, 4);
    dt_adamw_args_t a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f,
                         .grad_scale = 1.0f, .step = 3};
    cpu->ops->adamw(cpu, pc, NULL, g, mc, vc, n, &a, 1);
    for (int threads = 1; threads <= 3; threads++) {
        float *master = fcopy(w, n), *pg = fcopy(g, n), *m = calloc(n, 4), *v = calloc(n, 4);
        dt_host_adamw(threads, DT_DTYPE_F32, pg, master, pg, m, v, n, 0, &a, 1); /* params over the grads */
        cr_assert_eq(memcmp(master, pc, n * 4), 0, "%d thread(s): masters bitwise the CPU op's", threads);
        cr_assert_eq(memcmp(pg, pc, n * 4), 0, "%d thread(s): params bitwise the CPU op's", threads);
        cr_assert_eq(memcmp(m, mc, n * 4), 0);
        cr_assert_eq(memcmp(v, vc, n * 4), 0);
        free(master), free(pg), free(m), free(v);
    }
    free(w), free(g), free(pc), free(mc), free(vc);
    dt_device_free(cpu);
}
