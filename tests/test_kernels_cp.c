/*
 * test_kernels_cp.c - the CPU ops of context parallelism (kernels.h:
 * attention_block_*, attention_kv_pack, attention_kv_grad_add) against the full
 * causal attention (attention_forward / attention_backward on all T rows).
 *
 * A ring of R ranks is played out in one process: the T rows of each sequence are
 * cut into 2R chunks and rank r holds chunks r and 2R-1-r (the causal load balance),
 * its local rows with their global indices; every rank runs the forward over the R
 * key/value blocks (each rank's local k|v, kv_pack) in ring order from its own, then
 * finish; the backward runs over the same blocks with the final lse, each block's
 * dkv summed in its owner's buffer and added into the owner's rows. The rows put
 * back in place equal the full attention's out and dqkv within 1e-5 of the largest
 * value (the sums run in another order), with and without packed positions, for
 * multi-head and grouped-query shapes, and across the 64-row tiles of the CPU
 * kernel. Blocks no query row sees leave o and lse bitwise as they were; two
 * threads give the bits of one.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels_harness.h"

#define MAX_DOCS 8

typedef struct cp_shape {
    int B, T, C, NH, NKV;
    const int (*docs)[MAX_DOCS]; /* per row, document lengths ending at 0; NULL: unpacked */
} cp_shape;

static int *make_pos(const cp_shape *s) {
    if (!s->docs) return NULL;
    int *pos = malloc(sizeof(int) * (size_t)s->B * s->T);
    for (int b = 0; b < s->B; b++) {
        int t = 0;
        for (int d = 0; s->docs[b][d]; d++)
            for (int i = 0; i < s->docs[b][d]; i++) pos[b * s->T + t++] = i;
        cr_assert_eq(t, s->T, "row %d's documents fill %d of %d", b, t, s->T);
    }
    return pos;
}

/* What a ring run gives, put back in the full (B, T, .) layout. */
typedef struct cp_result {
    float *out, *dqkv; /* (B, T, C), (B, T, C3): dqkv started at PRE */
    float *lse;        /* (R, B, NH, Tq): each rank's final lse */
} cp_result;

static void cp_result_free(cp_result *r) { free(r->out), free(r->dqkv), free(r->lse); }

/* Plays out the ring of R ranks on nthreads threads. */
static cp_result ring_run(const cp_shape *s, int R, int nthreads, const float *qkv, const float *dout,
                          const int *pos) {
    dt_device_t *dev = open_cpu(nthreads);
    const dt_ops_t *ops = dev->ops;
    int B = s->B, T = s->T, C = s->C, NH = s->NH, NKV = s->NKV, HS = C / NH, KV = NKV * HS, C3 = C + 2 * KV;
    cr_assert_eq(T % (2 * R), 0);
    int L = T / (2 * R), Tq = 2 * L;
    cp_result res = {.out = ffill((size_t)B * T * C, 7), .dqkv = ffill((size_t)B * T * C3, PRE),
                     .lse = malloc(sizeof(float) * (size_t)R * B * NH * Tq)};
    int *qidx[R], *qlo[R];
    float *q[R], *kv[R], *dO[R], *out[R], *dq[R], *dkv[R], *o[R], *lse[R], *delta[R];
    size_t sbytes = ops->attention_block_scratch_bytes(dev, B, Tq, Tq, C, NH, NKV);
    void *scratch = malloc(sbytes);
    memset(scratch, 0xff, sbytes); /* NaN: nothing may be read before it is written */
    for (int r = 0; r < R; r++) {
        qidx[r] = malloc(sizeof(int) * (size_t)B * Tq), qlo[r] = malloc(sizeof(int) * (size_t)B * Tq);
        q[r] = malloc(sizeof(float) * (size_t)B * Tq * C3), dO[r] = malloc(sizeof(float) * (size_t)B * Tq * C);
        kv[r] = malloc(sizeof(float) * (size_t)B * Tq * 2 * KV), out[r] = ffill((size_t)B * Tq * C, 5);
        dq[r] = ffill((size_t)B * Tq * C3, PRE), dkv[r] = ffill((size_t)B * Tq * 2 * KV, 0);
        o[r] = malloc(sizeof(float) * (size_t)B * Tq * C), lse[r] = malloc(sizeof(float) * (size_t)B * NH * Tq);
        delta[r] = malloc(sizeof(float) * (size_t)B * NH * Tq);
        memset(o[r], 0xff, sizeof(float) * (size_t)B * Tq * C); /* first = 1 must start them */
        memset(lse[r], 0xff, sizeof(float) * (size_t)B * NH * Tq);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tq; i++) {
                int t = i < L ? r * L + i : (2 * R - 1 - r) * L + (i - L), at = b * Tq + i;
                qidx[r][at] = t;
                qlo[r][at] = pos ? t - pos[b * T + t] : 0;
                memcpy(q[r] + (size_t)at * C3, qkv + ((size_t)b * T + t) * C3, sizeof(float) * (size_t)C3);
                memcpy(dO[r] + (size_t)at * C, dout + ((size_t)b * T + t) * C, sizeof(float) * (size_t)C);
            }
        ops->attention_kv_pack(dev, kv[r], q[r], B, Tq, C, NH, NKV);
    }
    for (int r = 0; r < R; r++) {
        for (int step = 0; step < R; step++) {
            int src = (r - step + R) % R;
            ops->attention_block_forward(dev, o[r], lse[r], scratch, q[r], kv[src], qidx[r], qlo[r], qidx[src],
                                         step == 0, B, Tq, Tq, C, NH, NKV);
        }
        ops->attention_block_finish(dev, out[r], o[r], B, Tq, C);
        ops->attention_block_delta(dev, delta[r], dO[r], out[r], B, Tq, C, NH);
        for (int step = 0; step < R; step++) {
            int src = (r - step + R) % R;
            ops->attention_block_backward(dev, dq[r], dkv[src], scratch, dO[r], q[r], kv[src], lse[r], delta[r],
                                          qidx[r], qlo[r], qidx[src], B, Tq, Tq, C, NH, NKV);
        }
    }
    for (int r = 0; r < R; r++) {
        ops->attention_kv_grad_add(dev, dq[r], dkv[r], B, Tq, C, NH, NKV);
        memcpy(res.lse + (size_t)r * B * NH * Tq, lse[r], sizeof(float) * (size_t)B * NH * Tq);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tq; i++) {
                int at = b * Tq + i, t = qidx[r][at];
                memcpy(res.out + ((size_t)b * T + t) * C, out[r] + (size_t)at * C, sizeof(float) * (size_t)C);
                memcpy(res.dqkv + ((size_t)b * T + t) * C3, dq[r] + (size_t)at * C3, sizeof(float) * (size_t)C3);
            }
        free(qidx[r]), free(qlo[r]), free(q[r]), free(kv[r]), free(dO[r]), free(out[r]), free(dq[r]);
        free(dkv[r]), free(o[r]), free(lse[r]), free(delta[r]);
    }
    free(scratch);
    dt_device_free(dev);
    return res;
}

/* max |got - want| over n values, asserted <= tol * max(1, max |want|). */
static double check_rel(const char *what, const float *got, const float *want, size_t n, double tol) {
    double top = 1, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) top = fabs(want[i]) > top ? fabs(want[i]) : top;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= worst)) worst = e, at = i; /* NaN is the worst */
    }
    cr_assert(worst <= tol * top, "%s[%zu]: got %.9g, want %.9g (max |diff| %.3g, max |want| %.3g)", what, at,
              got[at], want[at], worst, top);
    return worst;
}

/* The ring over R ranks against the full attention. */
static void ring_vs_full(const cp_shape *s, int R, int nthreads, uint64_t seed) {
    rng_seed(seed);
    int B = s->B, T = s->T, C = s->C, NH = s->NH, NKV = s->NKV, C3 = C + 2 * NKV * (C / NH);
    size_t n1 = (size_t)B * T * C, n3 = (size_t)B * T * C3;
    float *qkv = frand(n3, 1.5f), *dout = frand(n1, 1), *out = ffill(n1, 9), *dqkv = ffill(n3, PRE);
    int *pos = make_pos(s);
    dt_device_t *dev = open_cpu(nthreads);
    void *saved = malloc(dev->ops->attention_saved_bytes(dev, B, T, C, NH, NKV));
    void *scratch = malloc(dev->ops->attention_scratch_bytes(dev, B, T, C, NH, NKV));
    dev->ops->attention_forward(dev, out, saved, qkv, pos, B, T, C, NH, NKV);
    dev->ops->attention_backward(dev, dqkv, scratch, dout, qkv, saved, pos, B, T, C, NH, NKV);
    cp_result got = ring_run(s, R, nthreads, qkv, dout, pos);
    double eo = check_rel("out", got.out, out, n1, 1e-5);
    double ed = check_rel("dqkv", got.dqkv, dqkv, n3, 1e-5);
    cr_log_info("B %d T %d C %d NH %d NKV %d %s, %d ranks, %d threads: max |diff| out %.3g, dqkv %.3g", B, T, C, NH,
                NKV, pos ? "packed" : "unpacked", R, nthreads, eo, ed);
    cp_result_free(&got);
    free(qkv), free(dout), free(out), free(dqkv), free(pos), free(saved), free(scratch);
    dt_device_free(dev);
}

static const int docs_24[][MAX_DOCS] = {{7, 1, 10, 6}, {3, 21}};
static const int docs_160[][MAX_DOCS] = {{30, 70, 60}, {64, 64, 1, 31}};

Test(cp, ring_multi_head) {
    cp_shape s = {.B = 2, .T = 24, .C = 16, .NH = 2, .NKV = 2};
    for (int R = 2; R <= 4; R += 2) ring_vs_full(&s, R, 1, 11);
}

Test(cp, ring_multi_head_packed) {
    cp_shape s = {.B = 2, .T = 24, .C = 16, .NH = 2, .NKV = 2, .docs = docs_24};
    for (int R = 2; R <= 4; R += 2) ring_vs_full(&s, R, 1, 12);
}

Test(cp, ring_grouped_query) {
    cp_shape s = {.B = 2, .T = 24, .C = 32, .NH = 4, .NKV = 2};
    for (int R = 2; R <= 4; R += 2) ring_vs_full(&s, R, 1, 13);
    s.NKV = 1;
    ring_vs_full(&s, 4, 1, 14);
}

Test(cp, ring_grouped_query_packed) {
    cp_shape s = {.B = 2, .T = 24, .C = 32, .NH = 4, .NKV = 2, .docs = docs_24};
    for (int R = 2; R <= 4; R += 2) ring_vs_full(&s, R, 1, 15);
}

/* 80 local rows at R = 2: two query tiles of the CPU kernel; two threads. */
Test(cp, ring_across_tiles) {
    cp_shape s = {.B = 2, .T = 160, .C = 32, .NH = 4, .NKV = 2};
    for (int R = 2; R <= 4; R += 2) ring_vs_full(&s, R, 2, 16);
    s.docs = docs_160;
    for (int R = 2; R <= 4; R += 2) ring_vs_full(&s, R, 2, 17);
}

static void check_bitwise(const char *what, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        cr_assert(memcmp(&a[i], &b[i], sizeof(float)) == 0, "%s[%zu]: %.9g (1 thread) vs %.9g (2)", what, i, a[i],
                  b[i]);
}

Test(cp, threads_bitwise) {
    cp_shape s = {.B = 2, .T = 160, .C = 32, .NH = 4, .NKV = 2, .docs = docs_160};
    int C3 = s.C + 2 * s.NKV * (s.C / s.NH);
    for (int R = 2; R <= 4; R += 2) {
        rng_seed(18);
        float *qkv = frand((size_t)s.B * s.T * C3, 1.5f), *dout = frand((size_t)s.B * s.T * s.C, 1);
        int *pos = make_pos(&s);
        cp_result one = ring_run(&s, R, 1, qkv, dout, pos), two = ring_run(&s, R, 2, qkv, dout, pos);
        check_bitwise("out", one.out, two.out, (size_t)s.B * s.T * s.C);
        check_bitwise("dqkv", one.dqkv, two.dqkv, (size_t)s.B * s.T * C3);
        check_bitwise("lse", one.lse, two.lse, (size_t)s.B * s.NH * s.T);
        cp_result_free(&one), cp_result_free(&two);
        free(qkv), free(dout), free(pos);
    }
}

/* ---- blocks some rows do not see ------------------------------------------------ */

enum { E_B = 1, E_TQ = 4, E_TK = 3, E_C = 8, E_NH = 2, E_NKV = 1, E_KV = E_NKV * E_C / E_NH,
       E_C3 = E_C + 2 * E_KV };

typedef struct empty_ctx {
    dt_device_t *dev;
    float *qkv, *o, *lse;
    void *scratch;
} empty_ctx;

static void run_block(empty_ctx *x, const int *qidx, const int *qlo, const int *kidx, int first) {
    float kv[E_TK * 2 * E_KV];
    float kq[E_TK * E_C3];
    for (int i = 0; i < E_TK * E_C3; i++) kq[i] = rnd();
    x->dev->ops->attention_kv_pack(x->dev, kv, kq, E_B, E_TK, E_C, E_NH, E_NKV);
    x->dev->ops->attention_block_forward(x->dev, x->o, x->lse, x->scratch, x->qkv, kv, qidx, qlo, kidx, first,
                                         E_B, E_TQ, E_TK, E_C, E_NH, E_NKV);
}

static void same_rows(const empty_ctx *x, const float *o0, const float *l0, int t0, int t1, int same) {
    for (int t = 0; t < E_TQ; t++) {
        int want_same = (t >= t0 && t < t1) == same;
        int eq = memcmp(x->o + t * E_C, o0 + t * E_C, sizeof(float) * E_C) == 0;
        for (int h = 0; h < E_NH; h++) eq = eq && memcmp(&x->lse[h * E_TQ + t], &l0[h * E_TQ + t], sizeof(float)) == 0;
        cr_assert_eq(eq, want_same, "row %d %s", t, want_same ? "changed" : "unchanged");
    }
}

Test(cp, block_unseen_rows_unchanged) {
    rng_seed(21);
    empty_ctx x = {.dev = open_cpu(1), .qkv = frand(E_TQ * E_C3, 1.5f), .o = ffill(E_TQ * E_C, 3),
                   .lse = ffill(E_NH * E_TQ, 3)};
    x.scratch = malloc(x.dev->ops->attention_block_scratch_bytes(x.dev, E_B, E_TQ, E_TK, E_C, E_NH, E_NKV));
    static const int qidx[E_TQ] = {0, 1, 5, 6}, qlo[E_TQ] = {0, 0, 0, 0};
    static const int past[E_TK] = {0, 1, 2}, mid[E_TK] = {4, 5, 6}, future[E_TK] = {10, 11, 12};
    float o0[E_TQ * E_C], l0[E_NH * E_TQ];

    /* first = 1 on a block no row sees: o = 0, lse = -inf, finish 0 */
    run_block(&x, qidx, qlo, future, 1);
    for (int i = 0; i < E_TQ * E_C; i++) cr_assert_eq(x.o[i], 0.0f);
    for (int i = 0; i < E_NH * E_TQ; i++) cr_assert(isinf(x.lse[i]) && x.lse[i] < 0, "lse[%d] %g", i, x.lse[i]);
    float out[E_TQ * E_C];
    memset(out, 0xff, sizeof out);
    x.dev->ops->attention_block_finish(x.dev, out, x.o, E_B, E_TQ, E_C);
    for (int i = 0; i < E_TQ * E_C; i++) cr_assert_eq(out[i], 0.0f);

    /* first = 1 on a block rows 0 and 1 do not see: they start empty, rows 2 and 3 not */
    memcpy(o0, x.o, sizeof o0), memcpy(l0, x.lse, sizeof l0);
    run_block(&x, qidx, qlo, mid, 1);
    same_rows(&x, o0, l0, 0, 2, 1);

    /* Then a block every row sees, then the same two blocks again: a block leaves the
     * rows that see none of it bitwise as they were. */
    run_block(&x, qidx, qlo, past, 0);
    memcpy(o0, x.o, sizeof o0), memcpy(l0, x.lse, sizeof l0);
    run_block(&x, qidx, qlo, future, 0);
    same_rows(&x, o0, l0, 0, E_TQ, 1);
    run_block(&x, qidx, qlo, mid, 0);
    same_rows(&x, o0, l0, 0, 2, 1);
    /* A document starting at 3 hides the past block from rows 2 and 3 (qlo). */
    static const int qlo_doc[E_TQ] = {0, 0, 3, 3};
    memcpy(o0, x.o, sizeof o0), memcpy(l0, x.lse, sizeof l0);
    run_block(&x, qidx, qlo_doc, past, 0);
    same_rows(&x, o0, l0, 2, 4, 1);

    /* The backward against a block no row sees adds nothing. */
    float dout[E_TQ * E_C], delta[E_NH * E_TQ], kv[E_TK * 2 * E_KV], *dq = ffill(E_TQ * E_C3, PRE);
    float dkv[E_TK * 2 * E_KV];
    for (int i = 0; i < E_TQ * E_C; i++) dout[i] = rnd();
    for (int i = 0; i < E_TK * 2 * E_KV; i++) kv[i] = rnd(), dkv[i] = PRE;
    x.dev->ops->attention_block_delta(x.dev, delta, dout, x.o, E_B, E_TQ, E_C, E_NH);
    x.dev->ops->attention_block_backward(x.dev, dq, dkv, x.scratch, dout, x.qkv, kv, x.lse, delta, qidx, qlo, future,
                                         E_B, E_TQ, E_TK, E_C, E_NH, E_NKV);
    for (int i = 0; i < E_TQ * E_C3; i++) cr_assert_eq(dq[i], PRE, "dqkv[%d] touched", i);
    for (int i = 0; i < E_TK * 2 * E_KV; i++) cr_assert_eq(dkv[i], PRE, "dkv[%d] touched", i);
    free(dq), free(x.qkv), free(x.o), free(x.lse), free(x.scratch);
    dt_device_free(x.dev);
}

/* kv_pack copies the k|v tail of each row; kv_grad_add adds into it only. */
Test(cp, kv_pack_and_grad_add) {
    rng_seed(22);
    dt_device_t *dev = open_cpu(1);
    int B = 2, T = 3, C = 8, NH = 2, NKV = 1, KV = NKV * C / NH, C3 = C + 2 * KV;
    float *qkv = frand((size_t)B * T * C3, 1), *kv = ffill((size_t)B * T * 2 * KV, 9);
    float *d = ffill((size_t)B * T * C3, PRE), *dkv = frand((size_t)B * T * 2 * KV, 1);
    dev->ops->attention_kv_pack(dev, kv, qkv, B, T, C, NH, NKV);
    dev->ops->attention_kv_grad_add(dev, d, dkv, B, T, C, NH, NKV);
    for (int r = 0; r < B * T; r++)
        for (int i = 0; i < C3; i++) {
            if (i >= C) cr_assert_eq(kv[r * 2 * KV + i - C], qkv[r * C3 + i]);
            cr_assert_eq(d[r * C3 + i], i < C ? PRE : PRE + dkv[r * 2 * KV + i - C]);
        }
    free(qkv), free(kv), free(d), free(dkv);
    dt_device_free(dev);
}
