/*
 * lora.h - LoRA (Hu et al. 2021; PEFT's math) on a frozen base: the adapters'
 * layout, the frozen base's storage (the compute dtype, or int8 per output row) and
 * what a net needs to run both.
 *
 * A model's linear layers are the 2-D weights of its block units (llama: q_proj,
 * k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; gpt: c_attn, attn.c_proj,
 * c_fc, mlp.c_proj). Each targeted one (its module name, PEFT's: the name's last
 * component before ".weight") gets a pair A (r, in), B (out, r) and computes
 * y = W x + (alpha / r) B (A x). A fused weight (llama's q|k|v rows, gate|up) is
 * several tensors of the base layout, so it carries one pair per module it holds.
 *
 * The adapters are a model layout of their own (dt_lora_init's `adapters`): the
 * tensors named as PEFT's state dict without its "base_model.model." prefix
 * ("model.layers.0.self_attn.q_proj.lora_A.weight"), in the unit of their block,
 * with as many units as the base (units without adapters are empty), so a
 * data-parallel strategy, the optimizer and checkpoints handle them as they handle
 * a model: only they get gradients and optimizer state. The base layout is what
 * the net computes over (shapes, arena); its weights live in dt_lora's buffers,
 * never in the trained flat buffer, replicated on every rank (FSDP and HSDP shard
 * the adapters only; the base is not sharded).
 */
#ifndef DT_RUNTIME_MODEL_LORA_H
#define DT_RUNTIME_MODEL_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/kernels.h"     /* defines: dt_device_t, dt_dtype_t */
#include "runtime/model/model.h" /* defines: dt_model_layout */

typedef enum dt_lora_base {
    DT_LORA_BASE_COMPUTE = 0, /* the compute dtype (fp32 on cpu, bf16 on cuda) */
    DT_LORA_BASE_INT8 = 1,    /* linear weights int8 + one fp32 scale per output row */
} dt_lora_base_t;

#define DT_LORA_MAX_TARGETS 16
#define DT_LORA_NAME_LEN 32

typedef struct dt_lora_spec {
    int r;
    double alpha;
    int n_targets; /* 0: PEFT's default for the model (llama q_proj,v_proj; gpt c_attn) */
    char targets[DT_LORA_MAX_TARGETS][DT_LORA_NAME_LEN];
    dt_lora_base_t base;
} dt_lora_spec;

/* A LoRA model: the base's storage plan and, once loaded, its device buffers. */
typedef struct dt_lora {
    dt_lora_spec spec;
    float scale;                 /* alpha / r */
    const dt_model_layout *base; /* the model (not owned) */
    const dt_model_layout *adapters;
    dt_dtype_t dtype;            /* the compute dtype */
    /* per base tensor */
    int *adapter;  /* its lora_A tensor in adapters (lora_B is the next), or -1 */
    int *linear;   /* 1: a linear weight of a block (stored in base dtype) */
    size_t *boff;  /* byte offset in its buffer (the q8 one for int8 linears, else base) */
    size_t *soff;  /* int8 linears: index of its first row's scale */
    size_t *goff;  /* 1-D tensors: element offset in the gradient sink */
    size_t base_bytes, q8_bytes, n_scales, sink_elems;
    /* device memory (dt_lora_load) */
    dt_device_t *dev;
    void *d_base, *d_sink;
    int8_t *d_q8;
    float *d_scales;
} dt_lora_t;

/* "q_proj,v_proj" into spec's targets; DT_STATUS_CONFIG naming lora.target_modules
 * when a name is too long or there are too many. NULL or "": the default. */
dt_status_t dt_lora_parse_targets(dt_lora_spec *spec, const char *list);

/* The LoRA model of base (a whole-model layout: TP 1, one stage) for spec, with the
 * adapters' layout built into *adapters (free it with dt_model_layout_free after
 * dt_lora_free). Checks every target names a linear module of the model
 * (DT_STATUS_CONFIG naming lora.target_modules and the model's names otherwise),
 * r >= 1 (lora.r), and that the base dtype is int8 or the compute dtype. Allocates
 * no device memory. */
dt_status_t dt_lora_init(const dt_model_layout *base, const dt_lora_spec *spec, dt_dtype_t compute,
                         dt_lora_t *out, dt_model_layout *adapters);
void dt_lora_free(dt_lora_t *lora);

/* Bytes of the frozen base on the device: the linear weights in the base dtype
 * (int8: + 4 bytes of scale per output row), the other tensors in the compute dtype.
 * What dt_lora_load allocates, without the gradient sink. */
size_t dt_lora_base_state_bytes(const dt_lora_t *lora);

/* Reads the base's fp32 weights (whole-model offsets, read(ctx, goffset, n, dst))
 * and stores them on dev: int8 linears quantized per output row (scale = absmax /
 * 127, q = round(w / scale)). Also allocates the 1-D gradient sink. */
typedef dt_status_t (*dt_lora_read_fn)(void *ctx, size_t goffset, size_t n, float *dst);
dt_status_t dt_lora_load(dt_lora_t *lora, dt_device_t *dev, dt_lora_read_fn read, void *ctx);

/* Elements [offset, offset + count) of the adapters' initial values, PEFT's: A
 * Kaiming-uniform with a = sqrt(5), i.e. uniform(-1/sqrt(in), 1/sqrt(in)), from the
 * stream (seed, tensor index); B zero. */
void dt_lora_init_range(const dt_lora_t *lora, uint64_t seed, size_t offset, size_t count, float *dst);

/* The prefix of PEFT's state-dict names before a tensor's name here: PEFT wraps the
 * Hugging Face model ("base_model.model."), whose GPT-2 weights sit under
 * "transformer." (which dtrun's names drop). */
const char *dt_lora_peft_prefix(const dt_model_layout *l);

/* Host quantization of one (rows, cols) fp32 matrix: q (rows * cols) and scale
 * (rows). A zero row gets scale 1 and zeros. Returns -1, or the first row holding a
 * NaN or infinite weight (it cannot be quantized: that row is left zero, scale 1). */
long dt_lora_quantize_rows(const float *w, size_t rows, size_t cols, int8_t *q, float *scale);

/* The device pointer of base tensor t (its weights; for an int8 linear the int8
 * values), and the gradient a model's backward may write for it: NULL for 2-D
 * tensors (frozen: no weight gradient is computed), a sink for 1-D ones (norms and
 * biases, whose ops always write one; never read). */
static inline void *dt_lora_param(const dt_lora_t *l, int t) {
    return l->linear[t] && l->spec.base == DT_LORA_BASE_INT8 ? (void *)(l->d_q8 + l->boff[t])
                                                             : (char *)l->d_base + l->boff[t];
}
static inline void *dt_lora_grad(const dt_lora_t *l, int t) {
    return l->base->tensors[t].ndim == 1 ? (char *)l->d_sink + l->goff[t] * dt_dtype_size(l->dtype) : NULL;
}

#endif /* DT_RUNTIME_MODEL_LORA_H */
