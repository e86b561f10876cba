/*
 * lora_config.h - a PEFT adapter's adapter_config.json, read beside the weights
 * that lora.init names and held against the config's lora section: an adapter
 * trained with another rank, alpha or set of target modules, or with a PEFT
 * option dtrun does not implement, is refused naming the file, the key and both
 * values, before any worker starts (it used to load silently: extra modules'
 * weights dropped, the wrong scale).
 *
 * What is compared (PEFT's name, the config's): r / lora.r, lora_alpha /
 * lora.alpha (PEFT's default 8 for either when absent), target_modules /
 * lora.target_modules as sets (null: PEFT's default for the model, as dtrun's).
 * What is refused when set: use_rslora, use_dora, bias other than "none",
 * rank_pattern / alpha_pattern (per-module ranks), layers_to_transform,
 * modules_to_save, target_modules as a regular expression (a string), a
 * peft_type other than LORA, and fan_in_fan_out against the model's layout: true
 * only for gpt, whose Hugging Face layers are Conv1D (PEFT's own value there,
 * and what dtrun's export writes), false for the llama family's nn.Linear.
 */
#ifndef DT_RUNTIME_MODEL_LORA_CONFIG_H
#define DT_RUNTIME_MODEL_LORA_CONFIG_H

#include "common/status.h"
#include "runtime/model/lora.h" /* defines: dt_lora_spec, DT_LORA_MAX_TARGETS */

/* adapter_config.json's largest plausible size (a few KiB in practice). */
#define DT_LORA_CONFIG_MAX ((size_t)1 << 20)

typedef struct dt_lora_peft_config {
    char path[4096];
    int r;                /* PEFT's default 8 when absent */
    double alpha;         /* lora_alpha; PEFT's default 8 when absent */
    int n_targets;        /* -1: null or absent (PEFT's default for the model) */
    char targets[DT_LORA_MAX_TARGETS][DT_LORA_NAME_LEN];
    int fan_in_fan_out;   /* 0 when absent */
} dt_lora_peft_config;

/* The adapter_config.json beside lora.init's path (DIR/adapter_config.json for a
 * folder, else the one in the file's folder) into buf; 0 when there is none. */
int dt_lora_peft_config_path(const char *init, char *buf, size_t len);

/* Reads path: DT_STATUS_CONFIG naming the file and key for a value of the wrong
 * type or range, or a PEFT option dtrun does not implement; NOT_FOUND / IO when
 * it cannot be read. */
dt_status_t dt_lora_peft_config_read(const char *path, dt_lora_peft_config *out);

/* DT_STATUS_CONFIG when pc disagrees with spec (the config's lora section, its
 * targets resolved: dt_lora_t.spec) for model ("gpt", "llama"), naming the file,
 * the key and both values. */
dt_status_t dt_lora_peft_config_check(const dt_lora_peft_config *pc, const dt_lora_spec *spec, const char *model);

/* PEFT's default target modules for a model ("c_attn" for gpt, else
 * "q_proj,v_proj"; peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING). */
const char *dt_lora_default_targets(const char *model);

#endif /* DT_RUNTIME_MODEL_LORA_CONFIG_H */
