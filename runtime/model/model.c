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

void dt_model_add_tensor(dt_model_layout *l, int unit, int decay, dt_model_init_t init, int ndim,
                         const int64_t *shape, const char *fmt, ...) {
    if (l->n_tensors % 64 == 0)
        l->tensors = dt_xrealloc(l->tensors, (size_t)(l->n_tensors + 64) * sizeof *l->tensors);
    dt_tensor_info *t = &l->tensors[l->n_tensors++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->numel *= (size_t)shape[i];
    }
    t->offset = l->n_params;
    t->unit = unit;
    t->decay = decay;
    t->init = (int)init;
    l->n_params += t->numel;
}

dt_status_t dt_model_layout_init(const dt_model_spec *spec, dt_model_layout *out) {
    memset(out, 0, sizeof *out);
    out->spec = *spec;
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
    }
    return DT_STATUS_OK;
}

void dt_model_layout_free(dt_model_layout *l) {
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

void dt_model_init_params(const dt_model_layout *l, uint64_t seed, float *params) {
    l->spec.ops->init_params(l, seed, params);
}

void dt_model_init_range(const dt_model_layout *l, uint64_t seed, size_t offset, size_t count, float *dst) {
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
