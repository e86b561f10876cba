/*
 * net_cp.c - attention for the models (net_impl.h): the device's causal attention,
 * or, under context parallelism, ring attention over the CP group; and this rank's
 * rows of a batch (net.h: dt_net_forward takes whole sequences under CP).
 *
 * Ring attention. Each of the C ranks of a CP group holds T = seq_len / C positions
 * of every sequence (model.h: dt_model_cp_row, the chunks r and 2C - 1 - r) and
 * their q, k, v. The forward packs its k|v rows into a block and passes blocks
 * around the ring: at step s a rank holds the block of rank (r - s) mod C, starts
 * sending it on to the next rank while it computes its queries against it
 * (attention_block_forward: a running output and log-sum-exp, merged block by block;
 * the mask is by global position, so causality and packed documents hold across
 * blocks), and after C steps it has seen every key. It keeps the log-sum-exp (the
 * saved slot); the output is the forward's out slot. The backward passes the blocks
 * around again, each with the fp32 gradient of its k|v accumulated by every rank it
 * visits (attention_block_backward); after C steps each block's gradient arrives
 * back at its owner, which adds it into its dqkv. All ranks run the same steps in
 * the same order, so the sums are in a fixed order: deterministic, and a CP run's
 * gradients equal one rank's up to that order.
 *
 * Where things live: the attention indices of a batch (each local row's global
 * position qidx, the first position it may see qlo: its document's start, and the
 * global positions of every rank's rows kidx) follow the positions in the positions
 * slot (sized here: plan_cp_slot), uploaded with the batch; the blocks, their
 * gradients, the running output and delta are in the attention scratch slot.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "runtime/model/net_impl.h"

static int cp_on(const dt_model_layout *l) { return l->cp_size > 1; }

/* ---- the scratch slot under CP ---- */

typedef struct cp_scratch {
    void *blk;      /* attention_block_scratch_bytes */
    void *kv[2];    /* (B, T, 2 KV) compute dtype each: the block held and the one arriving */
    float *dkv[2];  /* (B, T, 2 KV) fp32 each: their gradients */
    float *o;       /* (B, T, C) fp32: the running output */
    float *delta;   /* (B, NH, T) fp32 */
} cp_scratch;

static size_t al(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t cp_scratch_layout(const dt_device_t *dev, int B, int T, int C, int NH, int NKV, void *base,
                                cp_scratch *s) {
    size_t es = dt_dtype_size(dev->ops->dtype), KV2 = 2 * (size_t)NKV * (size_t)(C / NH), BT = (size_t)B * T;
    size_t sz[7] = {al(dev->ops->attention_block_scratch_bytes(dev, B, T, T, C, NH, NKV)), al(BT * KV2 * es),
                    al(BT * KV2 * es), al(BT * KV2 * 4), al(BT * KV2 * 4), al(BT * (size_t)C * 4),
                    al((size_t)B * NH * T * 4)};
    size_t off = 0, at[7];
    for (int i = 0; i < 7; i++) at[i] = off, off += sz[i];
    if (s) {
        char *p = base;
        *s = (cp_scratch){.blk = p + at[0], .kv = {p + at[1], p + at[2]}, .dkv = {(float *)(p + at[3]),
                          (float *)(p + at[4])}, .o = (float *)(p + at[5]), .delta = (float *)(p + at[6])};
    }
    return off;
}

size_t dt_net_attention_saved_bytes(const dt_device_t *dev, const dt_model_layout *l, int B, int T, int C, int NH,
                                    int NKV) {
    if (cp_on(l)) return sizeof(float) * (size_t)B * NH * T;
    return dev->ops->attention_saved_bytes(dev, B, T, C, NH, NKV);
}

size_t dt_net_attention_scratch_bytes(const dt_device_t *dev, const dt_model_layout *l, int B, int T, int C,
                                      int NH, int NKV) {
    if (cp_on(l) && dev->ops->attention_block_forward) return cp_scratch_layout(dev, B, T, C, NH, NKV, NULL, NULL);
    return dev->ops->attention_scratch_bytes(dev, B, T, C, NH, NKV);
}

/* ---- the indices in the positions slot ---- */

/* (B, T) ints each: positions, qidx, qlo; then kidx (C, B, T). */
size_t dt_net_cp_positions_bytes(const dt_model_layout *l, int B) {
    size_t BT = (size_t)B * dt_model_rows(l);
    return sizeof(int) * BT * (cp_on(l) ? 3 + (size_t)l->cp_size : 1);
}

static const int *qidx_of(const dt_net_t *n) { return n->d_positions + (size_t)n->n_rows; }
static const int *qlo_of(const dt_net_t *n) { return n->d_positions + 2 * (size_t)n->n_rows; }
static const int *kidx_of(const dt_net_t *n, int owner) {
    return n->d_positions + (3 + (size_t)owner) * (size_t)n->n_rows;
}

dt_status_t dt_net_cp_take_rows(dt_net_t *net, const dt_batch *whole, dt_batch *local) {
    const dt_model_layout *l = net->layout;
    int B = net->B, T = net->T, S = l->seq_len, C = l->cp_size, r = l->cp_rank;
    size_t BT = (size_t)B * T;
    if (whole->positions) DT_CHECK(dt_net_check_positions(whole->positions, B, S));
    if (!net->h_cp) net->h_cp = dt_xcalloc(BT * (5 + (size_t)C), sizeof(int32_t));
    int32_t *tok = net->h_cp, *tgt = tok + BT, *pos = tgt + BT, *qidx = pos + BT, *qlo = qidx + BT,
            *kidx = qlo + BT;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)b * T + t, g = (size_t)b * S + dt_model_cp_row(S, C, r, t);
            int gp = (int)(g - (size_t)b * S); /* the global position in the sequence */
            tok[i] = whole->tokens ? whole->tokens[g] : 0;
            tgt[i] = whole->targets ? whole->targets[g] : -1;
            pos[i] = whole->positions ? whole->positions[g] : gp;
            qidx[i] = gp;
            qlo[i] = gp - pos[i];
            for (int o = 0; o < C; o++) kidx[(size_t)o * BT + i] = dt_model_cp_row(S, C, o, t);
        }
    *local = (dt_batch){.tokens = whole->tokens ? tok : NULL, .targets = whole->targets ? tgt : NULL,
                        .positions = pos, .features = whole->features};
    return DT_STATUS_OK;
}

/* The host's (B, T) positions and the indices after them, for the positions slot. */
const int32_t *dt_net_cp_index_rows(const dt_net_t *net) { return net->h_cp + 2 * (size_t)net->n_rows; }

/* ---- the ring ---- */

static void *ring_start(dt_net_t *net, const void *send, void *recv, size_t bytes) {
    return net->cp->ring_start(net->cp_ctx, send, recv, bytes);
}

void dt_net_attention_forward(dt_net_t *net, void *out, void *saved, void *scratch, const void *qkv, int B, int T,
                              int C, int NH, int NKV) {
    dt_device_t *dv = net->dev;
    const dt_ops_t *o = dv->ops;
    const dt_model_layout *l = net->layout;
    if (!cp_on(l) || !net->cp) {
        o->attention_forward(dv, out, saved, qkv, net->d_positions, B, T, C, NH, NKV);
        return;
    }
    cp_scratch s;
    cp_scratch_layout(dv, B, T, C, NH, NKV, scratch, &s);
    int R = l->cp_size, r = l->cp_rank;
    size_t bytes = (size_t)B * T * 2 * NKV * (C / NH) * net->elsize;
    o->attention_kv_pack(dv, s.kv[0], qkv, B, T, C, NH, NKV);
    int cur = 0;
    for (int step = 0; step < R; step++) {
        int owner = ((r - step) % R + R) % R;
        void *h = NULL;
        if (step + 1 < R) { /* the next block comes while this one is computed */
            o->synchronize(dv);
            h = ring_start(net, s.kv[cur], s.kv[cur ^ 1], bytes);
        }
        o->attention_block_forward(dv, s.o, saved, s.blk, qkv, s.kv[cur], qidx_of(net), qlo_of(net),
                                   kidx_of(net, owner), step == 0, B, T, T, C, NH, NKV);
        if (h) {
            net->cp->ring_wait(net->cp_ctx, h);
            cur ^= 1;
        }
    }
    o->attention_block_finish(dv, out, s.o, B, T, C);
}

void dt_net_attention_backward(dt_net_t *net, void *dqkv, void *scratch, const void *dout, const void *qkv,
                               const void *saved, const void *out, int B, int T, int C, int NH, int NKV) {
    dt_device_t *dv = net->dev;
    const dt_ops_t *o = dv->ops;
    const dt_model_layout *l = net->layout;
    if (!cp_on(l) || !net->cp) {
        o->attention_backward(dv, dqkv, scratch, dout, qkv, saved, net->d_positions, B, T, C, NH, NKV);
        return;
    }
    cp_scratch s;
    cp_scratch_layout(dv, B, T, C, NH, NKV, scratch, &s);
    int R = l->cp_size, r = l->cp_rank;
    size_t n = (size_t)B * T * 2 * NKV * (C / NH), bytes = n * net->elsize;
    o->attention_block_delta(dv, s.delta, dout, out, B, T, C, NH);
    o->attention_kv_pack(dv, s.kv[0], qkv, B, T, C, NH, NKV);
    o->set(dv, s.dkv[0], 0, n * sizeof(float));
    int cur = 0;
    for (int step = 0; step < R; step++) {
        int owner = ((r - step) % R + R) % R;
        void *h = NULL;
        if (step + 1 < R) { /* the next block comes while this one is computed */
            o->synchronize(dv);
            h = ring_start(net, s.kv[cur], s.kv[cur ^ 1], bytes);
        }
        o->attention_block_backward(dv, dqkv, s.dkv[cur], s.blk, dout, qkv, s.kv[cur], saved, s.delta, qidx_of(net),
                                    qlo_of(net), kidx_of(net, owner), B, T, T, C, NH, NKV);
        if (h) net->cp->ring_wait(net->cp_ctx, h);
        /* the block's gradient goes on with it (after the last step: home) */
        o->synchronize(dv);
        net->cp->ring_wait(net->cp_ctx, ring_start(net, s.dkv[cur], s.dkv[cur ^ 1], n * sizeof(float)));
        cur ^= 1;
    }
    o->attention_kv_grad_add(dv, dqkv, s.dkv[cur], B, T, C, NH, NKV);
}
