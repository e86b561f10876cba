/*
 * hf_config.h - a Hugging Face config.json as a model spec (model.h), for
 * `model.pretrained: DIR` and `dtrun sample DIR`.
 *
 * model_type llama, mistral and qwen2 are our "llama" (qwen2: attention_bias true),
 * each of its keys model.X.Y read from config.json's X.Y (nested objects; null or
 * absent: the key's default); rope_scaling null or of rope_type "llama3";
 * hidden_act silu; no mlp_bias. gpt2 is our "gpt": n_embd, n_layer, n_head,
 * vocab_size, n_positions (the default and the bound of seq_len),
 * layer_norm_epsilon 1e-5 and activation_function gelu_new (dtrun's kernels), tied
 * embeddings. Anything else is an error naming the file and what is wrong.
 */
#ifndef DT_RUNTIME_HF_CONFIG_H
#define DT_RUNTIME_HF_CONFIG_H

#include "common/status.h"
#include "runtime/model/model.h"

#define DT_HF_MAX_KEYS 64

typedef struct dt_hf_config {
    char path[4096];      /* DIR/config.json */
    char model_type[32];  /* as config.json says it */
    char dtype[16];       /* torch_dtype (or dtype): the stored dtype, "" when absent */
    dt_model_spec spec;   /* ops and every key of the model */
    /* from_file[k]: spec.ops->keys[k] came from config.json (else its default) */
    unsigned char from_file[DT_HF_MAX_KEYS];
    int seq_len_default;  /* gpt: n_positions (seq_len when the config gives none); else 0 */
    int max_seq_len;      /* n_positions / max_position_embeddings: the bound of seq_len; 0 none */
    int sliding_window;   /* > 0: attention is windowed past this many positions (mistral, qwen2) */
} dt_hf_config;

/* Reads DIR/config.json. NOT_FOUND when it is missing, CONFIG naming the file and
 * key when it is not a model dtrun has (the supported model_types listed). */
dt_status_t dt_hf_config_read(const char *dir, dt_hf_config *out);

/* The config.json transformers reads for l's model (GPT2LMHeadModel or
 * LlamaForCausalLM: architectures, model_type, every size, tie_word_embeddings,
 * torch_dtype), as malloc'd JSON text; NULL with UNSUPPORTED for a model without a
 * Hugging Face form (mlp). */
char *dt_hf_config_json(const dt_model_layout *l, const char *torch_dtype);

/* The supported model_types: "llama, mistral, qwen2, gpt2". */
const char *dt_hf_config_types(void);

#endif /* DT_RUNTIME_HF_CONFIG_H */
