/*
 * hf_load.h - a Hugging Face directory (config.json + safetensors) as a whole
 * model on the host: its layout, with the context chosen as `dtrun sample` runs
 * it, and every parameter in fp32 (read through hf_weights.h). The checkpoint's
 * counterpart is dt_ckpt_load_params (checkpoint.h).
 */
#ifndef DT_RUNTIME_HF_LOAD_H
#define DT_RUNTIME_HF_LOAD_H

#include "common/status.h"
#include "runtime/model/model.h" /* defines: dt_model_layout */

/* The context of a Hugging Face directory when none is asked for: GPT-2's
 * n_positions; a llama's max_position_embeddings up to this (a 128k context would
 * size a 128k-row cache), and never past a sliding window (dtrun's attention is
 * not windowed, so within the window it is exact). */
#define DT_HF_DEFAULT_CONTEXT 2048

/* 1 when path holds a config.json (a Hugging Face directory, not a checkpoint). */
int dt_hf_is_dir(const char *path);

/* DIR's layout into *l and its parameters into *host (fp32, dt_mem_alloc'd as
 * DT_MEM_PARAMS; free with dt_mem_free, and the layout with dt_model_layout_free).
 * seq_len 0: the default context above. A seq_len over what DIR allows is CONFIG
 * naming config.json and the bound, with *seq_len_max set to the bound (else 0). */
dt_status_t dt_hf_load_params(const char *dir, int seq_len, dt_model_layout *l, float **host,
                              int *seq_len_max);

#endif /* DT_RUNTIME_HF_LOAD_H */
