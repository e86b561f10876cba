/*
 * model.c - what every model shares: building the tensor table and its units,
 * initialising tensors from per-tensor RNG streams, and the calls that dispatch to
 * the model table (model.h). The models themselves are gpt.c and mlp.c.
 */
#include "runtime/model/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xcalloc, dt_xrealloc */

static void add_tensor(dt_model_layout *l, int unit, int decay, dt_model_init_t init, dt_tp_split_t split, int parts,
                       int ndim, const int64_t *shape, const char *fmt, va_list ap) {
    if (l->n_tensors % 64 == 0)
        l->tensors = dt_xrealloc(l->tensors, (size_t)(l->n_tensors + 64) * sizeof *l->tensors);
    dt_tensor_info *t = &l->tensors[l->n_tensors++];
    memset(t, 0, sizeof *t);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    t->ndim = ndim;
    t->numel = 1;
    t->tp_split = (int)split;
    t->tp_parts = parts > 0 ? parts : 1;
    int cut = split == DT_TP_ROWS ? 0 : split == DT_TP_COLS ? 1 : -1;
    int tp = l->tp_size > 1 ? l->tp_size : 1;
    for (int i = 0; i < ndim; i++) {
        t->gshape[i] = shape[i];
        t->shape[i] = i == cut ? shape[i] / tp : shape[i];
        t->numel *= (size_t)t->shape[i];
    }
    t->offset = l->n_params;
    t->goffset = l->n_params;
    t->unit = unit;
    t->decay = decay;
    t->init = (int)init;
    l->n_params += t->numel;
}

void dt_model_add_tensor(dt_model_layout *l, int unit, int decay, dt_model_init_t init, int ndim,
                         const int64_t *shape, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    add_tensor(l, unit, decay, init, DT_TP_REPLICATED, 1, ndim, shape, fmt, ap);
    va_end(ap);
}

void dt_model_add_tensor_tp(dt_model_layout *l, int unit, int decay, dt_model_init_t init, dt_tp_split_t split,
                            int parts, int ndim, const int64_t *shape, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    add_tensor(l, unit, decay, init, split, parts, ndim, shape, fmt, ap);
    va_end(ap);
}

static dt_status_t layout_build(const dt_model_spec *spec, int tp_size, int tp_rank, int sp, dt_model_layout *out) {
    memset(out, 0, sizeof *out);
    out->spec = *spec;
    out->tp_size = tp_size;
    out->tp_rank = tp_rank;
    out->sequence_parallel = tp_size > 1 && sp;
    if (!spec->ops) {
        char names[256];
        dt_model_names(names, sizeof names);
        return dt_error(DT_STATUS_CONFIG, "model.type: expected one of %s", names);
    }
    DT_CHECK(spec->ops->validate(spec));
    spec->ops->build(out);
    int n_units = 0;
    for (int i = 0; i < out->n_tensors; i++)
        if (out->tensors[i].unit + 1 > n_units) n_units = out->tensors[i].unit + 1;
    out->units = dt_xcalloc((size_t)n_units, sizeof *out->units);
    out->n_units = n_units;
    for (int i = out->n_tensors - 1; i >= 0; i--) { /* tensors of a unit are contiguous */
        dt_unit_info *u = &out->units[out->tensors[i].unit];
        u->offset = out->tensors[i].offset;
        u->numel += out->tensors[i].numel;
        u->tensor0 = i;
        u->n_tensors++;
    }
    for (int u = 0; u < n_units; u++) out->units[u].gunit = u;
    /* the whole model: one chunk of every block */
    out->pp_size = 1;
    out->n_chunks = 1;
    out->chunks[0] = (dt_model_chunk){0, spec->ops->pipeline ? n_units - 2 : 0, 1, 1};
    out->tied = out->tied_head;
    return DT_STATUS_OK;
}

dt_status_t dt_model_layout_init(const dt_model_spec *spec, dt_model_layout *out) {
    return layout_build(spec, 1, 0, 0, out);
}

int dt_model_vocab_padded(const dt_model_spec *spec) {
    int m = spec->vocab_pad_multiple > 0 ? spec->vocab_pad_multiple : 1;
    return (spec->vocab_size + m - 1) / m * m;
}

int dt_model_tp_check(const dt_model_spec *spec, int tp, char *msg, size_t len) {
    if (tp == 1) return 0;
    if (tp < 1) {
        snprintf(msg, len, "tensor_parallel.size: expected an integer >= 1, found %d", tp);
        return 1;
    }
    if (!spec->ops || !spec->ops->tp_check) {
        snprintf(msg, len, "tensor_parallel.size: model.type %s has no tensor-parallel layers (size must be 1, found %d)",
                 spec->ops ? spec->ops->name : "?", tp);
        return 1;
    }
    if (spec->ops->tp_check(spec, tp, msg, len)) return 1;
    int m = spec->vocab_pad_multiple > 0 ? spec->vocab_pad_multiple : 1;
    if (spec->vocab_size > 0 && dt_model_vocab_padded(spec) % tp != 0) {
        snprintf(msg, len,
                 "model.vocab_pad_multiple: the padded vocabulary (%d rows, a multiple of %d) must divide "
                 "among tensor_parallel.size %d ranks: use a multiple of %d",
                 dt_model_vocab_padded(spec), m, tp, m * tp);
        return 1;
    }
    return 0;
}

dt_status_t dt_model_layout_init_tp(const dt_model_spec *spec, int tp_size, int tp_rank, int sequence_parallel,
                                    dt_model_layout *out) {
    memset(out, 0, sizeof *out); /* freeable on every error below */
    if (tp_size <= 1) return dt_model_layout_init(spec, out);
    char msg[512];
    if (dt_model_tp_check(spec, tp_size, msg, sizeof msg)) return dt_error(DT_STATUS_CONFIG, "%s", msg);
    if (tp_rank < 0 || tp_rank >= tp_size)
        return dt_error(DT_STATUS_INVALID, "tensor-parallel rank %d outside 0..%d", tp_rank, tp_size - 1);
    dt_model_layout *g = dt_xcalloc(1, sizeof *g);
    dt_status_t st = layout_build(spec, 1, 0, 0, g);
    if (st == DT_STATUS_OK) st = layout_build(spec, tp_size, tp_rank, sequence_parallel, out);
    if (st != DT_STATUS_OK || g->n_tensors != out->n_tensors) {
        dt_model_layout_free(g);
        free(g);
        dt_model_layout_free(out);
        return st != DT_STATUS_OK ? st : dt_error(DT_STATUS_INVALID, "model layout differs between TP sizes");
    }
    for (int i = 0; i < out->n_tensors; i++) out->tensors[i].goffset = g->tensors[i].offset;
    out->global = g;
    return DT_STATUS_OK;
}

/* ---- tensor-parallel pieces ---- */

/* The pieces of tensor t (local elements [a, e) of it, relative to its start). */
static void tensor_segments(const dt_model_layout *l, const dt_tensor_info *t, size_t a, size_t e,
                            dt_model_segment_fn fn, void *ctx) {
    int tp = l->tp_size > 1 ? l->tp_size : 1;
    if (tp == 1 || t->tp_split == DT_TP_REPLICATED) {
        if (a < e) fn(ctx, t->offset + a, t->goffset + a, e - a, tp > 1);
        return;
    }
    /* A piece is `run` contiguous local elements; local piece k sits at global
     * (k / per_row) * grow + (k % per_row) * gpart + rank * run within the tensor. */
    size_t run, per_row, grow, gpart;
    if (t->tp_split == DT_TP_ROWS) {
        size_t inner = t->shape[0] ? t->numel / (size_t)t->shape[0] : 0;
        size_t lrows = (size_t)t->shape[0] / (size_t)t->tp_parts; /* local rows per part */
        run = lrows * inner;
        per_row = (size_t)t->tp_parts;
        gpart = run * (size_t)tp;
        grow = gpart * per_row;
    } else { /* COLS: each row's columns, per part */
        size_t lcols = (size_t)t->shape[1] / (size_t)t->tp_parts;
        run = lcols;
        per_row = (size_t)t->tp_parts;
        gpart = lcols * (size_t)tp;
        grow = (size_t)t->gshape[1];
    }
    if (run == 0) return;
    for (size_t k = a / run; k * run < e; k++) {
        size_t lo = k * run, hi = lo + run;
        if (lo < a) lo = a;
        if (hi > e) hi = e;
        size_t g = (k / per_row) * grow + (k % per_row) * gpart + (size_t)l->tp_rank * run + (lo - k * run);
        fn(ctx, t->offset + lo, t->goffset + g, hi - lo, 0);
    }
}

void dt_model_tp_segments(const dt_model_layout *l, size_t offset, size_t count, dt_model_segment_fn fn, void *ctx) {
    for (int i = 0; i < l->n_tensors; i++) {
        const dt_tensor_info *t = &l->tensors[i];
        size_t a = t->offset > offset ? t->offset : offset, e = t->offset + t->numel;
        if (e > offset + count) e = offset + count;
        if (a < e) tensor_segments(l, t, a - t->offset, e - t->offset, fn, ctx);
    }
}

/* dt_model_tp_fill: pieces are gathered into spans of the global buffer of at most
 * SPAN elements, each read once. */
#define SPAN ((size_t)1 << 20)
typedef struct fill_state {
    const dt_model_layout *l;
    size_t offset; /* local offset of dst[0] */
    float *dst;
    dt_model_global_read_fn read;
    void *ctx;
    float *buf;
    size_t span_lo, span_hi; /* global span of the pending pieces */
    struct { size_t local, global, n; } *pend;
    int n_pend, cap_pend;
    dt_status_t st;
} fill_state;

static void fill_flush(fill_state *f) {
    if (f->n_pend == 0 || f->st != DT_STATUS_OK) { f->n_pend = 0; return; }
    if (f->n_pend == 1) { /* one piece: straight into place */
        f->st = f->read(f->ctx, f->pend[0].global, f->pend[0].n, f->dst + (f->pend[0].local - f->offset));
    } else {
        f->st = f->read(f->ctx, f->span_lo, f->span_hi - f->span_lo, f->buf);
        for (int i = 0; f->st == DT_STATUS_OK && i < f->n_pend; i++)
            memcpy(f->dst + (f->pend[i].local - f->offset), f->buf + (f->pend[i].global - f->span_lo),
                   f->pend[i].n * sizeof(float));
    }
    f->n_pend = 0;
}

static void fill_piece(void *ctx, size_t local, size_t global, size_t n, int replicated) {
    (void)replicated;
    fill_state *f = ctx;
    if (f->n_pend > 0 && (global < f->span_lo || global + n - f->span_lo > SPAN)) fill_flush(f);
    if (f->n_pend == 0) f->span_lo = global;
    if (f->n_pend == f->cap_pend) {
        f->cap_pend = f->cap_pend ? 2 * f->cap_pend : 256;
        f->pend = dt_xrealloc(f->pend, (size_t)f->cap_pend * sizeof *f->pend);
    }
    f->pend[f->n_pend].local = local;
    f->pend[f->n_pend].global = global;
    f->pend[f->n_pend].n = n;
    f->n_pend++;
    f->span_hi = global + n;
    if (n > SPAN) fill_flush(f); /* a big piece goes alone, straight into place */
}

dt_status_t dt_model_tp_fill(const dt_model_layout *l, size_t offset, size_t count, float *dst,
                             dt_model_global_read_fn read, void *ctx) {
    if (count == 0) return DT_STATUS_OK;
    if (!l->global) return read(ctx, offset, count, dst); /* the whole model */
    fill_state f = {.l = l, .offset = offset, .dst = dst, .read = read, .ctx = ctx, .st = DT_STATUS_OK};
    f.buf = dt_xcalloc(SPAN, sizeof(float));
    dt_model_tp_segments(l, offset, count, fill_piece, &f);
    fill_flush(&f);
    free(f.buf);
    free(f.pend);
    return f.st;
}

void dt_model_layout_free(dt_model_layout *l) {
    if (l->global) {
        dt_model_layout_free(l->global);
        free(l->global);
    }
    free(l->tensors);
    free(l->units);
    memset(l, 0, sizeof *l);
}

int dt_model_find(const dt_model_layout *l, const char *name) {
    for (int i = 0; i < l->n_tensors; i++)
        if (strcmp(l->tensors[i].name, name) == 0) return i;
    return -1;
}

size_t dt_model_unpadded_params(const dt_model_layout *l) {
    return l->spec.ops->unpadded_params ? l->spec.ops->unpadded_params(l) : l->n_params;
}

typedef struct init_ctx {
    const dt_model_layout *g;
    uint64_t seed;
} init_ctx;

static dt_status_t init_global(void *ctx, size_t goffset, size_t n, float *dst) {
    init_ctx *c = ctx;
    dt_model_init_range(c->g, c->seed, goffset, n, dst);
    return DT_STATUS_OK;
}

void dt_model_init_params(const dt_model_layout *l, uint64_t seed, float *params) {
    if (l->global) {
        dt_model_init_range(l, seed, 0, l->n_params, params);
        return;
    }
    l->spec.ops->init_params(l, seed, params);
}

void dt_model_init_range(const dt_model_layout *l, uint64_t seed, size_t offset, size_t count, float *dst) {
    if (l->global) { /* a TP piece or pipeline stage: the global model's values at its elements */
        init_ctx c = {l->global, seed};
        (void)dt_model_tp_fill(l, offset, count, dst, init_global, &c);
        return;
    }
    if (l->spec.ops->init_range) {
        l->spec.ops->init_range(l, seed, offset, count, dst);
        return;
    }
    float *all = dt_xcalloc(l->n_params ? l->n_params : 1, sizeof *all); /* a model without init_range */
    l->spec.ops->init_params(l, seed, all);
    memcpy(dst, all + offset, count * sizeof *dst);
    free(all);
}

double dt_model_flops_per_token(const dt_model_layout *l) { return l->spec.ops->flops_per_token(l); }

size_t dt_model_key_size(const dt_model_key *k) {
    return k->kind == DT_MODEL_KEY_FLOAT ? sizeof(double) : sizeof(int);
}

double dt_model_key_get(const dt_model_spec *spec, const dt_model_key *k) {
    const char *f = (const char *)spec + k->offset;
    if (k->kind == DT_MODEL_KEY_FLOAT) return *(const double *)f;
    return *(const int *)f;
}

void dt_model_key_set(dt_model_spec *spec, const dt_model_key *k, double v) {
    char *f = (char *)spec + k->offset;
    if (k->kind == DT_MODEL_KEY_FLOAT) *(double *)f = v;
    else if (k->kind == DT_MODEL_KEY_BOOL) *(int *)f = v != 0;
    else *(int *)f = (int)v;
}

const dt_model_key *dt_model_key_find(const dt_model_ops *ops, const char *path) {
    for (int i = 0; ops && path && i < ops->n_keys; i++)
        if (!strcmp(ops->keys[i].path, path)) return &ops->keys[i];
    return NULL;
}

void dt_model_spec_copy(const dt_model_spec *src, dt_model_spec *dst) {
    memset(dst, 0, sizeof *dst);
    dst->ops = src->ops;
    for (int i = 0; src->ops && i < src->ops->n_keys; i++) {
        const dt_model_key *k = &src->ops->keys[i];
        memcpy((char *)dst + k->offset, (const char *)src + k->offset, dt_model_key_size(k));
    }
}

void dt_model_init_tensor_range(const dt_model_layout *l, int i, uint64_t seed, size_t offset, size_t count,
                                float *dst, double std, double resid_std) {
    const dt_tensor_info *t = &l->tensors[i];
    size_t a = t->offset > offset ? t->offset : offset, e = t->offset + t->numel;
    if (e > offset + count) e = offset + count;
    if (a >= e) return;
    float *p = dst + (a - offset);
    size_t first = a - t->offset, n = e - a;
    /* One stream per tensor: a tensor's values do not depend on the others. */
    dt_rng rng;
    dt_rng_seed(&rng, seed, 0x6d6f64656cull + (uint64_t)i);
    double sd = t->init == DT_MODEL_INIT_RESIDUAL ? resid_std : std;
    switch (t->init) {
    case DT_MODEL_INIT_ZERO: memset(p, 0, n * sizeof *p); break;
    case DT_MODEL_INIT_ONE:
        for (size_t j = 0; j < n; j++) p[j] = 1.0f;
        break;
    default:
        /* dt_rng_normal draws two words per value: skip the values before the range */
        for (size_t j = 0; j < 2 * first; j++) dt_rng_u64(&rng);
        for (size_t j = 0; j < n; j++) p[j] = (float)(sd * dt_rng_normal(&rng));
    }
}

void dt_model_init_tensor(const dt_model_layout *l, int i, uint64_t seed, float *params, double std,
                          double resid_std) {
    const dt_tensor_info *t = &l->tensors[i];
    dt_model_init_tensor_range(l, i, seed, t->offset, t->numel, params + t->offset, std, resid_std);
}
