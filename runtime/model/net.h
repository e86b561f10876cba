/*
 * net.h - forward and backward of a model (model.h layout) on a device
 * (kernels/kernels.h), with all activations in one arena sized up front.
 *
 * net.c is the machinery every model shares: the arena (slot sizes from the
 * model's arena_sizes, each rounded up to 64 bytes), binding units to flat
 * buffers, uploading the batch, the loss and the logits, and the chunk driver of
 * decoder stacks. The compute itself is the model's, written against
 * runtime/model/net_impl.h: a decoder stack (gpt.c, llama.c) supplies only its math
 * through a small table (net_impl.h: dt_net_stack: embedding, block and final norm,
 * each forward and backward, and their decode forms), and net.c's driver runs the
 * choreography around it: the hooks below, recomputed blocks, the first and last
 * pipeline chunk, the tied or untied LM head and the loss. A new model family is
 * its file (its config keys, tensor table, arena and that table) plus one line in
 * runtime/model/registry.c, and copies none of the choreography; a model of another
 * shape (mlp.c) fills spec.ops->forward/backward itself.
 *
 * Parameters and gradients are reached per unit through unit_params[u] and
 * unit_grads[u] (base pointers of unit u's range), which dt_net_bind points into
 * flat buffers. A data-parallel strategy may re-point them (FSDP points a unit at
 * its gathered copy) and is told, through the hook, when each unit is about to be
 * used and when it is done: forward in unit order, backward in reverse. When the
 * LM head is tied to the embedding (layout.tied_head: GPT's wte, a llama with
 * tie_word_embeddings), unit 0 is also used at the head: the
 * forward ends with FWD_PRE(0) ... FWD_POST(0) around the logits, the backward
 * starts with BWD_PRE(0) and unit 0's gradient is complete only at BWD_POST(0),
 * the very last call. An untied head is used inside the final unit's hooks; the tied
 * copy of a last pipeline stage (net->head_w) inside none.
 *
 * Pipeline stages (model.h: dt_model_layout_init_stage): a net of a stage layout runs
 * one chunk per forward/backward (net->chunk): its blocks, the embedding only in a
 * first chunk, the final norm, head and loss only in a last one; the activations
 * cross chunk boundaries through the stage buffers (dt_net_stage_buf). Several
 * micro-batches are in flight at once, each in its own arena (dt_net_arenas,
 * dt_net_use). Hooks get the layout's (local) unit numbers.
 *
 * Packed sequences: a token batch may carry positions (dt_batch.positions), several
 * documents in one row, each attending only to itself with positions restarting at
 * 0. Every chunk's forward uploads them into its arena (attention and RoPE need them
 * in every pipeline stage), and the model hands them to the ops that see positions
 * (kernels.h: the embedding, attention, RoPE), in the recomputed forward too.
 */
#ifndef DT_RUNTIME_NET_H
#define DT_RUNTIME_NET_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/kernels.h" /* defines: dt_device_t, dt_ops_t */
#include "runtime/model/model.h"   /* defines: dt_model_layout */

typedef enum dt_net_phase {
    DT_NET_FWD_PRE = 0,
    DT_NET_FWD_POST = 1,
    DT_NET_BWD_PRE = 2,
    DT_NET_BWD_POST = 3,
} dt_net_phase_t;

/* Arena slots every model has (sized 0 when unused); its own slots follow. */
enum {
    DT_NET_SLOT_TOKENS = 0,   /* (B, T) int */
    DT_NET_SLOT_TARGETS = 1,  /* (B, T) int */
    DT_NET_SLOT_FEATURES = 2, /* (B, in_features) compute dtype */
    DT_NET_SLOT_LOSSES = 3,   /* (B*T) fp32 */
    DT_NET_SLOT_POSITIONS = 4, /* (B, T) int: the batch's positions; token models size it */
    DT_NET_SLOT_FIRST = 5,
};

typedef void (*dt_net_hook_fn)(void *ctx, int unit, dt_net_phase_t phase);

/* One micro-batch. Token models: tokens (B, T) and targets (B, T, -1: not trained),
 * and optionally positions (B, T): each token's position inside its document, 0 at
 * a document's start and the previous token's + 1 after, so pos[b][0] is 0 (packed
 * sequences: a token attends to its own document only); NULL: one document per row,
 * token t at position t. Feature models: features (B, in_features) and targets (B)
 * class ids. Host memory. */
typedef struct dt_batch {
    const int32_t *tokens;
    const float *features;
    const int32_t *targets;
    const int32_t *positions;
} dt_batch;

/* Tensor parallelism (model.h: a TP layout): the collectives a model's forward and
 * backward call inside its layers, over the ranks of its TP group, on device
 * buffers. runtime/parallel/tp.c fills them with the TP communicator; NULL in a net
 * of TP size 1. Each returns when the result is in place (the model's next op reads
 * it), except reduce_start, finished by wait. A failed collective is recorded by
 * the filler and reported after the micro-step; the buffers stay valid memory. */
typedef struct dt_net_tp_ops {
    /* buf (count elements, fp32 when f32, else the compute dtype) = its sum over the
     * group, or its maximum when max (fp32 only) */
    void (*all_reduce)(void *ctx, void *buf, size_t count, int f32, int max);
    /* recv (T * count) = every rank's send (count elements) in rank order */
    void (*all_gather)(void *ctx, const void *send, void *recv, size_t count);
    /* recv (count / T) = this rank's slice of the sum of every rank's send (count) */
    void (*reduce_scatter)(void *ctx, const void *send, void *recv, size_t count);
    /* the sum of part (count elements, compute dtype) over the group, started: in
     * place when out == part (all-reduce), else this rank's slice into out
     * (reduce-scatter); wait(handle) finishes it. One in flight at a time. */
    void *(*reduce_start)(void *ctx, void *part, void *out, size_t count);
    void (*wait)(void *ctx, void *handle);
} dt_net_tp_ops;

/* Context parallelism (model.h: a layout with cp_size > 1): the ring of the CP group,
 * on device buffers. runtime/parallel/cp.c fills it; NULL at CP size 1. ring_start
 * sends `send` (bytes) to the next rank of the group and receives `recv` (bytes) from
 * the previous one; ring_wait finishes both. One exchange in flight at a time. A
 * failure is recorded by the filler and reported after the micro-step, as TP's. */
typedef struct dt_net_cp_ops {
    void *(*ring_start)(void *ctx, const void *send, void *recv, size_t bytes);
    void (*ring_wait)(void *ctx, void *handle);
    /* recv's block j (bytes) = rank j's send block of this rank (send: one block of
     * bytes per rank, in rank order); returns when both are done (Ulysses) */
    void (*all_to_all)(void *ctx, const void *send, void *recv, size_t bytes);
} dt_net_cp_ops;

typedef struct dt_net {
    dt_device_t *dev;
    const dt_model_layout *layout;
    int B, T;    /* micro-batch and sequence length of the arena */
    size_t elsize;
    void **unit_params; /* (n_units) device pointers */
    void **unit_grads;
    dt_net_hook_fn hook;
    void *hook_ctx;
    const dt_net_tp_ops *tp; /* NULL at TP size 1 */
    void *tp_ctx;
    const dt_net_cp_ops *cp; /* NULL at CP size 1 */
    void *cp_ctx;
    int32_t *h_cp; /* context parallelism: this rank's rows of a batch (tokens, targets,
                      positions, then the attention's indices: net_cp.c) */
    /* arena */
    void *arena;
    size_t arena_bytes;
    size_t *off; /* byte offsets of the arena slots (the model's numbering) */
    int n_slots;
    int *d_tokens, *d_targets; /* device copies of the batch */
    void *d_features;
    int *d_positions; /* the current arena's copy of its batch's positions, NULL when
                         that batch had none: what the ops get (kernels.h: pos) */
    int have_positions; /* of the current arena: its forward's batch had positions */
    float *h_losses; /* host copy of per-row losses */
    int *h_tokens;   /* TP layouts: the batch's tokens as this rank's vocabulary rows
                        (token - tp_rank * Vp/T, or -1 when another rank holds the row),
                        what the tokens slot holds there; the targets stay global */
    int n_rows;      /* rows of the loss: B*T (T = 1 for feature rows) */
    int have_forward; /* of the current arena: a forward (of chunk fwd_chunk) awaits its backward */
    int fwd_chunk;
    /* pipeline stages */
    int chunk;            /* the layout's chunk the next forward/backward runs (0 by default) */
    void *head_w, *head_dw; /* layout.has_tied_copy: device buffers the caller owns, the
                               embedding's (local TP) rows used as the head's weight and
                               their gradient, accumulated (+=) by backward; no hook is
                               called for them */
    void **arenas;        /* (n_arenas) arena i's memory; arena = arenas[cur_arena] */
    int *arena_state;     /* per arena: have_forward | have_positions << 1 | fwd_chunk << 2
                             while not current */
    int n_arenas, cur_arena;
    int decode;          /* a decode net (dt_net_decode_init): B = T = 1 plus a KV cache */
    uint64_t rows_run;   /* positions computed so far: B*T per forward, 1 per decode */
    /* LoRA (runtime/model/lora.h; dt_net_lora_attach): the frozen base's weights are
     * the lora's buffers, unit_params/unit_grads point at the adapters' units */
    struct dt_lora *lora;
    void *lora_scratch; /* (2, rows, r) compute dtype: A x and its gradient */
} dt_net_t;

/* Sizes the arena for micro-batch B (and T = layout seq_len) and allocates it. */
dt_status_t dt_net_init(dt_net_t *net, dt_device_t *dev, const dt_model_layout *layout, int B);
void dt_net_free(dt_net_t *net);
/* Points every unit at its range of the flat params and grads buffers. */
void dt_net_bind(dt_net_t *net, void *params, void *grads);
/* Runs the net as a LoRA model: the layout the net was made with is lora's base,
 * its linear layers add the adapters (net_impl.h: dt_net_linear_*), the strategy
 * binds the units of lora->adapters. Allocates the adapters' scratch (2 x rows x r,
 * activations). UNSUPPORTED when the device lacks the LoRA ops (kernels.h gemm,
 * and the int8 matmuls for an int8 base). */
dt_status_t dt_net_lora_attach(dt_net_t *net, struct dt_lora *lora);
/* Activation arena bytes for a layout, micro-batch and device (for plans). */
size_t dt_net_arena_bytes(const dt_device_t *dev, const dt_model_layout *layout, int B);

/* Forward with loss; *mean_loss gets the mean over the B*T (or B) rows.
 * Context parallelism (layout cp_size > 1): the batch is the whole sequences (B,
 * seq_len), the net takes this rank's rows of them (T = seq_len / cp_size: its two
 * chunks, runtime/layout/layout.h) and the mean is over those B*T rows. A stage's
 * chunk (net->chunk) that is not last computes no loss (*mean_loss = NAN; targets
 * are not read); one that is not first reads no tokens but the IN buffer. Every
 * chunk reads the positions when the batch has them: DT_STATUS_INVALID naming the
 * row and column where they break the rule of dt_batch (dt_net_check_positions),
 * or for a model without tokens. */
dt_status_t dt_net_forward(dt_net_t *net, const dt_batch *batch, double *mean_loss);
/* OK when positions (B, T) follow dt_batch's rule: pos[b][0] == 0 and each later
 * one 0 or the previous + 1; else DT_STATUS_INVALID naming the first bad row and
 * column and its value. */
dt_status_t dt_net_check_positions(const int32_t *positions, int B, int T);
/* Backward of the current arena's forward (of the same chunk): gradients += d(dscale
 * * sum of row losses), or, for a chunk that is not last, of the gradient the DOUT
 * buffer holds (dscale unused). */
dt_status_t dt_net_backward(dt_net_t *net, float dscale);

/* ---- pipeline stages ---- */

/* The boundary buffers of a chunk, device memory of the current arena:
 *   IN   what a chunk that is not first reads instead of the embedding (fill it
 *        before the forward; the backward reads it again)
 *   OUT  what a chunk that is not last leaves (its last block's output: send it
 *        after the forward)
 *   DOUT the gradient of OUT (fill it before the backward)
 *   DIN  the gradient of IN (send it after the backward)
 * Each holds dt_net_stage_elems elements of the compute dtype: the residual stream,
 * B*T*C, or this TP rank's B*T/T rows of it under sequence parallelism. OUT and DIN
 * stay valid until the next forward or backward in the same arena (other arenas'
 * passes do not touch them), so they may be sent asynchronously. DOUT and DIN are
 * one buffer (the backward turns one into the other in place): fill DOUT only once
 * the previous DIN of the arena has gone, which a forward in between ensures. OUT
 * depends on the chunk: ask with net->chunk set to the chunk that ran. */
typedef enum dt_net_stage_io {
    DT_NET_STAGE_IN = 0,
    DT_NET_STAGE_OUT = 1,
    DT_NET_STAGE_DOUT = 2,
    DT_NET_STAGE_DIN = 3,
} dt_net_stage_io;
void *dt_net_stage_buf(dt_net_t *net, dt_net_stage_io which);
size_t dt_net_stage_elems(const dt_net_t *net);
/* Ensures n arenas exist (arena 0 is dt_net_init's; new ones, the same bytes and
 * slots, allocated in DT_MEM_ACTIVATIONS), so n forwards can await their backward:
 * one arena per (micro-batch, chunk) in flight (interleaving keeps a rank's chunks of
 * one micro-batch in flight together). */
dt_status_t dt_net_arenas(dt_net_t *net, int n);
/* Selects arena i for the next forwards/backwards and the stage buffers; each arena
 * keeps its own pending forward, so backward of arena i works after forwards in
 * others. DT_STATUS_INVALID for an arena dt_net_arenas has not made. */
dt_status_t dt_net_use(dt_net_t *net, int i);
/* Models with logits (ops->logits_slot >= 0): forward of tokens (B, T) without
 * loss, then the logits (vocab_padded floats, host) of row b at position t are
 * copied to out. For sampling. */
dt_status_t dt_net_logits(dt_net_t *net, const int32_t *tokens, int b, int t, float *out);
/* The same for rows t0 .. t0+n-1 of sequence b: out gets n rows of vocab_padded. */
dt_status_t dt_net_logits_rows(dt_net_t *net, const int32_t *tokens, int b, int t0, int n, float *out);

/* ---- KV-cache decoding (model.h: the optional decode slots) ----
 * A decode net runs one sequence one position at a time: the model keeps the keys
 * and values of the positions run so far in a cache in the arena (seq_len rows per
 * layer), so position pos costs one row of compute plus attention over pos+1 cached
 * rows, instead of a whole (1, seq_len) forward. The arena holds B = T = 1
 * activations and the cache; units are bound as for any net (dt_net_bind). */

/* 1 when the model has a decode path and the device the attention_decode op. */
int dt_net_can_decode(const dt_device_t *dev, const dt_model_layout *layout);
/* A decode net; DT_STATUS_UNSUPPORTED (with the reason) when !dt_net_can_decode. */
dt_status_t dt_net_decode_init(dt_net_t *net, dt_device_t *dev, const dt_model_layout *layout);
/* Runs token at position pos (0 <= pos < seq_len; the positions before it were
 * decoded in order since, or rewritten by later calls for, the same sequence) and
 * copies its logits (vocab_padded floats, host) to out. */
dt_status_t dt_net_decode(dt_net_t *net, int32_t token, int pos, float *out);

#endif /* DT_RUNTIME_NET_H */
