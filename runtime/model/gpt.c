/*
 * gpt.c - GPT-2 (llm.c's train_gpt2 structure over the device op table): its
 * config keys, tensor table, initialisation, FLOPs, activation arena, the math of
 * its embedding, blocks and final norm (forward, backward, KV-cache decode), and its
 * Hugging Face export shapes. Fills dt_model_gpt (model.h).
 *
 * Units: 0 = embeddings (wte (Vp, C), wpe (T, C)), 1..L = the blocks, L+1 = the
 * final LayerNorm; the LM head is tied to wte, so unit 0 is used again at the head
 * (on a last pipeline stage without the embedding, net->head_w: a copy of wte).
 * net.c's chunk driver (net_impl.h: dt_net_stack) runs that math over the layout's
 * chunk net->chunk with the hooks, the head and the loss; a block's tensors are
 * reached through its unit's first tensor, so a stage layout runs as the whole model.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "runtime/model/model.h"
#include "runtime/model/net_impl.h"

/* ---- config ---------------------------------------------------------------- */

#define SPEC(f) offsetof(dt_model_spec, f)

static const dt_model_key gpt_keys[] = {
    {"model.n_layer", SPEC(n_layer), 1, 1024, "4", "gpt: blocks", DT_MODEL_KEY_INT},
    {"model.n_head", SPEC(n_head), 1, 1024, "4", "gpt: attention heads", DT_MODEL_KEY_INT},
    {"model.n_embd", SPEC(n_embd), 1, 65536, "128", "gpt: width (a multiple of n_head)", DT_MODEL_KEY_INT},
    {"model.seq_len", SPEC(seq_len), 1, 1048576, "128", "gpt, llama: context length in tokens", DT_MODEL_KEY_INT},
    {"model.vocab_size", SPEC(vocab_size), 0, 16777216, "0",
     "gpt, llama: 0 = from the data (256 for text, 50257 for token shards)", DT_MODEL_KEY_INT},
    {"model.vocab_pad_multiple", SPEC(vocab_pad_multiple), 1, 65536, "64",
     "gpt, llama: embedding rows padded to a multiple of this", DT_MODEL_KEY_INT},
};

static int gpt_config_check(const dt_model_spec *s, char *msg, size_t len) {
    if (s->n_head > 0 && s->n_embd % s->n_head == 0) return 0;
    snprintf(msg, len, "model.n_embd: expected a multiple of model.n_head (%d), found %d", s->n_head,
             s->n_embd);
    return 1;
}

/* ---- layout ---------------------------------------------------------------- */

static dt_status_t check_positive(const char *name, int v) {
    if (v <= 0) return dt_error(DT_STATUS_CONFIG, "model.%s: expected an integer > 0, found %d", name, v);
    return DT_STATUS_OK;
}

/* Megatron's cut: the heads (and so n_embd) divide among the tp ranks. */
static void gpt_heads(const dt_model_spec *s, int *nh, int *nkv) { *nh = *nkv = s->n_head; }

static int gpt_tp_check(const dt_model_spec *s, int tp, char *msg, size_t len) {
    if (s->n_head % tp != 0) {
        snprintf(msg, len, "tensor_parallel.size: %d does not divide model.n_head (%d): each rank must hold whole heads",
                 tp, s->n_head);
        return 1;
    }
    return 0;
}

static dt_status_t gpt_validate(const dt_model_spec *s) {
    DT_CHECK(check_positive("n_layer", s->n_layer));
    DT_CHECK(check_positive("n_head", s->n_head));
    DT_CHECK(check_positive("n_embd", s->n_embd));
    DT_CHECK(check_positive("seq_len", s->seq_len));
    DT_CHECK(check_positive("vocab_size", s->vocab_size));
    if (s->n_embd % s->n_head != 0)
        return dt_error(DT_STATUS_CONFIG, "model.n_embd: %d is not divisible by model.n_head %d", s->n_embd,
                        s->n_head);
    if (s->vocab_size > 65536)
        return dt_error(DT_STATUS_CONFIG, "model.vocab_size: %d exceeds 65536 (token ids are uint16)",
                        s->vocab_size);
    return DT_STATUS_OK;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NDIM(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define ADD_TP(l, unit, decay, init, split, parts, shape_list, ...)                                            \
    dt_model_add_tensor_tp(l, unit, decay, DT_MODEL_INIT_##init, DT_TP_##split, parts, NDIM shape_list, SHAPE shape_list, \
                           __VA_ARGS__)
#define ADD(l, unit, decay, init, shape_list, ...) \
    dt_model_add_tensor(l, unit, decay, DT_MODEL_INIT_##init, NDIM shape_list, SHAPE shape_list, __VA_ARGS__)

/* Tensor k of layer l in the table gpt_build makes (forward and backward rely on it). */
enum {
    T_LN1W, T_LN1B, T_QKVW, T_QKVB, T_ATTPROJW, T_ATTPROJB, T_LN2W, T_LN2B, T_FCW, T_FCB,
    T_FCPROJW, T_FCPROJB, T_PER_LAYER
};
#define LAYER_T(l, k) (2 + (l) * T_PER_LAYER + (k))

static void gpt_build(dt_model_layout *l) {
    const dt_model_spec *s = &l->spec;
    l->vocab_padded = dt_model_vocab_padded(s);
    l->seq_len = s->seq_len;
    l->tied_head = 1; /* the LM head is wte */
    int64_t C = s->n_embd, Vp = l->vocab_padded, T = s->seq_len;
    ADD_TP(l, 0, 0, EMBED, ROWS, 1, (Vp, C), "wte.weight");
    ADD(l, 0, 0, EMBED, (T, C), "wpe.weight");
    for (int i = 0; i < s->n_layer; i++) {
        int u = 1 + i;
        ADD(l, u, 0, ONE, (C), "h.%d.ln_1.weight", i);
        ADD(l, u, 0, ZERO, (C), "h.%d.ln_1.bias", i);
        ADD_TP(l, u, 1, NORMAL, ROWS, 3, (3 * C, C), "h.%d.attn.c_attn.weight", i);
        ADD_TP(l, u, 0, ZERO, ROWS, 3, (3 * C), "h.%d.attn.c_attn.bias", i);
        ADD_TP(l, u, 1, RESIDUAL, COLS, 1, (C, C), "h.%d.attn.c_proj.weight", i);
        ADD(l, u, 0, ZERO, (C), "h.%d.attn.c_proj.bias", i);
        ADD(l, u, 0, ONE, (C), "h.%d.ln_2.weight", i);
        ADD(l, u, 0, ZERO, (C), "h.%d.ln_2.bias", i);
        ADD_TP(l, u, 1, NORMAL, ROWS, 1, (4 * C, C), "h.%d.mlp.c_fc.weight", i);
        ADD_TP(l, u, 0, ZERO, ROWS, 1, (4 * C), "h.%d.mlp.c_fc.bias", i);
        ADD_TP(l, u, 1, RESIDUAL, COLS, 1, (C, 4 * C), "h.%d.mlp.c_proj.weight", i);
        ADD(l, u, 0, ZERO, (C), "h.%d.mlp.c_proj.bias", i);
    }
    ADD(l, s->n_layer + 1, 0, ONE, (C), "ln_f.weight");
    ADD(l, s->n_layer + 1, 0, ZERO, (C), "ln_f.bias");
}

/* normal(0, 0.02), residual projections normal(0, 0.02/sqrt(2L)), padded vocab rows 0. */
static void gpt_init_range(const dt_model_layout *l, uint64_t seed, size_t offset, size_t count, float *dst) {
    double resid_std = 0.02 / sqrt(2.0 * l->spec.n_layer);
    for (int i = 0; i < l->n_tensors; i++) dt_model_init_tensor_range(l, i, seed, offset, count, dst, 0.02, resid_std);
    /* padded vocab rows never see a token */
    const dt_tensor_info *w = &l->tensors[dt_model_find(l, "wte.weight")];
    size_t a = w->offset + (size_t)l->spec.vocab_size * (size_t)l->spec.n_embd, e = w->offset + w->numel;
    if (a < offset) a = offset;
    if (e > offset + count) e = offset + count;
    if (a < e) memset(dst + (a - offset), 0, (e - a) * sizeof(float));
}

static void gpt_init_params(const dt_model_layout *l, uint64_t seed, float *params) {
    gpt_init_range(l, seed, 0, l->n_params, params);
}

static size_t gpt_unpadded_params(const dt_model_layout *l) {
    return l->n_params - (size_t)(l->vocab_padded - l->spec.vocab_size) * (size_t)l->spec.n_embd;
}

static double gpt_flops_per_token(const dt_model_layout *l) {
    const dt_model_spec *s = &l->spec;
    double n = (double)l->n_params - (double)s->seq_len * s->n_embd; /* all but wpe */
    return 6.0 * n + 12.0 * s->n_layer * (double)s->n_embd * s->seq_len;
}

static void gpt_describe(const dt_model_layout *l, const char *note, char *buf, size_t len) {
    const dt_model_spec *s = &l->spec;
    snprintf(buf, len,
             "gpt, %d layers, %d heads, n_embd %d, seq %d, vocab %d padded to %d%s; "
             "%zu parameters (%zu without vocab padding)",
             s->n_layer, s->n_head, s->n_embd, s->seq_len, s->vocab_size, l->vocab_padded, note, l->n_params,
             gpt_unpadded_params(l));
}

/* HF GPT-2: wte has the real vocabulary's rows; Conv1D weights are stored (in, out). */
static int gpt_export_shape(const dt_model_layout *l, int i, int64_t shape[2], int *ndim) {
    const dt_tensor_info *t = &l->tensors[i];
    *ndim = t->ndim;
    for (int d = 0; d < t->ndim && d < 2; d++) shape[d] = t->shape[d];
    if (!strcmp(t->name, "wte.weight")) shape[0] = l->spec.vocab_size;
    size_t n = strlen(t->name);
    int conv1d = t->ndim == 2 && n > 7 && !strcmp(t->name + n - 7, ".weight") &&
                 (strstr(t->name, ".c_attn.") || strstr(t->name, ".c_proj.") || strstr(t->name, ".c_fc."));
    if (conv1d) shape[0] = t->shape[1], shape[1] = t->shape[0];
    return conv1d;
}

/* ---- activation arena ------------------------------------------------------ */

/* Slots of the whole model (the first five are net.h's) ... Tensor parallelism
 * adds: G_GATH (sequence parallelism: a norm output gathered from every rank, the
 * input of a column-parallel matmul; it holds the gathered final norm from the
 * forward to the head's backward), G_PART (sequence parallelism: a row-parallel
 * matmul's or the embedding's partial sums before the reduce-scatter in the forward;
 * the residual gradient gathered in the backward), G_DRED (sequence parallelism: this rank's rows
 * of a reduced input gradient), G_XSTATS (the vocabulary-parallel loss's per-row max,
 * sum and target logit) and G_LNGRAD (sequence parallelism: a layer's partial norm
 * gradients). Sized 0 when unused. */
enum {
    G_TOKENS = DT_NET_SLOT_TOKENS, G_TARGETS = DT_NET_SLOT_TARGETS, G_FEATURES = DT_NET_SLOT_FEATURES,
    G_LOSSES = DT_NET_SLOT_LOSSES, G_POSITIONS = DT_NET_SLOT_POSITIONS, G_ENCODED = DT_NET_SLOT_FIRST, G_LNF,
    G_LNF_MEAN, G_LNF_RSTD,
    G_LOGITS, G_DRES, G_DTMP, G_DQKV, G_DFCH, G_DFCH_GELU, G_ATT_SCRATCH, G_GATH, G_PART, G_DRED,
    G_XSTATS, G_LNGRAD, G_COUNT
};
/* ... and of each layer. */
enum {
    L_LN1, L_LN1_MEAN, L_LN1_RSTD, L_QKV, L_ATTY, L_ATT_SAVED, L_ATTPROJ, L_RES2, L_LN2,
    L_LN2_MEAN, L_LN2_RSTD, L_FCH, L_FCH_GELU, L_FCPROJ, L_RES3, L_COUNT
};
#define LSLOT(l, s) (G_COUNT + (l) * L_COUNT + (s))
#define BIT(s) (1u << (s))

/* The layer slots a block keeps from its forward to its backward under each
 * recomputation policy (model.h: dt_model_block_slots; the others live in the scratch
 * set): selective keeps the GEMM outputs the backward reads (qkv, the MLP's first
 * output) and the residual stream (res2, res3); full the block's output. */
static const dt_model_block_slots gpt_blocks = {
    .first = G_COUNT, .per_block = L_COUNT,
    .keep = {[DT_MODEL_RECOMPUTE_NONE] = BIT(L_COUNT) - 1,
             [DT_MODEL_RECOMPUTE_SELECTIVE] = BIT(L_QKV) | BIT(L_RES2) | BIT(L_FCH) | BIT(L_RES3),
             [DT_MODEL_RECOMPUTE_FULL] = BIT(L_RES3)}};

static int gpt_arena_slots(const dt_model_layout *l) { return dt_model_block_slot_count(l, &gpt_blocks); }

/* A rank's widths: the whole model's at TP 1; under tensor parallelism the TP
 * regions (attention, MLP, logits) are 1/T as wide and, with sequence parallelism,
 * the rest holds R = B*T/T of the rows. */
typedef struct gdims {
    int tp, sp, B, T, BT, R, C, NH, L, V, Vp;
    int nb;          /* block slots in the arena (dt_model_max_chunk_blocks) */
    int first, last; /* the layout holds a first / a last chunk (the batch and head slots) */
    int Cl, NHl, Fl, Vl, v0; /* local attention width, heads, MLP width, vocabulary rows */
} gdims;

static gdims gdims_of(const dt_model_layout *lay, int B) {
    const dt_model_spec *s = &lay->spec;
    int tp = lay->tp_size > 1 ? lay->tp_size : 1;
    gdims d = {.tp = tp, .sp = lay->sequence_parallel, .B = B, .T = dt_model_rows(lay), .C = s->n_embd, .NH = s->n_head,
               .L = s->n_layer, .V = s->vocab_size, .Vp = lay->vocab_padded};
    d.BT = B * d.T;
    d.R = d.sp ? d.BT / tp : d.BT;
    d.Cl = d.C / tp;
    d.NHl = d.NH / tp;
    d.Fl = 4 * d.C / tp;
    d.Vl = d.Vp / tp;
    d.v0 = lay->tp_rank * d.Vl;
    d.nb = dt_model_max_chunk_blocks(lay);
    d.first = dt_model_has_first(lay);
    d.last = dt_model_has_last(lay);
    return d;
}

static void gpt_arena_sizes(const dt_device_t *dev, const dt_model_layout *lay, int B, size_t *sizes) {
    size_t es = dt_dtype_size(dev->ops->dtype);
    gdims d = gdims_of(lay, B);
    size_t BT = (size_t)d.BT, R = (size_t)d.R, C = (size_t)d.C, Cl = (size_t)d.Cl, Fl = (size_t)d.Fl;
    if (d.first) sizes[G_TOKENS] = BT * sizeof(int);
    sizes[G_POSITIONS] = BT * sizeof(int); /* every chunk: the embedding's and attention's */
    sizes[G_ENCODED] = R * C * es;
    if (d.last) { /* the head and the loss */
        sizes[G_TARGETS] = BT * sizeof(int);
        sizes[G_LNF] = R * C * es;
        sizes[G_LNF_MEAN] = sizes[G_LNF_RSTD] = R * sizeof(float);
        sizes[G_LOSSES] = BT * sizeof(float);
        sizes[G_LOGITS] = BT * (size_t)d.Vl * es;
    }
    sizes[G_DRES] = R * C * es;
    sizes[G_DTMP] = BT * C * es;
    sizes[G_DQKV] = BT * 3 * Cl * es;
    sizes[G_DFCH] = sizes[G_DFCH_GELU] = BT * Fl * es;
    sizes[G_ATT_SCRATCH] = dt_net_attention_scratch_bytes(dev, lay, B, d.T, d.Cl, d.NHl, d.NHl);
    if (d.sp) sizes[G_GATH] = sizes[G_PART] = BT * C * es;
    if (d.sp) sizes[G_DRED] = R * C * es;
    if (d.tp > 1 && d.last) sizes[G_XSTATS] = 3 * BT * sizeof(float);
    if (d.sp) sizes[G_LNGRAD] = 4 * C * es;
    size_t s[L_COUNT]; /* a block's whole set */
    s[L_LN1] = s[L_ATTPROJ] = s[L_RES2] = s[L_LN2] = s[L_FCPROJ] = s[L_RES3] = R * C * es;
    s[L_ATTY] = BT * Cl * es;
    s[L_LN1_MEAN] = s[L_LN1_RSTD] = s[L_LN2_MEAN] = s[L_LN2_RSTD] = R * sizeof(float);
    s[L_QKV] = BT * 3 * Cl * es;
    s[L_ATT_SAVED] = dt_net_attention_saved_bytes(dev, lay, B, d.T, d.Cl, d.NHl, d.NHl);
    s[L_FCH] = s[L_FCH_GELU] = BT * Fl * es;
    dt_model_block_sizes(lay, &gpt_blocks, s, sizes); /* each block what it keeps, and the scratch set */
}

/* The first tensor of block l (whole-model numbering) in the layout, which must hold
 * it: its tensors follow in the order of the T_ enum. */
static int block_t0(const dt_model_layout *lay, int l) {
    return lay->units[dt_model_local_unit(lay, 1 + l)].tensor0;
}

/* The table order forward and backward rely on. */
static dt_status_t gpt_net_check(const dt_model_layout *layout) {
    for (int l = 0; l < layout->spec.n_layer; l++) {
        if (dt_model_local_unit(layout, 1 + l) < 0) continue; /* another stage's */
        char name[DT_MODEL_NAME_LEN];
        snprintf(name, sizeof name, "h.%d.mlp.c_proj.bias", l);
        if (dt_model_find(layout, name) != block_t0(layout, l) + T_FCPROJB)
            return dt_error(DT_STATUS_INVALID, "model layout out of the expected order at %s", name);
    }
    return DT_STATUS_OK;
}

static void gpt_dims(const dt_model_layout *l, dt_model_dims *out) {
    const dt_model_spec *s = &l->spec;
    *out = (dt_model_dims){.n_layer = s->n_layer, .hidden = s->n_embd, .n_head = s->n_head, .n_kv_head = s->n_head,
                           .head_dim = s->n_embd / s->n_head, .mlp_in = 4 * s->n_embd, .mlp_act = 4 * s->n_embd,
                           .norm_stats = 2};
}

/* ---- forward and backward -------------------------------------------------- */

#define P(t) dt_net_param(net, (t))
#define G(t) dt_net_grad(net, (t))
#define A(slot) dt_net_slot(net, (slot))
#define AF(slot) ((float *)A(slot))
#define BS(j, s) A(dt_model_block_slot(net->layout, &gpt_blocks, (j), (s))) /* layer slot s of the chunk's block j */
#define BSF(j, s) ((float *)BS(j, s))
#define PL(l, k) P(LAYER_T(l, k)) /* the whole model's block l (decoding) */
#define PB(k) P(t0 + (k))           /* tensor k of the block at hand (first tensor t0) */
#define GB(k) G(t0 + (k))

/* gpt's TP matmuls over its slots, by tensor index, for the linear layers LoRA may
 * target (net_impl.h: dt_net_linear_*: the base plus adapters in a LoRA net). */
#define LINEAR_ROW_FORWARD(out, inp, k, IC) \
    dt_net_linear_row_forward(net, out, A(G_PART), inp, t0 + (k), PB((k) + 1), d.BT, IC, d.C)
#define LINEAR_COLUMN_BACKWARD(k, dout, x, OC) \
    dt_net_linear_column_backward(net, A(G_DTMP), A(G_DRED), t0 + (k), GB((k) + 1), dout, x, d.BT, d.C, OC)

/* Block l (position j of the chunk) from its input residual: its whole forward
 * (redo NONE), or what its backward first recomputes under policy redo (model.h):
 * full, every op up to the MLP activation, the GEMMs and their TP collectives
 * included; selective, the norms, the attention and the activation only (the GEMM
 * outputs it reads were kept). The ops run in the forward's order either way.
 * Under tensor parallelism (Megatron): c_attn and c_fc are column-parallel (this
 * rank's heads and MLP columns), the two c_proj row-parallel; the residual stream is
 * whole on every rank, or cut along the rows with sequence parallelism. */
static void gpt_block_forward(dt_net_t *net, int l, int j, void *residual, dt_model_recompute_t redo) {
    const dt_ops_t *o = net->dev->ops;
    dt_device_t *dv = net->dev;
    gdims d = gdims_of(net->layout, net->B);
    int t0 = block_t0(net->layout, l);
    int gemm = redo != DT_MODEL_RECOMPUTE_SELECTIVE, C = d.C, R = d.R, BT = d.BT;
    size_t rc = (size_t)R * C;
    o->layernorm_forward(dv, BS(j, L_LN1), BSF(j, L_LN1_MEAN), BSF(j, L_LN1_RSTD), residual, PB(T_LN1W),
                         PB(T_LN1B), R, C);
    if (gemm) {
        void *x = dt_net_tp_gather_in(net, BS(j, L_LN1), A(G_GATH), rc);
        dt_net_linear_forward(net, BS(j, L_QKV), x, t0 + T_QKVW, PB(T_QKVB), BT, C, 3 * d.Cl);
    }
    dt_net_attention_forward(net, BS(j, L_ATTY), BS(j, L_ATT_SAVED), A(G_ATT_SCRATCH), BS(j, L_QKV), d.B, d.T, d.Cl,
                             d.NHl, d.NHl);
    if (gemm) {
        LINEAR_ROW_FORWARD(BS(j, L_ATTPROJ), BS(j, L_ATTY), T_ATTPROJW, d.Cl);
        o->residual_forward(dv, BS(j, L_RES2), residual, BS(j, L_ATTPROJ), rc);
    }
    o->layernorm_forward(dv, BS(j, L_LN2), BSF(j, L_LN2_MEAN), BSF(j, L_LN2_RSTD), BS(j, L_RES2), PB(T_LN2W),
                         PB(T_LN2B), R, C);
    if (gemm) {
        void *x = dt_net_tp_gather_in(net, BS(j, L_LN2), A(G_GATH), rc);
        dt_net_linear_forward(net, BS(j, L_FCH), x, t0 + T_FCW, PB(T_FCB), BT, C, d.Fl);
    }
    o->gelu_forward(dv, BS(j, L_FCH_GELU), BS(j, L_FCH), (size_t)BT * d.Fl);
    if (redo != DT_MODEL_RECOMPUTE_NONE) return; /* the backward reads neither fcproj nor res3 */
    LINEAR_ROW_FORWARD(BS(j, L_FCPROJ), BS(j, L_FCH_GELU), T_FCPROJW, d.Fl);
    o->residual_forward(dv, BS(j, L_RES3), BS(j, L_RES2), BS(j, L_FCPROJ), rc);
}

/* A layer's norm gradients: into the gradients, or (sequence parallelism: partial,
 * from this rank's rows) into G_LNGRAD, summed over the group at the layer's end. */
static int lng_index(int k) { return k == T_LN1W ? 0 : k == T_LN1B ? 1 : k == T_LN2W ? 2 : 3; }
#define LNG(k) dt_net_tp_norm_grad(net, A(G_LNGRAD), lng_index(k), (size_t)C, GB(k))

/* Block l's backward: G_DRES holds the gradient of its output and ends holding that
 * of its input residual. */
static void gpt_block_backward(dt_net_t *net, int l, int j, void *residual) {
    const dt_ops_t *o = net->dev->ops;
    dt_device_t *dv = net->dev;
    gdims d = gdims_of(net->layout, net->B);
    int t0 = block_t0(net->layout, l);
    int B = d.B, T = d.T, C = d.C, BT = d.BT, R = d.R;
    size_t rc = (size_t)R * C;
    if (d.sp) dt_net_zero(net, G_LNGRAD, 4 * (size_t)C);
    /* dres holds d(res3) = d(fcproj) = the part of d(res2) from the skip. */
    void *dout = dt_net_tp_gather_in(net, A(G_DRES), A(G_PART), rc);
    dt_net_zero(net, G_DFCH_GELU, (size_t)BT * d.Fl);
    dt_net_linear_backward(net, A(G_DFCH_GELU), GB(T_FCPROJB), dout, BS(j, L_FCH_GELU), t0 + T_FCPROJW, BT, d.Fl,
                           C);
    dt_net_zero(net, G_DFCH, (size_t)BT * d.Fl);
    o->gelu_backward(dv, A(G_DFCH), BS(j, L_FCH), A(G_DFCH_GELU), (size_t)BT * d.Fl);
    void *x = dt_net_tp_gather_in(net, BS(j, L_LN2), A(G_GATH), rc);
    void *dln = LINEAR_COLUMN_BACKWARD(T_FCW, A(G_DFCH), x, d.Fl);
    o->layernorm_backward(dv, A(G_DRES), LNG(T_LN2W), LNG(T_LN2B), dln, BS(j, L_RES2), PB(T_LN2W),
                          BSF(j, L_LN2_MEAN), BSF(j, L_LN2_RSTD), R, C);
    /* dres now holds d(res2) = d(attproj) = the skip part of d(residual). */
    dout = dt_net_tp_gather_in(net, A(G_DRES), A(G_PART), rc);
    dt_net_zero(net, G_DTMP, (size_t)BT * d.Cl);
    dt_net_linear_backward(net, A(G_DTMP), GB(T_ATTPROJB), dout, BS(j, L_ATTY), t0 + T_ATTPROJW, BT, d.Cl, C);
    dt_net_zero(net, G_DQKV, (size_t)BT * 3 * d.Cl);
    dt_net_attention_backward(net, A(G_DQKV), A(G_ATT_SCRATCH), A(G_DTMP), BS(j, L_QKV), BS(j, L_ATT_SAVED),
                              BS(j, L_ATTY), B, T, d.Cl, d.NHl, d.NHl);
    x = dt_net_tp_gather_in(net, BS(j, L_LN1), A(G_GATH), rc);
    dln = LINEAR_COLUMN_BACKWARD(T_QKVW, A(G_DQKV), x, 3 * d.Cl);
    o->layernorm_backward(dv, A(G_DRES), LNG(T_LN1W), LNG(T_LN1B), dln, residual, PB(T_LN1W), BSF(j, L_LN1_MEAN),
                          BSF(j, L_LN1_RSTD), R, C);
    void *const ln_grads[] = {GB(T_LN1W), GB(T_LN1B), GB(T_LN2W), GB(T_LN2B)}; /* lng_index order */
    dt_net_tp_norm_grads_add(net, A(G_LNGRAD), (size_t)C, ln_grads, 4);
}

/* wte + wpe into G_ENCODED. Under tensor parallelism wte is cut over the vocabulary
 * rows: each rank its rows (the others' tokens are -1: 0), wpe once, summed. */
static void gpt_embed_forward(dt_net_t *net) {
    const dt_ops_t *o = net->dev->ops;
    dt_device_t *dv = net->dev;
    const dt_model_layout *lay = net->layout;
    gdims d = gdims_of(lay, net->B);
    if (d.tp == 1) {
        o->encoder_forward(dv, A(G_ENCODED), net->d_tokens, P(0), P(1), net->d_positions, d.B, d.T, d.C);
    } else {
        void *part = d.sp ? A(G_PART) : A(G_ENCODED);
        o->encoder_forward(dv, part, net->d_tokens, P(0), lay->tp_rank == 0 ? P(1) : NULL, net->d_positions, d.B,
                           d.T, d.C);
        dt_net_tp_reduce_out(net, part, A(G_ENCODED), (size_t)d.BT * d.C);
    }
}

/* dwte, dwpe += from dout; a LoRA net's embedding is frozen (no gradient). */
static void gpt_embed_backward(dt_net_t *net, const void *dout) {
    gdims d = gdims_of(net->layout, net->B);
    if (G(0))
        net->dev->ops->encoder_backward(net->dev, G(0), G(1), dout, net->d_tokens, net->d_positions, d.B, d.T, d.C);
}

/* ln_f (the final unit's tensors) into G_LNF. */
static int lnf_t0(const dt_model_layout *lay) {
    return lay->units[dt_model_local_unit(lay, lay->spec.n_layer + 1)].tensor0;
}

static void gpt_norm_forward(dt_net_t *net, const void *x) {
    gdims d = gdims_of(net->layout, net->B);
    int lnf = lnf_t0(net->layout);
    net->dev->ops->layernorm_forward(net->dev, A(G_LNF), AF(G_LNF_MEAN), AF(G_LNF_RSTD), x, P(lnf), P(lnf + 1), d.R,
                                     d.C);
}

static void gpt_norm_backward(dt_net_t *net, const void *dnorm, const void *x) {
    gdims d = gdims_of(net->layout, net->B);
    int lnf = lnf_t0(net->layout), C = d.C;
    if (d.sp) dt_net_zero(net, G_LNGRAD, 2 * (size_t)C);
    net->dev->ops->layernorm_backward(net->dev, A(G_DRES), dt_net_tp_norm_grad(net, A(G_LNGRAD), 0, (size_t)C, G(lnf)),
                                      dt_net_tp_norm_grad(net, A(G_LNGRAD), 1, (size_t)C, G(lnf + 1)), dnorm, x,
                                      P(lnf), AF(G_LNF_MEAN), AF(G_LNF_RSTD), d.R, C);
    void *const lnf_grads[] = {G(lnf), G(lnf + 1)};
    dt_net_tp_norm_grads_add(net, A(G_LNGRAD), (size_t)C, lnf_grads, 2);
}

/* ---- KV-cache decoding (model.h: decode) ---------------------------------- */

/* The decode arena: one position's activations (B = T = 1) and per layer a cache
 * of seq_len rows of keys|values (2C), the k|v tail of each position's qkv row. */
enum {
    D_TOKENS = DT_NET_SLOT_TOKENS, D_X = DT_NET_SLOT_FIRST, D_RES2, D_LN, D_MEAN, D_RSTD, D_QKV, D_ATTY,
    D_PROJ, D_FCH, D_FCH_GELU, D_LOGITS, D_COUNT
};
#define DSLOT_CACHE(l) (D_COUNT + (l))

static int gpt_decode_slots(const dt_model_layout *l) { return D_COUNT + l->spec.n_layer; }

static void gpt_decode_sizes(const dt_device_t *dev, const dt_model_layout *lay, size_t *sizes) {
    size_t es = dt_dtype_size(dev->ops->dtype), C = (size_t)lay->spec.n_embd;
    sizes[D_TOKENS] = sizeof(int);
    sizes[D_X] = sizes[D_RES2] = sizes[D_LN] = sizes[D_ATTY] = sizes[D_PROJ] = C * es;
    sizes[D_MEAN] = sizes[D_RSTD] = sizeof(float);
    sizes[D_QKV] = 3 * C * es;
    sizes[D_FCH] = sizes[D_FCH_GELU] = 4 * C * es;
    sizes[D_LOGITS] = (size_t)lay->vocab_padded * es;
    for (int l = 0; l < lay->spec.n_layer; l++) sizes[DSLOT_CACHE(l)] = (size_t)lay->seq_len * 2 * C * es;
}

/* The forward for one position pos of one sequence (net.c's driver runs it: the
 * head is wte): the position embedding is wpe row pos (a pointer offset), and
 * attention reads the cached keys and values of positions 0..pos after this
 * position's are stored at row pos. */
static void gpt_decode_embed(dt_net_t *net, int pos) {
    int C = net->layout->spec.n_embd;
    net->dev->ops->encoder_forward(net->dev, A(D_X), net->d_tokens, P(0), (char *)P(1) + (size_t)pos * C * net->elsize,
                                   NULL, 1, 1, C);
}

static void gpt_decode_block(dt_net_t *net, int l, int pos) {
    const dt_ops_t *o = net->dev->ops;
    dt_device_t *d = net->dev;
    const dt_model_spec *s = &net->layout->spec;
    int C = s->n_embd, NH = s->n_head, Tmax = net->layout->seq_len;
    size_t es = net->elsize;
    void *cache = A(DSLOT_CACHE(l));
    o->layernorm_forward(d, A(D_LN), AF(D_MEAN), AF(D_RSTD), A(D_X), PL(l, T_LN1W), PL(l, T_LN1B), 1, C);
    dt_net_linear_forward(net, A(D_QKV), A(D_LN), LAYER_T(l, T_QKVW), PL(l, T_QKVB), 1, C, 3 * C);
    o->copy(d, (char *)cache + (size_t)pos * 2 * C * es, (char *)A(D_QKV) + (size_t)C * es, 2 * (size_t)C * es,
            DT_COPY_DEVICE_TO_DEVICE);
    o->attention_decode(d, A(D_ATTY), A(D_QKV), 3 * C, cache, Tmax, pos, 1, C, NH, NH);
    dt_net_linear_forward(net, A(D_PROJ), A(D_ATTY), LAYER_T(l, T_ATTPROJW), PL(l, T_ATTPROJB), 1, C, C);
    o->residual_forward(d, A(D_RES2), A(D_X), A(D_PROJ), (size_t)C);
    o->layernorm_forward(d, A(D_LN), AF(D_MEAN), AF(D_RSTD), A(D_RES2), PL(l, T_LN2W), PL(l, T_LN2B), 1, C);
    dt_net_linear_forward(net, A(D_FCH), A(D_LN), LAYER_T(l, T_FCW), PL(l, T_FCB), 1, C, 4 * C);
    o->gelu_forward(d, A(D_FCH_GELU), A(D_FCH), (size_t)4 * C);
    dt_net_linear_forward(net, A(D_PROJ), A(D_FCH_GELU), LAYER_T(l, T_FCPROJW), PL(l, T_FCPROJB), 1, 4 * C, C);
    o->residual_forward(d, A(D_X), A(D_RES2), A(D_PROJ), (size_t)C);
}

static void gpt_decode_norm(dt_net_t *net) {
    int C = net->layout->spec.n_embd, lnf = LAYER_T(net->layout->spec.n_layer, 0);
    net->dev->ops->layernorm_forward(net->dev, A(D_LN), AF(D_MEAN), AF(D_RSTD), A(D_X), P(lnf), P(lnf + 1), 1, C);
}

/* What net.c's chunk driver runs (net_impl.h): the head is wte (tied), the logits
 * G_LOGITS, cut over the vocabulary rows under tensor parallelism. */
static const dt_net_stack gpt_stack = {
    .blocks = &gpt_blocks, .block_out = L_RES3,
    .in = G_ENCODED, .norm = G_LNF, .dres = G_DRES, .dtmp = G_DTMP, .dred = G_DRED, .gath = G_GATH,
    .part = G_PART, .xstats = G_XSTATS,
    .embed_forward = gpt_embed_forward, .embed_backward = gpt_embed_backward,
    .block_forward = gpt_block_forward, .block_backward = gpt_block_backward,
    .norm_forward = gpt_norm_forward, .norm_backward = gpt_norm_backward,
    .decode_embed = gpt_decode_embed, .decode_block = gpt_decode_block, .decode_norm = gpt_decode_norm,
    .decode_norm_slot = D_LN,
};

const dt_model_ops dt_model_gpt = {
    .name = "gpt",
    .help = "GPT-2 on text/tokens",
    .data = DT_MODEL_DATA_TOKENS,
    .keys = gpt_keys,
    .n_keys = (int)(sizeof gpt_keys / sizeof gpt_keys[0]),
    .config_check = gpt_config_check,
    .tp_check = gpt_tp_check,
    .heads = gpt_heads,
    .validate = gpt_validate,
    .build = gpt_build,
    .init_params = gpt_init_params,
    .init_range = gpt_init_range,
    .unpadded_params = gpt_unpadded_params,
    .flops_per_token = gpt_flops_per_token,
    .describe = gpt_describe,
    .arena_slots = gpt_arena_slots,
    .arena_sizes = gpt_arena_sizes,
    .net_check = gpt_net_check,
    .dims = gpt_dims,
    .forward = dt_net_stack_forward,
    .backward = dt_net_stack_backward,
    .stack = &gpt_stack,
    .logits_slot = G_LOGITS,
    .pipeline = 1,
    .stage_buf = dt_net_stack_stage_buf,
    .decode_slots = gpt_decode_slots,
    .decode_sizes = gpt_decode_sizes,
    .decode = dt_net_stack_decode,
    .decode_logits_slot = D_LOGITS,
    .export_shape = gpt_export_shape,
    .synthetic_batch = NULL,
};
