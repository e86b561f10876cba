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
 * Ulysses (context_parallel.mode "ulysses", layout cp_ulysses): an all-to-all gives
 * each rank every position of NH / C query heads (and NKV / C key/value heads) from
 * every rank's rows; it runs the device's attention on the whole sequences of its
 * heads (the positions of the whole sequences: packed documents as usual), and a
 * second all-to-all brings each rank its own rows of every head. The backward runs
 * the same in reverse. A rank's rows of a sequence are two runs of T / 2 positions,
 * so each exchange is two strided copies per (rank, sequence, q|k|v part).
 *
 * Where things live: the attention indices of a batch (each local row's global
 * position qidx, the first position it may see qlo: its document's start, and the
 * global positions of every rank's rows kidx) follow the positions in the positions
 * slot (sized here: dt_net_cp_positions_bytes), uploaded with the batch; the blocks, their
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

/* ---- Ulysses: the saved and scratch slots ---- */

typedef struct uly_dims {
    int R, S, h, hk, HS, W3, W; /* ranks, whole positions, heads here (q, kv), head size, qkv_u and out_u widths */
} uly_dims;

static uly_dims uly_of(const dt_model_layout *l, int C, int NH, int NKV) {
    uly_dims u = {.R = l->cp_size, .S = l->seq_len, .HS = C / NH};
    u.h = NH / u.R, u.hk = NKV / u.R;
    u.W3 = (u.h + 2 * u.hk) * u.HS;
    u.W = u.h * u.HS;
    return u;
}

/* saved: the device attention's saved bytes of the heads here, then qkv_u (B, S, W3) */
typedef struct uly_saved {
    void *att, *qkv;
} uly_saved;
static size_t uly_saved_layout(const dt_device_t *dev, const dt_model_layout *l, int B, int C, int NH, int NKV,
                               void *base, uly_saved *s) {
    uly_dims u = uly_of(l, C, NH, NKV);
    size_t es = dt_dtype_size(dev->ops->dtype), a = al(dev->ops->attention_saved_bytes(dev, B, u.S, u.W, u.h, u.hk));
    if (s) *s = (uly_saved){.att = base, .qkv = (char *)base + a};
    return a + al((size_t)B * u.S * u.W3 * es);
}

/* scratch: the device attention's scratch, out_u (B, S, W), dqkv_u (B, S, W3), and the
 * exchange's send and recv (R blocks of B x T x W3 each) */
typedef struct uly_scratch {
    void *att, *out, *dqkv, *send, *recv;
} uly_scratch;
static size_t uly_scratch_layout(const dt_device_t *dev, const dt_model_layout *l, int B, int T, int C, int NH,
                                 int NKV, void *base, uly_scratch *s) {
    uly_dims u = uly_of(l, C, NH, NKV);
    size_t es = dt_dtype_size(dev->ops->dtype), BS = (size_t)B * u.S;
    size_t blocks = al((size_t)u.R * B * T * (size_t)(u.W3 > C ? u.W3 : C) * es);
    size_t sz[5] = {al(dev->ops->attention_scratch_bytes(dev, B, u.S, u.W, u.h, u.hk)), al(BS * u.W * es),
                    al(BS * u.W3 * es), blocks, blocks};
    size_t off = 0, at[5];
    for (int i = 0; i < 5; i++) at[i] = off, off += sz[i];
    if (s) {
        char *p = base;
        *s = (uly_scratch){.att = p + at[0], .out = p + at[1], .dqkv = p + at[2], .send = p + at[3], .recv = p + at[4]};
    }
    return off;
}

size_t dt_net_attention_saved_bytes(const dt_device_t *dev, const dt_model_layout *l, int B, int T, int C, int NH,
                                    int NKV) {
    if (cp_on(l) && l->cp_ulysses) return uly_saved_layout(dev, l, B, C, NH, NKV, NULL, NULL);
    if (cp_on(l)) return sizeof(float) * (size_t)B * NH * T;
    return dev->ops->attention_saved_bytes(dev, B, T, C, NH, NKV);
}

size_t dt_net_attention_scratch_bytes(const dt_device_t *dev, const dt_model_layout *l, int B, int T, int C,
                                      int NH, int NKV) {
    if (cp_on(l) && l->cp_ulysses) return uly_scratch_layout(dev, l, B, T, C, NH, NKV, NULL, NULL);
    if (cp_on(l) && dev->ops->attention_block_forward) return cp_scratch_layout(dev, B, T, C, NH, NKV, NULL, NULL);
    return dev->ops->attention_scratch_bytes(dev, B, T, C, NH, NKV);
}

/* ---- the indices in the positions slot ---- */

/* (B, T) ints each: positions, qidx, qlo; then kidx (C, B, T); Ulysses then the whole
 * sequences' positions (B, seq_len). */
size_t dt_net_cp_positions_bytes(const dt_model_layout *l, int B) {
    size_t BT = (size_t)B * dt_model_rows(l);
    if (!cp_on(l)) return sizeof(int) * BT;
    return sizeof(int) * (BT * (3 + (size_t)l->cp_size) + (l->cp_ulysses ? (size_t)B * l->seq_len : 0));
}

static const int *qidx_of(const dt_net_t *n) { return n->d_positions + (size_t)n->n_rows; }
static const int *qlo_of(const dt_net_t *n) { return n->d_positions + 2 * (size_t)n->n_rows; }
static const int *kidx_of(const dt_net_t *n, int owner) {
    return n->d_positions + (3 + (size_t)owner) * (size_t)n->n_rows;
}
static const int *whole_pos_of(const dt_net_t *n) {
    return n->d_positions + (3 + (size_t)n->layout->cp_size) * (size_t)n->n_rows;
}

dt_status_t dt_net_cp_take_rows(dt_net_t *net, const dt_batch *whole, dt_batch *local) {
    const dt_model_layout *l = net->layout;
    int B = net->B, T = net->T, S = l->seq_len, C = l->cp_size, r = l->cp_rank;
    size_t BT = (size_t)B * T;
    if (whole->positions) DT_CHECK(dt_net_check_positions(whole->positions, B, S));
    if (!net->h_cp) net->h_cp = dt_xcalloc(BT * (5 + (size_t)C) + (size_t)B * S, sizeof(int32_t));
    int32_t *whole_pos = net->h_cp + BT * (5 + (size_t)C); /* Ulysses: after kidx */
    for (size_t i = 0; l->cp_ulysses && i < (size_t)B * S; i++)
        whole_pos[i] = whole->positions ? whole->positions[i] : (int32_t)(i % (size_t)S);
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

/* The rank whose block this rank holds at step `step` of the ring. */
static int ring_owner(const dt_model_layout *l, int step) {
    int R = l->cp_size;
    return ((l->cp_rank - step) % R + R) % R;
}

/* Starts passing the block held (bytes) to the next rank while the previous one's
 * arrives in `next`; NULL at the last step (nothing more to pass). */
static void *ring_pass(dt_net_t *net, int step, const void *held, void *next, size_t bytes) {
    if (step + 1 >= net->layout->cp_size) return NULL;
    net->dev->ops->synchronize(net->dev); /* the block is in place */
    return net->cp->ring_start(net->cp_ctx, held, next, bytes);
}

/* ---- Ulysses ---- */

/* n rows of w bytes, strided, device to device: one copy_2d (on a GPU one
 * cudaMemcpy2DAsync where a copy per row would issue thousands a layer); the row
 * loop only on a device without the op. */
static void copy_rows(dt_device_t *dv, void *dst, size_t dst_stride, const void *src, size_t src_stride, size_t w,
                      int n) {
    if (n <= 0 || w == 0) return;
    if (dv->ops->copy_2d) {
        dv->ops->copy_2d(dv, dst, dst_stride, src, src_stride, w, (size_t)n);
        return;
    }
    for (int i = 0; i < n; i++)
        dv->ops->copy(dv, (char *)dst + (size_t)i * dst_stride, (const char *)src + (size_t)i * src_stride, w,
                      DT_COPY_DEVICE_TO_DEVICE);
}

/* The segments of a row that go to (or come from) rank j: in a local row of width
 * `lw` elements, n_seg runs (q | k | v heads of j: at l_off[k], width len[k]); in a
 * whole-sequence row of width `uw`, the same runs back to back. */
typedef struct uly_segs {
    int n, l_off[3], u_off[3], len[3];
} uly_segs;

static uly_segs segs_qkv(const uly_dims *u, int C, int NKV, int j) {
    int KV = NKV * u->HS;
    uly_segs g = {.n = 3, .l_off = {j * u->h * u->HS, C + j * u->hk * u->HS, C + KV + j * u->hk * u->HS},
                  .len = {u->h * u->HS, u->hk * u->HS, u->hk * u->HS}};
    g.u_off[0] = 0, g.u_off[1] = g.len[0], g.u_off[2] = g.len[0] + g.len[1];
    return g;
}
static uly_segs segs_out(const uly_dims *u, int j) {
    return (uly_segs){.n = 1, .l_off = {j * u->h * u->HS}, .u_off = {0}, .len = {u->h * u->HS}};
}

/* to_whole: local rows (B, T, lw) -> blocks for every rank (its segments of each row),
 * exchanged, -> whole-sequence rows (B, S, uw) of this rank's heads. Else the reverse:
 * whole rows of this rank's heads -> each rank's rows -> local rows (every rank's
 * heads; the segments of all ranks cover the local row's columns exactly). */
static void uly_exchange(dt_net_t *net, int to_whole, void *local, int lw, void *whole, int uw, int qkv_parts,
                         const uly_dims *u, int C, int NKV, uly_scratch *s) {
    dt_device_t *dv = net->dev;
    size_t es = net->elsize;
    int B = net->B, T = net->T, L = T / 2;
    size_t block = (size_t)B * T * (size_t)uw * es; /* one rank's block */
    /* the local rows a block row k (of B x T) holds: row k itself; block rows are
     * packed (B, T, uw); whole rows: the rank's chunks at dt_model_cp_row */
    for (int pass = 0; pass < 2; pass++) {
        int packing = pass == 0;
        if (!packing) net->cp->all_to_all(net->cp_ctx, s->send, s->recv, block);
        for (int j = 0; j < u->R; j++) {
            uly_segs g = qkv_parts ? segs_qkv(u, C, NKV, j) : segs_out(u, j);
            char *blk = (char *)(packing ? s->send : s->recv) + (size_t)j * block;
            for (int b = 0; b < B; b++)
                for (int half = 0; half < 2; half++) {
                    /* block rows [b*T + half*L, +L): the sending rank's local rows */
                    char *brow = blk + ((size_t)b * T + (size_t)half * L) * uw * es;
                    if (to_whole && packing) { /* my local rows, rank j's heads */
                        char *lrow = (char *)local + ((size_t)b * T + (size_t)half * L) * lw * es;
                        for (int k = 0; k < g.n; k++)
                            copy_rows(dv, brow + (size_t)g.u_off[k] * es, (size_t)uw * es, lrow + (size_t)g.l_off[k] * es,
                                      (size_t)lw * es, (size_t)g.len[k] * es, L);
                    } else if (to_whole) { /* rank j's rows, my heads: into the whole rows */
                        int g0 = dt_model_cp_row(u->S, u->R, j, half * L);
                        char *wrow = (char *)whole + ((size_t)b * u->S + g0) * uw * es;
                        copy_rows(dv, wrow, (size_t)uw * es, brow, (size_t)uw * es, (size_t)uw * es, L);
                    } else if (packing) { /* rank j's rows of my heads, from the whole rows */
                        int g0 = dt_model_cp_row(u->S, u->R, j, half * L);
                        char *wrow = (char *)whole + ((size_t)b * u->S + g0) * uw * es;
                        copy_rows(dv, brow, (size_t)uw * es, wrow, (size_t)uw * es, (size_t)uw * es, L);
                    } else { /* my rows of rank j's heads: into the local rows' columns */
                        char *lrow = (char *)local + ((size_t)b * T + (size_t)half * L) * lw * es;
                        for (int k = 0; k < g.n; k++)
                            copy_rows(dv, lrow + (size_t)g.l_off[k] * es, (size_t)lw * es, brow + (size_t)g.u_off[k] * es,
                                      (size_t)uw * es, (size_t)g.len[k] * es, L);
                    }
                }
        }
    }
}

static void uly_forward(dt_net_t *net, void *out, void *saved, void *scratch, const void *qkv, int B, int T, int C,
                        int NH, int NKV) {
    dt_device_t *dv = net->dev;
    const dt_model_layout *l = net->layout;
    uly_dims u = uly_of(l, C, NH, NKV);
    uly_saved sv;
    uly_scratch sc;
    uly_saved_layout(dv, l, B, C, NH, NKV, saved, &sv);
    uly_scratch_layout(dv, l, B, T, C, NH, NKV, scratch, &sc);
    int C3 = C + 2 * NKV * u.HS;
    uly_exchange(net, 1, (void *)qkv, C3, sv.qkv, u.W3, 1, &u, C, NKV, &sc);
    dv->ops->attention_forward(dv, sc.out, sv.att, sv.qkv, whole_pos_of(net), B, u.S, u.W, u.h, u.hk);
    uly_exchange(net, 0, out, C, sc.out, u.W, 0, &u, C, NKV, &sc);
}

static void uly_backward(dt_net_t *net, void *dqkv, void *scratch, const void *dout, const void *saved, int B, int T,
                         int C, int NH, int NKV) {
    dt_device_t *dv = net->dev;
    const dt_model_layout *l = net->layout;
    uly_dims u = uly_of(l, C, NH, NKV);
    uly_saved sv;
    uly_scratch sc;
    uly_saved_layout(dv, l, B, C, NH, NKV, (void *)saved, &sv);
    uly_scratch_layout(dv, l, B, T, C, NH, NKV, scratch, &sc);
    int C3 = C + 2 * NKV * u.HS;
    size_t es = net->elsize;
    /* dout's rows -> the whole sequences of my heads (out_u's room) */
    uly_exchange(net, 1, (void *)dout, C, sc.out, u.W, 0, &u, C, NKV, &sc);
    dv->ops->set(dv, sc.dqkv, 0, (size_t)B * u.S * u.W3 * es);
    dv->ops->attention_backward(dv, sc.dqkv, sc.att, sc.out, sv.qkv, sv.att, whole_pos_of(net), B, u.S, u.W, u.h,
                                u.hk);
    /* back to my rows of every head, then added into dqkv: the recv room is free once
     * unpacked, so it holds my rows' gradient (B, T, C3) before the add */
    void *mine = sc.send; /* the send blocks are free once packed and sent: unpack there */
    uly_exchange(net, 0, mine, C3, sc.dqkv, u.W3, 1, &u, C, NKV, &sc);
    dv->ops->residual_backward(dv, dqkv, NULL, mine, (size_t)B * T * C3);
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
    if (l->cp_ulysses) {
        uly_forward(net, out, saved, scratch, qkv, B, T, C, NH, NKV);
        return;
    }
    cp_scratch s;
    cp_scratch_layout(dv, B, T, C, NH, NKV, scratch, &s);
    size_t bytes = (size_t)B * T * 2 * NKV * (C / NH) * net->elsize;
    o->attention_kv_pack(dv, s.kv[0], qkv, B, T, C, NH, NKV);
    int cur = 0;
    for (int step = 0; step < l->cp_size; step++) {
        void *h = ring_pass(net, step, s.kv[cur], s.kv[cur ^ 1], bytes); /* the next comes while this computes */
        o->attention_block_forward(dv, s.o, saved, s.blk, qkv, s.kv[cur], qidx_of(net), qlo_of(net),
                                   kidx_of(net, ring_owner(l, step)), step == 0, B, T, T, C, NH, NKV);
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
    if (l->cp_ulysses) {
        uly_backward(net, dqkv, scratch, dout, saved, B, T, C, NH, NKV);
        return;
    }
    cp_scratch s;
    cp_scratch_layout(dv, B, T, C, NH, NKV, scratch, &s);
    size_t n = (size_t)B * T * 2 * NKV * (C / NH), bytes = n * net->elsize;
    o->attention_block_delta(dv, s.delta, dout, out, B, T, C, NH);
    o->attention_kv_pack(dv, s.kv[0], qkv, B, T, C, NH, NKV);
    o->set(dv, s.dkv[0], 0, n * sizeof(float));
    int cur = 0;
    for (int step = 0; step < l->cp_size; step++) {
        void *h = ring_pass(net, step, s.kv[cur], s.kv[cur ^ 1], bytes); /* the next comes while this computes */
        o->attention_block_backward(dv, dqkv, s.dkv[cur], s.blk, dout, qkv, s.kv[cur], saved, s.delta, qidx_of(net),
                                    qlo_of(net), kidx_of(net, ring_owner(l, step)), B, T, T, C, NH, NKV);
        if (h) net->cp->ring_wait(net->cp_ctx, h);
        /* the block's gradient goes on with it (after the last step: home) */
        o->synchronize(dv);
        void *g = net->cp->ring_start(net->cp_ctx, s.dkv[cur], s.dkv[cur ^ 1], n * sizeof(float));
        net->cp->ring_wait(net->cp_ctx, g);
        cur ^= 1;
    }
    o->attention_kv_grad_add(dv, dqkv, s.dkv[cur], B, T, C, NH, NKV);
}
