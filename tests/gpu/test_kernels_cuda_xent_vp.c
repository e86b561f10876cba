/*
 * test_kernels_cuda_xent_vp.c - the CUDA vocabulary-parallel softmax + cross-entropy
 * ops (kernels.h: xent_vp_max, xent_vp_sums, xent_vp_loss, xent_vp_backward) against
 * the CPU's whole-vocabulary softmax_xent_forward/backward, in both compute dtypes.
 *
 * A full (N, Vp) logits matrix is rounded to the GPU's dtype (gpu_fixture.h), then
 * cut into T column slices as tensor-parallel ranks hold them (rank r: columns
 * [r*Vl, (r+1)*Vl), Vl = Vp / T), each uploaded on its own. The ops run on each
 * slice and the stats are combined on the host as the caller's all-reduces would
 * (MAX of stats[0, N), then SUM of stats[N, 3N)). Outputs are poisoned first (NaN),
 * every rank's losses must be the same bits, the GPU ops run twice and must give the
 * same bits, and the backward in place (over the logits slice) gives the same bits.
 *
 * Tolerances, as test_kernels_cuda_layers.c's softmax_xent ones: losses are fp32 on
 * both sides from the same inputs, differing in the order of the sum of exps and in
 * expf: 1e-5 relative plus 1e-6 of the rms. dlogits: fp32 1e-5 relative plus 1e-6
 * rms; bf16 one rounding of the result (BF_ULP) plus 1e-3 rms for the values near 0.
 * The reduced max is exact (a max of the same bf16/fp32 values) and checked so.
 *
 * Shapes: V not a multiple of Vp (padded columns hold 1e4, so reading one shows),
 * ignored rows, targets on the first and last real columns, T in {1, 2, 4}; slices
 * whose width allows 16-byte loads and slices that do not (Vl = 9, 13); a vocabulary
 * whose real columns all sit on rank 0 (the others' max is -INFINITY); a slice wide
 * enough that each thread loops.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/status.h"
#include "kernels/kernels.h"
#include "tests/gpu/gpu_fixture.h"

static void *gpu_raw(ctx_t *x, const void *host, size_t bytes) {
    void *d = gpu_alloc(x, bytes);
    cr_assert_eq(x->g->copy(x->gpu, d, host, bytes, DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK, "%s",
                 dt_error_detail());
    return d;
}

/* Buffers of one run_vp, freed at its end (the fixture keeps at most MAX_BUFS). */
static void *tmp_alloc(ctx_t *x, size_t bytes) {
    void *p = NULL;
    cr_assert_eq(x->g->alloc(x->gpu, DT_MEM_OTHER, bytes ? bytes : 1, &p), DT_STATUS_OK, "alloc: %s",
                 dt_error_detail());
    return p;
}

static void get_f32(ctx_t *x, float *h, const float *d, size_t n) {
    ctx_sync(x);
    cr_assert_eq(x->g->copy(x->gpu, h, d, n * sizeof *h, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK, "%s",
                 dt_error_detail());
}

static void put_f32(ctx_t *x, float *d, const float *h, size_t n) {
    cr_assert_eq(x->g->copy(x->gpu, d, h, n * sizeof *h, DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK, "%s",
                 dt_error_detail());
}

/* |got - want| <= rtol |want| + atol rms(want) for every element; no NaN. */
static void check(const char *what, int T, const float *got, const float *want, size_t n, double rtol,
                  double atol) {
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) ss += (double)want[i] * want[i];
    double rms = n ? sqrt(ss / (double)n) : 0.0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        cr_assert(!isnan(got[i]) && err <= rtol * fabs(want[i]) + atol * rms,
                  "T=%d %s[%zu]: got %.9g, want %.9g (err %.3g; rms %.3g)", T, what, i, got[i], want[i], err,
                  rms);
    }
}

/* The TP path on the GPU: losses (N) and the gradient reassembled into dl (N, Vp);
 * the reduced stats into stats_out (3N). in_place: the backward writes over the
 * logits slice. */
static void run_vp(ctx_t *x, int T, const float *logits, const int *d_tg, float dscale, int N, int V,
                   int Vp, int in_place, float *losses, float *dl, float *stats_out) {
    int Vl = Vp / T;
    size_t es = dt_dtype_size(x->dtype), NVl = (size_t)N * Vl;
    float *host = malloc(NVl * sizeof *host), *st = malloc(3 * (size_t)N * T * sizeof *st);
    float *lr = malloc((size_t)N * sizeof *lr);
    void *slice[4];
    float *d_stats[4];
    cr_assert_leq(T, 4);
    for (int r = 0; r < T; r++) {
        for (int n = 0; n < N; n++)
            memcpy(host + (size_t)n * Vl, logits + (size_t)n * Vp + (size_t)r * Vl, Vl * sizeof(float));
        slice[r] = tmp_alloc(x, NVl * es);
        upload(x, slice[r], host, NVl); /* already in the GPU's dtype: exact */
        d_stats[r] = tmp_alloc(x, 3 * (size_t)N * sizeof(float));
        poison(x, d_stats[r], 3 * (size_t)N * sizeof(float));
        x->g->xent_vp_max(x->gpu, d_stats[r], slice[r], N, Vl, r * Vl, V);
        get_f32(x, st + 3 * (size_t)N * r, d_stats[r], 3 * (size_t)N);
    }
    for (int n = 0; n < N; n++) { /* all-reduce MAX of [0, N) */
        float m = -INFINITY;
        for (int r = 0; r < T; r++) m = fmaxf(m, st[3 * (size_t)N * r + n]);
        for (int r = 0; r < T; r++) st[3 * (size_t)N * r + n] = m;
    }
    for (int r = 0; r < T; r++) {
        put_f32(x, d_stats[r], st + 3 * (size_t)N * r, (size_t)N);
        x->g->xent_vp_sums(x->gpu, d_stats[r], slice[r], d_tg, N, Vl, r * Vl, V);
        get_f32(x, st + 3 * (size_t)N * r, d_stats[r], 3 * (size_t)N);
    }
    for (int i = N; i < 3 * N; i++) { /* all-reduce SUM of [N, 3N), in rank order */
        float s = 0.0f;
        for (int r = 0; r < T; r++) s += st[3 * (size_t)N * r + i];
        for (int r = 0; r < T; r++) st[3 * (size_t)N * r + i] = s;
    }
    memcpy(stats_out, st, 3 * (size_t)N * sizeof *st);
    float *d_losses = tmp_alloc(x, (size_t)N * sizeof(float));
    void *d_dl = in_place ? NULL : tmp_alloc(x, NVl * es);
    for (int r = 0; r < T; r++) {
        put_f32(x, d_stats[r], st + 3 * (size_t)N * r, 3 * (size_t)N);
        poison(x, d_losses, (size_t)N * sizeof(float));
        x->g->xent_vp_loss(x->gpu, d_losses, d_stats[r], d_tg, N);
        get_f32(x, lr, d_losses, (size_t)N);
        if (r == 0) memcpy(losses, lr, (size_t)N * sizeof *lr);
        cr_assert_eq(memcmp(lr, losses, (size_t)N * sizeof *lr), 0, "T=%d rank %d: losses differ from rank 0",
                     T, r);
        void *d = in_place ? slice[r] : d_dl;
        if (!in_place) poison(x, d, NVl * es);
        x->g->xent_vp_backward(x->gpu, d, slice[r], d_tg, d_stats[r], dscale, N, Vl, r * Vl, V);
        float *g = fetch(x, d, NVl);
        for (int n = 0; n < N; n++)
            memcpy(dl + (size_t)n * Vp + (size_t)r * Vl, g + (size_t)n * Vl, Vl * sizeof(float));
        free(g);
    }
    ctx_sync(x);
    for (int r = 0; r < T; r++) x->g->free(x->gpu, slice[r]), x->g->free(x->gpu, d_stats[r]);
    x->g->free(x->gpu, d_losses), x->g->free(x->gpu, d_dl);
    free(host), free(st), free(lr);
}

static void run_case(dt_dtype_t dtype, int N, int V, int Vp, uint64_t seed) {
    ctx_t x;
    ctx_open(&x, dtype);
    rng_seed(seed);
    size_t NV = (size_t)N * Vp;
    float *logits = frand(NV, 4.0f, 0.0f);
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++) logits[(size_t)n * Vp + j] = 1e4f;
    (void)gpu_tensor(&x, logits, NV); /* rounds the host copy to the GPU's dtype */
    int *tg = malloc((size_t)N * sizeof *tg);
    for (int n = 0; n < N; n++) tg[n] = (int)(rng_next() % (uint64_t)V);
    tg[1 % N] = -1;
    if (N > 3) tg[2] = V - 1;
    if (N > 4) tg[3] = 0;
    if (N > 6) tg[N - 2] = -1;
    if (N > 8) tg[5] = Vp / 2 < V ? Vp / 2 : V - 1; /* rank 1's first column at T=2 */
    float dscale = 1.0f / (float)N;
    int *d_tg = gpu_raw(&x, tg, (size_t)N * sizeof *tg);

    float *want_l = malloc((size_t)N * sizeof *want_l), *want_d = malloc(NV * sizeof *want_d);
    x.c->softmax_xent_forward(x.cpu, want_l, logits, tg, N, V, Vp);
    x.c->softmax_xent_backward(x.cpu, want_d, NULL, logits, tg, dscale, N, V, Vp);

    float *gl[2], *gd[2], *stats = malloc(3 * (size_t)N * sizeof *stats);
    float *il = malloc((size_t)N * sizeof *il), *id = malloc(NV * sizeof *id);
    for (int run = 0; run < 2; run++) {
        gl[run] = malloc((size_t)N * sizeof(float));
        gd[run] = malloc(NV * sizeof(float));
    }
    static const int Ts[3] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        int T = Ts[k];
        for (int run = 0; run < 2; run++) run_vp(&x, T, logits, d_tg, dscale, N, V, Vp, 0, gl[run], gd[run], stats);
        check("loss", T, gl[0], want_l, (size_t)N, 1e-5, 1e-6);
        check("dlogits", T, gd[0], want_d, NV, x.bf16 ? BF_ULP : 1e-5, x.bf16 ? 1e-3 : 1e-6);
        cr_assert_eq(memcmp(gl[0], gl[1], (size_t)N * sizeof(float)), 0, "T=%d: losses differ run to run", T);
        cr_assert_eq(memcmp(gd[0], gd[1], NV * sizeof(float)), 0, "T=%d: dlogits differ run to run", T);
        for (int n = 0; n < N; n++) {
            if (tg[n] < 0) {
                cr_assert(gl[0][n] == 0.0f, "T=%d ignored row %d: loss %g", T, n, gl[0][n]);
                for (int j = 0; j < Vp; j++)
                    cr_assert(gd[0][(size_t)n * Vp + j] == 0.0f, "T=%d ignored row %d: dlogits[%d] = %g", T, n,
                              j, gd[0][(size_t)n * Vp + j]);
                continue;
            }
            float mx = -INFINITY;
            for (int j = 0; j < V; j++) mx = fmaxf(mx, logits[(size_t)n * Vp + j]);
            cr_assert(stats[n] == mx, "T=%d row %d: max %g, want %g", T, n, stats[n], mx);
            cr_assert(stats[2 * N + n] == logits[(size_t)n * Vp + tg[n]], "T=%d row %d: target logit %g", T, n,
                      stats[2 * N + n]);
            for (int j = V; j < Vp; j++)
                cr_assert(gd[0][(size_t)n * Vp + j] == 0.0f, "T=%d padded dlogits[%d][%d] = %g", T, n, j,
                          gd[0][(size_t)n * Vp + j]);
        }
        run_vp(&x, T, logits, d_tg, dscale, N, V, Vp, 1, il, id, stats);
        cr_assert_eq(memcmp(id, gd[0], NV * sizeof(float)), 0, "T=%d: in-place dlogits differ", T);
    }
    for (int run = 0; run < 2; run++) free(gl[run]), free(gd[run]);
    free(logits), free(tg), free(want_l), free(want_d), free(stats), free(il), free(id);
    ctx_close(&x);
}

static void run_all(dt_dtype_t dtype) {
    run_case(dtype, 10, 50, 64, 51);    /* T=4: rank 3 holds 2 real columns and 14 of padding */
    run_case(dtype, 10, 45, 64, 52);    /* T=4: rank 3 holds only padding */
    run_case(dtype, 9, 29, 36, 53);     /* Vl = 9 at T=4: no 16-byte loads */
    run_case(dtype, 12, 10, 64, 54);    /* every real column on rank 0 at T=2 and T=4 */
    run_case(dtype, 5, 5000, 5008, 55); /* each thread loops over several packs */
}

Test(cuda_xent_vp, matches_whole_vocab_f32) { run_all(DT_DTYPE_F32); }
Test(cuda_xent_vp, matches_whole_vocab_bf16) { run_all(DT_DTYPE_BF16); }

Test(cuda_xent_vp, table_slots) {
    for (int k = 0; k < 2; k++) {
        ctx_t x;
        ctx_open(&x, k ? DT_DTYPE_BF16 : DT_DTYPE_F32);
        cr_assert(x.g->xent_vp_max && x.g->xent_vp_sums && x.g->xent_vp_loss && x.g->xent_vp_backward);
        ctx_close(&x);
    }
}
