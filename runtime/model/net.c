/*
 * net.c - the machinery every model's forward/backward shares (net.h): the
 * activation arena, unit binding, batch upload, loss and logits, and the chunk
 * driver of decoder stacks (net_impl.h: dt_net_stack): the hooks around units, the
 * first and last pipeline chunk, the tied head and the loss, around the model's own
 * embedding, block and final norm math (gpt.c, llama.c). mlp.c has its own
 * forward/backward.
 */
#include "runtime/model/net.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xcalloc, dt_xrealloc */
#include "runtime/model/net_impl.h"

/* Computes slot offsets (each slot rounded up to 64 bytes) of the training arena,
 * or of the decode arena when decode; returns the arena size. off may be NULL. */
static size_t plan_arena(const dt_device_t *dev, const dt_model_layout *lay, int B, int decode, size_t *off) {
    const dt_model_ops *ops = lay->spec.ops;
    int n = decode ? ops->decode_slots(lay) : ops->arena_slots(lay);
    size_t *sizes = dt_xcalloc((size_t)n, sizeof *sizes), pos = 0;
    if (decode) ops->decode_sizes(dev, lay, sizes);
    else ops->arena_sizes(dev, lay, B, sizes);
    if (!decode && lay->cp_size > 1) sizes[DT_NET_SLOT_POSITIONS] = dt_net_cp_positions_bytes(lay, B);
    for (int i = 0; i < n; i++) {
        if (off) off[i] = pos;
        pos += (sizes[i] + 63) & ~(size_t)63;
    }
    free(sizes);
    return pos;
}

size_t dt_net_arena_bytes(const dt_device_t *dev, const dt_model_layout *layout, int B) {
    return plan_arena(dev, layout, B, 0, NULL);
}

/* The batch slots of the current arena; the positions only when its batch had them. */
static void point_batch(dt_net_t *net) {
    net->d_tokens = dt_net_slot(net, DT_NET_SLOT_TOKENS);
    net->d_targets = dt_net_slot(net, DT_NET_SLOT_TARGETS);
    net->d_features = dt_net_slot(net, DT_NET_SLOT_FEATURES);
    net->d_positions = net->have_positions ? dt_net_slot(net, DT_NET_SLOT_POSITIONS) : NULL;
}

/* A layout of a pipeline stage (not the whole model). */
static int is_stage(const dt_model_layout *l) { return l->pp_size > 1 || l->n_chunks > 1; }

/* The arena and the per-unit pointers of a net of B sequences of T positions. */
static dt_status_t net_alloc(dt_net_t *net, dt_device_t *dev, const dt_model_layout *layout, int B, int T,
                             int decode) {
    const dt_model_ops *ops = layout->spec.ops;
    net->dev = dev;
    net->layout = layout;
    net->B = B;
    net->T = T;
    net->decode = decode;
    net->elsize = dt_dtype_size(dev->ops->dtype);
    net->n_rows = B * net->T;
    net->n_slots = decode ? ops->decode_slots(layout) : ops->arena_slots(layout);
    net->off = dt_xcalloc((size_t)net->n_slots, sizeof *net->off);
    net->arena_bytes = plan_arena(dev, layout, B, decode, net->off);
    dt_status_t st = dev->ops->alloc(dev, DT_MEM_ACTIVATIONS, net->arena_bytes, &net->arena);
    if (st != DT_STATUS_OK) {
        free(net->off);
        net->off = NULL;
        return dt_error_prefix(st, "cannot allocate %.1f MiB of activations for %s %d",
                               (double)net->arena_bytes / (1 << 20), decode ? "decoding, seq_len" : "micro-batch",
                               decode ? layout->seq_len : B);
    }
    net->arenas = dt_xcalloc(1, sizeof *net->arenas);
    net->arena_state = dt_xcalloc(1, sizeof *net->arena_state);
    net->arenas[0] = net->arena;
    net->n_arenas = 1;
    point_batch(net);
    net->h_losses = dt_xcalloc((size_t)net->n_rows, sizeof(float));
    net->unit_params = dt_xcalloc((size_t)layout->n_units, sizeof(void *));
    net->unit_grads = dt_xcalloc((size_t)layout->n_units, sizeof(void *));
    return DT_STATUS_OK;
}

dt_status_t dt_net_init(dt_net_t *net, dt_device_t *dev, const dt_model_layout *layout, int B) {
    memset(net, 0, sizeof *net);
    if (B <= 0) return dt_error(DT_STATUS_INVALID, "micro-batch must be > 0, found %d", B);
    if (layout->spec.ops->net_check) DT_CHECK(layout->spec.ops->net_check(layout));
    return net_alloc(net, dev, layout, B, dt_model_rows(layout), 0);
}

int dt_net_can_decode(const dt_device_t *dev, const dt_model_layout *layout) {
    const dt_model_ops *ops = layout->spec.ops;
    return ops->decode && ops->decode_slots && ops->decode_sizes && ops->decode_logits_slot >= 0 &&
           dev->ops->attention_decode;
}

dt_status_t dt_net_decode_init(dt_net_t *net, dt_device_t *dev, const dt_model_layout *layout) {
    memset(net, 0, sizeof *net);
    const dt_model_ops *ops = layout->spec.ops;
    if (!ops->decode)
        return dt_error(DT_STATUS_UNSUPPORTED, "model %s has no KV-cache decode path", ops->name);
    if (!dt_net_can_decode(dev, layout))
        return dt_error(DT_STATUS_UNSUPPORTED, "the %s device has no attention_decode op",
                        dt_device_kind_name(dev->kind));
    if (layout->tp_size > 1)
        return dt_error(DT_STATUS_UNSUPPORTED, "no KV-cache decoding of a tensor-parallel piece (load it at TP 1)");
    if (is_stage(layout))
        return dt_error(DT_STATUS_UNSUPPORTED, "no KV-cache decoding of a pipeline stage (load the whole model)");
    if (ops->net_check) DT_CHECK(ops->net_check(layout));
    return net_alloc(net, dev, layout, 1, 1, 1);
}

void dt_net_free(dt_net_t *net) {
    for (int i = 0; net->dev && i < net->n_arenas; i++)
        if (net->arenas[i]) net->dev->ops->free(net->dev, net->arenas[i]);
    if (net->dev && !net->arenas && net->arena) net->dev->ops->free(net->dev, net->arena);
    if (net->dev && net->lora_scratch) net->dev->ops->free(net->dev, net->lora_scratch);
    free(net->arenas);
    free(net->arena_state);
    free(net->off);
    free(net->h_losses);
    free(net->h_tokens);
    free(net->h_cp);
    free(net->unit_params);
    free(net->unit_grads);
    memset(net, 0, sizeof *net);
}

void dt_net_bind(dt_net_t *net, void *params, void *grads) {
    for (int u = 0; u < net->layout->n_units; u++) {
        size_t off = net->layout->units[u].offset * net->elsize;
        net->unit_params[u] = params ? (char *)params + off : NULL;
        net->unit_grads[u] = grads ? (char *)grads + off : NULL;
    }
}

static dt_status_t upload(dt_net_t *net, void *dst, const void *src, size_t bytes) {
    return net->dev->ops->copy(net->dev, dst, src, bytes, DT_COPY_HOST_TO_DEVICE);
}

dt_status_t dt_net_check_positions(const int32_t *positions, int B, int T) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int32_t p = positions[(size_t)b * T + t];
            if (t == 0 ? p == 0 : p == 0 || p == positions[(size_t)b * T + t - 1] + 1) continue;
            if (t == 0)
                return dt_error(DT_STATUS_INVALID, "positions[%d][0] = %d: a row starts a document (0)", b, (int)p);
            return dt_error(DT_STATUS_INVALID,
                            "positions[%d][%d] = %d: a position is 0 (a document starts) or the previous one + 1 "
                            "(%d)",
                            b, t, (int)p, (int)positions[(size_t)b * T + t - 1] + 1);
        }
    return DT_STATUS_OK;
}

/* The batch's positions into the current arena (every chunk: attention and RoPE
 * read them in every stage), or none: the ops then get NULL. Checked first: a
 * refused batch leaves the arena as it was. */
static dt_status_t upload_positions(dt_net_t *net, const int32_t *positions) {
    if (positions) {
        const dt_model_layout *l = net->layout;
        size_t bytes = (size_t)net->n_rows * sizeof(int), k = DT_NET_SLOT_POSITIONS;
        size_t end = (int)k + 1 < net->n_slots ? net->off[k + 1] : net->arena_bytes; /* the slot's end */
        if (l->spec.ops->data != DT_MODEL_DATA_TOKENS || end - net->off[k] < bytes)
            return dt_error(DT_STATUS_INVALID, "model %s takes no positions (packed sequences are for token models)",
                            l->spec.ops->name);
        if (l->cp_size > 1) { /* this rank's rows (checked whole), then the attention's indices */
            bytes = dt_net_cp_positions_bytes(l, net->B);
            positions = dt_net_cp_index_rows(net);
        } else {
            DT_CHECK(dt_net_check_positions(positions, net->B, net->T));
        }
        DT_CHECK(upload(net, dt_net_slot(net, DT_NET_SLOT_POSITIONS), positions, bytes));
    }
    net->have_positions = positions != NULL;
    point_batch(net);
    return DT_STATUS_OK;
}

dt_status_t dt_net_forward(dt_net_t *net, const dt_batch *batch, double *mean_loss) {
    const dt_model_layout *l = net->layout;
    if (net->decode) return dt_error(DT_STATUS_INVALID, "a decode net has no training forward");
    if (net->chunk < 0 || net->chunk >= l->n_chunks)
        return dt_error(DT_STATUS_INVALID, "chunk %d outside the layout's %d chunk(s)", net->chunk, l->n_chunks);
    const dt_model_chunk *c = &l->chunks[net->chunk];
    if (c->last && l->has_tied_copy && !net->head_w)
        return dt_error(DT_STATUS_INVALID, "the last stage's tied head needs its weight (net->head_w) set");
    size_t rows = (size_t)net->n_rows;
    dt_batch local;
    if (l->cp_size > 1) { /* whole sequences in, this rank's rows of them on */
        DT_CHECK(dt_net_cp_take_rows(net, batch, &local));
        batch = &local;
    }
    DT_CHECK(upload_positions(net, batch->positions));
    if (!c->first) {
        /* the IN buffer holds the previous chunk's output */
    } else if (l->spec.ops->data == DT_MODEL_DATA_TOKENS && l->tp_size > 1) {
        /* A TP rank holds vocabulary rows [v0, v0 + Vp/T): the tokens slot gets each
         * token's row there, -1 for the others' (net.h). */
        int Vl = l->vocab_padded / l->tp_size, v0 = l->tp_rank * Vl;
        if (!net->h_tokens) net->h_tokens = dt_xcalloc(rows, sizeof(int));
        for (size_t i = 0; i < rows; i++) {
            int t = batch->tokens[i] - v0;
            net->h_tokens[i] = t >= 0 && t < Vl ? t : -1;
        }
        DT_CHECK(upload(net, net->d_tokens, net->h_tokens, rows * sizeof(int)));
    } else if (l->spec.ops->data == DT_MODEL_DATA_TOKENS) {
        DT_CHECK(upload(net, net->d_tokens, batch->tokens, rows * sizeof(int)));
    } else {
        DT_CHECK(net->dev->ops->upload_f32(net->dev, net->d_features, batch->features,
                                           (size_t)net->B * (size_t)l->in_features));
    }
    net->fwd_chunk = net->chunk;
    if (!c->last) {
        l->spec.ops->forward(net, 0);
        net->rows_run += rows;
        *mean_loss = NAN;
        net->have_forward = 1;
        return net->dev->ops->synchronize(net->dev);
    }
    DT_CHECK(upload(net, net->d_targets, batch->targets, rows * sizeof(int)));
    l->spec.ops->forward(net, 1);
    net->rows_run += rows;
    DT_CHECK(net->dev->ops->copy(net->dev, net->h_losses, dt_net_slot(net, DT_NET_SLOT_LOSSES),
                                 rows * sizeof(float), DT_COPY_DEVICE_TO_HOST));
    DT_CHECK(net->dev->ops->synchronize(net->dev));
    double sum = 0;
    for (size_t i = 0; i < rows; i++) sum += net->h_losses[i];
    *mean_loss = sum / (double)rows;
    net->have_forward = 1;
    return DT_STATUS_OK;
}

dt_status_t dt_net_backward(dt_net_t *net, float dscale) {
    if (!net->have_forward) return dt_error(DT_STATUS_INVALID, "backward without a forward");
    if (net->fwd_chunk != net->chunk)
        return dt_error(DT_STATUS_INVALID, "backward of chunk %d in arena %d, whose forward ran chunk %d", net->chunk,
                        net->cur_arena, net->fwd_chunk);
    net->layout->spec.ops->backward(net, dscale);
    net->have_forward = 0; /* the logits were consumed */
    return net->dev->ops->synchronize(net->dev);
}

dt_status_t dt_net_logits_rows(dt_net_t *net, const int32_t *tokens, int b, int t0, int n, float *out) {
    const dt_model_ops *ops = net->layout->spec.ops;
    if (ops->logits_slot < 0)
        return dt_error(DT_STATUS_UNSUPPORTED, "model %s has no logits to sample from", ops->name);
    if (net->decode) return dt_error(DT_STATUS_INVALID, "a decode net runs dt_net_decode, not a forward");
    if (net->layout->tp_size > 1)
        return dt_error(DT_STATUS_UNSUPPORTED, "logits of a tensor-parallel piece are a slice of the vocabulary: "
                                               "sample from a checkpoint (any TP size loads at TP 1)");
    if (is_stage(net->layout))
        return dt_error(DT_STATUS_UNSUPPORTED, "logits of a pipeline stage: sample from a checkpoint (it loads whole)");
    if (b < 0 || b >= net->B || t0 < 0 || n < 1 || t0 + n > net->T)
        return dt_error(DT_STATUS_INVALID, "logits rows [%d, %d) of sequence %d outside (%d, %d)", t0, t0 + n, b,
                        net->B, net->T);
    size_t rows = (size_t)net->n_rows;
    DT_CHECK(upload_positions(net, NULL));
    DT_CHECK(upload(net, net->d_tokens, tokens, rows * sizeof(int)));
    ops->forward(net, 0);
    net->rows_run += rows;
    size_t Vp = (size_t)net->layout->vocab_padded;
    const char *row = (const char *)dt_net_slot(net, ops->logits_slot) +
                      ((size_t)b * (size_t)net->T + (size_t)t0) * Vp * net->elsize;
    net->have_forward = 0;
    DT_CHECK(net->dev->ops->download_f32(net->dev, out, row, Vp * (size_t)n));
    return net->dev->ops->synchronize(net->dev);
}

dt_status_t dt_net_logits(dt_net_t *net, const int32_t *tokens, int b, int t, float *out) {
    return dt_net_logits_rows(net, tokens, b, t, 1, out);
}

dt_status_t dt_net_decode(dt_net_t *net, int32_t token, int pos, float *out) {
    const dt_model_layout *l = net->layout;
    if (!net->decode) return dt_error(DT_STATUS_INVALID, "dt_net_decode needs a decode net (dt_net_decode_init)");
    if (pos < 0 || pos >= l->seq_len)
        return dt_error(DT_STATUS_INVALID, "decode position %d outside the context [0, %d)", pos, l->seq_len);
    if (token < 0 || token >= l->vocab_padded)
        return dt_error(DT_STATUS_INVALID, "token %d outside the vocabulary [0, %d)", token, l->vocab_padded);
    int tok = token;
    DT_CHECK(upload(net, net->d_tokens, &tok, sizeof tok));
    l->spec.ops->decode(net, pos);
    net->rows_run += 1;
    const void *row = dt_net_slot(net, l->spec.ops->decode_logits_slot);
    DT_CHECK(net->dev->ops->download_f32(net->dev, out, row, (size_t)l->vocab_padded));
    return net->dev->ops->synchronize(net->dev);
}

/* ---- pipeline stages ---- */

void *dt_net_stage_buf(dt_net_t *net, dt_net_stage_io which) {
    const dt_model_ops *ops = net->layout->spec.ops;
    if (!ops->stage_buf || net->decode || net->chunk < 0 || net->chunk >= net->layout->n_chunks) return NULL;
    return ops->stage_buf(net, (int)which);
}

size_t dt_net_stage_elems(const dt_net_t *net) {
    const dt_model_layout *l = net->layout;
    if (!l->spec.ops->pipeline || !l->spec.ops->dims) return 0;
    dt_model_dims d;
    l->spec.ops->dims(l, &d);
    size_t rows = (size_t)net->n_rows;
    if (l->sequence_parallel && l->tp_size > 1) rows /= (size_t)l->tp_size;
    return rows * (size_t)d.hidden;
}

dt_status_t dt_net_arenas(dt_net_t *net, int n) {
    if (net->decode) return dt_error(DT_STATUS_INVALID, "a decode net has one arena");
    if (n <= net->n_arenas) return DT_STATUS_OK;
    net->arenas = dt_xrealloc(net->arenas, (size_t)n * sizeof *net->arenas);
    net->arena_state = dt_xrealloc(net->arena_state, (size_t)n * sizeof *net->arena_state);
    for (int i = net->n_arenas; i < n; i++) {
        net->arena_state[i] = 0;
        dt_status_t st = net->dev->ops->alloc(net->dev, DT_MEM_ACTIVATIONS, net->arena_bytes, &net->arenas[i]);
        if (st != DT_STATUS_OK)
            return dt_error_prefix(st, "cannot allocate activations for micro-batch %d in flight (%.1f MiB each)",
                                   i + 1, (double)net->arena_bytes / (1 << 20));
        net->n_arenas = i + 1;
    }
    return DT_STATUS_OK;
}

dt_status_t dt_net_use(dt_net_t *net, int i) {
    if (i < 0 || i >= net->n_arenas)
        return dt_error(DT_STATUS_INVALID, "arena %d: only %d exist (dt_net_arenas)", i, net->n_arenas);
    net->arena_state[net->cur_arena] =
        (net->have_forward ? 1 : 0) | (net->have_positions ? 2 : 0) | net->fwd_chunk << 2;
    net->cur_arena = i;
    net->arena = net->arenas[i];
    net->have_forward = net->arena_state[i] & 1;
    net->have_positions = (net->arena_state[i] >> 1) & 1;
    net->fwd_chunk = net->arena_state[i] >> 2;
    point_batch(net);
    return DT_STATUS_OK;
}

/* ---- the chunk driver (net_impl.h: dt_net_stack) ---- */

/* A chunk's rows and widths: the residual stream C wide, R rows (B*T, or this TP
 * rank's B*T/T under sequence parallelism); the head Vl = Vp/T vocabulary rows. */
typedef struct stack_geom {
    int L, C, BT, R, Vl, sp;
    size_t rc;
} stack_geom;

static stack_geom stack_geom_of(const dt_net_t *net) {
    const dt_model_layout *l = net->layout;
    dt_model_dims d;
    l->spec.ops->dims(l, &d);
    int tp = l->tp_size > 1 ? l->tp_size : 1;
    stack_geom g = {.L = d.n_layer, .C = d.hidden, .BT = net->n_rows, .sp = l->sequence_parallel};
    g.R = g.sp ? g.BT / tp : g.BT;
    g.Vl = l->vocab_padded / tp;
    g.rc = (size_t)g.R * g.C;
    return g;
}

#define SLOT(s) dt_net_slot(net, (s))

/* The output of the chunk's block j. */
static void *block_out(dt_net_t *net, const dt_net_stack *s, int j) {
    return SLOT(dt_model_block_slot(net->layout, s->blocks, j, s->block_out));
}

/* The unit whose hooks surround the head: unit 0 when the head is its embedding, none
 * (-1) for the caller's tied copy (net->head_w), else the final unit uf (lm_head). */
static int head_unit(const dt_model_layout *l, int uf) { return l->tied_head ? 0 : l->has_tied_copy ? -1 : uf; }

static void *head_weight(dt_net_t *net, int grad) {
    const dt_model_layout *l = net->layout;
    if (l->has_tied_copy) return grad ? net->head_dw : net->head_w;
    int t = l->tied_head ? 0 : l->n_tensors - 1;
    return grad ? dt_net_grad(net, t) : dt_net_param(net, t);
}

/* Forward, from the final norm to the head: the final unit's hooks close first
 * unless the head is its own tensor, and the head's unit opens. */
static void head_enter(dt_net_t *net, int uf, int hu) {
    if (hu != uf) dt_net_hook(net, uf, DT_NET_FWD_POST);
    if (hu >= 0 && hu != uf) dt_net_hook(net, hu, DT_NET_FWD_PRE);
}

void dt_net_stack_forward(dt_net_t *net, int with_loss) {
    const dt_model_layout *lay = net->layout;
    const dt_net_stack *s = lay->spec.ops->stack;
    const dt_model_chunk *ch = &lay->chunks[net->chunk];
    stack_geom g = stack_geom_of(net);
    if (ch->first) {
        dt_net_hook(net, 0, DT_NET_FWD_PRE);
        s->embed_forward(net);
        dt_net_hook(net, 0, DT_NET_FWD_POST);
    }
    void *residual = SLOT(s->in);
    for (int l = ch->l0; l < ch->l1; l++) {
        int j = l - ch->l0, u = dt_model_local_unit(lay, 1 + l);
        dt_net_hook(net, u, DT_NET_FWD_PRE);
        s->block_forward(net, l, j, residual, DT_MODEL_RECOMPUTE_NONE);
        residual = block_out(net, s, j);
        dt_net_hook(net, u, DT_NET_FWD_POST);
    }
    if (!ch->last) return;
    int uf = dt_model_local_unit(lay, g.L + 1), hu = head_unit(lay, uf);
    dt_net_hook(net, uf, DT_NET_FWD_PRE);
    s->norm_forward(net, residual);
    head_enter(net, uf, hu);
    /* sequence parallelism: gath keeps the gathered norm until the head's backward */
    void *x = dt_net_tp_gather_in(net, SLOT(s->norm), SLOT(s->gath), g.rc);
    void *logits = SLOT(lay->spec.ops->logits_slot);
    net->dev->ops->matmul_forward(net->dev, logits, x, head_weight(net, 0), NULL, g.BT, g.C, g.Vl);
    if (hu >= 0) dt_net_hook(net, hu, DT_NET_FWD_POST);
    if (with_loss) dt_net_xent_forward(net, SLOT(DT_NET_SLOT_LOSSES), logits, SLOT(s->xstats), g.BT);
}

/* From the loss in a last chunk, else from the gradient of the chunk's output in dres
 * (DOUT); in a chunk that is not first dres ends holding the gradient of its input
 * (DIN). A tied head's unit 0 is the first BWD_PRE and the last BWD_POST. */
void dt_net_stack_backward(dt_net_t *net, float dscale) {
    const dt_model_layout *lay = net->layout;
    const dt_net_stack *s = lay->spec.ops->stack;
    const dt_model_chunk *ch = &lay->chunks[net->chunk];
    stack_geom g = stack_geom_of(net);
    int nbc = ch->l1 - ch->l0;
    if (ch->last) {
        int uf = dt_model_local_unit(lay, g.L + 1), hu = head_unit(lay, uf);
        if (hu >= 0) dt_net_hook(net, hu, DT_NET_BWD_PRE);
        void *logits = SLOT(lay->spec.ops->logits_slot);
        dt_net_xent_backward(net, logits, SLOT(s->xstats), dscale, g.BT); /* the logits become dlogits */
        /* the head: x was gathered in the forward (gath kept it) */
        void *dnorm = dt_net_tp_column_backward(net, SLOT(s->dtmp), SLOT(s->dred), head_weight(net, 1), NULL, logits,
                                                g.sp ? SLOT(s->gath) : SLOT(s->norm), head_weight(net, 0), g.BT, g.C,
                                                g.Vl);
        void *top = nbc > 0 ? block_out(net, s, nbc - 1) : SLOT(s->in);
        if (hu != uf) dt_net_hook(net, uf, DT_NET_BWD_PRE);
        dt_net_zero(net, s->dres, g.rc);
        s->norm_backward(net, dnorm, top);
        dt_net_hook(net, uf, DT_NET_BWD_POST);
    }
    for (int l = ch->l1 - 1; l >= ch->l0; l--) {
        int j = l - ch->l0, u = dt_model_local_unit(lay, 1 + l);
        void *residual = j > 0 ? block_out(net, s, j - 1) : SLOT(s->in);
        dt_model_recompute_t redo = dt_model_block_recompute(lay, j);
        if (redo != DT_MODEL_RECOMPUTE_NONE) { /* its dropped activations, as the forward made them */
            dt_net_hook(net, u, DT_NET_FWD_PRE);
            s->block_forward(net, l, j, residual, redo);
            dt_net_hook(net, u, DT_NET_FWD_POST);
        }
        dt_net_hook(net, u, DT_NET_BWD_PRE);
        s->block_backward(net, l, j, residual);
        dt_net_hook(net, u, DT_NET_BWD_POST);
    }
    if (!ch->first) return; /* dres: the gradient of the chunk's input */
    if (!(ch->last && lay->tied_head)) dt_net_hook(net, 0, DT_NET_BWD_PRE);
    s->embed_backward(net, dt_net_tp_gather_in(net, SLOT(s->dres), SLOT(s->part), g.rc));
    dt_net_hook(net, 0, DT_NET_BWD_POST);
}

/* The chunk's input is in (where the embedding would write), its output the last
 * block's, and the backward turns dres from the output's gradient into the input's. */
void *dt_net_stack_stage_buf(dt_net_t *net, int which) {
    const dt_net_stack *s = net->layout->spec.ops->stack;
    const dt_model_chunk *ch = &net->layout->chunks[net->chunk];
    switch (which) {
    case DT_NET_STAGE_IN: return SLOT(s->in);
    case DT_NET_STAGE_OUT: return ch->l1 > ch->l0 ? block_out(net, s, ch->l1 - ch->l0 - 1) : SLOT(s->in);
    case DT_NET_STAGE_DOUT:
    case DT_NET_STAGE_DIN: return SLOT(s->dres);
    default: return NULL;
    }
}

/* One position of a decode net (a whole model: local units are global): the
 * forward's hooks and head around the model's decode math, the head's rows of all
 * vocab_padded columns into ops->decode_logits_slot. */
void dt_net_stack_decode(dt_net_t *net, int pos) {
    const dt_model_layout *lay = net->layout;
    const dt_net_stack *s = lay->spec.ops->stack;
    dt_model_dims d;
    lay->spec.ops->dims(lay, &d);
    dt_net_hook(net, 0, DT_NET_FWD_PRE);
    s->decode_embed(net, pos);
    dt_net_hook(net, 0, DT_NET_FWD_POST);
    for (int l = 0; l < d.n_layer; l++) {
        dt_net_hook(net, 1 + l, DT_NET_FWD_PRE);
        s->decode_block(net, l, pos);
        dt_net_hook(net, 1 + l, DT_NET_FWD_POST);
    }
    int uf = d.n_layer + 1, hu = head_unit(lay, uf);
    dt_net_hook(net, uf, DT_NET_FWD_PRE);
    s->decode_norm(net);
    head_enter(net, uf, hu);
    net->dev->ops->matmul_forward(net->dev, SLOT(lay->spec.ops->decode_logits_slot), SLOT(s->decode_norm_slot),
                                  head_weight(net, 0), NULL, 1, d.hidden, lay->vocab_padded);
    if (hu >= 0) dt_net_hook(net, hu, DT_NET_FWD_POST);
}

#undef SLOT

/* ---- tensor-parallel matmuls (net_impl.h) ---- */

void dt_net_tp_row_forward(dt_net_t *net, void *out, void *part, const void *inp, const void *w, const void *bias,
                           int BT, int IC, int C) {
    if (!net->tp || !net->layout->sequence_parallel) part = out;
    net->dev->ops->matmul_forward(net->dev, part, inp, w, net->layout->tp_rank == 0 ? bias : NULL, BT, IC, C);
    dt_net_tp_reduce_out(net, part, out, (size_t)BT * C);
}

void *dt_net_tp_column_backward(dt_net_t *net, void *dtmp, void *dred, void *dw, void *db, const void *dout,
                                const void *x, const void *w, int BT, int C, int OC) {
    const dt_ops_t *o = net->dev->ops;
    size_t btc = (size_t)BT * C;
    o->set(net->dev, dtmp, 0, btc * net->elsize);
    if (!net->tp) {
        o->matmul_backward(net->dev, dtmp, dw, db, dout, x, w, BT, C, OC);
        return dtmp;
    }
    void *dinp = net->layout->sequence_parallel ? dred : dtmp;
    o->matmul_backward(net->dev, dtmp, NULL, NULL, dout, x, w, BT, C, OC);
    void *h = dt_net_tp_reduce_start(net, dtmp, dinp, btc);
    o->matmul_backward(net->dev, NULL, dw, db, dout, x, w, BT, C, OC);
    dt_net_tp_wait(net, h);
    return dinp;
}

void dt_net_xent_forward(dt_net_t *net, float *losses, const void *logits, float *stats, int BT) {
    const dt_model_layout *l = net->layout;
    const dt_ops_t *o = net->dev->ops;
    int V = l->spec.vocab_size, Vp = l->vocab_padded;
    if (l->tp_size <= 1) {
        o->softmax_xent_forward(net->dev, losses, logits, net->d_targets, BT, V, Vp);
        return;
    }
    int Vl = Vp / l->tp_size, v0 = l->tp_rank * Vl;
    o->xent_vp_max(net->dev, stats, logits, BT, Vl, v0, V);
    dt_net_tp_max_f32(net, stats, (size_t)BT);
    o->xent_vp_sums(net->dev, stats, logits, net->d_targets, BT, Vl, v0, V);
    dt_net_tp_sum_f32(net, stats + BT, 2 * (size_t)BT);
    o->xent_vp_loss(net->dev, losses, stats, net->d_targets, BT);
}

void dt_net_xent_backward(dt_net_t *net, void *logits, const float *stats, float dscale, int BT) {
    const dt_model_layout *l = net->layout;
    const dt_ops_t *o = net->dev->ops;
    int V = l->spec.vocab_size, Vp = l->vocab_padded;
    if (l->tp_size <= 1) {
        o->softmax_xent_backward(net->dev, logits, NULL, logits, net->d_targets, dscale, BT, V, Vp);
        return;
    }
    int Vl = Vp / l->tp_size;
    o->xent_vp_backward(net->dev, logits, logits, net->d_targets, stats, dscale, BT, Vl, l->tp_rank * Vl, V);
}

void dt_net_tp_norm_grads_add(dt_net_t *net, void *scratch, size_t n, void *const *grads, int count) {
    if (!net->layout->sequence_parallel) return;
    dt_net_tp_sum(net, scratch, (size_t)count * n);
    for (int i = 0; i < count; i++)
        net->dev->ops->residual_forward(net->dev, grads[i], grads[i], (char *)scratch + (size_t)i * n * net->elsize,
                                        n);
}
