/*
 * test_model.c - tensor tables: exact parameter counts, contiguous units,
 * initialisation statistics and determinism; and the model table: every
 * registered model fills the slots the trainer needs, and its layout, FLOPs,
 * initialisation and arena keep the invariants the rest of dtrun relies on.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "runtime/config/config.h"
#include "runtime/model/model.h"
#include "runtime/model/net.h"
#include "runtime/model/sample.h"

static dt_model_spec gpt2_124m(void) {
    dt_model_spec s = {.ops = &dt_model_gpt, .n_layer = 12, .n_head = 12, .n_embd = 768,
                       .seq_len = 1024, .vocab_size = 50257, .vocab_pad_multiple = 1};
    return s;
}

Test(model, gpt2_124m_parameter_count_is_exact) {
    dt_model_spec s = gpt2_124m();
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    cr_assert_eq(l.n_params, 124439808u);
    cr_assert_eq(l.n_tensors, 2 + 12 * 12 + 2);
    cr_assert_eq(l.n_units, 14);
    dt_model_layout_free(&l);

    s.vocab_pad_multiple = 128; /* llm.c pads 50257 to 50304 */
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    cr_assert_eq(l.vocab_padded, 50304);
    cr_assert_eq(l.n_params, 124439808u + 47u * 768u);
    cr_assert_eq(dt_model_unpadded_params(&l), 124439808u);
    dt_model_layout_free(&l);
}

Test(model, units_are_contiguous_and_cover_the_buffer) {
    dt_model_spec s = {.ops = &dt_model_gpt, .n_layer = 3, .n_head = 2, .n_embd = 8,
                       .seq_len = 16, .vocab_size = 61, .vocab_pad_multiple = 64};
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    size_t next = 0;
    for (int u = 0; u < l.n_units; u++) {
        cr_assert_eq(l.units[u].offset, next, "unit %d starts where the previous ends", u);
        next += l.units[u].numel;
    }
    cr_assert_eq(next, l.n_params);
    for (int i = 0; i < l.n_tensors; i++) {
        const dt_tensor_info *t = &l.tensors[i];
        const dt_unit_info *u = &l.units[t->unit];
        cr_assert_geq(t->offset, u->offset);
        cr_assert_leq(t->offset + t->numel, u->offset + u->numel);
    }
    int qkv = dt_model_find(&l, "h.1.attn.c_attn.weight");
    cr_assert_geq(qkv, 0);
    cr_assert_eq(l.tensors[qkv].shape[0], 24);
    cr_assert_eq(l.tensors[qkv].unit, 2);
    cr_assert_eq(l.tensors[qkv].decay, 1);
    cr_assert_eq(l.tensors[dt_model_find(&l, "h.1.attn.c_attn.bias")].decay, 0);
    cr_assert_eq(l.tensors[dt_model_find(&l, "wte.weight")].decay, 0);
    cr_assert_eq(dt_model_find(&l, "nope"), -1);
    dt_model_layout_free(&l);
}

Test(model, bad_specs_name_the_field) {
    dt_model_spec s = gpt2_124m();
    dt_model_layout l;
    s.n_head = 7;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "model.n_embd"));
    s = gpt2_124m();
    s.n_layer = 0;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "model.n_layer"));
}

Test(model, gpt2_init_statistics_and_determinism) {
    dt_model_spec s = {.ops = &dt_model_gpt, .n_layer = 4, .n_head = 4, .n_embd = 64,
                       .seq_len = 32, .vocab_size = 250, .vocab_pad_multiple = 64};
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    float *a = malloc(l.n_params * sizeof(float)), *b = malloc(l.n_params * sizeof(float));
    dt_model_init_params(&l, 42, a);
    dt_model_init_params(&l, 42, b);
    cr_assert_arr_eq(a, b, l.n_params * sizeof(float), "same seed, same parameters");
    for (int i = 0; i < l.n_tensors; i++) {
        const dt_tensor_info *t = &l.tensors[i];
        double sum = 0, sq = 0;
        for (size_t j = 0; j < t->numel; j++) {
            sum += a[t->offset + j];
            sq += (double)a[t->offset + j] * a[t->offset + j];
        }
        double mean = sum / (double)t->numel, std = sqrt(sq / (double)t->numel - mean * mean);
        if (strstr(t->name, "ln_") && strstr(t->name, "weight")) cr_assert_eq(mean, 1.0);
        else if (strstr(t->name, "bias")) cr_assert_eq(sq, 0.0);
        else if (strstr(t->name, "c_proj.weight")) cr_assert_float_eq(std, 0.02 / sqrt(8.0), 0.002, "%s", t->name);
        else if (strcmp(t->name, "wte.weight") != 0) cr_assert_float_eq(std, 0.02, 0.002, "%s std %g", t->name, std);
    }
    int w = dt_model_find(&l, "wte.weight");
    for (size_t j = 250 * 64; j < 256 * 64; j++) cr_assert_eq(a[l.tensors[w].offset + j], 0.0f);
    dt_model_init_params(&l, 43, b);
    cr_assert(memcmp(a, b, l.n_params * sizeof(float)) != 0, "another seed differs");
    free(a);
    free(b);
    dt_model_layout_free(&l);
}

Test(model, flops_per_token) {
    dt_model_spec s = gpt2_124m();
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    double n = 124439808.0 - 1024.0 * 768.0;
    cr_assert_float_eq(dt_model_flops_per_token(&l), 6 * n + 12.0 * 12 * 768 * 1024, 1.0);
    dt_model_layout_free(&l);
}

Test(model, mlp_layout) {
    dt_model_spec s = {.ops = &dt_model_mlp, .in_dim = 10, .hidden_dim = 7, .n_hidden_layers = 2,
                       .n_classes = 3};
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    cr_assert_eq(l.n_params, (10 * 7 + 7) + (7 * 7 + 7) + (7 * 3 + 3));
    cr_assert_eq(l.n_units, 3);
    dt_model_layout_free(&l);
}

/* ---- the registry ---------------------------------------------------------- */

/* The spec a model gets from its config defaults (a token model's vocabulary 0
 * becomes 256, as for text data). */
static dt_model_spec default_spec(const dt_model_ops *ops) {
    dt_model_spec s = {.ops = ops};
    for (int i = 0; i < ops->n_keys; i++) {
        const dt_model_key *k = &ops->keys[i];
        dt_model_key_set(&s, k, k->kind == DT_MODEL_KEY_BOOL ? !strcmp(k->def, "true") : strtod(k->def, NULL));
    }
    if (ops->data == DT_MODEL_DATA_TOKENS && s.vocab_size == 0) s.vocab_size = 256;
    return s;
}

Test(registry, every_model_fills_the_slots_the_trainer_needs) {
    cr_assert_geq(dt_model_count(), 2);
    cr_assert_null(dt_model_at(dt_model_count()));
    cr_assert_null(dt_model_lookup("no-such-model"));
    for (int m = 0; m < dt_model_count(); m++) {
        const dt_model_ops *o = dt_model_at(m);
        cr_assert_not_null(o->name);
        cr_assert_eq(dt_model_lookup(o->name), o, "%s is found by its name", o->name);
        for (int k = 0; k < m; k++) cr_assert_str_neq(dt_model_at(k)->name, o->name, "names are unique");
        cr_assert(o->help && o->keys && o->n_keys > 0, "%s: help and config keys", o->name);
        cr_assert(o->validate && o->build && o->init_params && o->flops_per_token && o->describe,
                  "%s: layout slots", o->name);
        cr_assert(o->arena_slots && o->arena_sizes && o->forward && o->backward && o->export_shape,
                  "%s: compute and export slots", o->name);
        if (o->data == DT_MODEL_DATA_FEATURES)
            cr_assert_not_null(o->synthetic_batch, "%s: feature data needs its synthetic samples", o->name);
        for (int i = 0; i < o->n_keys; i++) {
            const dt_model_key *k = &o->keys[i];
            cr_assert(!strncmp(k->path, "model.", 6), "%s: %s is under model.", o->name, k->path);
            cr_assert(k->offset + dt_model_key_size(k) <= sizeof(dt_model_spec) && k->offset >= sizeof(void *),
                      "%s: %s is a field of the spec", o->name, k->path);
            if (k->kind == DT_MODEL_KEY_FLOAT)
                cr_assert_eq(k->offset % sizeof(double), 0, "%s: %s: a double field, aligned", o->name, k->path);
            if (k->kind == DT_MODEL_KEY_BOOL) {
                cr_assert(!strcmp(k->def, "true") || !strcmp(k->def, "false"), "%s: %s: a bool default", o->name,
                          k->path);
                continue;
            }
            char *end;
            double def = strtod(k->def, &end);
            cr_assert(*end == '\0' && (k->kind == DT_MODEL_KEY_FLOAT || def == floor(def)),
                      "%s: %s: default %s is a %s", o->name, k->path, k->def,
                      k->kind == DT_MODEL_KEY_FLOAT ? "number" : "integer");
            cr_assert(def >= k->min && def <= k->max, "%s: %s default in its bounds", o->name, k->path);
        }
    }
}

/* A model whose sizes are its own (in spec.priv), as a new model file would keep
 * them: nothing in model.h names them, yet layout, copy and keys work. */
typedef struct toy_sizes {
    int width, depth;
} toy_sizes;
DT_MODEL_PRIV_FITS(toy_sizes);
static const dt_model_key toy_keys[] = {
    {"model.toy_width", DT_MODEL_PRIV_KEY(toy_sizes, width), 1, 4096, "4", "width", DT_MODEL_KEY_INT},
    {"model.toy_depth", DT_MODEL_PRIV_KEY(toy_sizes, depth), 1, 64, "2", "layers", DT_MODEL_KEY_INT},
};
static dt_status_t toy_validate(const dt_model_spec *s) {
    const toy_sizes *z = DT_MODEL_PRIV(s, const toy_sizes);
    if (z->width < 1) return dt_error(DT_STATUS_CONFIG, "model.toy_width: expected >= 1, got %d", z->width);
    return DT_STATUS_OK;
}
static void toy_build(dt_model_layout *l) {
    const toy_sizes *z = DT_MODEL_PRIV(&l->spec, const toy_sizes);
    l->seq_len = 1;
    l->in_features = z->width;
    for (int i = 0; i < z->depth; i++)
        dt_model_add_tensor(l, i, 1, DT_MODEL_INIT_NORMAL, 2, (const int64_t[]){z->width, z->width}, "w.%d", i);
}
static const dt_model_ops toy_ops = {.name = "toy", .help = "test", .keys = toy_keys, .n_keys = 2,
                                     .validate = toy_validate, .build = toy_build};

Test(model, a_model_keeps_its_own_sizes_in_the_spec_priv_area) {
    dt_model_spec s = {.ops = &toy_ops};
    DT_MODEL_PRIV(&s, toy_sizes)->width = 5;
    DT_MODEL_PRIV(&s, toy_sizes)->depth = 3;
    s.priv[DT_MODEL_PRIV_BYTES - 1] = 0x5a; /* not a key: not copied */
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(l.n_tensors, 3);
    cr_assert_eq(l.n_units, 3);
    cr_assert_eq(l.n_params, 75u);
    cr_assert_eq(l.tensors[2].offset, 50u);
    dt_model_layout_free(&l);
    dt_model_spec d;
    memset(&d, 0xff, sizeof d);
    dt_model_spec_copy(&s, &d);
    cr_assert_eq(d.ops, &toy_ops);
    cr_assert_eq(DT_MODEL_PRIV(&d, toy_sizes)->width, 5);
    cr_assert_eq(DT_MODEL_PRIV(&d, toy_sizes)->depth, 3);
    cr_assert_eq(d.priv[DT_MODEL_PRIV_BYTES - 1], 0, "only the model's keys are copied");
    cr_assert_eq(d.n_layer, 0, "named fields the model has no key for are 0");
    DT_MODEL_PRIV(&s, toy_sizes)->width = 0;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "model.toy_width"), "%s", dt_error_detail());
}

Test(registry, layouts_tile_the_buffer_and_initialise_deterministically) {
    dt_device_t *dev = NULL;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 1), DT_STATUS_OK);
    for (int m = 0; m < dt_model_count(); m++) {
        const dt_model_ops *o = dt_model_at(m);
        dt_model_spec s = default_spec(o);
        dt_model_layout l;
        cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK, "%s: %s", o->name, dt_error_detail());
        cr_assert_eq(l.spec.ops, o);
        cr_assert_gt(l.n_tensors, 0);
        cr_assert_geq(l.seq_len, 1, "%s: positions per sample", o->name);
        if (o->data == DT_MODEL_DATA_FEATURES) cr_assert_gt(l.in_features, 0, "%s: features per sample", o->name);
        if (o->logits_slot >= 0) cr_assert_gt(l.vocab_padded, 0, "%s: logits width", o->name);
        /* tensors follow each other in order, units are runs of them, in order */
        size_t next = 0;
        for (int i = 0; i < l.n_tensors; i++) {
            const dt_tensor_info *t = &l.tensors[i];
            cr_assert_eq(t->offset, next, "%s: %s starts where the previous ends", o->name, t->name);
            cr_assert(i == 0 || t->unit == l.tensors[i - 1].unit || t->unit == l.tensors[i - 1].unit + 1,
                      "%s: %s: units in order", o->name, t->name);
            cr_assert_gt(t->numel, 0);
            int64_t shape[2];
            int nd;
            o->export_shape(&l, i, shape, &nd);
            cr_assert(nd >= 1 && nd <= 2, "%s: %s exported as 1 or 2 dims", o->name, t->name);
            next += t->numel;
        }
        cr_assert_eq(next, l.n_params);
        next = 0;
        for (int u = 0; u < l.n_units; u++) {
            cr_assert_eq(l.units[u].offset, next, "%s: unit %d starts where the previous ends", o->name, u);
            cr_assert_gt(l.units[u].numel, 0);
            next += l.units[u].numel;
        }
        cr_assert_eq(next, l.n_params, "%s: the units cover the buffer", o->name);
        cr_assert_leq(dt_model_unpadded_params(&l), l.n_params);
        cr_assert_gt(dt_model_flops_per_token(&l), 0, "%s: FLOPs per token", o->name);
        char line[512] = "";
        o->describe(&l, "", line, sizeof line);
        cr_assert(!strncmp(line, o->name, strlen(o->name)), "%s: the line names the model: %s", o->name, line);

        float *a = malloc(l.n_params * sizeof(float)), *b = malloc(l.n_params * sizeof(float));
        dt_model_init_params(&l, 7, a);
        dt_model_init_params(&l, 7, b);
        cr_assert_arr_eq(a, b, l.n_params * sizeof(float), "%s: same seed, same parameters", o->name);
        dt_model_init_params(&l, 8, b);
        cr_assert(memcmp(a, b, l.n_params * sizeof(float)) != 0, "%s: another seed differs", o->name);
        /* any range alone gives the same values as the whole buffer (ranks initialise what they hold) */
        size_t cuts[][2] = {{0, l.n_params}, {0, 1}, {l.n_params - 1, 1}, {l.n_params / 3, l.n_params / 2},
                            {7, l.n_params / 5}, {l.n_params / 2, 0}};
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
            memset(b, 0xff, l.n_params * sizeof(float));
            dt_model_init_range(&l, 7, cuts[c][0], cuts[c][1], b);
            cr_assert_arr_eq(b, a + cuts[c][0], cuts[c][1] * sizeof(float), "%s: range [%zu, +%zu)", o->name,
                             cuts[c][0], cuts[c][1]);
            if (cuts[c][1] < l.n_params) cr_assert_eq(((uint32_t *)b)[cuts[c][1]], 0xffffffffu, "writes only the range");
        }
        free(a);
        free(b);

        /* the arena: slot 3 holds the losses, logits in a real slot, net.c sums the slots */
        int ns = o->arena_slots(&l);
        cr_assert_gt(ns, DT_NET_SLOT_LOSSES);
        cr_assert_lt(o->logits_slot, ns);
        size_t *sizes = calloc((size_t)ns, sizeof *sizes), sum = 0;
        o->arena_sizes(dev, &l, 2, sizes);
        cr_assert_eq(sizes[DT_NET_SLOT_LOSSES], 2 * (size_t)l.seq_len * sizeof(float), "%s: losses", o->name);
        for (int i = 0; i < ns; i++) sum += (sizes[i] + 63) & ~(size_t)63;
        cr_assert_eq(dt_net_arena_bytes(dev, &l, 2), sum);
        free(sizes);
        dt_model_layout_free(&l);
    }
    dt_device_free(dev);
}

Test(registry, unknown_model_type_is_a_config_error_listing_the_models) {
    dt_config_t cfg;
    cr_assert_eq(dt_config_load_string("{\"model\": {\"type\": \"mamba\"}}", "x.json", NULL, 0, &cfg),
                 DT_STATUS_CONFIG);
    const char *e = dt_config_errors(&cfg);
    cr_assert(strstr(e, "x.json: model.type: expected one of"), "%s", e);
    for (int m = 0; m < dt_model_count(); m++) {
        char quoted[64];
        snprintf(quoted, sizeof quoted, "\"%s\"", dt_model_at(m)->name);
        cr_assert(strstr(e, quoted), "lists %s: %s", quoted, e);
    }
    dt_config_free(&cfg);
    /* each name picks its model */
    for (int m = 0; m < dt_model_count(); m++) {
        char kv[64];
        snprintf(kv, sizeof kv, "model.type=%s", dt_model_at(m)->name);
        const char *ov[] = {kv, "data.train=x.txt"};
        cr_assert_eq(dt_config_load_string("{}", "y.json", ov, 2, &cfg), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
        cr_assert_eq(cfg.model.ops, dt_model_at(m));
        dt_config_free(&cfg);
    }
}

Test(sample, byte_ids_print_as_the_trainer_and_dtrun_sample_print_them) {
    cr_assert_eq(dt_sample_char('a', 1), 'a');
    cr_assert_eq(dt_sample_char('\n', 1), '\n');
    cr_assert_eq(dt_sample_char('\t', 0), '\t');
    cr_assert_eq(dt_sample_char(7, 0), '?');
    cr_assert_eq(dt_sample_char(127, 1), '?'); /* the trainer: printable ASCII only */
    cr_assert_eq(dt_sample_char(200, 1), '?');
    cr_assert_eq(dt_sample_char(200, 0), 200); /* dtrun sample: raw bytes (UTF-8 survives) */
    cr_assert_eq(dt_sample_char(300, 0), '?');
}
