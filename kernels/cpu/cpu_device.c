/*
 * cpu_device.c - the CPU backend's device side: memory (host memory accounted
 * through common/mem.h), copies, and the op table itself (OpenBLAS: cpu_blas.c).
 */
#include "kernels/cpu/cpu.h"

#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/meminfo.h"

dt_status_t dt_cpu_device_init(dt_device_t *dev, int nthreads) {
    DT_CHECK(dt_cpu_blas_load());
    dev->kind = DT_DEVICE_CPU;
    snprintf(dev->name, sizeof dev->name, "cpu");
    dev->ordinal = 0;
    dev->nthreads = nthreads > 0 ? nthreads : omp_get_max_threads();
    if (dev->nthreads < 1) dev->nthreads = 1;
    dev->ops = dt_cpu_ops();
    dev->impl = NULL;
    return DT_STATUS_OK;
}

void dt_cpu_device_free(dt_device_t *dev) {
    free(dev->impl); /* the cached peak FLOP/s, if measured */
    dev->impl = NULL;
}

/* ---- memory ------------------------------------------------------------- */

static dt_status_t cpu_alloc(dt_device_t *dev, dt_mem_category_t cat, size_t bytes, void **out) {
    *out = dt_mem_alloc(cat, bytes ? bytes : 1);
    if (!*out) return DT_STATUS_NOMEM; /* dt_mem_alloc set the detail */
    return DT_STATUS_OK;
}

static void cpu_free(dt_device_t *dev, void *ptr) { dt_mem_free(ptr); }

static dt_status_t cpu_copy(dt_device_t *dev, void *dst, const void *src, size_t bytes,
                            dt_copy_kind_t kind) {
    if ((unsigned)kind > DT_COPY_HOST_TO_HOST)
        return dt_error(DT_STATUS_INVALID, "copy: unknown copy kind %d", (int)kind);
    if (bytes && (!dst || !src))
        return dt_error(DT_STATUS_INVALID, "copy: NULL %s for %zu bytes",
                        dst ? "source" : "destination", bytes);
    if (bytes) memmove(dst, src, bytes);
    return DT_STATUS_OK;
}

static dt_status_t cpu_copy_2d(dt_device_t *dev, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                               size_t width, size_t height) {
    if (!width || !height) return DT_STATUS_OK;
    if (dst_pitch < width || src_pitch < width)
        return dt_error(DT_STATUS_INVALID, "copy_2d: %s pitch %zu below the width %zu bytes",
                        dst_pitch < width ? "destination" : "source", dst_pitch < width ? dst_pitch : src_pitch,
                        width);
    if (!dst || !src)
        return dt_error(DT_STATUS_INVALID, "copy_2d: NULL %s for %zu rows of %zu bytes",
                        dst ? "source" : "destination", height, width);
    for (size_t i = 0; i < height; i++) memcpy((char *)dst + i * dst_pitch, (const char *)src + i * src_pitch, width);
    return DT_STATUS_OK;
}

static dt_status_t cpu_set(dt_device_t *dev, void *ptr, int byte, size_t bytes) {
    if (bytes && !ptr) return dt_error(DT_STATUS_INVALID, "set: NULL pointer for %zu bytes", bytes);
    /* Large buffers (the backward zeroes its gradient buffers) in a slice per thread:
     * one core's stores do not fill the memory bus. */
    int nt = bytes >= ((size_t)1 << 22) ? dev->nthreads : 1;
    if (nt <= 1) {
        if (bytes) memset(ptr, byte, bytes);
        return DT_STATUS_OK;
    }
#pragma omp parallel num_threads(nt)
    {
        size_t b0, b1;
        dt_cpu_split(bytes, omp_get_num_threads(), omp_get_thread_num(), &b0, &b1);
        if (b1 > b0) memset((char *)ptr + b0, byte, b1 - b0);
    }
    return DT_STATUS_OK;
}

static dt_status_t cpu_synchronize(dt_device_t *dev) { return DT_STATUS_OK; }

/* The CPU device's memory is host memory: "pinned" memory is plain memory, and an
 * asynchronous copy is done when it returns. */
static dt_status_t cpu_copy_async(dt_device_t *dev, void *dst, const void *src, size_t bytes,
                                  dt_copy_kind_t kind) {
    return cpu_copy(dev, dst, src, bytes, kind);
}

static dt_status_t cpu_copy_async_wait(dt_device_t *dev) { return DT_STATUS_OK; }

static dt_status_t cpu_upload_f32(dt_device_t *dev, void *dst, const float *src, size_t n) {
    return cpu_copy(dev, dst, src, n * sizeof(float), DT_COPY_HOST_TO_DEVICE);
}

static dt_status_t cpu_download_f32(dt_device_t *dev, float *dst, const void *src, size_t n) {
    return cpu_copy(dev, dst, src, n * sizeof(float), DT_COPY_DEVICE_TO_HOST);
}

/* The fp32 FLOP/s the cores this device's threads use can do at most: threads x
 * the highest clock the kernel reports x FLOPs per cycle (2 FMA units x 2 x the
 * vector lanes: 16 with AVX-512, 8 with AVX2+FMA, 4 else). 0 when the clock is
 * unknown. */
static double cpu_theoretical_flops(const dt_device_t *dev) {
    double mhz = 0;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "r");
    if (f) {
        double khz = 0;
        if (fscanf(f, "%lf", &khz) == 1) mhz = khz / 1000;
        fclose(f);
    }
    if (mhz <= 0 && (f = fopen("/proc/cpuinfo", "r"))) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "cpu MHz", 7) && strchr(line, ':')) {
                double m = strtod(strchr(line, ':') + 1, NULL);
                if (m > mhz) mhz = m;
            }
        fclose(f);
    }
    if (mhz <= 0) return 0;
    double lanes = 4;
#if defined(__x86_64__) || defined(__i386__)
    if (__builtin_cpu_supports("avx512f")) lanes = 16;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) lanes = 8;
#endif
    return (double)dev->nthreads * mhz * 1e6 * 2 * 2 * lanes;
}

/* The host's memory: what the process can still get (MemAvailable, or the room
 * under its cgroup's limits) and the physical total. The trainer's memory check
 * uses the agent's one sample per round instead (train_mem.c). */
static dt_status_t cpu_mem_info(dt_device_t *dev, size_t *free_bytes, size_t *total_bytes) {
    (void)dev;
    const char *what;
    double avail = dt_meminfo_host_available(&what);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    *free_bytes = avail > 0 ? (size_t)avail : 0;
    *total_bytes = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
    return DT_STATUS_OK;
}

/* The peak MFU is reported against: the theoretical one (cpu_theoretical_flops),
 * else the best of a few timed matmuls (512^3, near sgemm's plateau) for at most
 * 0.1 s with the device's threads. A timed peak alone was taken on a loaded
 * machine (ranks timing it at once) and runs then beat it: MFU 128-153%. The
 * result is cached in dev->impl, the CPU backend's only private state. */
static double cpu_peak_flops(dt_device_t *dev) {
    if (dev->impl) return *(double *)dev->impl;
    const int N = 512, C = 512, OC = 512;
    size_t bytes = sizeof(float) * ((size_t)N * C + (size_t)OC * C + (size_t)N * OC);
    float *buf = dt_mem_alloc(DT_MEM_OTHER, bytes);
    if (!buf) return 0.0;
    float *x = buf, *w = x + (size_t)N * C, *out = w + (size_t)OC * C;
    for (size_t i = 0; i < (size_t)N * C; i++) x[i] = (float)(i % 17) * 0.01f;
    for (size_t i = 0; i < (size_t)OC * C; i++) w[i] = (float)(i % 13) * 0.01f;
    double best = 0.0, start = dt_now_s();
    dt_cpu_matmul_forward(dev, out, x, w, NULL, N, C, OC); /* warm-up */
    for (int rep = 0; rep < 50 && dt_now_s() - start < 0.1; rep++) {
        double t0 = dt_now_s();
        dt_cpu_matmul_forward(dev, out, x, w, NULL, N, C, OC);
        double dt = dt_now_s() - t0;
        double f = 2.0 * N * C * OC / (dt > 1e-9 ? dt : 1e-9);
        if (f > best) best = f;
    }
    dt_mem_free(buf);
    double theory = cpu_theoretical_flops(dev);
    if (theory > best) best = theory;
    double *cache = dt_xmalloc(sizeof *cache);
    *cache = best;
    dev->impl = cache;
    return best;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static void cpu_cast(dt_device_t *dev, void *dst, dt_dtype_t to, const void *src, dt_dtype_t from, size_t n) {
    if (to == from) {
        if (dst != src) memcpy(dst, src, n * dt_dtype_size(to));
        return;
    }
    if (to == DT_DTYPE_BF16) {
        uint16_t *d = dst;
        const float *s = src;
#pragma omp parallel for num_threads(dev->nthreads) schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(s[i]);
    } else {
        float *d = dst;
        const uint16_t *s = src;
#pragma omp parallel for num_threads(dev->nthreads) schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)s[i] << 16;
            memcpy(&d[i], &u, sizeof u);
        }
    }
}

static const dt_ops_t cpu_ops = {
    .name = "cpu",
    .dtype = DT_DTYPE_F32,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .copy_2d = cpu_copy_2d,
    .set = cpu_set,
    .synchronize = cpu_synchronize,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .copy_async = cpu_copy_async,
    .copy_async_wait = cpu_copy_async_wait,
    .upload_f32 = cpu_upload_f32,
    .download_f32 = cpu_download_f32,
    .peak_flops = cpu_peak_flops,
    .mem_info = cpu_mem_info,
    .encoder_forward = dt_cpu_encoder_forward,
    .encoder_backward = dt_cpu_encoder_backward,
    .layernorm_forward = dt_cpu_layernorm_forward,
    .layernorm_backward = dt_cpu_layernorm_backward,
    .matmul_forward = dt_cpu_matmul_forward,
    .matmul_backward = dt_cpu_matmul_backward,
    .attention_saved_bytes = dt_cpu_attention_saved_bytes,
    .attention_scratch_bytes = dt_cpu_attention_scratch_bytes,
    .attention_forward = dt_cpu_attention_forward,
    .attention_backward = dt_cpu_attention_backward,
    .attention_decode = dt_cpu_attention_decode,
    .attention_block_scratch_bytes = dt_cpu_attention_block_scratch_bytes,
    .attention_kv_pack = dt_cpu_attention_kv_pack,
    .attention_block_forward = dt_cpu_attention_block_forward,
    .attention_block_finish = dt_cpu_attention_block_finish,
    .attention_block_delta = dt_cpu_attention_block_delta,
    .attention_block_backward = dt_cpu_attention_block_backward,
    .attention_kv_grad_add = dt_cpu_attention_kv_grad_add,
    .rmsnorm_forward = dt_cpu_rmsnorm_forward,
    .rmsnorm_backward = dt_cpu_rmsnorm_backward,
    .rope_forward = dt_cpu_rope_forward,
    .rope_backward = dt_cpu_rope_backward,
    .swiglu_forward = dt_cpu_swiglu_forward,
    .swiglu_backward = dt_cpu_swiglu_backward,
    .gelu_forward = dt_cpu_gelu_forward,
    .gelu_backward = dt_cpu_gelu_backward,
    .relu_forward = dt_cpu_relu_forward,
    .relu_backward = dt_cpu_relu_backward,
    .residual_forward = dt_cpu_residual_forward,
    .residual_backward = dt_cpu_residual_backward,
    .softmax_xent_forward = dt_cpu_softmax_xent_forward,
    .softmax_xent_backward = dt_cpu_softmax_xent_backward,
    .xent_vp_max = dt_cpu_xent_vp_max,
    .xent_vp_sums = dt_cpu_xent_vp_sums,
    .xent_vp_loss = dt_cpu_xent_vp_loss,
    .xent_vp_backward = dt_cpu_xent_vp_backward,
    .mse_forward = dt_cpu_mse_forward,
    .mse_backward = dt_cpu_mse_backward,
    .adamw = dt_cpu_adamw,
    .grad_sq_norm = dt_cpu_grad_sq_norm,
    .grad_sq_norm_ranges = dt_cpu_grad_sq_norm_ranges,
    .scale = dt_cpu_scale,
    .cast = cpu_cast,
    .gemm = dt_cpu_gemm,
    .matmul_forward_q8 = dt_cpu_matmul_forward_q8,
    .matmul_backward_q8 = dt_cpu_matmul_backward_q8,
};

const dt_ops_t *dt_cpu_ops(void) { return &cpu_ops; }
