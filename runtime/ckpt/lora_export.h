/*
 * lora_export.h - `dtrun export` of a LoRA checkpoint (lora.r > 0: its saved
 * tensors are the adapters, runtime/model/lora.h): a PEFT adapter directory, or the
 * adapters merged into the base as a Hugging Face directory.
 */
#ifndef DT_RUNTIME_LORA_EXPORT_H
#define DT_RUNTIME_LORA_EXPORT_H

#include <stdint.h>

#include "common/status.h"
#include "runtime/ckpt/checkpoint.h" /* defines: dt_ckpt_t */
#include "runtime/ckpt/hf_export.h"  /* defines: dt_hf_export_opts */
#include "runtime/model/lora.h"      /* defines: dt_lora_t */

typedef enum dt_lora_export_format {
    DT_LORA_EXPORT_PEFT = 0,     /* out/adapter_config.json + out/adapter_model.safetensors (fp32) */
    DT_LORA_EXPORT_HF_MERGE = 1, /* out as dt_hf_export writes it, W + alpha/r B A */
    DT_LORA_EXPORT_ADAPTERS = 2, /* out: one safetensors file of the adapters, dtrun's names */
} dt_lora_export_format_t;

/* 1 when the checkpoint's config has lora.r > 0. */
int dt_ckpt_is_lora(const dt_ckpt_t *c);
/* Exports c (a LoRA checkpoint) to out; the base for a merge is read from the saved
 * config's model.pretrained (an int8 base quantized as training did). *n_tensors,
 * *n_files and *bytes describe what was written. */
dt_status_t dt_lora_export(dt_ckpt_t *c, const char *out, dt_lora_export_format_t format, const dt_hf_export_opts *o,
                           int *n_tensors, int *n_files, uint64_t *bytes);

#endif /* DT_RUNTIME_LORA_EXPORT_H */
