/*
 * hf_weights.h - a model's initial parameters from a Hugging Face weight set
 * (DIR/model.safetensors or its index and shards, read through safetensors.h), by
 * ranges of the model's flat fp32 buffer, so each rank reads only what it holds.
 *
 * Tensors are matched by name: the layout's names are Hugging Face's (model.h), and
 * a name is also looked for with a "transformer." prefix (GPT2LMHeadModel's state
 * dict). The shape expected in the file is the one export writes (the model's
 * export_shape): HF Conv1D weights (in, out) are transposed into our (out, in);
 * embedding rows past the real vocabulary (padding) are zero; GPT-2's position table
 * (wpe) may hold more rows than seq_len, of which the first seq_len are used.
 * Tensors in the files that the layout does not name (attn.bias masks, a tied
 * lm_head) are not read. Any dtype the reader takes (F32, BF16, F16) converts to fp32.
 */
#ifndef DT_RUNTIME_HF_WEIGHTS_H
#define DT_RUNTIME_HF_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/model/model.h" /* defines: dt_model_layout */

typedef struct dt_hf_weights dt_hf_weights_t;

/* Opens DIR's weights (headers only) and checks that every tensor of l is there
 * with the expected shape: FORMAT/NOT_FOUND naming the file, tensor, expected and
 * found shapes. l must outlive the handle. */
dt_status_t dt_hf_weights_open(const char *dir, const dt_model_layout *l, dt_hf_weights_t **out);
void dt_hf_weights_close(dt_hf_weights_t *w);
/* Elements [offset, offset + count) of the flat buffer into dst (fp32). */
dt_status_t dt_hf_weights_fill(dt_hf_weights_t *w, size_t offset, size_t count, float *dst);
/* A hash of the files' headers (ranks compare it). */
uint64_t dt_hf_weights_id(const dt_hf_weights_t *w);
/* Bytes of file data read so far; bytes of tensor data in the files. */
uint64_t dt_hf_weights_bytes_read(const dt_hf_weights_t *w);
uint64_t dt_hf_weights_file_bytes(const dt_hf_weights_t *w);
/* Seconds spent filling so far (reading and converting). */
double dt_hf_weights_seconds(const dt_hf_weights_t *w);

#endif /* DT_RUNTIME_HF_WEIGHTS_H */
