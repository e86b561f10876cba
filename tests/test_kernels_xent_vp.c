/*
 * test_kernels_xent_vp.c - the CPU vocabulary-parallel softmax + cross-entropy ops
 * (kernels.h: xent_vp_max, xent_vp_sums, xent_vp_loss, xent_vp_backward) against
 * the whole-vocabulary softmax_xent_forward/backward.
 *
 * A full (N, Vp) logits matrix is cut into T column slices as tensor-parallel
 * ranks hold them (rank r: columns [r*Vl, (r+1)*Vl), Vl = Vp / T). The ops run on
 * each slice, and the stats are combined here as the caller's all-reduces would
 * (MAX over the ranks of stats[0, N), then SUM of stats[N, 3N)). The losses of
 * every rank and the reassembled (N, Vp) gradient must equal the whole-vocabulary
 * ops' within 1e-6 relative: both compute the same fp32 exps of x - max (the max is
 * exact), and only the order of the fp32 sum of exps differs (a few ulp of the
 * sum). An absolute 1e-7 (loss) and 1e-7 * dscale (gradient) allow for the
 * cancellation in log(sum) + max - x[target] and p[target] - 1 near 0.
 *
 * Shapes: V not a multiple of Vp (padded columns, which hold 1e4 here so that
 * reading one would show), targets < 0, targets on the first and last real column
 * of a slice; T in {1, 2, 4}; a vocabulary whose real columns all sit on rank 0
 * (the other ranks' max is -INFINITY and their slices are all padding); rows with
 * a large offset (max subtraction); enough elements for several threads.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ull + 1; }
static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static float rnd(void) { /* uniform in [-1, 1) */
    return (float)((rng_next() >> 40) * (1.0 / (1ull << 24)) * 2.0 - 1.0);
}

static dt_device_t *open_cpu(int nthreads) {
    dt_device_t *dev = NULL;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, nthreads), DT_STATUS_OK, "%s",
                 dt_error_detail());
    return dev;
}

static void check_rel(const char *what, int T, const float *got, const float *want, size_t n,
                      double rtol, double atol) {
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        cr_assert(!isnan(got[i]) && err <= rtol * fabs(want[i]) + atol,
                  "T=%d %s[%zu]: got %.9g, want %.9g (err %.3g)", T, what, i, got[i], want[i], err);
    }
}

/* The TP path on T slices of `logits` (N, Vp); losses (N) from every rank (they
 * must agree bit for bit) and the gradient reassembled into dl (N, Vp). The stats
 * after the "all-reduces" go to stats_out (3N) when not NULL. in_place: the
 * backward writes over its logits slice. */
static void run_vp(dt_device_t *dev, int T, const float *logits, const int *tgt, float dscale, int N,
                   int V, int Vp, int in_place, float *losses, float *dl, float *stats_out) {
    int Vl = Vp / T;
    cr_assert_eq(Vl * T, Vp, "T=%d must divide Vp=%d", T, Vp);
    float **slice = malloc(T * sizeof *slice), **stats = malloc(T * sizeof *stats);
    for (int r = 0; r < T; r++) {
        slice[r] = malloc((size_t)N * Vl * sizeof(float));
        stats[r] = malloc(3 * (size_t)N * sizeof(float));
        for (int n = 0; n < N; n++)
            memcpy(slice[r] + (size_t)n * Vl, logits + (size_t)n * Vp + (size_t)r * Vl,
                   Vl * sizeof(float));
        for (int i = 0; i < 3 * N; i++) stats[r][i] = NAN; /* unwritten shows */
        dev->ops->xent_vp_max(dev, stats[r], slice[r], N, Vl, r * Vl, V);
    }
    for (int n = 0; n < N; n++) { /* all-reduce MAX of [0, N) */
        float m = -INFINITY;
        for (int r = 0; r < T; r++) m = fmaxf(m, stats[r][n]);
        for (int r = 0; r < T; r++) stats[r][n] = m;
    }
    for (int r = 0; r < T; r++)
        dev->ops->xent_vp_sums(dev, stats[r], slice[r], tgt, N, Vl, r * Vl, V);
    for (int i = N; i < 3 * N; i++) { /* all-reduce SUM of [N, 3N), in rank order */
        float s = 0.0f;
        for (int r = 0; r < T; r++) s += stats[r][i];
        for (int r = 0; r < T; r++) stats[r][i] = s;
    }
    if (stats_out) memcpy(stats_out, stats[0], 3 * (size_t)N * sizeof(float));
    float *lr = malloc((size_t)N * sizeof *lr), *dr = malloc((size_t)N * Vl * sizeof *dr);
    for (int r = 0; r < T; r++) {
        for (int n = 0; n < N; n++) lr[n] = NAN;
        dev->ops->xent_vp_loss(dev, lr, stats[r], tgt, N);
        if (r == 0) memcpy(losses, lr, (size_t)N * sizeof *lr);
        cr_assert_eq(memcmp(lr, losses, (size_t)N * sizeof *lr), 0, "T=%d rank %d: losses differ from rank 0",
                     T, r);
        float *d = in_place ? slice[r] : dr;
        if (!in_place)
            for (size_t i = 0; i < (size_t)N * Vl; i++) d[i] = NAN;
        dev->ops->xent_vp_backward(dev, d, slice[r], tgt, stats[r], dscale, N, Vl, r * Vl, V);
        for (int n = 0; n < N; n++)
            memcpy(dl + (size_t)n * Vp + (size_t)r * Vl, d + (size_t)n * Vl, Vl * sizeof(float));
    }
    for (int r = 0; r < T; r++) free(slice[r]), free(stats[r]);
    free(slice), free(stats), free(lr), free(dr);
}

/* Random logits (scale 3, rows 0 mod 5 offset by +60 for max subtraction), padded
 * columns 1e4, random targets < V with some ignored, the first and last real
 * column and each slice's first column as targets where the rows allow. */
static void run_case(int nthreads, int N, int V, int Vp, uint64_t seed) {
    dt_device_t *dev = open_cpu(nthreads);
    rng_seed(seed);
    size_t NV = (size_t)N * Vp;
    float *logits = malloc(NV * sizeof *logits);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < Vp; j++)
            logits[(size_t)n * Vp + j] = j >= V ? 1e4f : 3.0f * rnd() + (n % 5 == 0 ? 60.0f : 0.0f);
    int *tgt = malloc((size_t)N * sizeof *tgt);
    for (int n = 0; n < N; n++) tgt[n] = (int)(rng_next() % (uint64_t)V);
    tgt[1 % N] = -1;
    if (N > 3) tgt[2] = V - 1;
    if (N > 4) tgt[3] = 0;
    if (N > 6) tgt[N - 2] = -1;
    if (N > 8) tgt[5] = (Vp / 2 < V) ? Vp / 2 : V - 1; /* rank 1's first column at T=2 */
    if (N > 9) tgt[6] = (Vp / 4 < V) ? Vp / 4 : 0;     /* rank 1's first column at T=4 */
    if (N > 10) tgt[7] = (Vp / 2 - 1 < V) ? Vp / 2 - 1 : 1; /* rank 0's last column at T=2 */
    float dscale = 1.0f / (float)N;

    float *want_l = malloc((size_t)N * sizeof *want_l), *want_d = malloc(NV * sizeof *want_d);
    dev->ops->softmax_xent_forward(dev, want_l, logits, tgt, N, V, Vp);
    dev->ops->softmax_xent_backward(dev, want_d, NULL, logits, tgt, dscale, N, V, Vp);

    float *got_l = malloc((size_t)N * sizeof *got_l), *got_d = malloc(NV * sizeof *got_d);
    float *got_d2 = malloc(NV * sizeof *got_d2), *got_l2 = malloc((size_t)N * sizeof *got_l2);
    float *stats = malloc(3 * (size_t)N * sizeof *stats);
    static const int Ts[3] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        int T = Ts[k];
        run_vp(dev, T, logits, tgt, dscale, N, V, Vp, 0, got_l, got_d, stats);
        check_rel("loss", T, got_l, want_l, (size_t)N, 1e-6, 1e-7);
        check_rel("dlogits", T, got_d, want_d, NV, 1e-6, 1e-7 * dscale);
        for (int n = 0; n < N; n++) {
            if (tgt[n] < 0) {
                cr_assert(got_l[n] == 0.0f, "T=%d ignored row %d: loss %g", T, n, got_l[n]);
                for (int j = 0; j < Vp; j++)
                    cr_assert(got_d[(size_t)n * Vp + j] == 0.0f, "T=%d ignored row %d: dlogits[%d] = %g", T,
                              n, j, got_d[(size_t)n * Vp + j]);
                continue;
            }
            /* The reduced stats are the row's true max and target logit. */
            float mx = -INFINITY;
            for (int j = 0; j < V; j++) mx = fmaxf(mx, logits[(size_t)n * Vp + j]);
            cr_assert(stats[n] == mx, "T=%d row %d: max %g, want %g", T, n, stats[n], mx);
            cr_assert(stats[2 * N + n] == logits[(size_t)n * Vp + tgt[n]], "T=%d row %d: target logit %g", T,
                      n, stats[2 * N + n]);
            for (int j = V; j < Vp; j++)
                cr_assert(got_d[(size_t)n * Vp + j] == 0.0f, "T=%d padded dlogits[%d][%d] = %g", T, n, j,
                          got_d[(size_t)n * Vp + j]);
        }
        /* In place (dlogits over the logits slice): the same bits. */
        run_vp(dev, T, logits, tgt, dscale, N, V, Vp, 1, got_l2, got_d2, NULL);
        cr_assert_eq(memcmp(got_d2, got_d, NV * sizeof *got_d), 0, "T=%d: in-place gradient differs", T);
        cr_assert_eq(memcmp(got_l2, got_l, (size_t)N * sizeof *got_l), 0, "T=%d: losses differ", T);
    }
    free(logits), free(tgt), free(want_l), free(want_d), free(got_l), free(got_d), free(got_d2);
    free(got_l2), free(stats);
    dt_device_free(dev);
}

Test(xent_vp, padded_vocab_matches_whole_vocab) {
    run_case(2, 12, 50, 64, 1);  /* T=4: rank 3 holds columns 48, 49 and 14 of padding */
    run_case(2, 12, 45, 64, 2);  /* T=4: rank 3 holds only padding */
    run_case(1, 7, 61, 64, 3);   /* rows fewer than the special targets need */
    run_case(2, 13, 29, 36, 4);  /* Vl = 9 at T=4: slices not a multiple of the SIMD width */
}

Test(xent_vp, many_rows_use_threads) {
    run_case(2, 64, 1000, 1024, 5); /* N * Vl >= 2^15 at T <= 2: several threads */
    run_case(4, 40, 5000, 5008, 6);
}

/* Every real column on rank 0: the other ranks see only padding, report a max of
 * -INFINITY and sums of 0, write zero gradients, and the loss is rank 0's alone. */
Test(xent_vp, real_columns_on_one_rank) {
    run_case(2, 12, 10, 64, 7);
    dt_device_t *dev = open_cpu(1);
    int N = 3, Vl = 16, V = 10;
    float x[3 * 16], stats[9], d[3 * 16];
    for (int i = 0; i < 3 * 16; i++) x[i] = rnd();
    int tgt[3] = {4, -1, 9};
    dev->ops->xent_vp_max(dev, stats, x, N, Vl, 16, V);
    for (int n = 0; n < N; n++) cr_assert(isinf(stats[n]) && stats[n] < 0, "row %d: max %g", n, stats[n]);
    for (int n = 0; n < N; n++) stats[n] = 1.5f; /* the global max, from rank 0 */
    dev->ops->xent_vp_sums(dev, stats, x, tgt, N, Vl, 16, V);
    for (int i = N; i < 3 * N; i++) cr_assert(stats[i] == 0.0f, "stats[%d] = %g", i, stats[i]);
    stats[N] = stats[N + 1] = stats[N + 2] = 2.0f; /* the global sums */
    dev->ops->xent_vp_backward(dev, d, x, tgt, stats, 0.5f, N, Vl, 16, V);
    for (int i = 0; i < 3 * 16; i++) cr_assert(d[i] == 0.0f, "d[%d] = %g", i, d[i]);
    dt_device_free(dev);
}
