/*
 * hf_export.h - a model as a Hugging Face directory that
 * transformers.AutoModelForCausalLM.from_pretrained loads: config.json (from
 * runtime/model/hf_config.h), generation_config.json, and the weights as
 * model.safetensors, or, past max_shard_bytes, as model-0000i-of-0000n.safetensors
 * shards (whole tensors, in layout order, as transformers cuts them) with
 * model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}).
 * Names and shapes as safetensors.h writes them (export_shape: GPT-2's Conv1D
 * transposes, the vocabulary unpadded, a tied head not stored).
 */
#ifndef DT_RUNTIME_HF_EXPORT_H
#define DT_RUNTIME_HF_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/model/model.h" /* defines: dt_model_layout */

typedef struct dt_hf_export_opts {
    int bf16;                  /* weights in bfloat16 (else fp32) */
    uint64_t max_shard_bytes;  /* 0: transformers' 5 GB (5e9) */
} dt_hf_export_opts;

/* Writes dir: the whole export into a staging folder beside it (DIR.tmp.XXXXXX),
 * then swapped in by a rename, so that an earlier export at dir stays loadable
 * until the new one is complete; any other file of the old folder (a tokenizer, a
 * README) is kept. On failure (a full disk, ...) dir is unchanged and the staging
 * folder removed; a process killed mid-export leaves dir unchanged and the staging
 * folder behind. *n_files gets the number of weight files, *bytes their tensor
 * bytes (either may be NULL). */
dt_status_t dt_hf_export(const dt_model_layout *l, const float *params, const char *dir, const dt_hf_export_opts *o,
                         int *n_files, uint64_t *bytes);

#endif /* DT_RUNTIME_HF_EXPORT_H */
