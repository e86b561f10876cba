/*
 * llama.c - the Llama family (Llama 2/3, Mistral, Qwen2: model.type "llama") over the
 * device op table, in the order of the paper: its config keys (Hugging Face's
 * config.json names), tensor table (Hugging Face's LlamaForCausalLM state-dict names),
 * initialisation, FLOPs, activation arena, the math of its embedding, layers and final
 * norm (forward, backward, KV-cache decode) and export shapes. Fills dt_model_llama
 * (model.h).
 *
 * A decoder layer: x += o_proj(attention(rope(qkv(rmsnorm(x))))), then
 * x += down_proj(silu(gate(h)) * up(h)) with h = rmsnorm(x); grouped-query attention
 * (num_key_value_heads key/value heads shared by the query heads), RoPE with optional
 * Llama 3 frequency scaling, optional q/k/v biases (Qwen2), an untied LM head unless
 * tie_word_embeddings.
 *
 * Units: 0 = embed_tokens, 1..L = the decoder layers, L+1 = the final norm (and
 * lm_head when untied; tied, the head is unit 0's embedding used again, as gpt, or on
 * a last pipeline stage without it net->head_w). net.c's chunk driver (net_impl.h:
 * dt_net_stack) runs that math over the layout's chunk net->chunk with the hooks,
 * the head and the loss; a layer's tensors are reached through its unit's first
 * tensor, so a stage layout runs as the whole model.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "runtime/model/model.h"
#include "runtime/model/net_impl.h"

/* ---- config ---------------------------------------------------------------- */

/* Llama's sizes, laid over dt_model_spec.priv (model.h). seq_len, vocab_size and
 * vocab_pad_multiple are the spec's named fields, shared with gpt. */
typedef struct llama_sizes {
    int hidden_size, num_hidden_layers, num_attention_heads;
    int num_key_value_heads; /* 0 in a config: = num_attention_heads */
    int head_dim;            /* 0 in a config: = hidden_size / num_attention_heads */
    int intermediate_size;   /* 0 in a config: Meta's rule, see resolve() */
    int max_position_embeddings;
    int tie_word_embeddings, attention_bias; /* bools */
    int rope_original_max_pos;
    double rope_theta, rms_norm_eps;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
} llama_sizes;
DT_MODEL_PRIV_FITS(llama_sizes);

#define SPEC(f) offsetof(dt_model_spec, f)
#define PK(f) DT_MODEL_PRIV_KEY(llama_sizes, f)
#define INT_ DT_MODEL_KEY_INT
#define FLOAT_ DT_MODEL_KEY_FLOAT
#define BOOL_ DT_MODEL_KEY_BOOL

static const dt_model_key llama_keys[] = {
    {"model.hidden_size", PK(hidden_size), 1, 65536, "128", "llama: width", INT_},
    {"model.num_hidden_layers", PK(num_hidden_layers), 1, 1024, "4", "llama: decoder layers", INT_},
    {"model.num_attention_heads", PK(num_attention_heads), 1, 1024, "4", "llama: query heads", INT_},
    {"model.num_key_value_heads", PK(num_key_value_heads), 0, 1024, "0",
     "llama: key/value heads, a divisor of num_attention_heads (0 = num_attention_heads)", INT_},
    {"model.head_dim", PK(head_dim), 0, 256, "0",
     "llama: head size, even (0 = hidden_size / num_attention_heads)", INT_},
    {"model.intermediate_size", PK(intermediate_size), 0, 1048576, "0",
     "llama: MLP width (0 = 8/3 hidden_size rounded up to a multiple of 256)", INT_},
    {"model.max_position_embeddings", PK(max_position_embeddings), 1, 16777216, "2048",
     "llama: longest context the positions are meant for (seq_len <= it)", INT_},
    {"model.rope_theta", PK(rope_theta), 1, 1e12, "10000", "llama: RoPE base", FLOAT_},
    {"model.rms_norm_eps", PK(rms_norm_eps), 0, 1, "1e-06", "llama: RMSNorm epsilon", FLOAT_},
    {"model.tie_word_embeddings", PK(tie_word_embeddings), 0, 1, "false",
     "llama: the LM head is embed_tokens (no lm_head.weight)", BOOL_},
    {"model.attention_bias", PK(attention_bias), 0, 1, "false", "llama: q/k/v projections have biases (Qwen2)",
     BOOL_},
    {"model.rope_scaling.factor", PK(rope_factor), 0, 1e6, "0",
     "llama: Llama 3 RoPE frequency scaling factor (0 = none)", FLOAT_},
    {"model.rope_scaling.low_freq_factor", PK(rope_low_freq_factor), 0, 1e6, "1",
     "llama: Llama 3 RoPE scaling: low_freq_factor", FLOAT_},
    {"model.rope_scaling.high_freq_factor", PK(rope_high_freq_factor), 0, 1e6, "4",
     "llama: Llama 3 RoPE scaling: high_freq_factor", FLOAT_},
    {"model.rope_scaling.original_max_position_embeddings", PK(rope_original_max_pos), 1, 16777216, "8192",
     "llama: Llama 3 RoPE scaling: the pretraining context", INT_},
    /* shared with gpt (the same path is one key; gpt's row is listed) */
    {"model.seq_len", SPEC(seq_len), 1, 1048576, "128", "context length in tokens", INT_},
    {"model.vocab_size", SPEC(vocab_size), 0, 16777216, "0", "0 = from the data", INT_},
    {"model.vocab_pad_multiple", SPEC(vocab_pad_multiple), 1, 65536, "64",
     "embedding rows padded to a multiple of this", INT_},
};

/* The sizes with the config's zeros ("same as ...") resolved. */
static llama_sizes resolve(const dt_model_spec *s) {
    llama_sizes z = *DT_MODEL_PRIV(s, const llama_sizes);
    if (z.num_key_value_heads == 0) z.num_key_value_heads = z.num_attention_heads;
    if (z.head_dim == 0 && z.num_attention_heads > 0) z.head_dim = z.hidden_size / z.num_attention_heads;
    if (z.intermediate_size == 0) { /* Meta's reference: 2/3 of 4C, up to a multiple of 256 */
        int i = 2 * (4 * z.hidden_size) / 3;
        z.intermediate_size = (i + 255) / 256 * 256;
    }
    return z;
}

/* The rules between keys; 0, or 1 with the message naming the key. */
static int check_sizes(const dt_model_spec *s, char *msg, size_t len) {
    llama_sizes z = resolve(s);
    const llama_sizes *given = DT_MODEL_PRIV(s, const llama_sizes);
    if (given->head_dim == 0 && z.hidden_size % z.num_attention_heads != 0) {
        snprintf(msg, len,
                 "model.hidden_size: expected a multiple of model.num_attention_heads (%d) when "
                 "model.head_dim is 0, found %d",
                 z.num_attention_heads, z.hidden_size);
        return 1;
    }
    if (z.num_attention_heads % z.num_key_value_heads != 0) {
        snprintf(msg, len, "model.num_key_value_heads: expected a divisor of model.num_attention_heads (%d), found %d",
                 z.num_attention_heads, z.num_key_value_heads);
        return 1;
    }
    if (z.head_dim % 2 != 0 || z.head_dim <= 0 || z.head_dim > 256) {
        snprintf(msg, len, "model.head_dim: expected an even size from 2 to 256 (RoPE rotates pairs), found %d%s",
                 z.head_dim, given->head_dim == 0 ? " (hidden_size / num_attention_heads)" : "");
        return 1;
    }
    if (s->seq_len > z.max_position_embeddings) {
        snprintf(msg, len, "model.seq_len: expected at most model.max_position_embeddings (%d), found %d",
                 z.max_position_embeddings, s->seq_len);
        return 1;
    }
    if (z.rope_factor > 0 && !(z.rope_high_freq_factor > z.rope_low_freq_factor)) {
        snprintf(msg, len,
                 "model.rope_scaling.high_freq_factor: expected more than low_freq_factor (%g), found %g",
                 z.rope_low_freq_factor, z.rope_high_freq_factor);
        return 1;
    }
    return 0;
}

static int llama_config_check(const dt_model_spec *s, char *msg, size_t len) { return check_sizes(s, msg, len); }

/* Megatron's cut: query heads, key/value heads (GQA: each rank holds its query
 * heads' groups, so num_key_value_heads must divide too; replicating key/value heads
 * across ranks is not supported) and the MLP width divide among the tp ranks. */
static void llama_heads(const dt_model_spec *s, int *nh, int *nkv) {
    llama_sizes z = resolve(s);
    *nh = z.num_attention_heads, *nkv = z.num_key_value_heads;
}

static int llama_tp_check(const dt_model_spec *s, int tp, char *msg, size_t len) {
    llama_sizes z = resolve(s);
    const struct {
        const char *key;
        int v;
    } cut[] = {{"num_attention_heads", z.num_attention_heads},
               {"num_key_value_heads", z.num_key_value_heads},
               {"intermediate_size", z.intermediate_size}};
    for (int i = 0; i < 3; i++)
        if (cut[i].v % tp != 0) {
            snprintf(msg, len,
                     "tensor_parallel.size: %d does not divide model.%s (%d): each rank must hold a whole "
                     "share%s",
                     tp, cut[i].key, cut[i].v,
                     i == 1 ? " (key/value heads are cut, not replicated: use a size dividing num_key_value_heads)"
                            : "");
            return 1;
        }
    return 0;
}

/* ---- layout ---------------------------------------------------------------- */

static dt_status_t check_positive(const char *name, int v) {
    if (v <= 0) return dt_error(DT_STATUS_CONFIG, "model.%s: expected an integer > 0, found %d", name, v);
    return DT_STATUS_OK;
}

static dt_status_t llama_validate(const dt_model_spec *s) {
    const llama_sizes *z = DT_MODEL_PRIV(s, const llama_sizes);
    DT_CHECK(check_positive("hidden_size", z->hidden_size));
    DT_CHECK(check_positive("num_hidden_layers", z->num_hidden_layers));
    DT_CHECK(check_positive("num_attention_heads", z->num_attention_heads));
    DT_CHECK(check_positive("max_position_embeddings", z->max_position_embeddings));
    DT_CHECK(check_positive("seq_len", s->seq_len));
    DT_CHECK(check_positive("vocab_size", s->vocab_size));
    const struct {
        const char *name;
        int v;
    } derived[] = {{"num_key_value_heads", z->num_key_value_heads}, {"head_dim", z->head_dim},
                   {"intermediate_size", z->intermediate_size}};
    for (int i = 0; i < 3; i++)
        if (derived[i].v < 0)
            return dt_error(DT_STATUS_CONFIG, "model.%s: expected >= 0 (0 = derived), found %d", derived[i].name,
                            derived[i].v);
    if (!(z->rope_theta > 0)) return dt_error(DT_STATUS_CONFIG, "model.rope_theta: expected > 0, found %g", z->rope_theta);
    if (!(z->rms_norm_eps >= 0))
        return dt_error(DT_STATUS_CONFIG, "model.rms_norm_eps: expected >= 0, found %g", z->rms_norm_eps);
    char msg[256];
    if (check_sizes(s, msg, sizeof msg)) return dt_error(DT_STATUS_CONFIG, "%s", msg);
    return DT_STATUS_OK;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NDIM(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define ADD_TP(l, unit, decay, init, split, shape_list, ...)                                            \
    dt_model_add_tensor_tp(l, unit, decay, DT_MODEL_INIT_##init, DT_TP_##split, 1, NDIM shape_list, SHAPE shape_list, \
                           __VA_ARGS__)
#define ADD(l, unit, decay, init, shape_list, ...) \
    dt_model_add_tensor(l, unit, decay, DT_MODEL_INIT_##init, NDIM shape_list, SHAPE shape_list, __VA_ARGS__)

/* Tensor k of layer i in the table llama_build makes (forward and backward rely on
 * it): q, k, v weights are contiguous, so they are one fused (NH*HD + 2*NKV*HD, C)
 * matmul weight (T_Q); with attention_bias their biases follow as one fused bias;
 * gate and up are one fused (2I, C) weight whose output rows are [gate | up]. */
enum { T_LN1, T_Q, T_K, T_V, T_QB, T_KB, T_VB, T_O, T_LN2, T_GATE, T_UP, T_DOWN };

/* Index in the layout's table of tensor k (from the enum above) of layer i (whole-
 * model numbering), which the layout must hold: the layer's unit's first tensor + k. */
static int layer_t(const dt_model_layout *lay, const llama_sizes *z, int i, int k) {
    if (!z->attention_bias && k >= T_QB) k -= 3; /* no T_QB..T_VB */
    return lay->units[dt_model_local_unit(lay, 1 + i)].tensor0 + k;
}

static void llama_build(dt_model_layout *l) {
    dt_model_spec *s = &l->spec;
    llama_sizes *z = DT_MODEL_PRIV(s, llama_sizes);
    *z = resolve(s); /* the layout's spec holds the sizes it was built with */
    l->vocab_padded = dt_model_vocab_padded(s);
    l->seq_len = s->seq_len;
    l->tied_head = z->tie_word_embeddings != 0;
    int64_t C = z->hidden_size, Vp = l->vocab_padded, HD = z->head_dim, IC = z->intermediate_size;
    int64_t Q = z->num_attention_heads * HD, KV = z->num_key_value_heads * HD;
    int L = z->num_hidden_layers;
    ADD_TP(l, 0, 0, EMBED, ROWS, (Vp, C), "model.embed_tokens.weight");
    for (int i = 0; i < L; i++) {
        int u = 1 + i;
        ADD(l, u, 0, ONE, (C), "model.layers.%d.input_layernorm.weight", i);
        ADD_TP(l, u, 1, NORMAL, ROWS, (Q, C), "model.layers.%d.self_attn.q_proj.weight", i);
        ADD_TP(l, u, 1, NORMAL, ROWS, (KV, C), "model.layers.%d.self_attn.k_proj.weight", i);
        ADD_TP(l, u, 1, NORMAL, ROWS, (KV, C), "model.layers.%d.self_attn.v_proj.weight", i);
        if (z->attention_bias) {
            ADD_TP(l, u, 0, ZERO, ROWS, (Q), "model.layers.%d.self_attn.q_proj.bias", i);
            ADD_TP(l, u, 0, ZERO, ROWS, (KV), "model.layers.%d.self_attn.k_proj.bias", i);
            ADD_TP(l, u, 0, ZERO, ROWS, (KV), "model.layers.%d.self_attn.v_proj.bias", i);
        }
        ADD_TP(l, u, 1, NORMAL, COLS, (C, Q), "model.layers.%d.self_attn.o_proj.weight", i);
        ADD(l, u, 0, ONE, (C), "model.layers.%d.post_attention_layernorm.weight", i);
        ADD_TP(l, u, 1, NORMAL, ROWS, (IC, C), "model.layers.%d.mlp.gate_proj.weight", i);
        ADD_TP(l, u, 1, NORMAL, ROWS, (IC, C), "model.layers.%d.mlp.up_proj.weight", i);
        ADD_TP(l, u, 1, NORMAL, COLS, (C, IC), "model.layers.%d.mlp.down_proj.weight", i);
    }
    ADD(l, L + 1, 0, ONE, (C), "model.norm.weight");
    if (!z->tie_word_embeddings) ADD_TP(l, L + 1, 1, NORMAL, ROWS, (Vp, C), "lm_head.weight");
}

/* Hugging Face's LlamaPreTrainedModel: normal(0, initializer_range = 0.02) for every
 * matmul and the embedding, norms 1, biases 0; padded vocabulary rows 0 (they never
 * see a token, and as head rows their logits are ignored). */
static void llama_init_range(const dt_model_layout *l, uint64_t seed, size_t offset, size_t count, float *dst) {
    for (int i = 0; i < l->n_tensors; i++) dt_model_init_tensor_range(l, i, seed, offset, count, dst, 0.02, 0.02);
    size_t C = (size_t)DT_MODEL_PRIV(&l->spec, const llama_sizes)->hidden_size;
    const char *vocab_rows[] = {"model.embed_tokens.weight", "lm_head.weight"};
    for (int k = 0; k < 2; k++) {
        int t = dt_model_find(l, vocab_rows[k]);
        if (t < 0) continue;
        size_t a = l->tensors[t].offset + (size_t)l->spec.vocab_size * C, e = l->tensors[t].offset + l->tensors[t].numel;
        if (a < offset) a = offset;
        if (e > offset + count) e = offset + count;
        if (a < e) memset(dst + (a - offset), 0, (e - a) * sizeof(float));
    }
}

static void llama_init_params(const dt_model_layout *l, uint64_t seed, float *params) {
    llama_init_range(l, seed, 0, l->n_params, params);
}

static size_t llama_unpadded_params(const dt_model_layout *l) {
    size_t rows = (size_t)(l->vocab_padded - l->spec.vocab_size) * (l->tied_head ? 1 : 2);
    return l->n_params - rows * (size_t)DT_MODEL_PRIV(&l->spec, const llama_sizes)->hidden_size;
}

/* 6 FLOPs per matmul parameter per token (forward 2, backward 4) + attention's
 * 12·L·HD·NH·T (scores and weighted values, forward and backward; PaLM's appendix).
 * The matmul parameters are all but the embedding lookup when the head is untied
 * (a tied head multiplies by the embedding); the norms' few weights are counted too. */
static double llama_flops_per_token(const dt_model_layout *l) {
    const llama_sizes *z = DT_MODEL_PRIV(&l->spec, const llama_sizes);
    double n = (double)l->n_params;
    if (!l->tied_head) n -= (double)l->vocab_padded * z->hidden_size;
    return 6.0 * n + 12.0 * z->num_hidden_layers * (double)z->head_dim * z->num_attention_heads * l->seq_len;
}

static void llama_describe(const dt_model_layout *l, const char *note, char *buf, size_t len) {
    const llama_sizes *z = DT_MODEL_PRIV(&l->spec, const llama_sizes);
    snprintf(buf, len,
             "llama, %d layers, hidden %d, %d heads (%d key/value) of %d, intermediate %d, seq %d, "
             "vocab %d padded to %d%s%s; %zu parameters (%zu without vocab padding)",
             z->num_hidden_layers, z->hidden_size, z->num_attention_heads, z->num_key_value_heads, z->head_dim,
             z->intermediate_size, l->seq_len, l->spec.vocab_size, l->vocab_padded, note,
             l->tied_head ? ", tied head" : "", l->n_params, llama_unpadded_params(l));
}

/* ---- activation arena ------------------------------------------------------ */

/* A rank's widths: the whole model's at TP 1. Under tensor parallelism NH, NKV, IC
 * (and so QC, QKVC) are this rank's share (1/T: its query heads, their key/value
 * heads, its MLP columns), Vl of the vocabulary rows from v0, and with sequence
 * parallelism the norms and the residual stream hold R = B*T/T of the rows. */
typedef struct dims {
    int tp, sp, B, T, BT, R, C, NH, NKV, HD, IC, L, V, Vp;
    int QC;     /* NH*HD: the attention's width (q, out) */
    int QKVC;   /* (NH + 2*NKV)*HD: a fused qkv row */
    int Vl, v0; /* this rank's vocabulary rows [v0, v0 + Vl) */
    float eps;
    dt_rope_args_t rope;
} dims;

static dims dims_of(const dt_model_layout *l, int B) {
    const llama_sizes *z = DT_MODEL_PRIV(&l->spec, const llama_sizes);
    int tp = l->tp_size > 1 ? l->tp_size : 1;
    dims d = {.tp = tp, .sp = tp > 1 && l->sequence_parallel, .B = B, .T = dt_model_rows(l), .C = z->hidden_size,
              .NH = z->num_attention_heads / tp, .NKV = z->num_key_value_heads / tp, .HD = z->head_dim,
              .IC = z->intermediate_size / tp, .L = z->num_hidden_layers, .V = l->spec.vocab_size,
              .Vp = l->vocab_padded, .eps = (float)z->rms_norm_eps};
    d.BT = B * d.T;
    d.R = d.sp ? d.BT / tp : d.BT;
    d.QC = d.NH * d.HD;
    d.QKVC = (d.NH + 2 * d.NKV) * d.HD;
    d.Vl = d.Vp / tp;
    d.v0 = (tp > 1 ? l->tp_rank : 0) * d.Vl;
    d.rope = (dt_rope_args_t){.theta = z->rope_theta, .factor = z->rope_factor,
                              .low_freq_factor = z->rope_low_freq_factor,
                              .high_freq_factor = z->rope_high_freq_factor,
                              .original_max_pos = z->rope_original_max_pos};
    return d;
}

/* Slots of the whole model (the first five are net.h's). There is no position
 * table: the embedding is the device's encoder_forward without one (wpe and dwpe
 * NULL), a token's row of embed_tokens; positions enter through RoPE. G_DTMP is
 * max(C, QC) wide: it holds d(norm output) (C, before any reduction over the TP
 * group) and d(attention output) (QC). Tensor parallelism adds (sized 0 when
 * unused): G_GATH (sequence parallelism: a norm output gathered from every rank, the
 * input of a column-parallel matmul; it keeps the gathered final norm from the
 * forward to the head's backward), G_PART (sequence parallelism: a row-parallel
 * matmul's or the embedding's partial sums before the reduce-scatter in the forward;
 * the residual gradient gathered in the backward), G_DRED (sequence
 * parallelism: this rank's rows of a reduced input gradient), G_XSTATS (the
 * vocabulary-parallel loss's per-row max, sum and target logit) and G_LNGRAD
 * (sequence parallelism: a layer's two RMSNorm weight gradients, partial from this
 * rank's rows, or model.norm's). */
enum {
    G_TOKENS = DT_NET_SLOT_TOKENS, G_TARGETS = DT_NET_SLOT_TARGETS, G_FEATURES = DT_NET_SLOT_FEATURES,
    G_LOSSES = DT_NET_SLOT_LOSSES, G_POSITIONS = DT_NET_SLOT_POSITIONS, G_ENCODED = DT_NET_SLOT_FIRST, G_NORM,
    G_NORM_RSTD, G_LOGITS,
    G_DRES, G_DTMP, G_DQKV, G_DFCH, G_DSWI, G_ATT_SCRATCH, G_GATH, G_PART, G_DRED, G_XSTATS, G_LNGRAD,
    G_COUNT
};
/* ... and of each layer: ln1 = rmsnorm(x), qkv (roped in place), atty = attention,
 * attproj = o_proj(atty), res2 = x + attproj, ln2 = rmsnorm(res2), fch = [gate | up]
 * (ln2), swi = silu(gate) * up, fcproj = down_proj(swi), res3 = res2 + fcproj. */
enum {
    L_LN1, L_LN1_RSTD, L_QKV, L_ATTY, L_ATT_SAVED, L_ATTPROJ, L_RES2, L_LN2, L_LN2_RSTD, L_FCH, L_SWI,
    L_FCPROJ, L_RES3, L_COUNT
};
#define LSLOT(l, s) (G_COUNT + (l) * L_COUNT + (s))
#define BIT(s) (1u << (s))

/* The layer slots a block keeps from its forward to its backward under each
 * recomputation policy (model.h: dt_model_block_slots; the others live in the scratch
 * set): selective keeps the GEMM outputs the backward reads (qkv, the MLP's first
 * output) and the residual stream (res2, res3); full the block's output. */
static const dt_model_block_slots llama_blocks = {
    .first = G_COUNT, .per_block = L_COUNT,
    .keep = {[DT_MODEL_RECOMPUTE_NONE] = BIT(L_COUNT) - 1,
             [DT_MODEL_RECOMPUTE_SELECTIVE] = BIT(L_QKV) | BIT(L_RES2) | BIT(L_FCH) | BIT(L_RES3),
             [DT_MODEL_RECOMPUTE_FULL] = BIT(L_RES3)}};

static int llama_arena_slots(const dt_model_layout *l) { return dt_model_block_slot_count(l, &llama_blocks); }

/* TP-region slots (qkv, attention, MLP, logits) are the local width by all B*T rows;
 * norm and residual slots R rows of C. */
static void llama_arena_sizes(const dt_device_t *dev, const dt_model_layout *lay, int B, size_t *sizes) {
    size_t es = dt_dtype_size(dev->ops->dtype);
    dims d = dims_of(lay, B);
    size_t BT = (size_t)d.BT, R = (size_t)d.R, C = (size_t)d.C;
    size_t wide = d.QC > d.C ? (size_t)d.QC : C;
    int first = dt_model_has_first(lay), last = dt_model_has_last(lay);
    if (first) sizes[G_TOKENS] = BT * sizeof(int);
    sizes[G_POSITIONS] = BT * sizeof(int); /* every chunk: RoPE's and attention's */
    sizes[G_ENCODED] = R * C * es;
    if (last) { /* the head and the loss */
        sizes[G_TARGETS] = BT * sizeof(int);
        sizes[G_NORM] = R * C * es;
        sizes[G_NORM_RSTD] = R * sizeof(float);
        sizes[G_LOSSES] = BT * sizeof(float);
        sizes[G_LOGITS] = BT * (size_t)d.Vl * es;
    }
    sizes[G_DRES] = R * C * es;
    sizes[G_DTMP] = BT * wide * es;
    sizes[G_DQKV] = BT * (size_t)d.QKVC * es;
    sizes[G_DFCH] = BT * 2 * (size_t)d.IC * es;
    sizes[G_DSWI] = BT * (size_t)d.IC * es;
    sizes[G_ATT_SCRATCH] = dt_net_attention_scratch_bytes(dev, lay, B, d.T, d.QC, d.NH, d.NKV);
    if (d.sp) sizes[G_GATH] = sizes[G_PART] = BT * C * es;
    if (d.sp) sizes[G_DRED] = R * C * es;
    if (d.tp > 1 && last) sizes[G_XSTATS] = 3 * BT * sizeof(float);
    if (d.sp) sizes[G_LNGRAD] = 2 * C * es;
    size_t s[L_COUNT]; /* a layer's whole set */
    s[L_LN1] = s[L_ATTPROJ] = s[L_RES2] = s[L_LN2] = s[L_FCPROJ] = s[L_RES3] = R * C * es;
    s[L_LN1_RSTD] = s[L_LN2_RSTD] = R * sizeof(float);
    s[L_QKV] = BT * (size_t)d.QKVC * es;
    s[L_ATTY] = BT * (size_t)d.QC * es;
    s[L_ATT_SAVED] = dt_net_attention_saved_bytes(dev, lay, B, d.T, d.QC, d.NH, d.NKV);
    s[L_FCH] = BT * 2 * (size_t)d.IC * es;
    s[L_SWI] = BT * (size_t)d.IC * es;
    dt_model_block_sizes(lay, &llama_blocks, s, sizes); /* each block what it keeps, and the scratch set */
}

/* The table order forward and backward rely on. */
static dt_status_t check_order(const dt_model_layout *layout) {
    const llama_sizes *z = DT_MODEL_PRIV(&layout->spec, const llama_sizes);
    for (int i = 0; i < z->num_hidden_layers; i++) {
        char name[DT_MODEL_NAME_LEN];
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", i);
        if (dt_model_local_unit(layout, 1 + i) < 0) continue; /* another stage's */
        if (dt_model_find(layout, name) != layer_t(layout, z, i, T_DOWN))
            return dt_error(DT_STATUS_INVALID, "model layout out of the expected order at %s", name);
    }
    return DT_STATUS_OK;
}

static dt_status_t llama_net_check(const dt_model_layout *layout) { return check_order(layout); }

static void llama_dims(const dt_model_layout *l, dt_model_dims *out) {
    const llama_sizes *z = DT_MODEL_PRIV(&l->spec, const llama_sizes);
    *out = (dt_model_dims){.n_layer = z->num_hidden_layers, .hidden = z->hidden_size,
                           .n_head = z->num_attention_heads, .n_kv_head = z->num_key_value_heads,
                           .head_dim = z->head_dim, .mlp_in = 2 * z->intermediate_size,
                           .mlp_act = z->intermediate_size, .norm_stats = 1};
}

/* ---- forward and backward -------------------------------------------------- */

#define P(t) dt_net_param(net, (t))
#define G(t) dt_net_grad(net, (t))
#define A(slot) dt_net_slot(net, (slot))
#define AF(slot) ((float *)A(slot))
#define BS(j, s) A(dt_model_block_slot(net->layout, &llama_blocks, (j), (s))) /* layer slot s of the chunk's layer j */
#define BSF(j, s) ((float *)BS(j, s))
#define PL(l, k) P(layer_t(lay, z, l, k))
#define GL(l, k) G(layer_t(lay, z, l, k))
#define TL(l, k) layer_t(lay, z, l, k) /* the tensor index, for the linear layers (net_impl.h) */
/* The fused q|k|v bias, or NULL without attention_bias. */
#define QKV_BIAS(l) (z->attention_bias ? PL(l, T_QB) : NULL)
#define DQKV_BIAS(l) (z->attention_bias ? GL(l, T_QB) : NULL)

/* llama's TP matmuls over its slots (net_impl.h: dt_net_linear_row_forward,
 * dt_net_linear_column_backward); its row-parallel matmuls have no bias. The linear
 * layers LoRA may target go by tensor index (the base plus adapters in a LoRA net). */
#define LINEAR_ROW_FORWARD(out, inp, t, IC) \
    dt_net_linear_row_forward(net, out, A(G_PART), inp, t, NULL, d.BT, IC, d.C)
#define LINEAR_COLUMN_BACKWARD(t, db, dout, x, OC) \
    dt_net_linear_column_backward(net, A(G_DTMP), A(G_DRED), t, db, dout, x, d.BT, d.C, OC)

/* Layer l (position j of the chunk) from its input residual: its whole forward
 * (redo NONE), or what its backward first recomputes under policy redo (model.h):
 * full, every op up to swiglu, the GEMMs, RoPE and their TP collectives included;
 * selective, the norms, the attention and swiglu only (the GEMM outputs it reads,
 * qkv already rotated, were kept). The ops run in the forward's order either way.
 * Under tensor parallelism (Megatron): the fused q|k|v (this rank's query heads and
 * their key/value heads, contiguous in the local layout as in the fused weight) and
 * gate|up (this rank's [gate | up] columns) are column-parallel, o_proj and down_proj
 * row-parallel; the residual stream is whole on every rank, or cut along the rows
 * with sequence parallelism. */
static void llama_block_forward(dt_net_t *net, int l, int j, void *residual, dt_model_recompute_t redo) {
    const dt_ops_t *o = net->dev->ops;
    dt_device_t *dv = net->dev;
    const dt_model_layout *lay = net->layout;
    const llama_sizes *z = DT_MODEL_PRIV(&lay->spec, const llama_sizes);
    dims d = dims_of(lay, net->B);
    int gemm = redo != DT_MODEL_RECOMPUTE_SELECTIVE, B = d.B, T = d.T, BT = d.BT, R = d.R, C = d.C;
    size_t rc = (size_t)R * C;
    o->rmsnorm_forward(dv, BS(j, L_LN1), BSF(j, L_LN1_RSTD), residual, PL(l, T_LN1), R, C, d.eps);
    if (gemm) {
        void *x = dt_net_tp_gather_in(net, BS(j, L_LN1), A(G_GATH), rc);
        dt_net_linear_forward(net, BS(j, L_QKV), x, TL(l, T_Q), QKV_BIAS(l), BT, C, d.QKVC);
        o->rope_forward(dv, BS(j, L_QKV), B, T, d.QKVC, d.NH + d.NKV, d.HD, 0, net->d_positions, &d.rope);
    }
    dt_net_attention_forward(net, BS(j, L_ATTY), BS(j, L_ATT_SAVED), A(G_ATT_SCRATCH), BS(j, L_QKV), B, T, d.QC,
                             d.NH, d.NKV);
    if (gemm) {
        LINEAR_ROW_FORWARD(BS(j, L_ATTPROJ), BS(j, L_ATTY), TL(l, T_O), d.QC);
        o->residual_forward(dv, BS(j, L_RES2), residual, BS(j, L_ATTPROJ), rc);
    }
    o->rmsnorm_forward(dv, BS(j, L_LN2), BSF(j, L_LN2_RSTD), BS(j, L_RES2), PL(l, T_LN2), R, C, d.eps);
    if (gemm) {
        void *x = dt_net_tp_gather_in(net, BS(j, L_LN2), A(G_GATH), rc);
        dt_net_linear_forward(net, BS(j, L_FCH), x, TL(l, T_GATE), NULL, BT, C, 2 * d.IC);
    }
    o->swiglu_forward(dv, BS(j, L_SWI), BS(j, L_FCH), BT, d.IC);
    if (redo != DT_MODEL_RECOMPUTE_NONE) return; /* the backward reads neither fcproj nor res3 */
    LINEAR_ROW_FORWARD(BS(j, L_FCPROJ), BS(j, L_SWI), TL(l, T_DOWN), d.IC);
    o->residual_forward(dv, BS(j, L_RES3), BS(j, L_RES2), BS(j, L_FCPROJ), rc);
}

/* Layer l's backward: G_DRES holds the gradient of its output and ends holding that
 * of its input residual. */
static void llama_block_backward(dt_net_t *net, int l, int j, void *residual) {
    const dt_ops_t *o = net->dev->ops;
    dt_device_t *dv = net->dev;
    const dt_model_layout *lay = net->layout;
    const llama_sizes *z = DT_MODEL_PRIV(&lay->spec, const llama_sizes);
    dims d = dims_of(lay, net->B);
    int B = d.B, T = d.T, BT = d.BT, R = d.R, C = d.C;
    size_t rc = (size_t)R * C;
    if (d.sp) dt_net_zero(net, G_LNGRAD, 2 * (size_t)C);
    /* dres holds d(res3) = d(fcproj) = the skip part of d(res2); sequence
     * parallelism: this rank's rows, gathered for the row-parallel backward. */
    void *dout = dt_net_tp_gather_in(net, A(G_DRES), A(G_PART), rc);
    dt_net_zero(net, G_DSWI, (size_t)BT * d.IC);
    dt_net_linear_backward(net, A(G_DSWI), NULL, dout, BS(j, L_SWI), TL(l, T_DOWN), BT, d.IC, C);
    dt_net_zero(net, G_DFCH, (size_t)BT * 2 * d.IC);
    o->swiglu_backward(dv, A(G_DFCH), BS(j, L_FCH), A(G_DSWI), BT, d.IC);
    void *x = dt_net_tp_gather_in(net, BS(j, L_LN2), A(G_GATH), rc);
    void *dln = LINEAR_COLUMN_BACKWARD(TL(l, T_GATE), NULL, A(G_DFCH), x, 2 * d.IC);
    o->rmsnorm_backward(dv, A(G_DRES), dt_net_tp_norm_grad(net, A(G_LNGRAD), 1, (size_t)C, GL(l, T_LN2)), dln,
                        BS(j, L_RES2), PL(l, T_LN2), BSF(j, L_LN2_RSTD), R, C);
    /* dres now holds d(res2) = d(attproj) = the skip part of d(residual). */
    dout = dt_net_tp_gather_in(net, A(G_DRES), A(G_PART), rc);
    dt_net_zero(net, G_DTMP, (size_t)BT * d.QC);
    dt_net_linear_backward(net, A(G_DTMP), NULL, dout, BS(j, L_ATTY), TL(l, T_O), BT, d.QC, C);
    dt_net_zero(net, G_DQKV, (size_t)BT * d.QKVC);
    dt_net_attention_backward(net, A(G_DQKV), A(G_ATT_SCRATCH), A(G_DTMP), BS(j, L_QKV), BS(j, L_ATT_SAVED),
                              BS(j, L_ATTY), B, T, d.QC, d.NH, d.NKV);
    /* d(rotated q, k) -> d(q, k) as the matmul produced them */
    o->rope_backward(dv, A(G_DQKV), B, T, d.QKVC, d.NH + d.NKV, d.HD, 0, net->d_positions, &d.rope);
    x = dt_net_tp_gather_in(net, BS(j, L_LN1), A(G_GATH), rc);
    dln = LINEAR_COLUMN_BACKWARD(TL(l, T_Q), DQKV_BIAS(l), A(G_DQKV), x, d.QKVC);
    o->rmsnorm_backward(dv, A(G_DRES), dt_net_tp_norm_grad(net, A(G_LNGRAD), 0, (size_t)C, GL(l, T_LN1)), dln,
                        residual, PL(l, T_LN1), BSF(j, L_LN1_RSTD), R, C);
    void *const ln_grads[] = {GL(l, T_LN1), GL(l, T_LN2)};
    dt_net_tp_norm_grads_add(net, A(G_LNGRAD), (size_t)C, ln_grads, 2);
}

/* embed_tokens into G_ENCODED (no position table: positions enter through RoPE).
 * Under tensor parallelism cut over the vocabulary rows: each rank its rows (the
 * others' tokens are -1: rows of 0), summed. */
static void llama_embed_forward(dt_net_t *net) {
    dims d = dims_of(net->layout, net->B);
    void *part = d.sp ? A(G_PART) : A(G_ENCODED);
    net->dev->ops->encoder_forward(net->dev, part, net->d_tokens, P(0), NULL, NULL, d.B, d.T, d.C);
    dt_net_tp_reduce_out(net, part, A(G_ENCODED), (size_t)d.BT * d.C);
}

/* d(embed_tokens) += from dout; a LoRA net's embedding is frozen (no gradient). */
static void llama_embed_backward(dt_net_t *net, const void *dout) {
    dims d = dims_of(net->layout, net->B);
    if (G(0)) net->dev->ops->encoder_backward(net->dev, G(0), NULL, dout, net->d_tokens, NULL, d.B, d.T, d.C);
}

/* model.norm: the final unit's first tensor, into G_NORM. */
static int norm_t(const dt_model_layout *lay) {
    const llama_sizes *z = DT_MODEL_PRIV(&lay->spec, const llama_sizes);
    return lay->units[dt_model_local_unit(lay, z->num_hidden_layers + 1)].tensor0;
}

static void llama_norm_forward(dt_net_t *net, const void *x) {
    dims d = dims_of(net->layout, net->B);
    net->dev->ops->rmsnorm_forward(net->dev, A(G_NORM), AF(G_NORM_RSTD), x, P(norm_t(net->layout)), d.R, d.C, d.eps);
}

static void llama_norm_backward(dt_net_t *net, const void *dnorm, const void *x) {
    dims d = dims_of(net->layout, net->B);
    int norm = norm_t(net->layout), C = d.C;
    if (d.sp) dt_net_zero(net, G_LNGRAD, (size_t)C);
    net->dev->ops->rmsnorm_backward(net->dev, A(G_DRES), dt_net_tp_norm_grad(net, A(G_LNGRAD), 0, (size_t)C, G(norm)),
                                    dnorm, x, P(norm), AF(G_NORM_RSTD), d.R, C);
    void *const norm_grads[] = {G(norm)};
    dt_net_tp_norm_grads_add(net, A(G_LNGRAD), (size_t)C, norm_grads, 1);
}

/* ---- KV-cache decoding (model.h: decode) ------------------------------------ */

/* The decode arena: one position's activations (B = T = 1) and per layer a cache
 * of seq_len rows of keys|values (2*NKV*HD, already rotated), the k|v tail of each
 * position's qkv row. */
enum {
    D_TOKENS = DT_NET_SLOT_TOKENS, D_X = DT_NET_SLOT_FIRST, D_RES2, D_LN, D_RSTD, D_QKV, D_ATTY,
    D_PROJ, D_FCH, D_SWI, D_LOGITS, D_COUNT
};
#define DSLOT_CACHE(l) (D_COUNT + (l))

static int llama_decode_slots(const dt_model_layout *l) {
    return D_COUNT + DT_MODEL_PRIV(&l->spec, const llama_sizes)->num_hidden_layers;
}

static void llama_decode_sizes(const dt_device_t *dev, const dt_model_layout *lay, size_t *sizes) {
    size_t es = dt_dtype_size(dev->ops->dtype);
    dims d = dims_of(lay, 1);
    size_t C = (size_t)d.C;
    sizes[D_TOKENS] = sizeof(int);
    sizes[D_X] = sizes[D_RES2] = sizes[D_LN] = sizes[D_PROJ] = C * es;
    sizes[D_RSTD] = sizeof(float);
    sizes[D_QKV] = (size_t)d.QKVC * es;
    sizes[D_ATTY] = (size_t)d.QC * es;
    sizes[D_FCH] = 2 * (size_t)d.IC * es;
    sizes[D_SWI] = (size_t)d.IC * es;
    sizes[D_LOGITS] = (size_t)d.Vp * es;
    for (int l = 0; l < d.L; l++) sizes[DSLOT_CACHE(l)] = (size_t)d.T * 2 * (size_t)d.NKV * d.HD * es;
}

/* The forward for one position pos of one sequence (net.c's driver runs it, and
 * the head): RoPE rotates q and k at position pos, the rotated k and v go to cache
 * row pos, and attention reads rows 0..pos. */
static void llama_decode_embed(dt_net_t *net, int pos) {
    (void)pos; /* positions enter through RoPE */
    dims d = dims_of(net->layout, 1);
    net->dev->ops->encoder_forward(net->dev, A(D_X), net->d_tokens, P(0), NULL, NULL, 1, 1, d.C);
}

static void llama_decode_block(dt_net_t *net, int l, int pos) {
    const dt_ops_t *o = net->dev->ops;
    dt_device_t *dv = net->dev;
    const dt_model_layout *lay = net->layout;
    const llama_sizes *z = DT_MODEL_PRIV(&lay->spec, const llama_sizes);
    dims d = dims_of(lay, 1);
    int C = d.C;
    size_t es = net->elsize, kv = 2 * (size_t)d.NKV * d.HD;
    void *cache = A(DSLOT_CACHE(l));
    o->rmsnorm_forward(dv, A(D_LN), AF(D_RSTD), A(D_X), PL(l, T_LN1), 1, C, d.eps);
    dt_net_linear_forward(net, A(D_QKV), A(D_LN), TL(l, T_Q), QKV_BIAS(l), 1, C, d.QKVC);
    o->rope_forward(dv, A(D_QKV), 1, 1, d.QKVC, d.NH + d.NKV, d.HD, pos, NULL, &d.rope);
    o->copy(dv, (char *)cache + (size_t)pos * kv * es, (char *)A(D_QKV) + (size_t)d.QC * es, kv * es,
            DT_COPY_DEVICE_TO_DEVICE);
    o->attention_decode(dv, A(D_ATTY), A(D_QKV), d.QKVC, cache, d.T, pos, 1, d.QC, d.NH, d.NKV);
    dt_net_linear_forward(net, A(D_PROJ), A(D_ATTY), TL(l, T_O), NULL, 1, d.QC, C);
    o->residual_forward(dv, A(D_RES2), A(D_X), A(D_PROJ), (size_t)C);
    o->rmsnorm_forward(dv, A(D_LN), AF(D_RSTD), A(D_RES2), PL(l, T_LN2), 1, C, d.eps);
    dt_net_linear_forward(net, A(D_FCH), A(D_LN), TL(l, T_GATE), NULL, 1, C, 2 * d.IC);
    o->swiglu_forward(dv, A(D_SWI), A(D_FCH), 1, d.IC);
    dt_net_linear_forward(net, A(D_PROJ), A(D_SWI), TL(l, T_DOWN), NULL, 1, d.IC, C);
    o->residual_forward(dv, A(D_X), A(D_RES2), A(D_PROJ), (size_t)C);
}

static void llama_decode_norm(dt_net_t *net) {
    dims d = dims_of(net->layout, 1);
    net->dev->ops->rmsnorm_forward(net->dev, A(D_LN), AF(D_RSTD), A(D_X), P(norm_t(net->layout)), 1, d.C, d.eps);
}

/* What net.c's chunk driver runs (net_impl.h): the head is lm_head, the final unit's
 * last tensor, or embed_tokens when tied; the logits G_LOGITS, cut over the
 * vocabulary rows under tensor parallelism. */
static const dt_net_stack llama_stack = {
    .blocks = &llama_blocks, .block_out = L_RES3,
    .in = G_ENCODED, .norm = G_NORM, .dres = G_DRES, .dtmp = G_DTMP, .dred = G_DRED, .gath = G_GATH,
    .part = G_PART, .xstats = G_XSTATS,
    .embed_forward = llama_embed_forward, .embed_backward = llama_embed_backward,
    .block_forward = llama_block_forward, .block_backward = llama_block_backward,
    .norm_forward = llama_norm_forward, .norm_backward = llama_norm_backward,
    .decode_embed = llama_decode_embed, .decode_block = llama_decode_block, .decode_norm = llama_decode_norm,
    .decode_norm_slot = D_LN,
};

/* ---- export ------------------------------------------------------------------ */

/* Hugging Face's shapes are the table's (no transposes); the vocabulary tensors
 * have the real vocabulary's rows (padding is dropped on export, zero on load). */
static int llama_export_shape(const dt_model_layout *l, int i, int64_t shape[2], int *ndim) {
    const dt_tensor_info *t = &l->tensors[i];
    *ndim = t->ndim;
    for (int d = 0; d < t->ndim && d < 2; d++) shape[d] = t->shape[d];
    if (!strcmp(t->name, "model.embed_tokens.weight") || !strcmp(t->name, "lm_head.weight"))
        shape[0] = l->spec.vocab_size;
    return 0;
}

const dt_model_ops dt_model_llama = {
    .name = "llama",
    .help = "Llama/Mistral/Qwen2 on text/tokens",
    .data = DT_MODEL_DATA_TOKENS,
    .keys = llama_keys,
    .n_keys = (int)(sizeof llama_keys / sizeof llama_keys[0]),
    .config_check = llama_config_check,
    .tp_check = llama_tp_check,
    .heads = llama_heads,
    .validate = llama_validate,
    .build = llama_build,
    .init_params = llama_init_params,
    .init_range = llama_init_range,
    .unpadded_params = llama_unpadded_params,
    .flops_per_token = llama_flops_per_token,
    .describe = llama_describe,
    .arena_slots = llama_arena_slots,
    .arena_sizes = llama_arena_sizes,
    .net_check = llama_net_check,
    .dims = llama_dims,
    .forward = dt_net_stack_forward,
    .backward = dt_net_stack_backward,
    .stack = &llama_stack,
    .logits_slot = G_LOGITS,
    .pipeline = 1,
    .stage_buf = dt_net_stack_stage_buf,
    .decode_slots = llama_decode_slots,
    .decode_sizes = llama_decode_sizes,
    .decode = dt_net_stack_decode,
    .decode_logits_slot = D_LOGITS,
    .export_shape = llama_export_shape,
    .synthetic_batch = NULL,
};
