/*
 * model.h - models as a tensor table over one flat parameter buffer.
 *
 * A model's parameters live in one contiguous buffer (llm.c style); gradients,
 * master weights and Adam m/v are buffers of the same layout. The tensor table
 * names each tensor (Hugging Face GPT-2 names, so export can use them), its shape,
 * its element offset, its FSDP unit and whether weight decay applies. Units are
 * contiguous ranges in forward order: GPT: 0 = embeddings (wte, wpe), 1..L = the
 * blocks, L+1 = final LayerNorm (the LM head is tied to wte). MLP: one unit per
 * layer. DDP buckets are byte ranges of the same buffer; FSDP shards units.
 */
#ifndef DT_RUNTIME_MODEL_H
#define DT_RUNTIME_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/rng.h"
#include "common/status.h"

#define DT_MODEL_MAX_DIMS 4
#define DT_MODEL_NAME_LEN 48

typedef enum dt_model_type {
    DT_MODEL_GPT = 0,
    DT_MODEL_MLP = 1,
} dt_model_type_t;

typedef struct dt_model_spec {
    dt_model_type_t type;
    /* gpt */
    int n_layer, n_head, n_embd, seq_len;
    int vocab_size;         /* real vocab V */
    int vocab_pad_multiple; /* Vp = V rounded up to this (1 = no padding) */
    /* mlp: in_dim -> hidden_dim (x n_hidden_layers, ReLU) -> n_classes */
    int in_dim, hidden_dim, n_hidden_layers, n_classes;
} dt_model_spec;

typedef struct dt_tensor_info {
    char name[DT_MODEL_NAME_LEN];
    int ndim;
    int64_t shape[DT_MODEL_MAX_DIMS];
    size_t offset; /* in elements, into the flat buffer */
    size_t numel;
    int unit;
    int decay; /* AdamW weight decay applies (matmul weights, not biases/LN/embeddings) */
    int init;  /* how it is initialised: see model.c */
} dt_tensor_info;

typedef struct dt_unit_info {
    size_t offset; /* first element */
    size_t numel;
} dt_unit_info;

typedef struct dt_model_layout {
    dt_model_spec spec;
    int vocab_padded; /* Vp (gpt) */
    dt_tensor_info *tensors;
    int n_tensors;
    dt_unit_info *units;
    int n_units;
    size_t n_params; /* elements in the flat buffer */
} dt_model_layout;

/* Checks the spec (names the bad field) and builds the table. */
dt_status_t dt_model_layout_init(const dt_model_spec *spec, dt_model_layout *out);
void dt_model_layout_free(dt_model_layout *l);
/* Index of the tensor called name, or -1. */
int dt_model_find(const dt_model_layout *l, const char *name);
/* Parameters the model would have without vocab padding (GPT-2 124M: 124,439,808). */
size_t dt_model_unpadded_params(const dt_model_layout *l);
/* Fills params (fp32, n_params) as GPT-2 does: normal(0, 0.02), residual
 * projections normal(0, 0.02/sqrt(2*n_layer)), biases 0, LayerNorm weights 1,
 * padded vocab rows 0. Identical on every rank for the same seed. */
void dt_model_init_params(const dt_model_layout *l, uint64_t seed, float *params);
/* Training FLOPs per token (forward + backward): 6*N + 12*L*C*T for gpt (N the
 * non-embedding-position matmul parameters as in the PaLM appendix: all params
 * but wpe), 6*N for mlp (per sample). */
double dt_model_flops_per_token(const dt_model_layout *l);

#endif /* DT_RUNTIME_MODEL_H */
