/*
 * net_impl.h - what a model file's forward and backward see of a net (net.h):
 * its arena slots, its parameters and gradients by tensor index, the hook and a
 * zeroing helper. Only runtime/model/ includes it.
 */
#ifndef DT_RUNTIME_NET_IMPL_H
#define DT_RUNTIME_NET_IMPL_H

#include "runtime/model/lora.h" /* defines: dt_lora_param, dt_lora_grad */
#include "runtime/model/net.h"

/* Arena slot `slot` (a byte address in device memory). */
static inline void *dt_net_slot(const dt_net_t *net, int slot) {
    return (char *)net->arena + net->off[slot];
}

static inline void *dt_net_tensor_in(const dt_net_t *net, void *const *bases, int t) {
    const dt_tensor_info *ti = &net->layout->tensors[t];
    size_t rel = ti->offset - net->layout->units[ti->unit].offset;
    return (char *)bases[ti->unit] + rel * net->elsize;
}
/* Parameters / gradients of tensor t (index in the layout), through the unit's base;
 * a LoRA net's are the frozen base's (lora.h: no gradient for 2-D tensors). */
static inline void *dt_net_param(const dt_net_t *net, int t) {
    return net->lora ? dt_lora_param(net->lora, t) : dt_net_tensor_in(net, net->unit_params, t);
}
static inline void *dt_net_grad(const dt_net_t *net, int t) {
    return net->lora ? dt_lora_grad(net->lora, t) : dt_net_tensor_in(net, net->unit_grads, t);
}

/* ---- linear layers (net.c): the base weight of tensor t (the first of its fused
 * group: the group's tensors are consecutive, their rows OC in all) plus, in a LoRA
 * net, the adapters of each tensor of the group on its rows. A model calls these for
 * the layers LoRA may target (lora.h). ---- */

/* out (N, OC) = x (N, C) @ W^T + bias (+ scale * B (A x) per adapter). */
void dt_net_linear_forward(dt_net_t *net, void *out, const void *x, int t, const void *bias, int N, int C, int OC);
/* dinp (N, C) += dout @ W (+ the adapters' part); the weight and bias gradients
 * (+=; a LoRA net: the adapters' instead, the base is frozen). dinp may be NULL. */
void dt_net_linear_backward(dt_net_t *net, void *dinp, void *db, const void *dout, const void *x, int t, int N,
                            int C, int OC);

/* ---- attention (net_cp.c): the device's attention_forward/backward, or under
 * context parallelism the ring over the CP group's key/value blocks (the device's
 * attention_block_* ops). The layer slots a model sizes with these: saved (kept from
 * forward to backward: CP, the log-sum-exp (B, NH, T) fp32) and scratch (one per
 * arena, used by the forward too under CP); out is the forward's output, which the
 * CP backward reads again. T is the net's (this rank's rows). ---- */
size_t dt_net_attention_saved_bytes(const dt_device_t *dev, const dt_model_layout *l, int B, int T, int C, int NH,
                                    int NKV);
size_t dt_net_attention_scratch_bytes(const dt_device_t *dev, const dt_model_layout *l, int B, int T, int C,
                                      int NH, int NKV);
void dt_net_attention_forward(dt_net_t *net, void *out, void *saved, void *scratch, const void *qkv, int B, int T,
                              int C, int NH, int NKV);
void dt_net_attention_backward(dt_net_t *net, void *dqkv, void *scratch, const void *dout, const void *qkv,
                               const void *saved, const void *out, int B, int T, int C, int NH, int NKV);

/* Context parallelism (net_cp.c, for net.c): the positions slot's bytes (the
 * positions, then the attention's indices); this rank's rows of a batch of whole
 * sequences into net->h_cp (local points into it; the positions are checked on the
 * whole sequences); the host block the positions slot gets (positions + indices). */
size_t dt_net_cp_positions_bytes(const dt_model_layout *l, int B);
dt_status_t dt_net_cp_take_rows(dt_net_t *net, const dt_batch *whole, dt_batch *local);
const int32_t *dt_net_cp_index_rows(const dt_net_t *net);

/* ---- the chunk driver of a decoder stack (net.c) ----
 * A model whose units are [embedding = unit 0][block l = unit 1 + l][final = unit
 * L + 1: the final norm, and the head when untied] (model.h: ops->pipeline) fills a
 * dt_net_stack with its own math and points ops->stack at it, and ops->forward,
 * backward and stage_buf (and decode) at dt_net_stack_forward, _backward,
 * _stage_buf (and _decode). The
 * driver runs the layout's chunk net->chunk: the hooks around each unit's use
 * (forward in unit order, backward in reverse, a recomputed block's forward again
 * just before its backward), the embedding in a first chunk only, the final norm, LM
 * head (its weight: tensor 0 when tied, net->head_w on a last stage holding a tied
 * copy, else the layout's last tensor, lm_head) and the loss in a last chunk only.
 * The residual stream is hidden (ops->dims) wide, of R = B*T rows or B*T/T under
 * sequence parallelism; the head and loss run on the model's slots below. */
typedef struct dt_net_stack {
    const dt_model_block_slots *blocks; /* the per-block slots (model.h) */
    int block_out; /* the block slot of a block's output, the next block's input */
    /* arena slots: in, the embedding's output and a chunk's input (IN); norm, the final
     * norm's output (R x C); dres, the residual stream's gradient (R x C: DOUT, then
     * DIN); dtmp (B*T x C) and dred (R x C), the head's input gradient, as
     * dt_net_tp_column_backward's; gath, part and xstats, the sequence-parallel
     * gather, partial sums and vocabulary-parallel loss stats (net_impl.h). The
     * logits are ops->logits_slot, the losses DT_NET_SLOT_LOSSES. */
    int in, norm, dres, dtmp, dred, gath, part, xstats;
    /* tokens (the tokens slot) -> in */
    void (*embed_forward)(dt_net_t *net);
    /* the embedding's gradients += from dout, d(in) gathered to all B*T rows */
    void (*embed_backward)(dt_net_t *net, const void *dout);
    /* block l of the whole model, at position j of the chunk, from its input
     * residual: its whole forward (redo NONE), or what its backward first recomputes
     * under policy redo (model.h: dt_model_block_recompute), in the forward's order */
    void (*block_forward)(dt_net_t *net, int l, int j, void *residual, dt_model_recompute_t redo);
    /* block l's gradients += and dres: the gradient of its output -> of its input */
    void (*block_backward)(dt_net_t *net, int l, int j, void *residual);
    /* x (the last block's output) -> norm; the backward: its gradients += and dres
     * (zeroed by the driver) += from dnorm, the gradient of norm */
    void (*norm_forward)(dt_net_t *net, const void *x);
    void (*norm_backward)(dt_net_t *net, const void *dnorm, const void *x);
    /* (optional) KV-cache decoding (model.h: decode, of a whole model; the decode
     * arena's slots): the token at position pos into the model's residual row; block
     * l on it, its keys and values cached at row pos; its final norm into
     * decode_norm_slot. The driver runs the head into ops->decode_logits_slot. */
    void (*decode_embed)(dt_net_t *net, int pos);
    void (*decode_block)(dt_net_t *net, int l, int pos);
    void (*decode_norm)(dt_net_t *net);
    int decode_norm_slot;
} dt_net_stack;

/* ops->forward, backward, stage_buf (and decode) of a model with ops->stack. */
void dt_net_stack_forward(dt_net_t *net, int with_loss);
void dt_net_stack_backward(dt_net_t *net, float dscale);
void *dt_net_stack_stage_buf(dt_net_t *net, int which);
void dt_net_stack_decode(dt_net_t *net, int pos);

/* Tells the data-parallel strategy that unit is about to be used / is done. */
static inline void dt_net_hook(dt_net_t *net, int unit, dt_net_phase_t phase) {
    if (net->hook) net->hook(net->hook_ctx, unit, phase);
}

/* Zeroes the first elems elements of a slot (backward accumulates into it). */
static inline void dt_net_zero(dt_net_t *net, int slot, size_t elems) {
    net->dev->ops->set(net->dev, dt_net_slot(net, slot), 0, elems * net->elsize);
}

/* ---- tensor parallelism (net.h: dt_net_tp_ops; no-ops at TP size 1) ---- */

/* The input of a column-parallel matmul: rows (of n elements in all) as they are,
 * or gathered from every rank into full (sequence parallelism). */
static inline void *dt_net_tp_gather_in(dt_net_t *net, void *rows, void *full, size_t n) {
    if (!net->tp || !net->layout->sequence_parallel) return rows;
    net->tp->all_gather(net->tp_ctx, rows, full, n);
    return full;
}

/* The output of a row-parallel matmul, partial sums of n elements in part: summed
 * over the group in place (out == part), or this rank's rows of the sum into out
 * (sequence parallelism). */
static inline void dt_net_tp_reduce_out(dt_net_t *net, void *part, void *out, size_t n) {
    if (!net->tp) return;
    if (net->layout->sequence_parallel) net->tp->reduce_scatter(net->tp_ctx, part, out, n);
    else net->tp->all_reduce(net->tp_ctx, part, n, 0, 0);
}

/* dt_net_tp_reduce_out, started (NULL at TP 1); dt_net_tp_wait finishes it: the
 * caller computes something else meanwhile (the weight gradient). */
static inline void *dt_net_tp_reduce_start(dt_net_t *net, void *part, void *out, size_t n) {
    if (!net->tp) return NULL;
    return net->tp->reduce_start(net->tp_ctx, part, net->layout->sequence_parallel ? out : part, n);
}
static inline void dt_net_tp_wait(dt_net_t *net, void *handle) {
    if (net->tp && handle) net->tp->wait(net->tp_ctx, handle);
}

/* A row-parallel matmul (gpt's c_proj, llama's o_proj / down_proj): out (BT, C) =
 * inp (BT, IC) @ W^T + bias. Under tensor parallelism this rank's IC input columns
 * give partial sums (the bias added by TP rank 0 only), summed over the group in
 * place, or first written to part (BT x C) and reduce-scattered into this rank's
 * rows of out (sequence parallelism). (net.c) */
void dt_net_tp_row_forward(dt_net_t *net, void *out, void *part, const void *inp, const void *w, const void *bias,
                           int BT, int IC, int C);
/* The backward of a column-parallel matmul (fused q|k|v, the MLP's first matmul, a
 * vocabulary-parallel head) of input x (BT, C; gathered under sequence parallelism):
 * dW (and db) += the weight gradients, and the input gradient, summed over the group,
 * into the returned buffer: dtmp (BT x C, zeroed here), or this rank's rows of it in
 * dred (sequence parallelism). Under TP the input gradient is computed first and its
 * reduction runs while the weight gradient is computed (Megatron's overlap). (net.c) */
void *dt_net_tp_column_backward(dt_net_t *net, void *dtmp, void *dred, void *dw, void *db, const void *dout,
                                const void *x, const void *w, int BT, int C, int OC);
/* The same two by tensor index (a model's target layers): through the LoRA linear
 * helpers in a LoRA net (never tensor-parallel), else dt_net_tp_row_forward /
 * dt_net_tp_column_backward with tensor t's weight and gradient. (net.c) */
void dt_net_linear_row_forward(dt_net_t *net, void *out, void *part, const void *inp, int t, const void *bias,
                               int BT, int IC, int C);
void *dt_net_linear_column_backward(dt_net_t *net, void *dtmp, void *dred, int t, void *db, const void *dout,
                                    const void *x, int BT, int C, int OC);

/* The softmax cross-entropy of the logits (BT rows of vocab_padded columns, or of
 * this rank's Vp/T under tensor parallelism: the vocabulary-parallel form, whose
 * per-row max, sum and target logit go to stats, 3*BT fp32, summed over the group so
 * no rank holds B*T*V logits) into losses; the backward turns the logits into
 * dlogits in place from the same stats. (net.c) */
void dt_net_xent_forward(dt_net_t *net, float *losses, const void *logits, float *stats, int BT);
void dt_net_xent_backward(dt_net_t *net, void *logits, const float *stats, float dscale, int BT);

/* Sequence parallelism leaves the gradients of the norms' weights (and biases)
 * partial, each rank's from its own rows: the model computes gradient k (n
 * elements) into piece k of a zeroed scratch slot instead of grad, and
 * dt_net_tp_norm_grads_add sums the scratch's count pieces over the group and adds
 * piece i to grads[i]. Without sequence parallelism grad itself, and the add does
 * nothing. (net.c) */
static inline void *dt_net_tp_norm_grad(const dt_net_t *net, void *scratch, int k, size_t n, void *grad) {
    return net->layout->sequence_parallel ? (char *)scratch + (size_t)k * n * net->elsize : grad;
}
void dt_net_tp_norm_grads_add(dt_net_t *net, void *scratch, size_t n, void *const *grads, int count);

/* fp32 sum / max over the group, in place (the vocabulary-parallel loss's stats). */
static inline void dt_net_tp_sum_f32(dt_net_t *net, float *buf, size_t n) {
    if (net->tp) net->tp->all_reduce(net->tp_ctx, buf, n, 1, 0);
}
static inline void dt_net_tp_max_f32(dt_net_t *net, float *buf, size_t n) {
    if (net->tp) net->tp->all_reduce(net->tp_ctx, buf, n, 1, 1);
}

/* Sum over the group in place, compute dtype (sequence parallelism: the partial
 * gradients of replicated tensors, each rank's from its own rows). */
static inline void dt_net_tp_sum(dt_net_t *net, void *buf, size_t n) {
    if (net->tp) net->tp->all_reduce(net->tp_ctx, buf, n, 0, 0);
}

#endif /* DT_RUNTIME_NET_IMPL_H */
