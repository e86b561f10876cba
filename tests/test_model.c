/*
 * test_model.c - tensor tables: exact parameter counts, contiguous units,
 * initialisation statistics and determinism.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/model/model.h"

static dt_model_spec gpt2_124m(void) {
    dt_model_spec s = {.type = DT_MODEL_GPT, .n_layer = 12, .n_head = 12, .n_embd = 768,
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
    dt_model_spec s = {.type = DT_MODEL_GPT, .n_layer = 3, .n_head = 2, .n_embd = 8,
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
    dt_model_spec s = {.type = DT_MODEL_GPT, .n_layer = 4, .n_head = 4, .n_embd = 64,
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
    dt_model_spec s = {.type = DT_MODEL_MLP, .in_dim = 10, .hidden_dim = 7, .n_hidden_layers = 2,
                       .n_classes = 3};
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    cr_assert_eq(l.n_params, (10 * 7 + 7) + (7 * 7 + 7) + (7 * 3 + 3));
    cr_assert_eq(l.n_units, 3);
    dt_model_layout_free(&l);
}
