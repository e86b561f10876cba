/*
 * test_lora_config.c - PEFT adapter_config.json against the config's lora section
 * (runtime/model/lora_config.h): dtrun's own export and PEFT's fixture pass; another
 * r, lora_alpha or set of target_modules is refused naming the file, the key and
 * both values; use_rslora, use_dora, bias, rank_pattern, modules_to_save, a regex
 * target_modules and fan_in_fan_out on a llama are refused naming the option.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/model/lora_config.h"

static char dir[64], path[128];

/* DIR/adapter_config.json holding json; returns its path as dt_lora_peft_config_path finds it. */
static const char *write_cfg(const char *json) {
    snprintf(dir, sizeof dir, "/tmp/dt-lcfg-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(json, f);
    fclose(f);
    static char found[256];
    cr_assert(dt_lora_peft_config_path(dir, found, sizeof found));
    cr_assert_str_eq(found, path);
    return found;
}

static const dt_lora_spec LLAMA = {.r = 4, .alpha = 8, .n_targets = 2, .targets = {"v_proj", "q_proj"}};

/* Reading and checking json against spec for model gives st, the message holding want1, want2. */
static void expect(const char *json, const dt_lora_spec *spec, const char *model, dt_status_t want, const char *want1,
                   const char *want2) {
    dt_lora_peft_config pc;
    dt_status_t st = dt_lora_peft_config_read(write_cfg(json), &pc);
    if (st == DT_STATUS_OK) st = dt_lora_peft_config_check(&pc, spec, model);
    cr_assert_eq(st, want, "%s: %s", json, dt_error_detail());
    if (want == DT_STATUS_OK) return;
    cr_assert_not_null(strstr(dt_error_detail(), path), "names the file: %s", dt_error_detail());
    cr_assert_not_null(strstr(dt_error_detail(), want1), "want \"%s\" in: %s", want1, dt_error_detail());
    if (want2) cr_assert_not_null(strstr(dt_error_detail(), want2), "want \"%s\" in: %s", want2, dt_error_detail());
}

Test(lora_config, matching_adapters_pass) {
    expect("{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\", \"v_proj\"], "
           "\"bias\": \"none\", \"fan_in_fan_out\": false, \"use_rslora\": false, \"use_dora\": false, "
           "\"rank_pattern\": {}, \"alpha_pattern\": {}, \"modules_to_save\": null}",
           &LLAMA, "llama", DT_STATUS_OK, NULL, NULL);
    /* null targets: PEFT's default for the model, which the config's resolved list is */
    expect("{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": null}", &LLAMA, "llama", DT_STATUS_OK, NULL, NULL);
    /* absent r and lora_alpha: PEFT's defaults (8, 8) */
    dt_lora_spec r8 = LLAMA;
    r8.r = 8;
    expect("{\"target_modules\": [\"q_proj\", \"v_proj\", \"q_proj\"]}", &r8, "llama", DT_STATUS_OK, NULL, NULL);
    /* gpt: HF's Conv1D layers, fan_in_fan_out true as PEFT and dtrun's export write it */
    dt_lora_spec gpt = {.r = 4, .alpha = 8, .n_targets = 1, .targets = {"c_attn"}};
    expect("{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"c_attn\"], \"fan_in_fan_out\": true}", &gpt, "gpt",
           DT_STATUS_OK, NULL, NULL);
    /* no adapter_config.json: nothing to compare */
    char none[256];
    cr_assert_not(dt_lora_peft_config_path("/tmp/dt-lcfg-none/adapter_model.safetensors", none, sizeof none));
    cr_assert_str_eq(none, "/tmp/dt-lcfg-none/adapter_config.json");
}

Test(lora_config, mismatches_name_file_key_and_both_values) {
    expect("{\"r\": 8, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\", \"v_proj\"]}", &LLAMA, "llama",
           DT_STATUS_CONFIG, "r is 8, the config's lora.r is 4", NULL);
    expect("{\"r\": 4, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\", \"v_proj\"]}", &LLAMA, "llama",
           DT_STATUS_CONFIG, "lora_alpha is 16, the config's lora.alpha is 8", NULL);
    expect("{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\", \"k_proj\", \"v_proj\"]}", &LLAMA,
           "llama", DT_STATUS_CONFIG, "target_modules is [q_proj, k_proj, v_proj]",
           "the config's lora.target_modules is [v_proj, q_proj]");
    expect("{\"r\": 4, \"lora_alpha\": 8}", &(dt_lora_spec){.r = 4, .alpha = 8, .n_targets = 1, .targets = {"q_proj"}},
           "llama", DT_STATUS_CONFIG, "target_modules is [q_proj, v_proj] (null: PEFT's default)", "[q_proj]");
}

Test(lora_config, unimplemented_options_are_named) {
    static const char *const cases[][2] = {
        {"\"use_rslora\": true", "use_rslora is true"},
        {"\"use_dora\": true", "use_dora is true"},
        {"\"bias\": \"all\"", "bias is \"all\""},
        {"\"bias\": \"lora_only\"", "bias is \"lora_only\""},
        {"\"rank_pattern\": {\"q_proj\": 8}", "rank_pattern is"},
        {"\"alpha_pattern\": {\"q_proj\": 8}", "alpha_pattern is"},
        {"\"modules_to_save\": [\"lm_head\"]", "modules_to_save is [\"lm_head\"]"},
        {"\"layers_to_transform\": [0]", "layers_to_transform is [0]"},
        {"\"peft_type\": \"IA3\"", "peft_type is \"IA3\""},
        {"\"fan_in_fan_out\": true", "fan_in_fan_out is true"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[256];
        snprintf(json, sizeof json, "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\", \"v_proj\"], %s}",
                 cases[i][0]);
        expect(json, &LLAMA, "llama", DT_STATUS_CONFIG, cases[i][1], NULL);
    }
    expect("{\"r\": 4, \"target_modules\": \".*proj\"}", &LLAMA, "llama", DT_STATUS_CONFIG, "regular expression", NULL);
}

Test(lora_config, malformed_values_are_refused) {
    expect("[1]", &LLAMA, "llama", DT_STATUS_CONFIG, "expected a JSON object", NULL);
    expect("{\"r\": 4.5}", &LLAMA, "llama", DT_STATUS_CONFIG, "r: expected an integer from 1 to 65536, found 4.5", NULL);
    expect("{\"r\": 1e300}", &LLAMA, "llama", DT_STATUS_CONFIG, "r: expected an integer", NULL);
    expect("{\"r\": 4, \"lora_alpha\": \"8\"}", &LLAMA, "llama", DT_STATUS_CONFIG, "lora_alpha: expected a number",
           NULL);
    expect("{\"r\": 4, \"target_modules\": [\"q_proj\", 7]}", &LLAMA, "llama", DT_STATUS_CONFIG,
           "target_modules: expected module names", NULL);
    expect("{\"r\": 4, \"fan_in_fan_out\": \"yes\"}", &LLAMA, "llama", DT_STATUS_CONFIG,
           "fan_in_fan_out: expected true or false", NULL);
}
