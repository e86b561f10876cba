/*
 * test_cuda_counts.c - the CUDA backend's host waits and cuBLAS calls, counted: the
 * gradient norm over many ranges (ZeRO's shard) waits for the device once, not once
 * per range, and gives the sum of the per-range norms bit for bit (and the CPU's
 * within rounding); host-to-device copies and fp32 uploads do not wait for the
 * stream, yet the host buffer may be reused the moment they return; the cuBLAS
 * attention issues one batched call per product, not one per sequence. The counts
 * come from the emulator (tests/cuemu: cuemu_counter, weak here so the file also
 * links against the real runtime, where those checks are skipped and the results
 * are still checked).
 */
#include <math.h>

#include "tests/gpu/gpu_fixture.h"

extern unsigned long long cuemu_counter(const char *name) __attribute__((weak));

/* The emulator's counter, or ~0 on a real GPU (no counters). */
static unsigned long long counter(const char *name) { return cuemu_counter ? cuemu_counter(name) : ~0ULL; }
static int counting(void) { return cuemu_counter != NULL; }
/* Host waits are counted only in the default mode: DTRUN_CUDA_SYNC_OPS (set by
 * scripts/gpu_check.sh so a fault names its op) waits after every op by design. */
static int counting_waits(void) {
    const char *e = getenv("DTRUN_CUDA_SYNC_OPS");
    return counting() && !(e && *e && strcmp(e, "0") != 0);
}

/* ---- gradient norm over ranges ------------------------------------------------------------ */

#define NR 7

static void norm_ranges_case(dt_dtype_t dt) {
    ctx_t x;
    ctx_open(&x, dt);
    rng_seed(14);
    /* sizes: empty, one element, unaligned (odd offsets in one buffer), large */
    size_t counts[NR] = {1000, 0, 1, 333, ((size_t)1 << 16) + 3, 17, 4096};
    size_t total = 0;
    for (int i = 0; i < NR; i++) total += counts[i] + 1; /* one element apart: misaligned starts */
    float *h = frand(total, 3.0f, 0.0f);
    char *d = gpu_tensor(&x, h, total); /* h now holds what the GPU holds */
    size_t es = dt_dtype_size(dt), off = 0;
    const void *gp[NR], *cp[NR];
    for (int i = 0; i < NR; i++) {
        gp[i] = d + (off + 1) * es;
        cp[i] = h + off + 1;
        off += counts[i] + 1;
    }
    ctx_sync(&x);

    unsigned long long s0 = counter("stream_sync");
    double one_by_one = 0;
    int nonempty = 0;
    for (int i = 0; i < NR; i++) {
        one_by_one += x.g->grad_sq_norm(x.gpu, gp[i], counts[i]);
        nonempty += counts[i] > 0;
    }
    unsigned long long s1 = counter("stream_sync");
    double got = x.g->grad_sq_norm_ranges(x.gpu, gp, counts, NR);
    unsigned long long s2 = counter("stream_sync");
    double cpu = x.c->grad_sq_norm_ranges(x.cpu, cp, counts, NR);

    cr_assert(isfinite(got) && got > 0, "%g", got);
    cr_assert(memcmp(&got, &one_by_one, sizeof got) == 0, "ranges %.17g, range by range %.17g", got, one_by_one);
    cr_assert(fabs(got - cpu) <= 2.0 * (double)total * 0x1p-53 * cpu, "gpu %.17g cpu %.17g", got, cpu);
    if (counting_waits()) {
        cr_assert_eq(s1 - s0, (unsigned long long)nonempty, "range by range: %llu waits", s1 - s0);
        cr_assert_eq(s2 - s1, 1, "ranges: %llu waits for %d ranges, want 1", s2 - s1, NR);
    }
    /* nothing to add: no wait at all */
    cr_assert_eq(x.g->grad_sq_norm_ranges(x.gpu, gp, counts, 0), 0.0);
    cr_assert_eq(x.g->grad_sq_norm_ranges(x.gpu, gp + 1, counts + 1, 1), 0.0);
    if (counting_waits()) cr_assert_eq(counter("stream_sync"), s2);
    free(h);
    ctx_close(&x);
}

Test(cuda_norm_ranges, one_wait_same_sum_f32) { norm_ranges_case(DT_DTYPE_F32); }
Test(cuda_norm_ranges, one_wait_same_sum_bf16) { norm_ranges_case(DT_DTYPE_BF16); }

/* ---- host-to-device copies ---------------------------------------------------------------- */

/* Back-to-back copies and uploads of one host buffer, rewritten after each returns
 * (more copies than the ring has slots, some larger than a slot), all land intact,
 * and none waits for the stream. */
#define NUP 12

static void uploads_case(dt_dtype_t dt) {
    ctx_t x;
    ctx_open(&x, dt);
    size_t es = dt_dtype_size(dt);
    /* sizes in elements: small, one slot exactly (4 MiB of fp32), several slots */
    size_t sizes[NUP] = {1, 1000, (size_t)1 << 20, 7, ((size_t)3 << 20) + 5, 64, 333, 1, ((size_t)1 << 20) + 1,
                         4096, 2, 100000};
    size_t most = 0;
    for (int i = 0; i < NUP; i++) most = sizes[i] > most ? sizes[i] : most;
    float *h = malloc(most * sizeof *h);
    void *raw[NUP], *up[NUP];
    for (int i = 0; i < NUP; i++) {
        raw[i] = gpu_alloc(&x, sizes[i] * sizeof(float));
        up[i] = gpu_alloc(&x, sizes[i] * es);
    }
    ctx_sync(&x);
    /* value of element j in round i: exact in bf16 (8 significant bits) */
#define VAL(i, j) ((float)((int)(((j) * 7 + (i) * 13) % 200) - 100))
    unsigned long long s0 = counter("stream_sync"), e0 = counter("event_sync");
    for (int i = 0; i < NUP; i++) {
        for (size_t j = 0; j < sizes[i]; j++) h[j] = VAL(i, j);
        cr_assert_eq(x.g->copy(x.gpu, raw[i], h, sizes[i] * sizeof(float), DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK,
                     "%s", dt_error_detail());
        for (size_t j = 0; j < sizes[i]; j++) h[j] = -VAL(i, j); /* reused at once */
        cr_assert_eq(x.g->upload_f32(x.gpu, up[i], h, sizes[i]), DT_STATUS_OK, "%s", dt_error_detail());
        for (size_t j = 0; j < sizes[i]; j++) h[j] = NAN;
    }
    unsigned long long s1 = counter("stream_sync");
    if (counting_waits()) cr_assert_eq(s1 - s0, 0, "%d copies and %d uploads waited %llu times", NUP, NUP, s1 - s0);
    cr_log_info("%s: %d copies and %d uploads: %llu stream waits, %llu slot waits", dt_dtype_name(dt), NUP, NUP,
                s1 - s0, counter("event_sync") - e0);
    for (int i = 0; i < NUP; i++) {
        cr_assert_eq(x.g->copy(x.gpu, h, raw[i], sizes[i] * sizeof(float), DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK);
        for (size_t j = 0; j < sizes[i]; j++)
            cr_assert(h[j] == VAL(i, j), "copy %d [%zu]: %g, want %g", i, j, h[j], VAL(i, j));
        cr_assert_eq(x.g->download_f32(x.gpu, h, up[i], sizes[i]), DT_STATUS_OK);
        for (size_t j = 0; j < sizes[i]; j++)
            cr_assert(h[j] == -VAL(i, j), "upload %d [%zu]: %g, want %g", i, j, h[j], -VAL(i, j));
    }
#undef VAL
    free(h);
    ctx_close(&x);
}

Test(cuda_uploads, no_stream_wait_and_host_buffer_reusable_f32, .timeout = 120) { uploads_case(DT_DTYPE_F32); }
Test(cuda_uploads, no_stream_wait_and_host_buffer_reusable_bf16, .timeout = 120) { uploads_case(DT_DTYPE_BF16); }

/* ---- cuBLAS calls of the cuBLAS attention ------------------------------------------------- */

/* One batched call per product over all B sequences and NH heads; the backward's
 * products into the shared dk and dv are one call per group member (rep = NH/NKV). */
static void attention_calls_case(dt_dtype_t dt, int NKV) {
    ctx_t x;
    ctx_open_attention(&x, dt, "cublas");
    int B = 3, T = 17, C = 32, NH = 4, C3 = C + 2 * NKV * (C / NH), rep = NH / NKV;
    rng_seed(15);
    float *qkv = frand((size_t)B * T * C3, 1.0f, 0.0f), *dout = frand((size_t)B * T * C, 1.0f, 0.0f);
    void *d_qkv = gpu_tensor(&x, qkv, (size_t)B * T * C3), *d_dout = gpu_tensor(&x, dout, (size_t)B * T * C);
    void *d_out = gpu_alloc(&x, (size_t)B * T * C * dt_dtype_size(dt));
    void *d_dqkv = gpu_alloc(&x, (size_t)B * T * C3 * dt_dtype_size(dt));
    void *d_saved = gpu_alloc(&x, x.g->attention_saved_bytes(x.gpu, B, T, C, NH, NKV));
    void *d_scratch = gpu_alloc(&x, x.g->attention_scratch_bytes(x.gpu, B, T, C, NH, NKV));
    ctx_sync(&x);
    unsigned long long c0 = counter("blas_call");
    x.g->attention_forward(x.gpu, d_out, d_saved, d_qkv, NULL, B, T, C, NH, NKV);
    unsigned long long c1 = counter("blas_call");
    x.g->attention_backward(x.gpu, d_dqkv, d_scratch, d_dout, d_qkv, d_saved, NULL, B, T, C, NH, NKV);
    unsigned long long c2 = counter("blas_call");
    float *got = fetch(&x, d_dqkv, (size_t)B * T * C3);
    for (size_t i = 0; i < (size_t)B * T * C3; i++) cr_assert(isfinite(got[i]), "dqkv[%zu] = %g", i, got[i]);
    cr_log_info("%s NKV %d: cuBLAS calls forward %llu, backward %llu (B %d, rep %d)", dt_dtype_name(dt), NKV, c1 - c0,
                c2 - c1, B, rep);
    if (counting()) {
        cr_assert_eq(c1 - c0, 2, "forward: %llu cuBLAS calls", c1 - c0);
        cr_assert_eq(c2 - c1, (unsigned long long)(2 + 2 * rep), "backward: %llu cuBLAS calls", c2 - c1);
    }
    free(got);
    free(qkv);
    free(dout);
    ctx_close(&x);
}

Test(cuda_attention_calls, one_batched_call_per_product_f32) {
    attention_calls_case(DT_DTYPE_F32, 4);
    attention_calls_case(DT_DTYPE_F32, 2);
}
Test(cuda_attention_calls, one_batched_call_per_product_bf16) {
    attention_calls_case(DT_DTYPE_BF16, 4);
    attention_calls_case(DT_DTYPE_BF16, 1);
}
