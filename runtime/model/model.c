/*
 * model.c - tensor tables of the GPT-2 and MLP models and their initialisation.
 */
#include "runtime/model/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"

enum { INIT_NORMAL = 0, INIT_RESIDUAL = 1, INIT_ZERO = 2, INIT_ONE = 3, INIT_EMBED = 4 };

typedef struct builder {
    dt_model_layout *l;
    int cap;
} builder;

static void add_tensor(builder *b, int unit, int decay, int init, int ndim, const int64_t *shape,
                       const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static void add_tensor(builder *b, int unit, int decay, int init, int ndim, const int64_t *shape,
                       const char *fmt, ...) {
    dt_model_layout *l = b->l;
    if (l->n_tensors == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        l->tensors = dt_xrealloc(l->tensors, (size_t)b->cap * sizeof *l->tensors);
    }
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
    t->init = init;
    l->n_params += t->numel;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NDIM(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define ADD(b, unit, decay, init, shape_list, ...)                                             \
    add_tensor(b, unit, decay, init, NDIM shape_list, SHAPE shape_list, __VA_ARGS__)

static dt_status_t check_positive(const char *name, int v) {
    if (v <= 0) return dt_error(DT_STATUS_CONFIG, "model.%s: expected an integer > 0, found %d", name, v);
    return DT_STATUS_OK;
}

static void build_gpt(builder *b) {
    const dt_model_spec *s = &b->l->spec;
    int64_t C = s->n_embd, Vp = b->l->vocab_padded, T = s->seq_len;
    ADD(b, 0, 0, INIT_EMBED, (Vp, C), "wte.weight");
    ADD(b, 0, 0, INIT_EMBED, (T, C), "wpe.weight");
    for (int i = 0; i < s->n_layer; i++) {
        int u = 1 + i;
        ADD(b, u, 0, INIT_ONE, (C), "h.%d.ln_1.weight", i);
        ADD(b, u, 0, INIT_ZERO, (C), "h.%d.ln_1.bias", i);
        ADD(b, u, 1, INIT_NORMAL, (3 * C, C), "h.%d.attn.c_attn.weight", i);
        ADD(b, u, 0, INIT_ZERO, (3 * C), "h.%d.attn.c_attn.bias", i);
        ADD(b, u, 1, INIT_RESIDUAL, (C, C), "h.%d.attn.c_proj.weight", i);
        ADD(b, u, 0, INIT_ZERO, (C), "h.%d.attn.c_proj.bias", i);
        ADD(b, u, 0, INIT_ONE, (C), "h.%d.ln_2.weight", i);
        ADD(b, u, 0, INIT_ZERO, (C), "h.%d.ln_2.bias", i);
        ADD(b, u, 1, INIT_NORMAL, (4 * C, C), "h.%d.mlp.c_fc.weight", i);
        ADD(b, u, 0, INIT_ZERO, (4 * C), "h.%d.mlp.c_fc.bias", i);
        ADD(b, u, 1, INIT_RESIDUAL, (C, 4 * C), "h.%d.mlp.c_proj.weight", i);
        ADD(b, u, 0, INIT_ZERO, (C), "h.%d.mlp.c_proj.bias", i);
    }
    ADD(b, s->n_layer + 1, 0, INIT_ONE, (C), "ln_f.weight");
    ADD(b, s->n_layer + 1, 0, INIT_ZERO, (C), "ln_f.bias");
}

static void build_mlp(builder *b) {
    const dt_model_spec *s = &b->l->spec;
    int64_t in = s->in_dim;
    for (int i = 0; i <= s->n_hidden_layers; i++) {
        int64_t out = i == s->n_hidden_layers ? s->n_classes : s->hidden_dim;
        ADD(b, i, 1, INIT_NORMAL, (out, in), "layers.%d.weight", i);
        ADD(b, i, 0, INIT_ZERO, (out), "layers.%d.bias", i);
        in = out;
    }
}

dt_status_t dt_model_layout_init(const dt_model_spec *spec, dt_model_layout *out) {
    memset(out, 0, sizeof *out);
    out->spec = *spec;
    if (spec->type == DT_MODEL_GPT) {
        DT_CHECK(check_positive("n_layer", spec->n_layer));
        DT_CHECK(check_positive("n_head", spec->n_head));
        DT_CHECK(check_positive("n_embd", spec->n_embd));
        DT_CHECK(check_positive("seq_len", spec->seq_len));
        DT_CHECK(check_positive("vocab_size", spec->vocab_size));
        if (spec->n_embd % spec->n_head != 0)
            return dt_error(DT_STATUS_CONFIG, "model.n_embd: %d is not divisible by model.n_head %d",
                            spec->n_embd, spec->n_head);
        if (spec->vocab_size > 65536)
            return dt_error(DT_STATUS_CONFIG,
                            "model.vocab_size: %d exceeds 65536 (token ids are uint16)", spec->vocab_size);
        int m = spec->vocab_pad_multiple > 0 ? spec->vocab_pad_multiple : 1;
        out->vocab_padded = (spec->vocab_size + m - 1) / m * m;
    } else if (spec->type == DT_MODEL_MLP) {
        DT_CHECK(check_positive("in_dim", spec->in_dim));
        DT_CHECK(check_positive("hidden_dim", spec->hidden_dim));
        DT_CHECK(check_positive("n_classes", spec->n_classes));
        if (spec->n_hidden_layers < 0)
            return dt_error(DT_STATUS_CONFIG, "model.n_hidden_layers: expected >= 0, found %d",
                            spec->n_hidden_layers);
    } else {
        return dt_error(DT_STATUS_CONFIG, "model.type: expected gpt or mlp");
    }
    builder b = {out, 0};
    if (spec->type == DT_MODEL_GPT) build_gpt(&b);
    else build_mlp(&b);
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
    if (l->spec.type != DT_MODEL_GPT) return l->n_params;
    return l->n_params - (size_t)(l->vocab_padded - l->spec.vocab_size) * (size_t)l->spec.n_embd;
}

void dt_model_init_params(const dt_model_layout *l, uint64_t seed, float *params) {
    double resid_std = 0.02;
    if (l->spec.type == DT_MODEL_GPT) resid_std = 0.02 / sqrt(2.0 * l->spec.n_layer);
    for (int i = 0; i < l->n_tensors; i++) {
        const dt_tensor_info *t = &l->tensors[i];
        float *p = params + t->offset;
        /* One stream per tensor: a tensor's values do not depend on the others. */
        dt_rng rng;
        dt_rng_seed(&rng, seed, 0x6d6f64656cull + (uint64_t)i);
        double std = 0.02;
        if (l->spec.type == DT_MODEL_MLP) std = 1.0 / sqrt((double)t->shape[t->ndim - 1]);
        switch (t->init) {
        case INIT_ZERO: memset(p, 0, t->numel * sizeof *p); break;
        case INIT_ONE:
            for (size_t j = 0; j < t->numel; j++) p[j] = 1.0f;
            break;
        case INIT_RESIDUAL:
            for (size_t j = 0; j < t->numel; j++) p[j] = (float)(resid_std * dt_rng_normal(&rng));
            break;
        default:
            for (size_t j = 0; j < t->numel; j++) p[j] = (float)(std * dt_rng_normal(&rng));
        }
    }
    if (l->spec.type == DT_MODEL_GPT) { /* padded vocab rows never see a token */
        int w = dt_model_find(l, "wte.weight");
        size_t C = (size_t)l->spec.n_embd;
        memset(params + l->tensors[w].offset + (size_t)l->spec.vocab_size * C, 0,
               (size_t)(l->vocab_padded - l->spec.vocab_size) * C * sizeof(float));
    }
}

double dt_model_flops_per_token(const dt_model_layout *l) {
    if (l->spec.type != DT_MODEL_GPT) return 6.0 * (double)l->n_params;
    const dt_model_spec *s = &l->spec;
    double n = (double)l->n_params - (double)s->seq_len * s->n_embd; /* all but wpe */
    return 6.0 * n + 12.0 * s->n_layer * (double)s->n_embd * s->seq_len;
}
