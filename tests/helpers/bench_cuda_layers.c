/*
 * bench_cuda_layers.c - times the CUDA layer ops (encoder, layernorm, attention,
 * fused softmax + cross-entropy, and Llama's rmsnorm, rope, swiglu, KV-cache
 * decode) at GPT-2 124M's shapes on one GPU (--kv-heads N: grouped-query attention
 * with N key/value heads; Llama's MLP width is 8/3 C): milliseconds
 * per call (mean of K calls after one warm-up, the stream drained before and
 * after), the bandwidth the memory-bound ops reach, and the attention GEMMs'
 * TFLOP/s. Attention is timed for both kinds of the CUDA backend: the cuBLAS path
 * and the fused kernel (a second device opened with DTRUN_CUDA_ATTENTION=fused);
 * TFLOP/s count the full T x T products for both (the masked half included), so
 * the two rows compare directly. Prints one line per op; exits 0 without timing
 * anything where no CUDA device is present.
 *
 * usage: bench_cuda_layers [--fp32] [--iters K] [-B 16] [-T 1024] [-C 768]
 *                          [--heads 12] [--kv-heads 12] [--vocab 50257] [--attention-only]
 * Inputs are constant bytes (finite values; timing does not depend on them) and
 * token ids drawn at random below the vocabulary, as text would be.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/mem.h"
#include "common/status.h"
#include "kernels/kernels.h"

static dt_device_t *dev;

static void die(const char *what) {
    fprintf(stderr, "bench_cuda_layers: %s: %s\n", what, dt_error_detail());
    exit(1);
}

/* A device buffer of `bytes` filled with 0x3C bytes (bf16 0x3C3C and fp32
 * 0x3C3C3C3C are both about 0.0115). */
static void *dbuf(size_t bytes) {
    void *p = NULL;
    if (dev->ops->alloc(dev, DT_MEM_ACTIVATIONS, bytes, &p) != DT_STATUS_OK) die("alloc");
    if (dev->ops->set(dev, p, 0x3C, bytes) != DT_STATUS_OK) die("set");
    return p;
}

static int *dids(size_t n, int below, unsigned seed) {
    int *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        h[i] = (int)((seed >> 8) % (unsigned)below);
    }
    int *d = dbuf(n * sizeof *d);
    if (dev->ops->copy(dev, d, h, n * sizeof *h, DT_COPY_HOST_TO_DEVICE) != DT_STATUS_OK) die("copy");
    free(h);
    return d;
}

static int iters = 20;

static void report(const char *name, double ms, double bytes, double flops);

/* Times `call` and prints ms, and GB/s for `bytes` moved or TFLOP/s for `flops`. */
#define TIME(name, bytes, flops, call)                                                            \
    do {                                                                                          \
        call;                                                                                     \
        if (dev->ops->synchronize(dev) != DT_STATUS_OK) die(name);                                \
        double t0_ = dt_now_s();                                                                  \
        for (int i_ = 0; i_ < iters; i_++) call;                                                  \
        if (dev->ops->synchronize(dev) != DT_STATUS_OK) die(name);                                \
        double ms_ = (dt_now_s() - t0_) * 1e3 / iters;                                            \
        report(name, ms_, (double)(bytes), (double)(flops));                                      \
    } while (0)

static void report(const char *name, double ms, double bytes, double flops) {
    printf("%-25s %9.3f ms", name, ms);
    if (bytes > 0) printf("   %7.1f GB/s (%.0f MB moved)", bytes / (ms * 1e-3) / 1e9, bytes / 1e6);
    if (flops > 0) printf("   %7.1f TFLOP/s (%.1f GFLOP, masked half included)", flops / (ms * 1e-3) / 1e12, flops / 1e9);
    printf("\n");
}

/* Attention forward and backward on the global device (its kind chosen at open):
 * 2 GEMMs of B NH T^2 HS multiply-adds forward, 4 backward. */
static void bench_attention(const char *label, int B, int T, int C, int NH, int NKV, size_t es) {
    const dt_ops_t *op = dev->ops;
    size_t NC = (size_t)B * T * C, N3 = (size_t)B * T * (C + 2 * NKV * (C / NH));
    void *qkv = dbuf(N3 * es), *dqkv = dbuf(N3 * es), *y = dbuf(NC * es);
    size_t saved_b = op->attention_saved_bytes(dev, B, T, C, NH, NKV);
    size_t scratch_b = op->attention_scratch_bytes(dev, B, T, C, NH, NKV);
    void *saved = dbuf(saved_b), *scratch = dbuf(scratch_b);
    double gemm = 2.0 * B * NH * (double)T * T * (C / NH);
    char name[64];
    snprintf(name, sizeof name, "%sattention_forward", label);
    TIME(name, 0, 2 * gemm, op->attention_forward(dev, y, saved, qkv, NULL, B, T, C, NH, NKV));
    snprintf(name, sizeof name, "%sattention_backward", label);
    TIME(name, 0, 4 * gemm, op->attention_backward(dev, dqkv, scratch, y, qkv, saved, NULL, B, T, C, NH, NKV));
    snprintf(name, sizeof name, "%sattention memory", label);
    printf("%-25s %9.1f MB saved per layer, %.1f MB scratch\n", name, saved_b / 1e6, scratch_b / 1e6);
    op->free(dev, saved);
    op->free(dev, scratch);
    op->free(dev, qkv);
    op->free(dev, dqkv);
    op->free(dev, y);
}

int main(int argc, char **argv) {
    int B = 16, T = 1024, C = 768, NH = 12, NKV = 0, V = 50257, attention_only = 0;
    dt_dtype_t dtype = DT_DTYPE_BF16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--fp32")) { dtype = DT_DTYPE_F32; continue; }
        if (!strcmp(a, "--attention-only")) { attention_only = 1; continue; }
        if (!v) { fprintf(stderr, "bench_cuda_layers: %s needs a value\n", a); return 2; }
        int x = atoi(v);
        if (x <= 0) { fprintf(stderr, "bench_cuda_layers: %s %s: expected a positive integer\n", a, v); return 2; }
        if (!strcmp(a, "--iters")) iters = x;
        else if (!strcmp(a, "-B")) B = x;
        else if (!strcmp(a, "-T")) T = x;
        else if (!strcmp(a, "-C")) C = x;
        else if (!strcmp(a, "--heads")) NH = x;
        else if (!strcmp(a, "--kv-heads")) NKV = x;
        else if (!strcmp(a, "--vocab")) V = x;
        else { fprintf(stderr, "bench_cuda_layers: unknown option %s\n", a); return 2; }
        i++;
    }
    if (C % NH) { fprintf(stderr, "bench_cuda_layers: -C %d is not a multiple of --heads %d\n", C, NH); return 2; }
    if (NKV == 0) NKV = NH;
    if (NH % NKV) { fprintf(stderr, "bench_cuda_layers: --heads %d is not a multiple of --kv-heads %d\n", NH, NKV); return 2; }
    if (dt_device_count(DT_DEVICE_CUDA) == 0) {
        printf("bench_cuda_layers: no CUDA device: nothing to time\n");
        return 0;
    }
    dt_device_opts_t o = {.kind = DT_DEVICE_CUDA, .nthreads = 1, .ordinal = 0, .dtype = dtype};
    if (dt_device_open(&dev, &o) != DT_STATUS_OK) die("open cuda");
    const dt_ops_t *op = dev->ops;
    int Vp = (V + 127) / 128 * 128, N = B * T;
    size_t es = dt_dtype_size(dtype), NC = (size_t)N * C;
    printf("CUDA layer ops, %s, B=%d T=%d C=%d NH=%d NKV=%d V=%d (padded %d), mean of %d calls\n",
           dt_dtype_name(dtype), B, T, C, NH, NKV, V, Vp, iters);

    /* attention, both kinds */
    bench_attention("", B, T, C, NH, NKV, es);
    {
        /* the fused kernel: a second device on the same GPU, asked for it at open */
        dt_device_t *main_dev = dev;
        if (setenv("DTRUN_CUDA_ATTENTION", "fused", 1) != 0) die("setenv");
        if (dt_device_open(&dev, &o) != DT_STATUS_OK) die("open cuda (fused attention)");
        bench_attention("fused ", B, T, C, NH, NKV, es);
        dt_device_free(dev);
        dev = main_dev;
        unsetenv("DTRUN_CUDA_ATTENTION");
    }
    if (attention_only) {
        dt_device_free(dev);
        return 0;
    }

    /* encoder */
    void *wte = dbuf((size_t)Vp * C * es), *wpe = dbuf((size_t)T * C * es), *x = dbuf(NC * es);
    void *dwte = dbuf((size_t)Vp * C * es), *dwpe = dbuf((size_t)T * C * es), *dx = dbuf(NC * es);
    int *ids = dids(N, V, 1), *tg = dids(N, V, 2);
    TIME("encoder_forward", 3 * NC * es, 0, op->encoder_forward(dev, x, ids, wte, wpe, NULL, B, T, C));
    TIME("encoder_backward", 3 * NC * es, 0, op->encoder_backward(dev, dwte, dwpe, dx, ids, NULL, B, T, C));

    /* layernorm */
    void *ln = dbuf(NC * es), *w = dbuf(C * es), *b = dbuf(C * es), *dw = dbuf(C * es), *db = dbuf(C * es);
    float *mean = dbuf(N * sizeof(float)), *rstd = dbuf(N * sizeof(float));
    TIME("layernorm_forward", 2 * NC * es, 0, op->layernorm_forward(dev, ln, mean, rstd, x, w, b, N, C));
    TIME("layernorm_backward", 4 * NC * es, 0,
         op->layernorm_backward(dev, dx, dw, db, ln, x, w, mean, rstd, N, C));

    /* fused softmax + cross-entropy over (N, Vp) logits; the backward in place */
    size_t NV = (size_t)N * Vp;
    void *logits = dbuf(NV * es);
    float *losses = dbuf(N * sizeof(float));
    TIME("softmax_xent_forward", NV * es, 0, op->softmax_xent_forward(dev, losses, logits, tg, N, V, Vp));
    TIME("softmax_xent_backward", 2 * NV * es, 0,
         op->softmax_xent_backward(dev, logits, losses, logits, tg, 1.0f / N, N, V, Vp));

    /* Llama's ops: rmsnorm as layernorm; rope on the q and k heads of qkv rows in
     * place (read and write them); swiglu over (N, 2 IC); one decode step of B
     * sequences against a cache of T positions. */
    int HS = C / NH, IC = (8 * C / 3 + 127) / 128 * 128, C3 = C + 2 * NKV * HS;
    TIME("rmsnorm_forward", 2 * NC * es, 0, op->rmsnorm_forward(dev, ln, rstd, x, w, N, C, 1e-5f));
    TIME("rmsnorm_backward", 4 * NC * es, 0, op->rmsnorm_backward(dev, dx, dw, ln, x, w, rstd, N, C));
    if (HS % 2 == 0 && HS <= DT_ROPE_MAX_HS) {
        dt_rope_args_t rope = {.theta = 500000, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                               .original_max_pos = 8192};
        void *qkv = dbuf((size_t)N * C3 * es);
        double moved = 2.0 * N * (NH + NKV) * HS * es;
        TIME("rope_forward", moved, 0, op->rope_forward(dev, qkv, B, T, C3, NH + NKV, HS, 0, NULL, &rope));
        TIME("rope_backward", moved, 0, op->rope_backward(dev, qkv, B, T, C3, NH + NKV, HS, 0, NULL, &rope));
        void *kv = dbuf((size_t)B * T * 2 * NKV * HS * es), *o1 = dbuf((size_t)B * C * es);
        TIME("attention_decode", (double)B * T * 2 * NKV * HS * es, 0,
             op->attention_decode(dev, o1, qkv, C3, kv, T, T - 1, B, C, NH, NKV));
    }
    void *gu = dbuf((size_t)N * 2 * IC * es), *dgu = dbuf((size_t)N * 2 * IC * es), *act = dbuf((size_t)N * IC * es);
    TIME("swiglu_forward", 3.0 * N * IC * es, 0, op->swiglu_forward(dev, act, gu, N, IC));
    TIME("swiglu_backward", 7.0 * N * IC * es, 0, op->swiglu_backward(dev, dgu, gu, act, N, IC));
    dt_device_free(dev); /* frees what is still allocated */
    return 0;
}
