/*
 * hf_weights.c - initial parameters from a Hugging Face weight set, by flat-buffer
 * ranges (hf_weights.h).
 */
#include "runtime/ckpt/hf_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h" /* defines: dt_now_s */
#include "common/mem.h" /* defines: dt_xcalloc */
#include "runtime/ckpt/safetensors.h"

/* Where one tensor of the layout comes from. */
typedef struct src {
    dt_st_file_t *file;
    const dt_st_tensor *t;
    int transposed; /* file (in, out), ours (out, in) */
    size_t valid;   /* non-transposed: our leading elements the file holds (rows past it are padding, 0) */
} src_t;

struct dt_hf_weights {
    const dt_model_layout *l;
    dt_st_set_t *set;
    src_t *src; /* (n_tensors) */
    float *tmp; /* a file row band of a transposed tensor */
    size_t tmp_len;
    uint64_t bytes_read;
    double seconds; /* spent in dt_hf_weights_fill */
};

/* Tensors whose file may hold more leading rows than we use (GPT-2's n_positions
 * position table, of which seq_len rows are used). */
static int prefix_rows_ok(const char *name) { return !strcmp(name, "wpe.weight"); }

static void shape_str(const int64_t *s, int nd, char *out, size_t len) {
    size_t k = (size_t)snprintf(out, len, "(");
    for (int d = 0; d < nd && k < len; d++) k += (size_t)snprintf(out + k, len - k, "%s%lld", d ? ", " : "", (long long)s[d]);
    if (k < len) snprintf(out + k, len - k, ")");
}

static dt_status_t match(dt_hf_weights_t *w, const char *dir, int i) {
    const dt_model_layout *l = w->l;
    const dt_tensor_info *ti = &l->tensors[i];
    int64_t e[2] = {0, 0};
    int nd = 0;
    int tr = l->spec.ops->export_shape(l, i, e, &nd);
    char name[DT_MODEL_NAME_LEN + 16], want[64], found[160];
    dt_st_file_t *f = NULL;
    const dt_st_tensor *t = dt_st_set_find(w->set, ti->name, &f);
    if (!t) {
        snprintf(name, sizeof name, "transformer.%s", ti->name);
        t = dt_st_set_find(w->set, name, &f);
    }
    shape_str(e, nd, want, sizeof want);
    if (!t)
        return dt_error(DT_STATUS_NOT_FOUND, "%s: tensor %s (expected shape %s) is in none of the weight files", dir,
                        ti->name, want);
    shape_str(t->shape, t->ndim, found, sizeof found);
    int ok = t->ndim == nd;
    for (int d = 0; ok && d < nd; d++)
        ok = t->shape[d] == e[d] || (d == 0 && !tr && prefix_rows_ok(ti->name) && t->shape[0] >= e[0]);
    if (!ok)
        return dt_error(DT_STATUS_FORMAT, "%s: tensor %s: expected shape %s, found %s", dt_st_path(f), t->name, want,
                        found);
    size_t row = ti->ndim > 0 && ti->shape[0] > 0 ? ti->numel / (size_t)ti->shape[0] : 1;
    w->src[i] = (src_t){f, t, tr, tr ? ti->numel : (nd > 0 ? (size_t)e[0] * row : ti->numel)};
    if (w->src[i].valid > ti->numel) w->src[i].valid = ti->numel;
    return DT_STATUS_OK;
}

dt_status_t dt_hf_weights_open(const char *dir, const dt_model_layout *l, dt_hf_weights_t **out) {
    *out = NULL;
    dt_hf_weights_t *w = dt_xcalloc(1, sizeof *w);
    w->l = l;
    w->src = dt_xcalloc((size_t)l->n_tensors + 1, sizeof *w->src);
    dt_status_t st = dt_st_set_open(dir, &w->set);
    for (int i = 0; st == DT_STATUS_OK && i < l->n_tensors; i++) st = match(w, dir, i);
    if (st != DT_STATUS_OK) {
        dt_hf_weights_close(w);
        return st;
    }
    *out = w;
    return DT_STATUS_OK;
}

void dt_hf_weights_close(dt_hf_weights_t *w) {
    if (!w) return;
    dt_st_set_close(w->set);
    free(w->src);
    free(w->tmp);
    free(w);
}

/* File rows of a transposed tensor converted per block (a tile of the transpose). */
#define TR_BLOCK 64

/* Our elements [a, e) of a transposed tensor (ours (R, C) row-major = file (C, R)):
 * the band of our rows the range touches, read from TR_BLOCK file rows at a time and
 * written out row by row (contiguous runs of TR_BLOCK, not a stride of C). */
static dt_status_t fill_transposed(dt_hf_weights_t *w, const dt_tensor_info *ti, const src_t *s, size_t a, size_t e,
                                   float *dst) {
    size_t R = (size_t)ti->shape[0], C = (size_t)ti->shape[1];
    size_t r0 = a / C, r1 = (e - 1) / C, band = r1 - r0 + 1;
    if (band * TR_BLOCK > w->tmp_len) {
        w->tmp = dt_xrealloc(w->tmp, band * TR_BLOCK * sizeof *w->tmp);
        w->tmp_len = band * TR_BLOCK;
    }
    for (size_t c0 = 0; c0 < C; c0 += TR_BLOCK) {
        size_t cb = C - c0 < TR_BLOCK ? C - c0 : TR_BLOCK;
        for (size_t k = 0; k < cb; k++)
            DT_CHECK(dt_st_copy_f32(s->file, s->t, (c0 + k) * R + r0, band, w->tmp + k * band));
        for (size_t r = r0; r <= r1; r++) {
            size_t j0 = r * C + c0;
            if (j0 >= e || j0 + cb <= a) continue;
            size_t lo = j0 < a ? a - j0 : 0, hi = j0 + cb > e ? e - j0 : cb;
            for (size_t k = lo; k < hi; k++) dst[j0 + k - a] = w->tmp[k * band + (r - r0)];
        }
    }
    w->bytes_read += band * C * dt_st_dtype_size(s->t->dtype);
    dt_st_drop(s->file, s->t, r0, (C - 1) * R + band);
    return DT_STATUS_OK;
}

static dt_status_t fill(dt_hf_weights_t *w, size_t offset, size_t count, float *dst);

dt_status_t dt_hf_weights_fill(dt_hf_weights_t *w, size_t offset, size_t count, float *dst) {
    double t0 = dt_now_s();
    dt_status_t st = fill(w, offset, count, dst);
    w->seconds += dt_now_s() - t0;
    return st;
}

static dt_status_t fill(dt_hf_weights_t *w, size_t offset, size_t count, float *dst) {
    const dt_model_layout *l = w->l;
    for (int i = 0; i < l->n_tensors; i++) {
        const dt_tensor_info *ti = &l->tensors[i];
        size_t a = ti->offset > offset ? ti->offset : offset, e = ti->offset + ti->numel;
        if (e > offset + count) e = offset + count;
        if (a >= e) continue;
        const src_t *s = &w->src[i];
        float *d = dst + (a - offset);
        size_t ja = a - ti->offset, je = e - ti->offset; /* tensor-local */
        if (s->transposed) {
            DT_CHECK(fill_transposed(w, ti, s, ja, je, d));
            continue;
        }
        size_t rd = je < s->valid ? je : s->valid;
        if (ja < rd) {
            DT_CHECK(dt_st_read_f32(s->file, s->t, ja, rd - ja, d));
            w->bytes_read += (rd - ja) * dt_st_dtype_size(s->t->dtype);
        }
        size_t z = ja > rd ? ja : rd; /* padding rows */
        if (z < je) memset(d + (z - ja), 0, (je - z) * sizeof(float));
    }
    return DT_STATUS_OK;
}

uint64_t dt_hf_weights_id(const dt_hf_weights_t *w) { return dt_st_set_hash(w->set); }
uint64_t dt_hf_weights_bytes_read(const dt_hf_weights_t *w) { return w->bytes_read; }
uint64_t dt_hf_weights_file_bytes(const dt_hf_weights_t *w) { return dt_st_set_bytes(w->set); }
double dt_hf_weights_seconds(const dt_hf_weights_t *w) { return w->seconds; }
