/*
 * bench_kernels.c - times the CPU op table on the benchmark shape: one
 * GPT-2 transformer block (pre-LayerNorm, causal attention, GELU MLP), forward
 * and backward, at micro-batch 8, seq 256, d_model 384, 6 heads; plus the head
 * (embedding, final LayerNorm, tied LM head over a padded vocab 256, fused
 * cross-entropy) and AdamW over the whole model, so that a full training step of
 * the n_layer-6 model can be estimated as head + 6 blocks + optimizer.
 *
 * usage: bench_kernels [--threads N] [--iters K] [-B 8] [-T 256] [-C 384] [--heads 6]
 *                      [--layers 6] [--vocab 256] [--profile]
 * Prints milliseconds per part (median of K iterations after one warm-up) and the
 * estimated tokens/s of a full step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/status.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"

typedef struct block {
    /* parameters, llm.c layout */
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
        *fcprojb;
    /* activations */
    float *x, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *attproj, *res2, *ln2, *ln2_mean,
        *ln2_rstd, *fch, *fch_gelu, *fcproj, *out;
    /* gradients of parameters and activations */
    float *g[12], *dx, *dln1, *dqkv, *datty, *dres2, *dln2, *dfch, *dfch_gelu, *dout;
    float *scratch;
} block;

/* --profile: milliseconds per op name, summed over the timed iterations. */
static int profiling;
static struct {
    const char *name;
    double ms;
} prof[32];
static void prof_add(const char *name, double ms) {
    for (int i = 0; i < 32; i++) {
        if (!prof[i].name) prof[i].name = name;
        if (prof[i].name == name || !strcmp(prof[i].name, name)) {
            prof[i].ms += ms;
            return;
        }
    }
}
/* Runs one op call, timing it under `name` when profiling. */
#define OP(name, call)                                                                             \
    do {                                                                                           \
        double op_t0_ = profiling ? dt_now_s() : 0;                                                \
        call;                                                                                      \
        if (profiling) prof_add(name, (dt_now_s() - op_t0_) * 1e3);                                \
    } while (0)

static float *buf(size_t n, float scale, unsigned *seed) {
    float *p = dt_mem_alloc(DT_MEM_ACTIVATIONS, n * sizeof(float));
    if (!p) {
        fprintf(stderr, "bench_kernels: %s\n", dt_error_detail());
        exit(1);
    }
    for (size_t i = 0; i < n && scale != 0; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        p[i] = scale * ((float)(*seed >> 8) / 16777216.0f - 0.5f);
    }
    return p;
}

static void block_init(block *k, dt_device_t *dev, int B, int T, int C, int NH) {
    unsigned s = 1;
    size_t N = (size_t)B * T;
    float *const *params[] = {&k->ln1w, &k->ln1b, &k->qkvw, &k->qkvb, &k->attprojw, &k->attprojb,
                              &k->ln2w, &k->ln2b, &k->fcw,  &k->fcb,  &k->fcprojw,  &k->fcprojb};
    size_t sizes[] = {C, C, 3 * C * (size_t)C, 3 * C, (size_t)C * C,     C,
                      C, C, 4 * (size_t)C * C, 4 * C, 4 * (size_t)C * C, C};
    for (int i = 0; i < 12; i++) {
        *(float **)params[i] = buf(sizes[i], 0.04f, &s);
        k->g[i] = buf(sizes[i], 0, &s);
    }
    k->x = buf(N * C, 2, &s);
    k->ln1 = buf(N * C, 0, &s);
    k->ln1_mean = buf(N, 0, &s);
    k->ln1_rstd = buf(N, 0, &s);
    k->qkv = buf(N * 3 * C, 0, &s);
    k->atty = buf(N * C, 0, &s);
    k->att = buf(dev->ops->attention_saved_bytes(dev, B, T, C, NH, NH) / 4, 0, &s);
    k->scratch = buf(dev->ops->attention_scratch_bytes(dev, B, T, C, NH, NH) / 4, 0, &s);
    k->attproj = buf(N * C, 0, &s);
    k->res2 = buf(N * C, 0, &s);
    k->ln2 = buf(N * C, 0, &s);
    k->ln2_mean = buf(N, 0, &s);
    k->ln2_rstd = buf(N, 0, &s);
    k->fch = buf(N * 4 * C, 0, &s);
    k->fch_gelu = buf(N * 4 * C, 0, &s);
    k->fcproj = buf(N * C, 0, &s);
    k->out = buf(N * C, 0, &s);
    k->dx = buf(N * C, 0, &s);
    k->dln1 = buf(N * C, 0, &s);
    k->dqkv = buf(N * 3 * C, 0, &s);
    k->datty = buf(N * C, 0, &s);
    k->dres2 = buf(N * C, 0, &s);
    k->dln2 = buf(N * C, 0, &s);
    k->dfch = buf(N * 4 * C, 0, &s);
    k->dfch_gelu = buf(N * 4 * C, 0, &s);
    k->dout = buf(N * C, 0.01f, &s);
}

static void block_forward(block *k, dt_device_t *dev, int B, int T, int C, int NH) {
    const dt_ops_t *o = dev->ops;
    int N = B * T;
    OP("layernorm fwd",
       o->layernorm_forward(dev, k->ln1, k->ln1_mean, k->ln1_rstd, k->x, k->ln1w, k->ln1b, N, C));
    OP("matmul fwd", o->matmul_forward(dev, k->qkv, k->ln1, k->qkvw, k->qkvb, N, C, 3 * C));
    OP("attention fwd", o->attention_forward(dev, k->atty, k->att, k->qkv, NULL, B, T, C, NH, NH));
    OP("matmul fwd",
       o->matmul_forward(dev, k->attproj, k->atty, k->attprojw, k->attprojb, N, C, C));
    OP("residual fwd", o->residual_forward(dev, k->res2, k->x, k->attproj, (size_t)N * C));
    OP("layernorm fwd", o->layernorm_forward(dev, k->ln2, k->ln2_mean, k->ln2_rstd, k->res2,
                                             k->ln2w, k->ln2b, N, C));
    OP("matmul fwd", o->matmul_forward(dev, k->fch, k->ln2, k->fcw, k->fcb, N, C, 4 * C));
    OP("gelu fwd", o->gelu_forward(dev, k->fch_gelu, k->fch, (size_t)N * 4 * C));
    OP("matmul fwd",
       o->matmul_forward(dev, k->fcproj, k->fch_gelu, k->fcprojw, k->fcprojb, N, 4 * C, C));
    OP("residual fwd", o->residual_forward(dev, k->out, k->res2, k->fcproj, (size_t)N * C));
}

static void block_backward(block *k, dt_device_t *dev, int B, int T, int C, int NH) {
    const dt_ops_t *o = dev->ops;
    int N = B * T;
    size_t NC = (size_t)N * C;
    /* Activation gradients are accumulated into, so zero them as a trainer would. */
    float *zero[] = {k->dx, k->dln1, k->dqkv, k->datty, k->dres2, k->dln2, k->dfch, k->dfch_gelu};
    size_t zn[] = {NC, NC, 3 * NC, NC, NC, NC, 4 * NC, 4 * NC};
    for (int i = 0; i < 8; i++)
        o->set(dev, zero[i], 0, zn[i] * sizeof(float));
    OP("residual bwd", o->residual_backward(dev, k->dres2, NULL, k->dout, NC));
    OP("matmul bwd", o->matmul_backward(dev, k->dfch_gelu, k->g[10], k->g[11], k->dout, k->fch_gelu,
                                        k->fcprojw, N, 4 * C, C));
    OP("gelu bwd", o->gelu_backward(dev, k->dfch, k->fch, k->dfch_gelu, 4 * NC));
    OP("matmul bwd",
       o->matmul_backward(dev, k->dln2, k->g[8], k->g[9], k->dfch, k->ln2, k->fcw, N, C, 4 * C));
    OP("layernorm bwd", o->layernorm_backward(dev, k->dres2, k->g[6], k->g[7], k->dln2, k->res2,
                                              k->ln2w, k->ln2_mean, k->ln2_rstd, N, C));
    /* datty receives d(attproj) here */
    OP("residual bwd", o->residual_backward(dev, k->dx, k->datty, k->dres2, NC));
    OP("matmul bwd",
       o->matmul_backward(dev, k->dln1, k->g[4], k->g[5], k->datty, k->atty, k->attprojw, N, C, C));
    /* dln1 now holds d(atty); reuse datty as its buffer for the attention input. */
    OP("set", o->set(dev, k->datty, 0, NC * sizeof(float)));
    OP("attention bwd",
       o->attention_backward(dev, k->dqkv, k->scratch, k->dln1, k->qkv, k->att, NULL, B, T, C, NH, NH));
    OP("set", o->set(dev, k->dln1, 0, NC * sizeof(float)));
    OP("matmul bwd",
       o->matmul_backward(dev, k->dln1, k->g[2], k->g[3], k->dqkv, k->ln1, k->qkvw, N, C, 3 * C));
    OP("layernorm bwd", o->layernorm_backward(dev, k->dx, k->g[0], k->g[1], k->dln1, k->x, k->ln1w,
                                              k->ln1_mean, k->ln1_rstd, N, C));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_double);
    return v[n / 2];
}

int main(int argc, char **argv) {
    int threads = 0, iters = 5, B = 8, T = 256, C = 384, NH = 6, L = 6, V = 256;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--profile")) {
            profiling = 1;
            i--;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_kernels: option '%s' needs a value\n", argv[i]);
            return 2;
        }
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--threads"))
            threads = v;
        else if (!strcmp(argv[i], "--iters"))
            iters = v;
        else if (!strcmp(argv[i], "-B"))
            B = v;
        else if (!strcmp(argv[i], "-T"))
            T = v;
        else if (!strcmp(argv[i], "-C"))
            C = v;
        else if (!strcmp(argv[i], "--heads"))
            NH = v;
        else if (!strcmp(argv[i], "--layers"))
            L = v;
        else if (!strcmp(argv[i], "--vocab"))
            V = v;
        else {
            fprintf(stderr, "bench_kernels: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (iters < 1 || iters > 1000 || B < 1 || T < 1 || C < 1 || NH < 1 || C % NH || L < 1 ||
        V < 2) {
        fprintf(stderr, "bench_kernels: bad sizes (need C divisible by heads, iters 1..1000)\n");
        return 2;
    }
    dt_device_t *dev = NULL;
    if (dt_device_init(&dev, DT_DEVICE_CPU, threads) != DT_STATUS_OK) {
        fprintf(stderr, "bench_kernels: %s\n", dt_error_detail());
        return 1;
    }
    const dt_ops_t *o = dev->ops;
    int N = B * T, Vp = (V + 63) / 64 * 64;
    block k;
    block_init(&k, dev, B, T, C, NH);

    /* Head: embedding, final layernorm, tied LM head, cross-entropy. */
    unsigned s = 7;
    float *wte = buf((size_t)Vp * C, 0.04f, &s), *wpe = buf((size_t)T * C, 0.04f, &s);
    float *dwte = buf((size_t)Vp * C, 0, &s), *dwpe = buf((size_t)T * C, 0, &s);
    float *lnfw = buf(C, 1, &s), *lnfb = buf(C, 0, &s), *dlnfw = buf(C, 0, &s),
          *dlnfb = buf(C, 0, &s);
    float *enc = buf((size_t)N * C, 0, &s), *lnf = buf((size_t)N * C, 0, &s);
    float *lnf_mean = buf(N, 0, &s), *lnf_rstd = buf(N, 0, &s);
    float *logits = buf((size_t)N * Vp, 0, &s), *losses = buf(N, 0, &s);
    float *dlnf = buf((size_t)N * C, 0, &s), *dres = buf((size_t)N * C, 0, &s);
    int *tok = malloc(sizeof(int) * N);
    for (int i = 0; i < N; i++)
        tok[i] = (i * 7919) % V;

    /* Optimizer over the whole model's parameter count. */
    size_t nparam = (size_t)L * 12 * C * C + (size_t)L * 13 * C + (size_t)Vp * C + (size_t)T * C +
                    2 * (size_t)C;
    float *p = buf(nparam, 0.02f, &s), *g = buf(nparam, 0.001f, &s);
    float *m = buf(nparam, 0, &s), *v = buf(nparam, 0, &s);
    dt_adamw_args_t a = {.lr = 1e-3f,
                         .beta1 = 0.9f,
                         .beta2 = 0.95f,
                         .eps = 1e-8f,
                         .weight_decay = 0.1f,
                         .step = 1,
                         .grad_scale = 1};

    double *tf = calloc(iters, sizeof(double)), *tb = calloc(iters, sizeof(double));
    double *th = calloc(iters, sizeof(double)), *to = calloc(iters, sizeof(double));
    struct timespec cpu0, cpu1;
    double wall0 = 0;
    int want_profile = profiling;
    for (int it = -1; it < iters; it++) {
        profiling = want_profile && it >= 0;
        if (it == 0) {
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
            wall0 = dt_now_s();
        }
        double t0 = dt_now_s();
        block_forward(&k, dev, B, T, C, NH);
        double t1 = dt_now_s();
        block_backward(&k, dev, B, T, C, NH);
        double t2 = dt_now_s();
        o->encoder_forward(dev, enc, tok, wte, wpe, NULL, B, T, C);
        o->layernorm_forward(dev, lnf, lnf_mean, lnf_rstd, enc, lnfw, lnfb, N, C);
        o->matmul_forward(dev, logits, lnf, wte, NULL, N, C, Vp);
        o->softmax_xent_backward(dev, logits, losses, logits, tok, 1.0f / N, N, V, Vp);
        o->set(dev, dlnf, 0, sizeof(float) * N * C);
        o->set(dev, dres, 0, sizeof(float) * N * C);
        o->matmul_backward(dev, dlnf, dwte, NULL, logits, lnf, wte, N, C, Vp);
        o->layernorm_backward(dev, dres, dlnfw, dlnfb, dlnf, enc, lnfw, lnf_mean, lnf_rstd, N, C);
        o->encoder_backward(dev, dwte, dwpe, dres, tok, NULL, B, T, C);
        double t3 = dt_now_s();
        double norm = o->grad_sq_norm(dev, g, nparam);
        o->adamw(dev, p, NULL, g, m, v, nparam, &a, 1);
        double t4 = dt_now_s();
        if (norm < 0) return 1;
        if (it >= 0) {
            tf[it] = (t1 - t0) * 1e3;
            tb[it] = (t2 - t1) * 1e3;
            th[it] = (t3 - t2) * 1e3;
            to[it] = (t4 - t3) * 1e3;
        }
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
    double wall = dt_now_s() - wall0;
    double cpu = (double)(cpu1.tv_sec - cpu0.tv_sec) + (cpu1.tv_nsec - cpu0.tv_nsec) * 1e-9;
    double f = median(tf, iters), b = median(tb, iters), h = median(th, iters);
    double opt = median(to, iters);
    /* Matmul FLOPs of one block, forward: 2 N C (3C + C + 4C + 4C) + attention 2 * 2 B NH T^2 HS
     * (full square; causal does about half); backward twice the forward. */
    double fwd_flop = 2.0 * N * C * 12.0 * C + 4.0 * B * T * (double)T * C;
    double step_ms = L * (f + b) + h + opt;
    printf("bench_kernels: B=%d T=%d C=%d heads=%d threads=%d blas=%s iters=%d\n", B, T, C, NH,
           dev->nthreads, dt_cpu_blas_core(), iters);
    printf("block forward   %8.2f ms  (%.1f GFLOP/s)\n", f, fwd_flop / f * 1e-6);
    printf("block backward  %8.2f ms  (%.1f GFLOP/s)\n", b, 2 * fwd_flop / b * 1e-6);
    printf("block fwd+bwd   %8.2f ms\n", f + b);
    printf("head fwd+bwd    %8.2f ms  (embedding, final LN, LM head V=%d/%d, cross-entropy)\n", h,
           V, Vp);
    printf("adamw+norm      %8.2f ms  (%zu params)\n", opt, nparam);
    printf("model step est. %8.2f ms = %d blocks + head + optimizer -> %.0f tokens/s\n", step_ms, L,
           N / step_ms * 1e3);
    /* CPU time per thread against wall time: below 1 means the cores were shared
     * with other processes (or threads idled) and the timings above are inflated. */
    printf("cpu/wall        %8.2f (process CPU time / (wall time * threads))\n",
           cpu / (wall * dev->nthreads));
    if (want_profile) {
        printf("per op, ms per block fwd+bwd (timed separately, so the sum exceeds the above):\n");
        for (int i = 0; i < 32 && prof[i].name; i++)
            printf("  %-22s %8.2f\n", prof[i].name, prof[i].ms / iters);
    }
    dt_device_free(dev);
    return 0;
}
