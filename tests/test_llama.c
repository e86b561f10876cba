/*
 * test_llama.c - the llama model (runtime/model/llama.c): its float and bool config
 * keys through config, spec copy and the checkpoint's meta.json; its tensor table
 * (Hugging Face's names, shapes, offsets, units; tied and untied heads, attention
 * biases); Llama-3-8B's exact parameter count; validation naming the bad key.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/config/config.h"
#include "runtime/model/model.h"

static void quiet(void) { dt_log_set_level(DT_LOG_OFF); }
TestSuite(llama, .init = quiet, .timeout = 60);

/* The value of key path in spec (through the model's key table). */
static double get(const dt_model_spec *s, const char *path) {
    const dt_model_key *k = dt_model_key_find(s->ops, path);
    cr_assert_not_null(k, "no key %s", path);
    return dt_model_key_get(s, k);
}

static void set(dt_model_spec *s, const char *path, double v) {
    const dt_model_key *k = dt_model_key_find(s->ops, path);
    cr_assert_not_null(k, "no key %s", path);
    dt_model_key_set(s, k, v);
}

/* A spec from JSON text under "model" (type llama), as the trainer builds it. */
static dt_status_t spec_from(const char *model_json, dt_model_spec *s, dt_config_t *cfg) {
    char json[2048];
    snprintf(json, sizeof json, "{\"model\": {\"type\": \"llama\", %s}, \"data\": {\"train\": \"x.txt\"}}",
             model_json);
    dt_status_t st = dt_config_load_string(json, "x.json", NULL, 0, cfg);
    if (st == DT_STATUS_OK) dt_model_spec_copy(&cfg->model, s);
    return st;
}

/* A small llama: vocab 100 padded to 128, hidden 32, 2 layers, 4 heads, 2 kv heads
 * of 8, intermediate 48. */
static dt_model_spec tiny(int tied, int bias) {
    dt_model_spec s;
    dt_config_t cfg;
    char m[512];
    snprintf(m, sizeof m,
             "\"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": 2, \"intermediate_size\": 48, \"seq_len\": 16, \"vocab_size\": 100, "
             "\"tie_word_embeddings\": %s, \"attention_bias\": %s",
             tied ? "true" : "false", bias ? "true" : "false");
    cr_assert_eq(spec_from(m, &s, &cfg), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
    return s;
}

/* ---- keys ------------------------------------------------------------------ */

Test(llama, float_and_bool_keys_parse_dump_and_copy) {
    dt_model_spec s;
    dt_config_t cfg;
    cr_assert_eq(spec_from("\"rope_theta\": 500000.5, \"rms_norm_eps\": 1e-05, "
                           "\"tie_word_embeddings\": true, \"rope_scaling\": {\"factor\": 8}",
                           &s, &cfg),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(get(&s, "model.rope_theta"), 500000.5);
    cr_assert_eq(get(&s, "model.rms_norm_eps"), 1e-05);
    cr_assert_eq(get(&s, "model.tie_word_embeddings"), 1.0);
    cr_assert_eq(get(&s, "model.attention_bias"), 0.0, "the default");
    cr_assert_eq(get(&s, "model.rope_scaling.factor"), 8.0);
    cr_assert_eq(get(&s, "model.rope_scaling.high_freq_factor"), 4.0, "the default");
    /* the dump writes floats as numbers and bools as true/false, and reloads */
    char *d = dt_config_dump_json(&cfg);
    cr_assert(strstr(d, "\"rope_theta\":\t500000.5"), "%s", d);
    cr_assert(strstr(d, "\"tie_word_embeddings\":\ttrue"), "%s", d);
    cr_assert(strstr(d, "\"attention_bias\":\tfalse"), "%s", d);
    dt_config_t back;
    cr_assert_eq(dt_config_load_string(d, "dump.json", NULL, 0, &back), DT_STATUS_OK, "%s", dt_config_errors(&back));
    dt_model_spec s2;
    dt_model_spec_copy(&back.model, &s2);
    cr_assert_eq(memcmp(&s, &s2, sizeof s), 0, "the spec survives dump and reload");
    free(d);
    dt_config_free(&back);
    dt_config_free(&cfg);

    /* an override on the command line parses the same */
    const char *ov[] = {"model.type=llama", "model.rope_theta=1e6", "model.attention_bias=true", "data.train=x.txt"};
    cr_assert_eq(dt_config_load_string("{}", "y.json", ov, 4, &cfg), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    dt_model_spec_copy(&cfg.model, &s);
    cr_assert_eq(get(&s, "model.rope_theta"), 1e6);
    cr_assert_eq(get(&s, "model.attention_bias"), 1.0);
    dt_config_free(&cfg);
}

Test(llama, bool_keys_take_true_or_false_only_and_floats_their_bounds) {
    dt_model_spec s;
    dt_config_t cfg;
    /* 1/0 are not bools: JSON's true/false only, as every bool key of the table */
    cr_assert_eq(spec_from("\"tie_word_embeddings\": 1", &s, &cfg), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_config_errors(&cfg), "model.tie_word_embeddings: expected true or false, found 1"), "%s",
              dt_config_errors(&cfg));
    dt_config_free(&cfg);
    cr_assert_eq(spec_from("\"attention_bias\": \"yes\"", &s, &cfg), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_config_errors(&cfg), "model.attention_bias: expected true or false"), "%s",
              dt_config_errors(&cfg));
    dt_config_free(&cfg);
    cr_assert_eq(spec_from("\"rope_theta\": 0.5", &s, &cfg), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_config_errors(&cfg), "model.rope_theta: expected a number in [1, 1e+12], found 0.5"), "%s",
              dt_config_errors(&cfg));
    dt_config_free(&cfg);
    cr_assert_eq(spec_from("\"rms_norm_eps\": true", &s, &cfg), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_config_errors(&cfg), "model.rms_norm_eps: expected a number"), "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
    /* an int key still wants an integer */
    cr_assert_eq(spec_from("\"hidden_size\": 32.5", &s, &cfg), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_config_errors(&cfg), "model.hidden_size: expected an integer"), "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
}

Test(llama, rules_across_keys_name_the_key) {
    dt_model_spec s;
    dt_config_t cfg;
    struct {
        const char *json, *err;
    } cases[] = {
        {"\"num_attention_heads\": 4, \"num_key_value_heads\": 3",
         "model.num_key_value_heads: expected a divisor of model.num_attention_heads (4), found 3"},
        {"\"hidden_size\": 30, \"num_attention_heads\": 4",
         "model.hidden_size: expected a multiple of model.num_attention_heads (4) when model.head_dim is 0, found 30"},
        {"\"hidden_size\": 36, \"num_attention_heads\": 4", "model.head_dim: expected an even size from 2 to 256"},
        {"\"head_dim\": 7", "model.head_dim: expected an even size from 2 to 256 (RoPE rotates pairs), found 7"},
        {"\"seq_len\": 512, \"max_position_embeddings\": 256",
         "model.seq_len: expected at most model.max_position_embeddings (256), found 512"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(spec_from(cases[i].json, &s, &cfg), DT_STATUS_CONFIG, "%s", cases[i].json);
        cr_assert(strstr(dt_config_errors(&cfg), cases[i].err), "%s:\n%s", cases[i].json, dt_config_errors(&cfg));
        dt_config_free(&cfg);
    }
    /* validate names the key too (a spec not from a config: sample, export) */
    s = tiny(0, 0);
    dt_model_layout l;
    set(&s, "model.num_key_value_heads", 3);
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "model.num_key_value_heads"), "%s", dt_error_detail());
    s = tiny(0, 0);
    s.vocab_size = 0;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "model.vocab_size: expected an integer > 0, found 0"), "%s", dt_error_detail());
    s = tiny(0, 0);
    set(&s, "model.rope_theta", 0);
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "model.rope_theta"), "%s", dt_error_detail());
    /* a vocabulary beyond uint16 is the model's to have (Llama 3: 128256) */
    s = tiny(0, 0);
    s.vocab_size = 128256;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(l.vocab_padded, 128256);
    dt_model_layout_free(&l);
}

/* config -> spec -> meta.json -> spec: every key of every kind comes back exactly. */
Test(llama, keys_round_trip_through_the_checkpoint_meta_json) {
    char dir[64] = "/tmp/dt-llama-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    dt_model_spec s;
    dt_config_t cfg;
    cr_assert_eq(spec_from("\"hidden_size\": 32, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, "
                           "\"num_key_value_heads\": 1, \"intermediate_size\": 40, \"seq_len\": 8, "
                           "\"vocab_size\": 70, \"rope_theta\": 123456.789, \"rms_norm_eps\": 9.999999747378752e-06, "
                           "\"attention_bias\": true, \"tie_word_embeddings\": true, "
                           "\"rope_scaling\": {\"factor\": 32, \"low_freq_factor\": 0.1, "
                           "\"high_freq_factor\": 4.25, \"original_max_position_embeddings\": 4096}",
                           &s, &cfg),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK, "%s", dt_error_detail());
    float *p = calloc(l.n_params, sizeof(float));
    dt_ckpt_range r = {.buffer = "params", .offset = 0, .count = l.n_params, .data = p};
    dt_ckpt_save_args a = {.dir = dir, .step = 1, .world_size = 1, .strategy = "ddp", .layout = &l,
                           .ranges = &r, .n_ranges = 1};
    cr_assert_eq(dt_ckpt_save(&a, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_OK, "%s", dt_error_detail());
    dt_model_spec back;
    cr_assert_eq(dt_ckpt_model_spec(c, &back), DT_STATUS_OK, "%s", dt_error_detail());
    dt_ckpt_close(c);
    cr_assert_eq(back.ops, &dt_model_llama);
    for (int i = 0; i < dt_model_llama.n_keys; i++) {
        const dt_model_key *k = &dt_model_llama.keys[i];
        cr_assert_eq(dt_model_key_get(&back, k), dt_model_key_get(&l.spec, k), "%s: %.17g after meta.json, %.17g before",
                     k->path, dt_model_key_get(&back, k), dt_model_key_get(&l.spec, k));
    }
    cr_assert_eq(get(&back, "model.rope_theta"), 123456.789);
    cr_assert_eq(get(&back, "model.rms_norm_eps"), 9.999999747378752e-06, "fp32's 1e-5 as a double, to the last bit");
    cr_assert_eq(get(&back, "model.rope_scaling.low_freq_factor"), 0.1);
    cr_assert_eq(get(&back, "model.tie_word_embeddings"), 1.0);
    cr_assert_eq(get(&back, "model.rope_scaling.original_max_position_embeddings"), 4096.0);
    /* the spec from meta.json builds the same table */
    dt_model_layout l2;
    cr_assert_eq(dt_model_layout_init(&back, &l2), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(l2.n_params, l.n_params);
    cr_assert_eq(l2.n_tensors, l.n_tensors);
    dt_model_layout_free(&l2);
    /* meta.json stores the bools as JSON bools */
    char path[256], text[16384];
    snprintf(path, sizeof path, "%s/step_00000001/meta.json", dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    cr_assert(strstr(text, "\"attention_bias\":\ttrue"), "%s", text);
    cr_assert(strstr(text, "\"rope_theta\":\t123456.789"), "%s", text);
    free(p);
    dt_model_layout_free(&l);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* ---- the tensor table ------------------------------------------------------ */

typedef struct {
    const char *name;
    int64_t d0, d1; /* d1 0: one dim */
    int unit, decay;
} want_t;

static void assert_table(const dt_model_layout *l, const want_t *w, int n) {
    cr_assert_eq(l->n_tensors, n, "%d tensors, expected %d", l->n_tensors, n);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const dt_tensor_info *t = &l->tensors[i];
        cr_assert_str_eq(t->name, w[i].name, "tensor %d", i);
        cr_assert_eq(t->ndim, w[i].d1 ? 2 : 1, "%s", t->name);
        cr_assert_eq(t->shape[0], w[i].d0, "%s", t->name);
        if (w[i].d1) cr_assert_eq(t->shape[1], w[i].d1, "%s", t->name);
        cr_assert_eq(t->offset, off, "%s at %zu, expected %zu", t->name, t->offset, off);
        cr_assert_eq(t->unit, w[i].unit, "%s", t->name);
        cr_assert_eq(t->decay, w[i].decay, "%s", t->name);
        off += (size_t)w[i].d0 * (size_t)(w[i].d1 ? w[i].d1 : 1);
    }
    cr_assert_eq(l->n_params, off);
}

Test(llama, table_untied_without_biases_has_hf_names_in_order) {
    dt_model_spec s = tiny(0, 0);
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK, "%s", dt_error_detail());
    want_t w[] = {
        {"model.embed_tokens.weight", 128, 32, 0, 0},
        {"model.layers.0.input_layernorm.weight", 32, 0, 1, 0},
        {"model.layers.0.self_attn.q_proj.weight", 32, 32, 1, 1},
        {"model.layers.0.self_attn.k_proj.weight", 16, 32, 1, 1},
        {"model.layers.0.self_attn.v_proj.weight", 16, 32, 1, 1},
        {"model.layers.0.self_attn.o_proj.weight", 32, 32, 1, 1},
        {"model.layers.0.post_attention_layernorm.weight", 32, 0, 1, 0},
        {"model.layers.0.mlp.gate_proj.weight", 48, 32, 1, 1},
        {"model.layers.0.mlp.up_proj.weight", 48, 32, 1, 1},
        {"model.layers.0.mlp.down_proj.weight", 32, 48, 1, 1},
        {"model.layers.1.input_layernorm.weight", 32, 0, 2, 0},
        {"model.layers.1.self_attn.q_proj.weight", 32, 32, 2, 1},
        {"model.layers.1.self_attn.k_proj.weight", 16, 32, 2, 1},
        {"model.layers.1.self_attn.v_proj.weight", 16, 32, 2, 1},
        {"model.layers.1.self_attn.o_proj.weight", 32, 32, 2, 1},
        {"model.layers.1.post_attention_layernorm.weight", 32, 0, 2, 0},
        {"model.layers.1.mlp.gate_proj.weight", 48, 32, 2, 1},
        {"model.layers.1.mlp.up_proj.weight", 48, 32, 2, 1},
        {"model.layers.1.mlp.down_proj.weight", 32, 48, 2, 1},
        {"model.norm.weight", 32, 0, 3, 0},
        {"lm_head.weight", 128, 32, 3, 1},
    };
    assert_table(&l, w, (int)(sizeof w / sizeof w[0]));
    cr_assert_eq(l.n_units, 4);
    cr_assert_eq(l.tied_head, 0);
    cr_assert_eq(l.vocab_padded, 128);
    cr_assert_eq(l.seq_len, 16);
    /* q, k, v are one fused (Q + 2KV, C) matmul weight; gate, up one (2I, C) */
    int q = dt_model_find(&l, "model.layers.1.self_attn.q_proj.weight");
    cr_assert_eq(l.tensors[q + 1].offset, l.tensors[q].offset + 32 * 32);
    cr_assert_eq(l.tensors[q + 2].offset, l.tensors[q].offset + 48 * 32);
    int g = dt_model_find(&l, "model.layers.1.mlp.gate_proj.weight");
    cr_assert_eq(l.tensors[g + 1].offset, l.tensors[g].offset + 48 * 32);
    /* exported by name with the real vocabulary's rows, never transposed */
    int64_t shape[2];
    int nd;
    for (int i = 0; i < l.n_tensors; i++) {
        cr_assert_eq(dt_model_llama.export_shape(&l, i, shape, &nd), 0, "%s is not transposed", l.tensors[i].name);
        int vocab = !strcmp(l.tensors[i].name, "lm_head.weight") || !strcmp(l.tensors[i].name, "model.embed_tokens.weight");
        cr_assert_eq(shape[0], vocab ? 100 : l.tensors[i].shape[0], "%s", l.tensors[i].name);
    }
    cr_assert_eq(dt_model_unpadded_params(&l), l.n_params - 2 * 28 * 32);
    dt_model_layout_free(&l);
}

Test(llama, table_tied_with_biases) {
    dt_model_spec s = tiny(1, 1);
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK, "%s", dt_error_detail());
    want_t w[] = {
        {"model.embed_tokens.weight", 128, 32, 0, 0},
        {"model.layers.0.input_layernorm.weight", 32, 0, 1, 0},
        {"model.layers.0.self_attn.q_proj.weight", 32, 32, 1, 1},
        {"model.layers.0.self_attn.k_proj.weight", 16, 32, 1, 1},
        {"model.layers.0.self_attn.v_proj.weight", 16, 32, 1, 1},
        {"model.layers.0.self_attn.q_proj.bias", 32, 0, 1, 0},
        {"model.layers.0.self_attn.k_proj.bias", 16, 0, 1, 0},
        {"model.layers.0.self_attn.v_proj.bias", 16, 0, 1, 0},
        {"model.layers.0.self_attn.o_proj.weight", 32, 32, 1, 1},
        {"model.layers.0.post_attention_layernorm.weight", 32, 0, 1, 0},
        {"model.layers.0.mlp.gate_proj.weight", 48, 32, 1, 1},
        {"model.layers.0.mlp.up_proj.weight", 48, 32, 1, 1},
        {"model.layers.0.mlp.down_proj.weight", 32, 48, 1, 1},
        {"model.layers.1.input_layernorm.weight", 32, 0, 2, 0},
        {"model.layers.1.self_attn.q_proj.weight", 32, 32, 2, 1},
        {"model.layers.1.self_attn.k_proj.weight", 16, 32, 2, 1},
        {"model.layers.1.self_attn.v_proj.weight", 16, 32, 2, 1},
        {"model.layers.1.self_attn.q_proj.bias", 32, 0, 2, 0},
        {"model.layers.1.self_attn.k_proj.bias", 16, 0, 2, 0},
        {"model.layers.1.self_attn.v_proj.bias", 16, 0, 2, 0},
        {"model.layers.1.self_attn.o_proj.weight", 32, 32, 2, 1},
        {"model.layers.1.post_attention_layernorm.weight", 32, 0, 2, 0},
        {"model.layers.1.mlp.gate_proj.weight", 48, 32, 2, 1},
        {"model.layers.1.mlp.up_proj.weight", 48, 32, 2, 1},
        {"model.layers.1.mlp.down_proj.weight", 32, 48, 2, 1},
        {"model.norm.weight", 32, 0, 3, 0},
    };
    assert_table(&l, w, (int)(sizeof w / sizeof w[0]));
    cr_assert_eq(l.tied_head, 1, "the head is embed_tokens");
    cr_assert_eq(dt_model_find(&l, "lm_head.weight"), -1);
    cr_assert_eq(dt_model_unpadded_params(&l), l.n_params - 28 * 32);
    dt_model_layout_free(&l);
}

Test(llama, derived_sizes_are_resolved_in_the_layout) {
    dt_model_spec s;
    dt_config_t cfg;
    cr_assert_eq(spec_from("\"hidden_size\": 96, \"num_attention_heads\": 6, \"seq_len\": 8, \"vocab_size\": 64",
                           &s, &cfg),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
    cr_assert_eq(get(&s, "model.num_key_value_heads"), 0.0, "0 in the config");
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(get(&l.spec, "model.num_key_value_heads"), 6.0, "= num_attention_heads");
    cr_assert_eq(get(&l.spec, "model.head_dim"), 16.0, "= hidden_size / num_attention_heads");
    cr_assert_eq(get(&l.spec, "model.intermediate_size"), 256.0, "8/3 * 96 = 256, a multiple of 256");
    cr_assert_eq(l.tensors[dt_model_find(&l, "model.layers.3.mlp.down_proj.weight")].shape[1], 256);
    dt_model_layout_free(&l);
    /* Llama 2 7B's width: 11008 */
    set(&s, "model.hidden_size", 4096);
    set(&s, "model.num_attention_heads", 32);
    set(&s, "model.num_hidden_layers", 1);
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(get(&l.spec, "model.intermediate_size"), 11008.0);
    dt_model_layout_free(&l);
    /* head_dim given apart from hidden / heads (Gemma-like shapes are llamas too) */
    s = tiny(0, 0);
    set(&s, "model.head_dim", 16);
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(l.tensors[dt_model_find(&l, "model.layers.0.self_attn.q_proj.weight")].shape[0], 64);
    cr_assert_eq(l.tensors[dt_model_find(&l, "model.layers.0.self_attn.k_proj.weight")].shape[0], 32);
    cr_assert_eq(l.tensors[dt_model_find(&l, "model.layers.0.self_attn.o_proj.weight")].shape[1], 64);
    dt_model_layout_free(&l);
}

/* Llama-3-8B: vocab 128256, hidden 4096, 32 layers, 32 heads, 8 kv heads,
 * intermediate 14336, untied: 8,030,261,248 parameters (its safetensors index). */
Test(llama, llama3_8b_parameter_count_is_exact) {
    dt_model_spec s = tiny(0, 0);
    set(&s, "model.hidden_size", 4096);
    set(&s, "model.num_hidden_layers", 32);
    set(&s, "model.num_attention_heads", 32);
    set(&s, "model.num_key_value_heads", 8);
    set(&s, "model.intermediate_size", 14336);
    set(&s, "model.rope_theta", 500000);
    set(&s, "model.max_position_embeddings", 8192);
    s.vocab_size = 128256;
    s.seq_len = 8192;
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(l.n_params, 8030261248u, "%zu", l.n_params);
    cr_assert_eq(dt_model_unpadded_params(&l), 8030261248u);
    cr_assert_eq(l.n_tensors, 1 + 32 * 9 + 2);
    cr_assert_eq(l.n_units, 34);
    /* FLOPs: 6 per matmul parameter (all but the embedding lookup) + attention */
    double n = 8030261248.0 - 128256.0 * 4096;
    cr_assert_float_eq(dt_model_flops_per_token(&l), 6 * n + 12.0 * 32 * 128 * 32 * 8192, 1.0);
    char line[512];
    dt_model_llama.describe(&l, "", line, sizeof line);
    cr_assert(strstr(line, "8030261248 parameters"), "%s", line);
    dt_model_layout_free(&l);
}

Test(llama, init_is_hf_normal_002_norms_one_padding_zero) {
    dt_model_spec s = tiny(0, 1);
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK, "%s", dt_error_detail());
    float *a = malloc(l.n_params * sizeof(float));
    dt_model_init_params(&l, 5, a);
    for (int i = 0; i < l.n_tensors; i++) {
        const dt_tensor_info *t = &l.tensors[i];
        double sum = 0, sq = 0;
        size_t rows = t->numel;
        if (strstr(t->name, "embed_tokens") || strstr(t->name, "lm_head")) rows = 100 * 32; /* real rows */
        for (size_t j = 0; j < rows; j++) sum += a[t->offset + j], sq += (double)a[t->offset + j] * a[t->offset + j];
        double mean = sum / (double)rows, std = sqrt(sq / (double)rows - mean * mean);
        if (strstr(t->name, "norm")) {
            for (size_t j = 0; j < t->numel; j++) cr_assert_eq(a[t->offset + j], 1.0f, "%s", t->name);
        } else if (strstr(t->name, "bias")) {
            cr_assert_eq(sq, 0.0, "%s", t->name);
        } else {
            cr_assert_float_eq(std, 0.02, 0.003, "%s std %g", t->name, std);
            cr_assert_float_eq(mean, 0.0, 0.003, "%s mean %g", t->name, mean);
        }
        if (rows < t->numel)
            for (size_t j = rows; j < t->numel; j++) cr_assert_eq(a[t->offset + j], 0.0f, "%s: padding rows 0", t->name);
    }
    free(a);
    dt_model_layout_free(&l);
}
