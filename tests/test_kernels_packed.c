/*
 * test_kernels_packed.c - the CPU ops that see positions (kernels.h: pos, packed
 * sequences: several documents in one row, each attending to itself, positions
 * restarting at 0) against running each document alone as its own sequence.
 *
 * A packed row and its documents run alone give the same numbers: the encoder and
 * RoPE bitwise (the same arithmetic per row: a row's position table row and angles
 * come from its position, not its column), attention within 1e-6 (a document's
 * scores and sums are the same terms; the sgemm blocks that produce them differ);
 * the saved probabilities are 0 outside each row's document. The attention shapes
 * cross the CPU kernel's 64-row blocks, so a block's first document (its key
 * columns from k0 > 0) and documents spanning two blocks are covered, with grouped
 * query heads and two threads. Backward ops run on buffers pre-filled with PRE (+=).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels_harness.h"

#define MAX_DOCS 16

/* B rows of T positions cut into documents: docs of row b are lens[b][0..], ending
 * at a 0; they must fill T. */
typedef struct packing {
    int B, T, n;
    int row[MAX_DOCS], start[MAX_DOCS], len[MAX_DOCS];
    int *pos; /* (B, T) */
} packing;

static packing pack(int B, int T, const int lens[][MAX_DOCS]) {
    packing p = {.B = B, .T = T, .pos = malloc(sizeof(int) * (size_t)B * T)};
    for (int b = 0; b < B; b++) {
        int t = 0;
        for (int k = 0; lens[b][k]; k++) {
            cr_assert_lt(p.n, MAX_DOCS);
            p.row[p.n] = b, p.start[p.n] = t, p.len[p.n] = lens[b][k];
            for (int i = 0; i < lens[b][k]; i++) p.pos[b * T + t + i] = i;
            t += lens[b][k];
            p.n++;
        }
        cr_assert_eq(t, T, "row %d's documents fill %d of %d", b, t, T);
    }
    return p;
}

/* Rows [start, start + len) of row b of a (B, T, w) tensor. */
static float *doc_rows(const packing *p, int d, float *x, int w) {
    return x + ((size_t)p->row[d] * p->T + p->start[d]) * w;
}

/* |got - want| <= tol (1 + |want|) over n values. */
static void check_near(const char *what, int d, const float *got, const float *want, size_t n, double tol) {
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs((double)got[i] - want[i]) <= tol * (1 + fabs(want[i])), "%s, document %d [%zu]: %.9g vs %.9g",
                  what, d, i, got[i], want[i]);
}

static void check_same(const char *what, int d, const float *got, const float *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0, "%s, document %d [%zu]: %.9g vs %.9g", what, d, i,
                  got[i], want[i]);
}

/* ---- attention ---------------------------------------------------------------- */

/* Packed forward and backward against each document alone (B = 1, T = its length,
 * no pos), values and gradients of every row; P zero outside the documents. */
static void attention_packed(const packing *p, int C, int NH, int NKV, int nthreads) {
    dt_device_t *dev = open_cpu(nthreads);
    int B = p->B, T = p->T, HS = C / NH, C3 = C + 2 * NKV * HS;
    size_t n3 = (size_t)B * T * C3, n1 = (size_t)B * T * C;
    float *qkv = frand(n3, 1.5f), *R = frand(n1, 1), *out = ffill(n1, 9), *dqkv = ffill(n3, PRE);
    float *saved = malloc(dev->ops->attention_saved_bytes(dev, B, T, C, NH, NKV));
    float *scratch = malloc(dev->ops->attention_scratch_bytes(dev, B, T, C, NH, NKV));
    memset(saved, 0xff, dev->ops->attention_saved_bytes(dev, B, T, C, NH, NKV)); /* NaN: all must be written */
    dev->ops->attention_forward(dev, out, saved, qkv, p->pos, B, T, C, NH, NKV);
    dev->ops->attention_backward(dev, dqkv, scratch, R, qkv, saved, p->pos, B, T, C, NH, NKV);
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++) {
            const float *row = saved + ((size_t)bh * T + t) * T;
            int lo = t - p->pos[(bh / NH) * T + t];
            double s = 0;
            for (int j = 0; j < T; j++) {
                if (j < lo || j > t) cr_assert_eq(row[j], 0.0f, "P[%d][%d][%d] outside the document", bh, t, j);
                s += row[j];
            }
            cr_assert_float_eq(s, 1.0, 1e-5, "P[%d][%d] sums to %g", bh, t, s);
        }
    for (int d = 0; d < p->n; d++) {
        int L = p->len[d];
        float *q1 = malloc(sizeof(float) * (size_t)L * C3), *r1 = malloc(sizeof(float) * (size_t)L * C);
        memcpy(q1, doc_rows(p, d, qkv, C3), sizeof(float) * (size_t)L * C3);
        memcpy(r1, doc_rows(p, d, R, C), sizeof(float) * (size_t)L * C);
        float *o1 = ffill((size_t)L * C, 9), *d1 = ffill((size_t)L * C3, PRE);
        float *s1 = malloc(dev->ops->attention_saved_bytes(dev, 1, L, C, NH, NKV));
        float *x1 = malloc(dev->ops->attention_scratch_bytes(dev, 1, L, C, NH, NKV));
        dev->ops->attention_forward(dev, o1, s1, q1, NULL, 1, L, C, NH, NKV);
        dev->ops->attention_backward(dev, d1, x1, r1, q1, s1, NULL, 1, L, C, NH, NKV);
        check_near("attention out", d, doc_rows(p, d, out, C), o1, (size_t)L * C, 1e-6);
        check_near("attention dqkv", d, doc_rows(p, d, dqkv, C3), d1, (size_t)L * C3, 1e-6);
        free(q1), free(r1), free(o1), free(d1), free(s1), free(x1);
    }
    free(qkv), free(R), free(out), free(dqkv), free(saved), free(scratch);
    dt_device_free(dev);
}

Test(packed, attention_one_row_three_documents) {
    rng_seed(41);
    static const int lens[][MAX_DOCS] = {{5, 7, 4}};
    packing p = pack(1, 16, lens);
    attention_packed(&p, 12, 3, 3, 1);
    free(p.pos);
}

Test(packed, attention_grouped_query_heads) {
    rng_seed(42);
    static const int lens[][MAX_DOCS] = {{1, 6, 2, 3}, {12}}; /* a one-token document; a plain row */
    packing p = pack(2, 12, lens);
    attention_packed(&p, 16, 4, 2, 1);
    attention_packed(&p, 16, 4, 1, 1);
    free(p.pos);
}

/* T 150 in blocks of 64: row 0's second document spans blocks 0-1, its third starts
 * inside block 1 and ends in block 2 (whose first key column is then > 0); row 1's
 * documents meet at the block boundaries 64 and 128. Two threads. */
Test(packed, attention_across_row_blocks) {
    rng_seed(43);
    static const int lens[][MAX_DOCS] = {{30, 70, 50}, {64, 64, 22}};
    packing p = pack(2, 150, lens);
    attention_packed(&p, 32, 4, 2, 2);
    free(p.pos);
}

/* ---- RoPE ----------------------------------------------------------------------- */

Test(packed, rope_each_document_from_position_0) {
    rng_seed(44);
    static const int lens[][MAX_DOCS] = {{3, 4, 2}, {1, 8}};
    packing p = pack(2, 9, lens);
    const dt_rope_args_t l3 = {.theta = 500000, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                               .original_max_pos = 8192};
    dt_device_t *dev = open_cpu(2);
    int NH = 4, NKV = 2, HS = 16, stride = (NH + 2 * NKV) * HS;
    size_t n = (size_t)p.B * p.T * stride;
    float *x = frand(n, 1), *y = malloc(n * sizeof *y);
    for (int dir = 0; dir < 2; dir++) {
        memcpy(y, x, n * sizeof *y);
        /* pos0 is ignored when pos is given */
        (dir ? dev->ops->rope_backward : dev->ops->rope_forward)(dev, y, p.B, p.T, stride, NH + NKV, HS, 99, p.pos,
                                                                 &l3);
        for (int d = 0; d < p.n; d++) {
            int L = p.len[d];
            float *a = malloc(sizeof(float) * (size_t)L * stride);
            memcpy(a, doc_rows(&p, d, x, stride), sizeof(float) * (size_t)L * stride);
            (dir ? dev->ops->rope_backward : dev->ops->rope_forward)(dev, a, 1, L, stride, NH + NKV, HS, 0, NULL,
                                                                     &l3);
            check_same(dir ? "rope backward" : "rope forward", d, doc_rows(&p, d, y, stride), a,
                       (size_t)L * stride);
            free(a);
        }
    }
    free(x), free(y), free(p.pos);
    dt_device_free(dev);
}

/* ---- encoder ------------------------------------------------------------------ */

/* out: each document's rows as alone (wpe rows 0..len-1); dwte and dwpe: the
 * documents run alone one after the other into the same buffers (the packed
 * backward adds its rows in row order, the same order). */
Test(packed, encoder_position_rows_restart) {
    rng_seed(45);
    static const int lens[][MAX_DOCS] = {{5, 3, 5}, {2, 11}};
    packing p = pack(2, 13, lens);
    int V = 9, C = 24, maxT = 16, B = p.B, T = p.T;
    int tok[2 * 13];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 7 + 3) % V; /* repeats: accumulation */
    tok[4] = -1;                                            /* another rank's row: no dwte term */
    for (int nthreads = 1; nthreads <= 2; nthreads++) {
        dt_device_t *dev = open_cpu(nthreads);
        float *wte = frand((size_t)V * C, 1), *wpe = frand((size_t)maxT * C, 1), *R = frand((size_t)B * T * C, 1);
        float *out = ffill((size_t)B * T * C, 9), *dwte = ffill((size_t)V * C, PRE), *dwpe = ffill((size_t)maxT * C, PRE);
        float *dwte1 = ffill((size_t)V * C, PRE), *dwpe1 = ffill((size_t)maxT * C, PRE);
        dev->ops->encoder_forward(dev, out, tok, wte, wpe, p.pos, B, T, C);
        dev->ops->encoder_backward(dev, dwte, dwpe, R, tok, p.pos, B, T, C);
        for (int d = 0; d < p.n; d++) {
            int L = p.len[d], *t1 = tok + p.row[d] * T + p.start[d];
            float *o1 = ffill((size_t)L * C, 9);
            dev->ops->encoder_forward(dev, o1, t1, wte, wpe, NULL, 1, L, C);
            dev->ops->encoder_backward(dev, dwte1, dwpe1, doc_rows(&p, d, R, C), t1, NULL, 1, L, C);
            check_same("encoder out", d, doc_rows(&p, d, out, C), o1, (size_t)L * C);
            free(o1);
        }
        check_same("encoder dwte", -1, dwte, dwte1, (size_t)V * C);
        check_same("encoder dwpe", -1, dwpe, dwpe1, (size_t)maxT * C);
        for (size_t i = (size_t)11 * C; i < (size_t)maxT * C; i++) /* positions past the longest document */
            cr_assert_eq(dwpe[i], PRE, "dwpe[%zu] touched", i);
        free(wte), free(wpe), free(R), free(out), free(dwte), free(dwpe), free(dwte1), free(dwpe1);
        dt_device_free(dev);
    }
    free(p.pos);
}
