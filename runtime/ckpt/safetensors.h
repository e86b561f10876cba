/*
 * safetensors.h - consolidated weights in the safetensors format
 * (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
 * length, a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, ...,
 * "__metadata__": {...}} and the raw little-endian data.
 *
 * GPT models are written the way Hugging Face's GPT-2 checkpoints are
 * (openai-community/gpt2 model.safetensors): names without a "transformer."
 * prefix ("wte.weight", "h.0.attn.c_attn.weight", ...), the vocabulary unpadded
 * (wte (V, C)), no lm_head (it is tied to wte), and the c_attn, c_proj and c_fc
 * weights in HF's Conv1D layout (in, out): the transpose of ours (out, in). MLP
 * models are written as they are, in our (out, in) layout.
 */
#ifndef DT_RUNTIME_SAFETENSORS_H
#define DT_RUNTIME_SAFETENSORS_H

#include "common/status.h"
#include "runtime/model/model.h" /* defines: dt_model_layout */

/* Writes params (host fp32, the layout's flat buffer) to path (temporary name,
 * fsync, rename). *bytes gets the file size (may be NULL). */
dt_status_t dt_safetensors_write(const dt_model_layout *l, const float *params, const char *path, size_t *bytes);

#endif /* DT_RUNTIME_SAFETENSORS_H */
