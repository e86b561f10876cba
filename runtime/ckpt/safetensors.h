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

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/model/model.h" /* defines: dt_model_layout */

/* Writes params (host fp32, the layout's flat buffer) to path (temporary name,
 * fsync, rename). *bytes gets the file size (may be NULL). */
dt_status_t dt_safetensors_write(const dt_model_layout *l, const float *params, const char *path, size_t *bytes);
/* The same for tensors [first, end) of the layout only (a shard), in fp32 or, with
 * bf16, rounded to bfloat16 (nearest even). */
dt_status_t dt_safetensors_write_tensors(const dt_model_layout *l, const float *params, const char *path, int first,
                                         int end, int bf16, size_t *bytes);

/* ---- reading (st_read.c) ----------------------------------------------------------
 * A file is mapped (mmap) and its header parsed and checked once at open: the
 * 8-byte header length inside the file, a JSON object, each tensor's dtype one of
 * F32, BF16, F16, its shape's element count times the dtype size equal to
 * end - begin, data_offsets inside the data area and no two tensors overlapping
 * ("__metadata__" is skipped). Reads then convert an element range of one tensor to
 * fp32 (bf16 and fp16 exactly) touching only those bytes, and drop the pages they
 * touched from the process (madvise), so reading a whole model one range at a time
 * never holds the whole file in the reader's memory. Errors name the file and the
 * tensor. */

typedef enum dt_st_dtype { DT_ST_F32 = 0, DT_ST_BF16 = 1, DT_ST_F16 = 2 } dt_st_dtype_t;

#define DT_ST_MAX_DIMS 8

typedef struct dt_st_tensor {
    const char *name;
    dt_st_dtype_t dtype;
    int ndim;
    int64_t shape[DT_ST_MAX_DIMS];
    size_t numel;
    uint64_t begin, end; /* bytes, relative to the data area */
} dt_st_tensor;

typedef struct dt_st_file dt_st_file_t;

/* Opens and checks path (FORMAT on a bad file, IO when it cannot be read). */
dt_status_t dt_st_open(const char *path, dt_st_file_t **out);
void dt_st_close(dt_st_file_t *f);
const char *dt_st_path(const dt_st_file_t *f);
int dt_st_count(const dt_st_file_t *f);
const dt_st_tensor *dt_st_at(const dt_st_file_t *f, int i);
/* The tensor called name, or NULL. */
const dt_st_tensor *dt_st_find(const dt_st_file_t *f, const char *name);
/* 64-bit FNV-1a of the JSON header (names, dtypes, shapes, offsets). */
uint64_t dt_st_header_hash(const dt_st_file_t *f);
/* Elements [first, first + count) of t (row-major) into dst as fp32, then their
 * pages dropped from the process (dt_st_drop). */
dt_status_t dt_st_read_f32(dt_st_file_t *f, const dt_st_tensor *t, size_t first, size_t count, float *dst);
/* The same without dropping (many small reads of one region), and the drop alone. */
dt_status_t dt_st_copy_f32(dt_st_file_t *f, const dt_st_tensor *t, size_t first, size_t count, float *dst);
void dt_st_drop(dt_st_file_t *f, const dt_st_tensor *t, size_t first, size_t count);
/* "F32", "BF16", "F16". */
const char *dt_st_dtype_name(dt_st_dtype_t d);
size_t dt_st_dtype_size(dt_st_dtype_t d);
/* bf16 / fp16 bit patterns to fp32 (exact). */
float dt_st_bf16_to_f32(uint16_t h);
float dt_st_f16_to_f32(uint16_t h);

/* A Hugging Face weight set: DIR/model.safetensors, or the shards that
 * DIR/model.safetensors.index.json's weight_map names. With both, model.safetensors
 * is read (as transformers does) and a warning says so. Every name of the map must
 * be in the shard it names, and every tensor of a shard must be one the map names
 * for that shard: a tensor in two shards, or one the map does not list, is
 * DT_STATUS_FORMAT naming both files. Names are hashed: finding one is O(1). */
typedef struct dt_st_set dt_st_set_t;
dt_status_t dt_st_set_open(const char *dir, dt_st_set_t **out);
void dt_st_set_close(dt_st_set_t *s);
/* The tensor called name and its file, or NULL (*file untouched). */
const dt_st_tensor *dt_st_set_find(const dt_st_set_t *s, const char *name, dt_st_file_t **file);
int dt_st_set_files(const dt_st_set_t *s);
dt_st_file_t *dt_st_set_file(const dt_st_set_t *s, int i);
/* Bytes of tensor data in all files; hash of all headers. */
uint64_t dt_st_set_bytes(const dt_st_set_t *s);
uint64_t dt_st_set_hash(const dt_st_set_t *s);

#endif /* DT_RUNTIME_SAFETENSORS_H */
