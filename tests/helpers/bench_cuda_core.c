/*
 * bench_cuda_core.c - times the CUDA backend's core ops on GPT-2 124M shapes, for
 * tuning on a GPU machine: the five matmuls of a block and the LM head, forward and
 * backward (TFLOP/s against the GPU's dense peak), GELU, residual, AdamW and the
 * gradient norm (GB/s of the bytes each must move).
 *
 * usage: bench_cuda_core [--fp32] [--rows N] [--iters K]
 *   --rows  B*T rows of the activations (default 8192 = 8 x 1024)
 * Exits 0 with a note when no CUDA device is visible.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/status.h"
#include "kernels/kernels.h"

static dt_device_t *dev;
static int iters = 20;

static void *dalloc(size_t bytes) {
    void *p = NULL;
    dt_status_t st = dev->ops->alloc(dev, DT_MEM_OTHER, bytes, &p);
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "bench_cuda_core: alloc of %zu bytes: %s\n", bytes, dt_error_detail());
        exit(1);
    }
    return p;
}

static void sync_or_die(const char *what) {
    if (dev->ops->synchronize(dev) != DT_STATUS_OK) {
        fprintf(stderr, "bench_cuda_core: %s: %s\n", what, dt_error_detail());
        exit(1);
    }
}

/* Milliseconds per call of fn(arg): median-free, the mean of `iters` calls after two
 * warm-up calls, timed on the host around a synchronize. */
typedef void (*bench_fn)(void *arg);
static double time_ms(bench_fn fn, void *arg, const char *what) {
    fn(arg);
    fn(arg);
    sync_or_die(what);
    double t0 = dt_now_s();
    for (int i = 0; i < iters; i++) fn(arg);
    sync_or_die(what);
    return (dt_now_s() - t0) * 1e3 / iters;
}

typedef struct mm {
    int N, C, OC, bias;
    void *inp, *w, *b, *out, *dinp, *dw, *db;
} mm;

static void mm_fwd(void *a) {
    mm *m = a;
    dev->ops->matmul_forward(dev, m->out, m->inp, m->w, m->bias ? m->b : NULL, m->N, m->C, m->OC);
}
static void mm_bwd(void *a) {
    mm *m = a;
    dev->ops->matmul_backward(dev, m->dinp, m->dw, m->bias ? m->db : NULL, m->out, m->inp, m->w, m->N, m->C,
                              m->OC);
}

typedef struct ew {
    size_t n;
    void *a, *b, *out;
    float *master, *m, *v;
    double norm;
} ew;

static void gelu_f(void *a) { ew *e = a; dev->ops->gelu_forward(dev, e->out, e->a, e->n); }
static void gelu_b(void *a) { ew *e = a; dev->ops->gelu_backward(dev, e->out, e->a, e->b, e->n); }
static void res_f(void *a) { ew *e = a; dev->ops->residual_forward(dev, e->out, e->a, e->b, e->n); }
static void adamw(void *a) {
    ew *e = a;
    dt_adamw_args_t args = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                            .step = 10, .grad_scale = 1.0f};
    dev->ops->adamw(dev, e->out, dev->ops->dtype == DT_DTYPE_F32 ? NULL : e->master, e->a, e->m, e->v, e->n, &args, 1);
}
static void norm(void *a) { ew *e = a; e->norm = dev->ops->grad_sq_norm(dev, e->a, e->n); }

int main(int argc, char **argv) {
    dt_dtype_t dt = DT_DTYPE_BF16;
    int rows = 8192;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--fp32") == 0) dt = DT_DTYPE_F32;
        else if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc) rows = atoi(argv[++i]);
        else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--fp32] [--rows N] [--iters K]\n", argv[0]);
            return 2;
        }
    }
    if (rows < 1 || iters < 1) {
        fprintf(stderr, "bench_cuda_core: --rows and --iters must be >= 1\n");
        return 2;
    }
    if (dt_device_count(DT_DEVICE_CUDA) == 0) {
        printf("bench_cuda_core: no CUDA device visible; nothing to time\n");
        return 0;
    }
    dt_device_opts_t o = {.kind = DT_DEVICE_CUDA, .nthreads = 1, .ordinal = 0, .dtype = dt};
    if (dt_device_open(&dev, &o) != DT_STATUS_OK) {
        fprintf(stderr, "bench_cuda_core: %s\n", dt_error_detail());
        return 1;
    }
    size_t es = dt_dtype_size(dt);
    double peak = dev->ops->peak_flops(dev);
    printf("%s, %s compute, rows %d, peak %.1f TFLOP/s (0: GPU not in the table)\n", dev->name, dt_dtype_name(dt),
           rows, peak / 1e12);

    /* GPT-2 124M: C 768; qkv, attproj, fc, fcproj, and the LM head over the padded vocab */
    static const struct { const char *name; int C, OC, bias; } shapes[] = {
        {"qkv      768->2304", 768, 2304, 1},  {"attproj  768->768", 768, 768, 1},
        {"fc       768->3072", 768, 3072, 1},  {"fcproj  3072->768", 3072, 768, 1},
        {"lm head 768->50304", 768, 50304, 0},
    };
    printf("%-20s %10s %10s %10s %10s\n", "matmul", "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        mm m = {.N = rows, .C = shapes[s].C, .OC = shapes[s].OC, .bias = shapes[s].bias};
        size_t nin = (size_t)rows * m.C, nw = (size_t)m.OC * m.C, nout = (size_t)rows * m.OC;
        m.inp = dalloc(nin * es), m.w = dalloc(nw * es), m.b = dalloc(m.OC * es), m.out = dalloc(nout * es);
        m.dinp = dalloc(nin * es), m.dw = dalloc(nw * es), m.db = dalloc(m.OC * es);
        double f = time_ms(mm_fwd, &m, "matmul_forward"), b = time_ms(mm_bwd, &m, "matmul_backward");
        double flops = 2.0 * rows * m.C * m.OC;
        printf("%-20s %10.3f %10.1f %10.3f %10.1f\n", shapes[s].name, f, flops / f / 1e9, b, 2 * flops / b / 1e9);
        void *bufs[] = {m.inp, m.w, m.b, m.out, m.dinp, m.dw, m.db};
        for (size_t i = 0; i < 7; i++) dev->ops->free(dev, bufs[i]);
    }

    printf("%-20s %10s %10s\n", "memory-bound", "ms", "GB/s");
    ew e = {.n = (size_t)rows * 3072};
    e.a = dalloc(e.n * es), e.b = dalloc(e.n * es), e.out = dalloc(e.n * es);
    double t = time_ms(gelu_f, &e, "gelu_forward");
    printf("%-20s %10.3f %10.1f\n", "gelu fwd (N,3072)", t, 2.0 * e.n * es / t / 1e6);
    t = time_ms(gelu_b, &e, "gelu_backward");
    printf("%-20s %10.3f %10.1f\n", "gelu bwd (N,3072)", t, 4.0 * e.n * es / t / 1e6);
    t = time_ms(res_f, &e, "residual_forward");
    printf("%-20s %10.3f %10.1f\n", "residual (N,3072)", t, 3.0 * e.n * es / t / 1e6);
    dev->ops->free(dev, e.a), dev->ops->free(dev, e.b), dev->ops->free(dev, e.out);

    ew p = {.n = 124475904}; /* GPT-2 124M, padded vocab */
    p.a = dalloc(p.n * es), p.out = dalloc(p.n * es);
    p.master = dalloc(p.n * 4), p.m = dalloc(p.n * 4), p.v = dalloc(p.n * 4);
    t = time_ms(adamw, &p, "adamw");
    /* read grads, m, v (+ master); write m, v, params (+ master) */
    double bytes = dt == DT_DTYPE_F32 ? p.n * (4.0 + 8 + 8 + 4) : p.n * (2.0 + 8 + 8 + 8 + 2);
    printf("%-20s %10.3f %10.1f\n", "adamw 124M", t, bytes / t / 1e6);
    t = time_ms(norm, &p, "grad_sq_norm");
    printf("%-20s %10.3f %10.1f\n", "grad norm 124M", t, (double)p.n * es / t / 1e6);
    void *bufs[] = {p.a, p.out, p.master, p.m, p.v};
    for (size_t i = 0; i < 5; i++) dev->ops->free(dev, bufs[i]);
    dt_device_free(dev);
    return 0;
}
