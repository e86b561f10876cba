/*
 * test_hf_config.c - Hugging Face config.json files written here, read into specs
 * (runtime/model/hf_config.h): gpt2 -> gpt (n_positions the default and bound of
 * seq_len), llama / mistral / qwen2 -> llama with every key by kind and nested paths
 * (rope_scaling.factor), Qwen2's implied q/k/v biases, sliding windows recorded; and
 * the errors: missing file, unsupported model_type (the supported ones listed), a
 * rope_scaling, activation or epsilon dtrun does not compute, a key of the wrong type.
 * Then the way back: dt_hf_config_json's text read again gives the same spec.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/model/hf_config.h"

static char dir[64];

static void write_cfg(const char *json) {
    snprintf(dir, sizeof dir, "/tmp/dt-hfc-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char p[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fputs(json, f);
    fclose(f);
}

static double key(const dt_hf_config *h, const char *path) {
    for (int i = 0; i < h->spec.ops->n_keys; i++)
        if (!strcmp(h->spec.ops->keys[i].path, path)) return dt_model_key_get(&h->spec, &h->spec.ops->keys[i]);
    cr_assert_fail("no key %s", path);
    return 0;
}

static void expect_error(const char *json, dt_status_t st, const char *want) {
    write_cfg(json);
    dt_hf_config h;
    cr_assert_eq(dt_hf_config_read(dir, &h), st, "%s", dt_error_detail());
    cr_assert_not_null(strstr(dt_error_detail(), want), "want \"%s\" in: %s", want, dt_error_detail());
    cr_assert_not_null(strstr(dt_error_detail(), "config.json"), "names the file: %s", dt_error_detail());
}

Test(hf_config, gpt2) {
    write_cfg("{\"model_type\": \"gpt2\", \"n_embd\": 48, \"n_layer\": 3, \"n_head\": 4, \"vocab_size\": 300,"
              " \"n_positions\": 96, \"layer_norm_epsilon\": 1e-05, \"activation_function\": \"gelu_new\","
              " \"n_inner\": null, \"torch_dtype\": \"bfloat16\"}");
    dt_hf_config h;
    cr_assert_eq(dt_hf_config_read(dir, &h), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_str_eq(h.spec.ops->name, "gpt");
    cr_assert(h.spec.n_embd == 48 && h.spec.n_layer == 3 && h.spec.n_head == 4 && h.spec.vocab_size == 300);
    cr_assert(h.seq_len_default == 96 && h.max_seq_len == 96 && h.spec.seq_len == 96);
    cr_assert_str_eq(h.dtype, "bfloat16");
    cr_assert_eq(h.spec.vocab_pad_multiple, 64, "a key config.json does not have keeps its default");
}

Test(hf_config, llama_family) {
    write_cfg("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
              " \"num_key_value_heads\": 2, \"head_dim\": null, \"intermediate_size\": 160, \"rope_theta\": 500000.0,"
              " \"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": true, \"vocab_size\": 512,"
              " \"max_position_embeddings\": 1024, \"hidden_act\": \"silu\", \"attention_bias\": false,"
              " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
              " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}");
    dt_hf_config h;
    cr_assert_eq(dt_hf_config_read(dir, &h), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_str_eq(h.spec.ops->name, "llama");
    cr_assert_eq(key(&h, "model.hidden_size"), 64);
    cr_assert_eq(key(&h, "model.num_key_value_heads"), 2);
    cr_assert_eq(key(&h, "model.head_dim"), 0, "null: the default");
    cr_assert_eq(key(&h, "model.rope_theta"), 500000.0);
    cr_assert_eq(key(&h, "model.rms_norm_eps"), 1e-5);
    cr_assert_eq(key(&h, "model.tie_word_embeddings"), 1);
    cr_assert_eq(key(&h, "model.rope_scaling.factor"), 8.0, "nested path");
    cr_assert_eq(key(&h, "model.rope_scaling.original_max_position_embeddings"), 8192);
    cr_assert_eq(key(&h, "model.vocab_size"), 512);
    cr_assert_eq(h.max_seq_len, 1024);
    cr_assert_eq(h.seq_len_default, 0);

    /* the way back: the JSON dtrun writes reads again as the same keys */
    dt_model_layout l;
    h.spec.seq_len = 16;
    cr_assert_eq(dt_model_layout_init(&h.spec, &l), DT_STATUS_OK, "%s", dt_error_detail());
    char *text = dt_hf_config_json(&l, "float32");
    cr_assert_not_null(text);
    dt_hf_config back;
    char p[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
    free(text);
    cr_assert_eq(dt_hf_config_read(dir, &back), DT_STATUS_OK, "%s", dt_error_detail());
    for (int i = 0; i < h.spec.ops->n_keys; i++) {
        const dt_model_key *k = &h.spec.ops->keys[i];
        if (!strcmp(k->path, "model.seq_len") || !strcmp(k->path, "model.vocab_pad_multiple")) continue;
        double a = dt_model_key_get(&h.spec, k), b = dt_model_key_get(&back.spec, k);
        if (!strcmp(k->path, "model.head_dim")) a = 8; /* written resolved */
        cr_assert_eq(a, b, "%s: %g then %g", k->path, a, b);
    }
    dt_model_layout_free(&l);

    write_cfg("{\"model_type\": \"qwen2\", \"hidden_size\": 32, \"num_attention_heads\": 4, \"vocab_size\": 64,"
              " \"use_sliding_window\": false, \"sliding_window\": 4096}");
    cr_assert_eq(dt_hf_config_read(dir, &h), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(key(&h, "model.attention_bias"), 1, "qwen2 has q/k/v biases");
    cr_assert_eq(h.sliding_window, 0, "qwen2 without use_sliding_window: no window");
    write_cfg("{\"model_type\": \"mistral\", \"hidden_size\": 32, \"num_attention_heads\": 4, \"vocab_size\": 64,"
              " \"sliding_window\": 4096}");
    cr_assert_eq(dt_hf_config_read(dir, &h), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(h.sliding_window, 4096, "mistral's window recorded (config checks it against seq_len)");
    cr_assert_eq(key(&h, "model.attention_bias"), 0);
}

Test(hf_config, errors_name_file_and_key) {
    strcpy(dir, "/tmp/dt-hfc-none-does-not-exist");
    dt_hf_config h;
    cr_assert_eq(dt_hf_config_read(dir, &h), DT_STATUS_NOT_FOUND);
    cr_assert_not_null(strstr(dt_error_detail(), "dt-hfc-none-does-not-exist/config.json"), "%s", dt_error_detail());
    expect_error("{\"model_type\": \"bert\"}", DT_STATUS_CONFIG,
                 "model_type \"bert\": expected one of llama, mistral, qwen2, gpt2");
    expect_error("{\"hidden_size\": 4}", DT_STATUS_CONFIG, "model_type (none)");
    expect_error("[1]", DT_STATUS_CONFIG, "expected a JSON object");
    expect_error("{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}",
                 DT_STATUS_CONFIG, "rope_scaling: dtrun reads null or rope_type \"llama3\", found yarn");
    expect_error("{\"model_type\": \"llama\", \"hidden_act\": \"gelu\"}", DT_STATUS_CONFIG, "hidden_act");
    expect_error("{\"model_type\": \"llama\", \"num_attention_heads\": 2.5}", DT_STATUS_CONFIG,
                 "num_attention_heads: expected an integer");
    expect_error("{\"model_type\": \"llama\", \"tie_word_embeddings\": 1}", DT_STATUS_CONFIG,
                 "tie_word_embeddings: expected true or false");
    expect_error("{\"model_type\": \"qwen2\", \"use_sliding_window\": true}", DT_STATUS_CONFIG, "use_sliding_window");
    expect_error("{\"model_type\": \"gpt2\", \"layer_norm_epsilon\": 1e-6}", DT_STATUS_CONFIG, "layer_norm_epsilon");
    expect_error("{\"model_type\": \"gpt2\", \"activation_function\": \"relu\"}", DT_STATUS_CONFIG,
                 "activation_function");
    expect_error("{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_inner\": 100}", DT_STATUS_CONFIG, "n_inner");
    /* numbers no int holds: refused before any cast (UBSan under make fuzz,
     * tests/fuzz/seeds_hf_config/crash_*.json) */
    expect_error("{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_inner\": 1e300}", DT_STATUS_CONFIG, "n_inner");
    expect_error("{\"model_type\": \"mistral\", \"sliding_window\": 1e300}", DT_STATUS_CONFIG,
                 "sliding_window: expected an integer from 1 to 2147483647, found 1e+300");
    expect_error("{\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 4096.5}",
                 DT_STATUS_CONFIG, "sliding_window: expected an integer");
}
