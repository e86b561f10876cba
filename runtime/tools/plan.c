/*
 * plan.c - the arithmetic of `dtrun plan` (formulas in plan.h): hardware tables,
 * model states, activations, ring collective times, step time, cost and the
 * recommendation.
 */
#include "runtime/tools/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/mem.h"
#include "kernels/kernels.h" /* defines: dt_attention_uses_fused */
#include "runtime/layout/layout.h"   /* defines: dt_layout_of */
#include "runtime/layout/pp_sched.h" /* defines: dt_pp_schedule_name */

/* ---- links -----------------------------------------------------------------
 * Bandwidth per GPU per direction, in GB/s (1e9). NVLink: NVIDIA's aggregate
 * bidirectional figure halved (V100 300 -> 150, A100 600 -> 300, H100 900 -> 450,
 * B200 1800 -> 900). PCIe x16: 32 GB/s (gen4) and 64 GB/s (gen5) theoretical,
 * about 25 and 50 achieved by NCCL through the host bridge. InfiniBand and
 * Ethernet: line rate / 8 (NDR 400 Gb/s = 50 GB/s), assuming one NIC per GPU, as
 * in DGX/HGX nodes; eth25 ~3 GB/s. shm: ranks of one host copying through shared
 * memory, bounded by memory bandwidth (rough). Latency α per collective: NCCL's
 * small-message all-reduce is around 10 µs within an NVLink node and some tens of
 * µs across InfiniBand; TCP Ethernet around 100 µs. Rough figures: give
 * --link-gbps for a measured number (`dtrun bench comm`). */
static const dt_plan_link links[] = {
    {"nvlink5", 900, 10, "NVLink 5 (B200), 1.8 TB/s bidirectional"},
    {"nvlink4", 450, 10, "NVLink 4 (H100/H200), 900 GB/s bidirectional"},
    {"nvlink3", 300, 10, "NVLink 3 (A100), 600 GB/s bidirectional"},
    {"nvlink2", 150, 10, "NVLink 2 (V100), 300 GB/s bidirectional"},
    {"pcie5", 50, 20, "PCIe 5.0 x16, 64 GB/s theoretical"},
    {"pcie4", 25, 20, "PCIe 4.0 x16, 32 GB/s theoretical"},
    {"ib800", 100, 30, "InfiniBand XDR 800 Gb/s, one NIC per GPU"},
    {"ib400", 50, 30, "InfiniBand NDR 400 Gb/s, one NIC per GPU"},
    {"ib200", 25, 30, "InfiniBand HDR 200 Gb/s, one NIC per GPU"},
    {"eth100", 12.5, 50, "100 Gb/s Ethernet (RoCE)"},
    {"eth25", 3, 100, "25 Gb/s Ethernet, TCP"},
    {"eth10", 1.2, 100, "10 Gb/s Ethernet, TCP"},
    {"shm", 5, 5, "shared memory between ranks of one host (rough)"},
};

int dt_plan_link_count(void) { return (int)(sizeof links / sizeof links[0]); }

const dt_plan_link *dt_plan_link_at(int i) {
    return i >= 0 && i < dt_plan_link_count() ? &links[i] : NULL;
}

const dt_plan_link *dt_plan_link_find(const char *name) {
    for (int i = 0; name && i < dt_plan_link_count(); i++)
        if (!strcasecmp(name, links[i].name)) return &links[i];
    return NULL;
}

void dt_plan_link_names(char *buf, size_t len) {
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < dt_plan_link_count() && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "", links[i].name);
}

/* ---- model ------------------------------------------------------------------ */

dt_status_t dt_plan_model_from_layout(const dt_model_layout *l, dt_plan_model *out) {
    memset(out, 0, sizeof *out);
    const dt_model_spec *s = &l->spec;
    out->type = s->ops->name;
    out->feature_rows = s->ops->data == DT_MODEL_DATA_FEATURES;
    /* a TP layout: rank tp_rank's piece; the whole model's counts and FLOPs come
     * from the global layout beside it */
    const dt_model_layout *whole = l->global ? l->global : l;
    out->tp_size = l->tp_size > 1 ? l->tp_size : 1;
    out->sequence_parallel = out->tp_size > 1 && l->sequence_parallel;
    out->n_params = (double)l->n_params;
    out->n_params_global = (double)whole->n_params;
    out->n_params_unpadded = (double)dt_model_unpadded_params(whole);
    if (out->tp_size > 1)
        for (int i = 0; i < l->n_tensors; i++)
            if (l->tensors[i].tp_split == DT_TP_REPLICATED) out->n_replicated += (double)l->tensors[i].numel;
    if (s->ops->dims) {
        dt_model_dims d;
        s->ops->dims(l, &d);
        out->n_layer = d.n_layer;
        out->n_head = d.n_head;
        out->n_embd = d.hidden;
        out->n_kv_head = d.n_kv_head;
        out->head_dim = d.head_dim;
        out->mlp_in = d.mlp_in;
        out->mlp_act = d.mlp_act;
        out->norm_stats = d.norm_stats;
    }
    out->seq_len = l->seq_len;
    out->cp_size = l->cp_size > 1 ? l->cp_size : 1;
    out->cp_ulysses = l->cp_ulysses;
    out->vocab_padded = l->vocab_padded;
    out->in_dim = s->in_dim;
    out->hidden_dim = s->hidden_dim;
    out->n_hidden_layers = s->n_hidden_layers;
    out->n_classes = s->n_classes;
    out->flops_per_token = dt_model_flops_per_token(whole);
    out->n_units = l->n_units;
    out->unit_numel = dt_xcalloc((size_t)l->n_units, sizeof *out->unit_numel);
    for (int u = 0; u < l->n_units; u++) {
        out->unit_numel[u] = (double)l->units[u].numel;
        if (out->unit_numel[u] > out->largest_unit) out->largest_unit = out->unit_numel[u];
    }
    return DT_STATUS_OK;
}

dt_status_t dt_plan_model_from_sizes(double params, int layers, int hidden, int heads, int seq,
                                     int vocab, dt_plan_model *out) {
    memset(out, 0, sizeof *out);
    out->type = "gpt";
    if (!(params >= 1) || params > 1e15)
        return dt_error(DT_STATUS_USAGE, "{params}: expected a count between 1 and 1e15, found %g",
                        params);
    if (layers <= 0 || layers > 100000)
        return dt_error(DT_STATUS_USAGE, "{layers}: expected an integer from 1 to 100000");
    if (hidden <= 0 || hidden > 10000000)
        return dt_error(DT_STATUS_USAGE, "{hidden}: expected an integer from 1 to 10000000");
    if (seq <= 0 || seq > 100000000)
        return dt_error(DT_STATUS_USAGE, "{seq}: expected an integer from 1 to 100000000");
    if (heads <= 0 || hidden % heads)
        return dt_error(DT_STATUS_USAGE, "{heads}: expected a divisor of {hidden} %d, found %d",
                        hidden, heads);
    if (vocab <= 0) return dt_error(DT_STATUS_USAGE, "{vocab}: expected an integer > 0");
    out->n_params = out->n_params_unpadded = out->n_params_global = params;
    out->tp_size = 1;
    out->cp_size = 1;
    out->n_layer = layers;
    out->n_embd = hidden;
    out->n_head = out->n_kv_head = heads;
    out->head_dim = hidden / heads;
    out->mlp_in = out->mlp_act = 4 * hidden; /* GPT's block */
    out->norm_stats = 2;
    out->seq_len = seq;
    out->vocab_padded = vocab;
    out->flops_per_token = 6.0 * params + 12.0 * layers * (double)hidden * seq;
    double block = 12.0 * hidden * (double)hidden + 13.0 * hidden;
    out->size_block = block;
    out->size_block_cut = 12.0 * hidden * (double)hidden + 7.0 * hidden; /* 6C biases stay whole */
    out->tied = 1;
    double rest = params - layers * block;
    out->largest_unit = rest > block ? rest : block;
    out->n_units = layers + 2;
    return DT_STATUS_OK;
}

dt_status_t dt_plan_model_from_shape(double params, int layers, int hidden, int heads, int kv_heads, int ffn,
                                     int seq, int vocab, dt_plan_model *out) {
    DT_CHECK(dt_plan_model_from_sizes(params, layers, hidden, heads, seq, vocab, out));
    if (kv_heads <= 0 || heads % kv_heads)
        return dt_error(DT_STATUS_USAGE, "{kv_heads}: expected a divisor of {heads} %d, found %d", heads, kv_heads);
    if (ffn <= 0 || ffn > 100000000)
        return dt_error(DT_STATUS_USAGE, "{ffn}: expected an integer from 1 to 100000000, found %d", ffn);
    double C = hidden, hd = (double)hidden / heads, I = ffn;
    out->type = "llama";
    out->n_kv_head = kv_heads;
    out->mlp_in = 2 * ffn; /* gate|up */
    out->mlp_act = ffn;    /* swiglu */
    out->norm_stats = 1;   /* RMSNorm */
    out->size_block_cut = C * (heads + 2.0 * kv_heads) * hd + heads * hd * C + 3 * C * I;
    out->size_block = out->size_block_cut + 2 * C;
    out->tied = 0;
    double rest = params - layers * out->size_block;
    out->largest_unit = rest > out->size_block ? rest : out->size_block;
    return DT_STATUS_OK;
}

void dt_plan_model_free(dt_plan_model *m) {
    free(m->unit_numel);
    m->unit_numel = NULL;
    for (int k = 0; m->stages && k < m->pp_size; k++) free(m->stages[k].unit_numel);
    free(m->stages);
    m->stages = NULL;
}

dt_status_t dt_plan_model_set_tp(dt_plan_model *m, int tp, int sp) {
    if (tp < 1) return dt_error(DT_STATUS_USAGE, "{tp}: expected sizes >= 1, found %d", tp);
    if (m->n_head % tp)
        return dt_error(DT_STATUS_USAGE, "{tp} %d: does not divide the %d heads (each rank holds whole heads)",
                        tp, m->n_head);
    if (m->vocab_padded % tp)
        return dt_error(DT_STATUS_USAGE, "{tp} %d: does not divide {vocab} %d (the vocabulary's rows are cut)", tp,
                        m->vocab_padded);
    if (m->n_kv_head % tp)
        return dt_error(DT_STATUS_USAGE, "{tp} %d: does not divide the %d key/value heads", tp, m->n_kv_head);
    double C = m->n_embd, L = m->n_layer, psi = m->n_params_global;
    double block = m->size_block, block_cut = m->size_block_cut;
    double rest = psi - L * block;
    /* the vocabulary's rows: the embedding, and an untied head */
    double vocab_cut = fmax(0, fmin(rest, (m->tied ? 1 : 2) * (double)m->vocab_padded * C));
    double cut = fmin(psi, L * block_cut + vocab_cut);
    m->tp_size = tp;
    m->sequence_parallel = tp > 1 && sp;
    m->n_params = psi - cut + cut / tp;
    m->n_replicated = tp > 1 ? psi - cut : 0;
    double block_l = block - block_cut + block_cut / tp, rest_l = rest - vocab_cut + vocab_cut / tp;
    m->largest_unit = rest_l > block_l ? rest_l : block_l;
    return DT_STATUS_OK;
}

dt_status_t dt_plan_model_set_cp(dt_plan_model *m, int cp) {
    if (cp < 1) return dt_error(DT_STATUS_USAGE, "{cp}: expected sizes >= 1, found %d", cp);
    if (cp > 1 && (m->feature_rows || m->n_layer <= 0))
        return dt_error(DT_STATUS_USAGE, "{cp} %d: the %s model has no context parallelism (gpt and llama have)", cp,
                        m->type);
    if (cp > 1 && m->seq_len % (2 * cp))
        return dt_error(DT_STATUS_USAGE,
                        "{cp} %d: {seq} %d is not a multiple of 2 x %d = %d (each rank holds 2 of the sequence's "
                        "2 x CP equal chunks)",
                        cp, m->seq_len, cp, 2 * cp);
    m->cp_size = cp;
    return DT_STATUS_OK;
}

int dt_plan_model_rows(const dt_plan_model *m) { return m->cp_size > 1 ? m->seq_len / m->cp_size : m->seq_len; }

/* ---- memory ----------------------------------------------------------------- */

static double shard(double numel, int n) { return ceil(numel / n); }

/* Elements per rank when every FSDP unit is padded to a multiple of n. */
static double fsdp_shard(const dt_plan_model *m, int n) {
    if (!m->unit_numel) return shard(m->n_params, n);
    double sum = 0;
    for (int u = 0; u < m->n_units; u++) sum += shard(m->unit_numel[u], n);
    return sum;
}

dt_plan_mem dt_plan_model_states(const dt_plan_model *m, dt_plan_precision_t p,
                                 dt_strategy_t s, int n, int g) {
    double kp = p == DT_PLAN_PRECISION_BF16 ? 2 : 4;
    double kg = kp;
    double ko = p == DT_PLAN_PRECISION_BF16 ? 12 : 8;
    double psi = m->n_params;
    dt_plan_mem r = {kp * psi, kg * psi, ko * psi};
    if (n < 1) n = 1;
    const dt_strategy_info *si = dt_strategy_get(s);
    if (!si) return r;
    if (si->shards & DT_STRATEGY_SHARDS_PARAMS) { /* every state by units, over the DP group or a node's part */
        int k = si->over == DT_STRATEGY_OVER_NODE && g > 0 && g < n ? g : n;
        double e = fsdp_shard(m, k);
        r.params = kp * e;
        r.grads = kg * e;
        r.optim = ko * e;
        return r;
    }
    if (si->shards & DT_STRATEGY_SHARDS_GRADS) r.grads = kg * shard(psi, n);
    if (si->shards & DT_STRATEGY_SHARDS_OPTIM) r.optim = ko * shard(psi, n);
    return r;
}

/* One arena slot: net.c rounds every slot up to 64 bytes. */
static double slot(double bytes) { return ceil(bytes / 64) * 64; }

double dt_plan_activation_bytes(const dt_plan_model *m, int micro_batch, int compute_bytes,
                                int attention, int recompute) {
    double B = micro_batch, d = compute_bytes;
    if (m->feature_rows) {
        double maxd = fmax(m->in_dim, fmax(m->hidden_dim, m->n_classes));
        double g = slot(B * 4) + slot(B * m->in_dim * d) + slot(B * 4) + 2 * slot(B * maxd * d);
        double layers = m->n_hidden_layers * 2 * slot(B * m->hidden_dim * d) +
                        2 * slot(B * m->n_classes * d);
        return g + layers;
    }
    double T = dt_plan_model_rows(m), C = m->n_embd, L = m->n_layer, BT = B * T; /* T: a CP rank's rows */
    int cp = m->cp_size > 1 ? m->cp_size : 1;
    /* TP: the cut widths are local (heads NH/tp, widths /tp); R is the row count of
     * the slots outside the TP regions (B·T/tp with sequence parallelism) */
    double tp = m->tp_size > 1 ? m->tp_size : 1;
    int sp = tp > 1 && m->sequence_parallel;
    double R = sp ? floor(BT / tp) : BT;
    double NH = m->n_head / tp;
    double A = NH * m->head_dim;                                           /* attention width */
    double Q = (double)(m->n_head + 2 * m->n_kv_head) * m->head_dim / tp; /* fused qkv row */
    double mlp_in = m->mlp_in / tp, mlp_act = m->mlp_act / tp, Vp = m->vocab_padded / tp;
    double saved, scratch;
    /* The attention slots' sizes below depend on the query heads NH only: with
     * grouped-query attention (NKV < NH) every backend reads the shared key/value
     * heads in place and saves nothing per key/value head. */
    if (attention > 0) { /* materialised, fp32 (CPU), `attention` threads of scratch rows */
        saved = 4 * B * NH * T * T;
        scratch = 4.0 * attention * fmin(T, 64) * T;
    } else if (attention == DT_PLAN_ATTENTION_FUSED && dt_attention_uses_fused(DT_ATTENTION_FUSED, m->head_dim)) {
        /* kernels/cuda/cuda_attention_fused.cu: per-row log-sum-exp (fp32) and a copy
         * of out saved; D = rowsum(dout * out) (fp32) as backward scratch */
        saved = 4 * B * NH * T + d * BT * A;
        scratch = 4 * B * NH * T;
    } else { /* the CUDA backend (kernels/cuda/cuda_attention.cu): the probabilities in the
              * compute dtype, and the score gradients of all B sequences as backward scratch */
        saved = d * B * NH * T * T;
        scratch = d * B * NH * T * T;
    }
    if (cp > 1) {
        /* ring attention (runtime/model/net_cp.c): the log-sum-exp saved; the scratch slot
         * holds the block kernel's scratch, two key/value blocks (compute dtype), their fp32
         * gradients, the fp32 running output and delta, each part rounded to 64 bytes.
         * The block kernel's scratch is the CPU's (kernels/cpu/cpu_attention_block.c: per
         * thread two min(T, 64) x T score tiles, a min(T, 64) x HS output tile and two row
         * statistics, fp32). The CUDA backend's block ops are being written: until their
         * attention_block_scratch_bytes is known here, its kinds are priced as the CPU
         * kernel with 1 thread (tests/gpu/test_plan_cuda.c holds the CUDA arena to it). */
        double HS = m->head_dim, KV2 = 2.0 * (m->n_kv_head / tp) * HS;
        /* the CUDA block ops need no scratch (kernels/cuda/cuda_attention_block.cu) */
        double blk = attention > 0 ? 4.0 * attention * fmin(T, 64) * (2 * T + HS + 2) : 0;
        saved = 4 * B * NH * T;
        scratch = slot(blk) + 2 * slot(BT * KV2 * d) + 2 * slot(BT * KV2 * 4) + slot(BT * A * 4) +
                  slot(4 * B * NH * T);
    }
    if (cp > 1 && m->cp_ulysses) {
        /* Ulysses (net_cp.c): the device attention over the whole S positions of h = NH/C
         * query heads (hk key/value heads); saved: its saved state and the exchanged
         * q|k|v (B, S, W3); scratch: its scratch, out and dqkv of those heads, and the
         * exchange's send and receive rooms (C blocks of B x T x max(W3, A) each) */
        double S = m->seq_len, h = NH / cp, hk = (double)m->n_kv_head / tp / cp, HS = m->head_dim;
        double W = h * HS, W3 = (h + 2 * hk) * HS, BS = B * S, a_saved, a_scratch;
        if (attention > 0) {
            a_saved = 4 * B * h * S * S;
            a_scratch = 4.0 * attention * fmin(S, 64) * S;
        } else if (attention == DT_PLAN_ATTENTION_FUSED && dt_attention_uses_fused(DT_ATTENTION_FUSED, m->head_dim)) {
            a_saved = 4 * B * h * S + d * BS * W;
            a_scratch = 4 * B * h * S;
        } else {
            a_saved = d * B * h * S * S;
            a_scratch = d * B * h * S * S;
        }
        double rooms = slot(cp * BT * fmax(W3, A) * d);
        saved = slot(a_saved) + slot(BS * W3 * d);
        scratch = slot(a_scratch) + slot(BS * W * d) + slot(BS * W3 * d) + 2 * rooms;
    }
    double rc = slot(R * C * d), r4 = slot(R * 4), bt4 = slot(BT * 4);
    /* ln1, attproj, res2, ln2, fcproj, res3; atty; the norms' statistics; qkv; the
     * MLP's two activations (gpt fch, fch_gelu; llama gate|up, swiglu) */
    double layer = 6 * rc + slot(BT * A * d) + 2 * m->norm_stats * r4 + slot(BT * Q * d) +
                   slot(BT * mlp_in * d) + slot(BT * mlp_act * d) + slot(saved);
    /* a pipeline stage without the first chunk has no tokens (pp_no_first), one
     * without the last no targets, final norm, logits or losses (pp_no_head) */
    int head = !m->pp_no_head;
    /* the positions slot: under CP each row's global index and first visible key, and
     * every rank's key indices, follow the positions (net_cp.c) */
    double positions = cp > 1 ? slot(4 * (BT * (3 + cp) + (m->cp_ulysses ? B * m->seq_len : 0))) : bt4;
    double once = (m->pp_no_first ? 0 : bt4) /* tokens */ + positions + rc /* encoded */ +
                  (head ? bt4 /* targets */ + rc + m->norm_stats * r4 /* final norm, statistics */ +
                              bt4 /* losses */ + slot(BT * Vp * d) /* logits */
                        : 0) +
                  rc /* dres */ + slot(BT * fmax(C, A) * d) /* dtmp */ +
                  slot(BT * Q * d) /* dqkv */ + slot(BT * mlp_in * d) + slot(BT * mlp_act * d) +
                  slot(scratch) +
                  /* sequence parallelism: a gathered norm output, a row-parallel matmul's
                   * partial sums (the gathered residual gradient in the backward), this
                   * rank's rows of a reduced input gradient, a layer's partial norm weight
                   * (and bias) gradients; TP: the vocabulary-parallel loss's max, sum and
                   * target logit per row */
                  (sp ? 2 * slot(BT * C * d) + slot(R * C * d) + slot(2 * m->norm_stats * C * d) : 0) +
                  (tp > 1 && head ? slot(3 * BT * 4) : 0);
    /* recomputation (model.h): a checkpointed block keeps its output (full) or also
     * qkv, res2 and the MLP's first output (selective); one block's set minus what a
     * checkpointed block keeps is the scratch the recompute refills */
    if (recompute == DT_MODEL_RECOMPUTE_NONE) return L * layer + once;
    double keep = rc + (recompute == DT_MODEL_RECOMPUTE_SELECTIVE ? slot(BT * Q * d) + rc + slot(BT * mlp_in * d) : 0);
    double every = m->recompute_every > 0 ? m->recompute_every : 1, nck = ceil(L / every);
    return (L - nck) * layer + nck * keep + (nck > 0 ? layer - keep : 0) + once;
}

double dt_plan_input_activation_bytes(const dt_plan_input *in, const dt_plan_model *m, int recompute) {
    int attn = in->gpu_attention ? (in->gpu_attention_fused ? DT_PLAN_ATTENTION_FUSED : DT_PLAN_ATTENTION_CUBLAS)
                                 : (in->cpu_threads > 0 ? in->cpu_threads : 1);
    return dt_plan_activation_bytes(m, in->micro_batch, in->precision == DT_PLAN_PRECISION_BF16 ? 2 : 4, attn,
                                    recompute);
}

double dt_plan_recompute_factor(const dt_plan_model *m, int recompute) {
    if (recompute == DT_MODEL_RECOMPUTE_NONE || m->feature_rows || m->flops_per_token <= 0) return 1.0;
    double L = m->n_layer, every = m->recompute_every > 0 ? m->recompute_every : 1, share = ceil(L / every) / L;
    if (recompute == DT_MODEL_RECOMPUTE_FULL) return 1.0 + share / 3.0;
    /* selective: the attention core's forward, 4·A·T FLOPs per token per block */
    double A = (double)m->n_head * m->head_dim;
    return 1.0 + share * L * 4.0 * A * m->seq_len / m->flops_per_token;
}

/* ---- collectives -------------------------------------------------------------- */

double dt_plan_all_reduce_s(double bytes, int n, double bytes_per_s, double alpha_s) {
    if (n <= 1) return 0;
    return 2.0 * (n - 1) / n * bytes / bytes_per_s + alpha_s;
}

double dt_plan_reduce_scatter_s(double bytes, int n, double bytes_per_s, double alpha_s) {
    if (n <= 1) return 0;
    return (double)(n - 1) / n * bytes / bytes_per_s + alpha_s;
}

double dt_plan_all_gather_s(double bytes, int n, double bytes_per_s, double alpha_s) {
    return dt_plan_reduce_scatter_s(bytes, n, bytes_per_s, alpha_s);
}

dt_plan_tp_comm dt_plan_tp_comm_time(const dt_plan_model *m, int micro_batch, int compute_bytes,
                                     const dt_plan_link *intra) {
    dt_plan_tp_comm r = {0};
    int tp = m->tp_size;
    if (tp <= 1 || m->feature_rows) return r;
    double bw = intra->gbps * 1e9, a = intra->alpha_us * 1e-6;
    double BT = (double)micro_batch * dt_plan_model_rows(m), L = m->pp_blocks > 0 ? m->pp_blocks : m->n_layer;
    double C = m->n_embd, S = BT * C * compute_bytes;
    double ar = dt_plan_all_reduce_s(S, tp, bw, a), ag = dt_plan_all_gather_s(S, tp, bw, a),
           rs = dt_plan_reduce_scatter_s(S, tp, bw, a);
    /* the loss: the rows' max, then their sums of exponentials and target logits */
    double loss = dt_plan_all_reduce_s(BT * 4, tp, bw, a) + dt_plan_all_reduce_s(2 * BT * 4, tp, bw, a);
    if (!m->sequence_parallel) {
        /* forward: the layers' two row-parallel outputs + the embedding's sum;
         * backward: the layers' two input gradients + the head's */
        r.fwd_s = (2 * L + 1) * ar + loss;
        r.fwd_coll = 2 * L + 1 + 2;
        r.bwd_s = (2 * L + 1) * ar;
        r.bwd_coll = 2 * L + 1;
        return r;
    }
    /* forward: per layer the two norm outputs gathered and the two row-parallel
     * outputs reduce-scattered; the embedding's reduce-scatter, the final norm's
     * gather. backward: per layer the residual gradient gathered twice and the two
     * norm outputs again (not kept), the two input gradients reduce-scattered, the
     * layer's partial norm weight (and bias) gradients all-reduced; the head's
     * reduce-scatter, the final norm's gradients, the embedding's gather. */
    double norm = m->norm_stats * C * compute_bytes; /* one norm's weights (and biases) */
    r.fwd_s = L * (2 * ag + 2 * rs) + rs + ag + loss;
    r.fwd_coll = 4 * L + 2 + 2;
    r.bwd_s = L * (4 * ag + 2 * rs + dt_plan_all_reduce_s(2 * norm, tp, bw, a)) + rs +
              dt_plan_all_reduce_s(norm, tp, bw, a) + ag;
    r.bwd_coll = 7 * L + 3;
    return r;
}

dt_plan_cp_ring dt_plan_cp_ring_time(const dt_plan_model *m, int micro_batch, int compute_bytes, double rate,
                                     const dt_plan_link *link) {
    dt_plan_cp_ring r = {0};
    int cp = m->cp_size, tp = m->tp_size > 1 ? m->tp_size : 1;
    if (cp <= 1 || m->feature_rows) return r;
    double bw = link->gbps * 1e9, a = link->alpha_us * 1e-6;
    double T = dt_plan_model_rows(m), BT = (double)micro_batch * T, L = m->pp_blocks > 0 ? m->pp_blocks : m->n_layer;
    double KV2 = 2.0 * (m->n_kv_head / tp) * m->head_dim, A = (double)m->n_head / tp * m->head_dim;
    double kv = BT * KV2 * compute_bytes, grad = BT * KV2 * 4;
    double t_kv = kv / bw + a, t_grad = grad / bw + a;
    /* one block's attention: the local queries against T keys, causal on average half
     * of the 4·A FLOPs per query and key; the backward twice the forward */
    double blk_f = rate > 0 ? 2.0 * A * BT * T / rate : 0, blk_b = 2 * blk_f;
    if (m->cp_ulysses) {
        /* Ulysses: per layer two all-to-alls forward (q|k|v, out) and two backward (dout,
         * dq|dk|dv), each rank sending (C - 1)/C of its rows' share; none overlapped */
        double Q = (double)(m->n_head + 2 * m->n_kv_head) / tp * m->head_dim;
        double qkv = BT * Q * compute_bytes * (cp - 1) / cp, out = BT * A * compute_bytes * (cp - 1) / cp;
        double t = (qkv + out) / bw + 2 * (cp - 1) * a;
        r.fwd_bytes = r.bwd_bytes = L * (qkv + out);
        r.fwd_s = r.fwd_exposed_s = r.bwd_s = r.bwd_exposed_s = L * t;
        return r;
    }
    r.fwd_bytes = L * (cp - 1) * kv;
    r.bwd_bytes = L * ((cp - 1) * kv + cp * grad);
    r.fwd_s = L * (cp - 1) * t_kv;
    r.bwd_s = L * ((cp - 1) * t_kv + cp * t_grad);
    r.fwd_exposed_s = L * (cp - 1) * fmax(0, t_kv - blk_f);
    r.bwd_exposed_s = L * ((cp - 1) * fmax(0, t_kv - blk_b) + cp * t_grad);
    return r;
}

void dt_plan_cost(double hours_1gpu, int n, double price, double efficiency, double *hours,
                  double *cost) {
    double h = n > 0 && efficiency > 0 ? hours_1gpu / (n * efficiency) : 0;
    if (hours) *hours = h;
    if (cost) *cost = n * price * h;
}

/* ---- one row ------------------------------------------------------------------- */

void dt_plan_input_defaults(dt_plan_input *in) {
    memset(in, 0, sizeof *in);
    in->micro_batch = 1;
    in->accum = 1;
    in->precision = DT_PLAN_PRECISION_BF16;
    in->comm_bytes = 2;
    in->gpu_attention = 1;
    in->mfu = 0.4;
    in->reserve = 0.10;
    in->intra = *dt_plan_link_find("nvlink4");
    in->inter = *dt_plan_link_find("ib400");
    in->gpus_per_node = 8;
    in->bucket_elems = 6553600;
}

/* Time of `total` bytes moved by one collective kind split into `count`
 * collectives: the ring's bandwidth term for the whole plus α each. */
typedef double (*coll_fn)(double, int, double, double);
static double coll_split(coll_fn f, double total, double count, int n, const dt_plan_link *ln) {
    if (n <= 1 || count <= 0) return 0;
    double bw = ln->gbps * 1e9, a = ln->alpha_us * 1e-6;
    return f(total, n, bw, 0) + count * (n > 1 ? a : 0);
}

dt_status_t dt_plan_row_compute(const dt_plan_input *in, dt_strategy_t s, int n_gpus,
                                dt_plan_row *out) {
    if (in->model.pp_size > 1) return dt_plan_row_compute_pp(in, s, n_gpus, out, NULL);
    return dt_plan_row_stage(in, &in->model, s, n_gpus, 1, -1, out);
}

dt_status_t dt_plan_row_stage(const dt_plan_input *in, const dt_plan_model *m, dt_strategy_t s, int n_gpus,
                              int pp, int recompute_given, dt_plan_row *out) {
    memset(out, 0, sizeof *out);
    if (pp < 1) pp = 1;
    if (n_gpus < 1) return dt_error(DT_STATUS_USAGE, "{gpus}: expected counts >= 1, found %d", n_gpus);
    int tp = m->tp_size > 1 ? m->tp_size : 1;
    if (tp > 1 && in->gpus_per_node > 0 && in->gpus_per_node % tp)
        return dt_error(DT_STATUS_USAGE,
                        "{tp} %d: does not divide the %d GPUs per node (a TP group is consecutive GPUs of one "
                        "node)",
                        tp, in->gpus_per_node);
    int cp = m->cp_size > 1 ? m->cp_size : 1;
    dt_layout_dims dims = dt_layout_dims_of(tp, cp, pp);
    dt_layout lay;
    if (dt_layout_of(&dims, n_gpus, 0, &lay) != DT_STATUS_OK) {
        if (cp > 1)
            return dt_error(DT_STATUS_USAGE,
                            "{cp} %d: TP %d x CP %d x PP %d does not divide {gpus} %d (world = TP x CP x PP x DP)",
                            cp, tp, cp, pp, n_gpus);
        if (pp == 1)
            return dt_error(DT_STATUS_USAGE, "{tp} %d: does not divide {gpus} %d (world = TP x DP)", tp, n_gpus);
        return dt_error(DT_STATUS_USAGE, "{pp} %d: TP %d x PP %d does not divide {gpus} %d (world = TP x PP x DP)",
                        pp, tp, pp, n_gpus);
    }
    /* the gradients are reduced (and the states sharded) over the DP x CP ranks */
    int dp = dt_layout_dp_size(&lay), replica = dt_layout_replica_size(&lay) / cp, red = dp * cp;
    int g = in->gpus_per_node > 0 ? in->gpus_per_node : n_gpus;
    int nodes = 1;
    if (n_gpus > g) {
        if (n_gpus % g)
            return dt_error(DT_STATUS_USAGE,
                            "{gpus}: %d GPUs span nodes of %d GPUs but are not a multiple of %d "
                            "(set {gpus_per_node} or {nodes} MxG)",
                            n_gpus, g, g);
        nodes = n_gpus / g;
    }
    int local = nodes > 1 ? g : n_gpus;                     /* ranks on one node */
    int dp_local = local > replica ? local / replica : 1; /* ranks of a DP x CP group on one node */
    const dt_strategy_info *si = dt_strategy_get(s);
    unsigned sharded = si ? si->shards : 0;
    dt_strategy_group_t over = si ? si->over : DT_STRATEGY_OVER_NONE;
    out->strategy = s;
    out->n_gpus = n_gpus;
    out->n_nodes = nodes;
    out->tp = tp;
    out->dp = dp;
    out->cp = cp;
    out->pp = pp;
    out->virtual_stages = 1;
    out->schedule = in->pp_schedule;
    out->partition = m->pp_partition;
    out->micro_batch = in->micro_batch;
    out->accum = in->accum;
    out->shard = over == DT_STRATEGY_OVER_NONE ? 1 : (over == DT_STRATEGY_OVER_NODE ? dp_local : red);

    /* memory: the TP piece's states, divided by the strategy over the DP x CP group */
    int cb = in->precision == DT_PLAN_PRECISION_BF16 ? 2 : 4; /* compute dtype */
    dt_plan_mem ms = dt_plan_model_states(m, in->precision, s, red, dp_local);
    out->params = ms.params;
    out->grads = ms.grads;
    out->optim = ms.optim;
    out->acts = dt_plan_input_activation_bytes(in, m, DT_MODEL_RECOMPUTE_NONE);
    /* recomputation: the cheaper policy that fits (selective), else full */
    out->ckpt_policy = DT_MODEL_RECOMPUTE_SELECTIVE;
    out->acts_ckpt = m->feature_rows ? out->acts : dt_plan_input_activation_bytes(in, m, DT_MODEL_RECOMPUTE_SELECTIVE);
    if (red > 1) {
        if (sharded & DT_STRATEGY_SHARDS_PARAMS)
            out->comm_buf = m->largest_unit * (2.0 * cb + in->comm_bytes);
        else if (!(sharded & DT_STRATEGY_SHARDS_GRADS) && in->comm_bytes != cb)
            out->comm_buf = (double)m->n_params * in->comm_bytes; /* the gradients cast for the wire (dp.c) */
        else
            out->comm_buf = 2.0 * fmin(in->bucket_elems, m->n_params) * in->comm_bytes;
    }
    double states = out->params + out->grads + out->optim;
    out->total = states + out->acts + out->comm_buf;
    out->total_ckpt = states + out->acts_ckpt + out->comm_buf;
    out->usable = in->mem_bytes * (1.0 - in->reserve);
    if (in->mem_shared) out->usable /= local;
    if (!m->feature_rows && out->total_ckpt > out->usable) {
        out->ckpt_policy = DT_MODEL_RECOMPUTE_FULL;
        out->acts_ckpt = dt_plan_input_activation_bytes(in, m, DT_MODEL_RECOMPUTE_FULL);
        out->total_ckpt = states + out->acts_ckpt + out->comm_buf;
    }
    out->fit = out->total <= out->usable        ? DT_PLAN_FIT_YES
               : out->total_ckpt <= out->usable ? DT_PLAN_FIT_CKPT
                                                : DT_PLAN_FIT_NO;

    /* compute */
    double tokens_mb = (double)in->micro_batch * (m->feature_rows ? 1 : dt_plan_model_rows(m)); /* this rank's */
    double tokens_gpu = tokens_mb * in->accum;
    double rate = in->peak_flops * in->mfu;
    double base = m->flops_per_token * tokens_gpu / tp / rate; /* the TP group's tokens, 1/tp each */
    int ckpt = recompute_given >= 0 ? recompute_given : out->fit == DT_PLAN_FIT_CKPT;
    double recompute = ckpt ? dt_plan_recompute_factor(m, ckpt > 1 ? ckpt : out->ckpt_policy) : 1.0;
    out->compute_s = base * recompute;
    double fwd_mb = base / in->accum / 3.0;
    double bwd_mb = base / in->accum * (2.0 / 3.0) * (recompute > 1 ? 1.5 : 1.0);

    /* communication: the ring runs on the slowest link it crosses */
    const dt_plan_link *ring = nodes > 1 ? &in->inter : &in->intra;
    double psi = m->n_params;
    double grad_b = psi * in->comm_bytes, param_b = psi * cb;
    double bucket = fmin(in->bucket_elems, psi);
    double n_buckets = ceil(psi / bucket);
    double bucket_b = bucket * in->comm_bytes;
    double comm = 0, exposed = 0;
    double ncoll = 0;
    /* by what the strategy shards (the strategy table): nothing (DDP all-reduces the
     * gradients), the optimizer states (ZeRO-1/2: reduce-scatter, once a step or every
     * micro-batch when the gradients are sharded too, then all-gather the parameters),
     * or the parameters too (FSDP/HSDP: per unit, over the DP group or a node's part) */
    if (red > 1 && si) {
        if (!(sharded & DT_STRATEGY_SHARDS_OPTIM)) {
            double ar = coll_split(dt_plan_all_reduce_s, grad_b, n_buckets, red, ring);
            double tail = coll_split(dt_plan_all_reduce_s, bucket_b, 1, red, ring);
            comm = ar;
            exposed = fmax(ar - bwd_mb, tail);
            ncoll = n_buckets;
        } else if (!(sharded & DT_STRATEGY_SHARDS_PARAMS)) {
            double times = sharded & DT_STRATEGY_SHARDS_GRADS ? in->accum : 1;
            double rs = coll_split(dt_plan_reduce_scatter_s, grad_b, n_buckets, red, ring);
            double tail = coll_split(dt_plan_reduce_scatter_s, bucket_b, 1, red, ring);
            double ag = coll_split(dt_plan_all_gather_s, param_b, n_buckets, red, ring);
            comm = times * rs + ag;
            exposed = times * fmax(rs - bwd_mb, tail) + ag;
            ncoll = times * n_buckets + n_buckets;
        } else {
            int by_node = over == DT_STRATEGY_OVER_NODE;
            int k = by_node ? dp_local : red;
            const dt_plan_link *ln = by_node ? &in->intra : ring;
            double nu = m->n_units > 0 ? m->n_units : 1;
            double ag = coll_split(dt_plan_all_gather_s, param_b, nu, k, ln);
            double rs = coll_split(dt_plan_reduce_scatter_s, grad_b, nu, k, ln);
            double always = coll_split(dt_plan_all_gather_s, m->largest_unit * cb, 1, k, ln) +
                            coll_split(dt_plan_reduce_scatter_s, m->largest_unit * in->comm_bytes,
                                       1, k, ln);
            double per_mb = 2 * ag + rs;
            double inter = 0;
            if (by_node && nodes > 1)
                inter = coll_split(dt_plan_all_reduce_s, grad_b / k, nu, nodes, &in->inter);
            comm = in->accum * per_mb + inter;
            exposed = (in->accum - 1) * fmax(per_mb - (fwd_mb + bwd_mb), always) +
                      fmax(per_mb + inter - (fwd_mb + bwd_mb), always);
            ncoll = (double)in->accum * 3 * nu + (inter > 0 ? nu : 0);
        }
    }
    if (exposed > comm) exposed = comm;
    /* TP: every micro-batch's collectives (the forward's twice when recomputed) and
     * the step's, all on the critical path */
    dt_plan_tp_comm tc = dt_plan_tp_comm_time(m, in->micro_batch, cb, &in->intra);
    out->tp_comm_s = in->accum * (tc.fwd_s * (recompute > 1 ? 2 : 1) + tc.bwd_s);
    comm += out->tp_comm_s;
    exposed += out->tp_comm_s;
    ncoll += in->accum * (tc.fwd_coll * (recompute > 1 ? 2 : 1) + tc.bwd_coll);
    /* CP: the ring of every micro-batch (a recomputed block's forward ring again); its
     * group is TP apart, on one node when TP x CP GPUs fit in one */
    if (cp > 1 && !m->feature_rows) {
        out->cp_inter = nodes > 1 && tp * cp > g;
        dt_plan_cp_ring cr = dt_plan_cp_ring_time(m, in->micro_batch, cb, rate, out->cp_inter ? &in->inter : &in->intra);
        double L = m->n_layer, every = m->recompute_every > 0 ? m->recompute_every : 1;
        double again = recompute > 1 ? ceil(L / every) / L : 0; /* the checkpointed blocks' share */
        out->cp_bytes = in->accum * (cr.fwd_bytes * (1 + again) + cr.bwd_bytes);
        out->cp_s = in->accum * (cr.fwd_s * (1 + again) + cr.bwd_s);
        out->cp_exposed_s = in->accum * (cr.fwd_exposed_s * (1 + again) + cr.bwd_exposed_s);
        comm += out->cp_s;
        exposed += out->cp_exposed_s;
    }
    out->comm_s = comm;
    out->exposed_s = exposed;
    out->overlapped_s = comm - exposed;
    out->n_collectives = ncoll;
    out->step_s = out->compute_s + exposed;
    out->efficiency = out->step_s > 0 ? base / out->step_s : 0;
    out->tokens_per_s = out->step_s > 0 ? red * tokens_gpu / out->step_s : 0; /* a CP rank's tokens are its own */
    dt_plan_cost(in->hours_1gpu, n_gpus, in->price, out->efficiency, &out->hours, &out->cost);
    return DT_STATUS_OK;
}

/* ---- recommendation ------------------------------------------------------------ */

static const char *gb(double bytes, char *buf, size_t len) {
    snprintf(buf, len, "%.1f GB", bytes / 1e9);
    return buf;
}

/* "fsdp on 8 GPUs", "fsdp on 8 GPUs at TP 2 x DP 4", "ddp on 4 GPUs at TP 1 x CP 4 x
 * DP 1", or with a pipeline "zero1 on 16 GPUs at TP 8 x PP 2 x DP 1 (1f1b)" */
static const char *plan_name(const dt_plan_row *r, char *buf, size_t len) {
    int n = snprintf(buf, len, "%s on %d GPU%s", dt_strategy_label(r->strategy), r->n_gpus,
                     r->n_gpus > 1 ? "s" : "");
    char cp[32] = "";
    if (r->cp > 1) snprintf(cp, sizeof cp, " x CP %d", r->cp);
    if (r->pp > 1 && n > 0 && (size_t)n < len) {
        char v[32] = "";
        if (r->virtual_stages > 1) snprintf(v, sizeof v, ", %d chunks per rank", r->virtual_stages);
        snprintf(buf + n, len - (size_t)n, " at TP %d%s x PP %d x DP %d (%s%s)", r->tp, cp, r->pp, r->dp,
                 dt_pp_schedule_name((dt_pp_schedule_t)r->schedule), v);
    } else if ((r->tp > 1 || r->cp > 1) && n > 0 && (size_t)n < len) {
        snprintf(buf + n, len - (size_t)n, " at TP %d%s x DP %d", r->tp, cp, r->dp);
    }
    return buf;
}

static int cp_of(const dt_plan_row *r) { return r->cp > 1 ? r->cp : 1; }

/* Why the cheapest plan has its CP size (plan.h: dt_plan_choice.cp_reason). */
static void cp_reason(const dt_plan_row *rows, int n_rows, dt_plan_choice *out) {
    int max_cp = 1, best1 = -1, bestc = -1;
    double need1 = INFINITY, acts1 = INFINITY;
    for (int i = 0; i < n_rows; i++) {
        const dt_plan_row *r = &rows[i];
        if (cp_of(r) > max_cp) max_cp = cp_of(r);
        int fits = r->fit != DT_PLAN_FIT_NO;
        if (cp_of(r) == 1) {
            if (r->total_ckpt < need1) need1 = r->total_ckpt, acts1 = r->acts_ckpt;
            if (fits && (best1 < 0 || r->efficiency > rows[best1].efficiency * 1.001)) best1 = i;
        } else if (fits && (bestc < 0 || r->efficiency > rows[bestc].efficiency * 1.001)) {
            bestc = i;
        }
    }
    if (max_cp <= 1) return;
    char *buf = out->cp_reason, n1[128], a[32], b[32];
    size_t len = sizeof out->cp_reason;
    if (out->cheapest < 0) {
        snprintf(buf, len, "no plan fits at any CP size up to %d", max_cp);
        return;
    }
    const dt_plan_row *c = &rows[out->cheapest];
    if (cp_of(c) > 1 && best1 < 0) {
        int min_cp = max_cp;
        for (int i = 0; i < n_rows; i++)
            if (rows[i].fit != DT_PLAN_FIT_NO && cp_of(&rows[i]) < min_cp) min_cp = cp_of(&rows[i]);
        if (isfinite(need1))
            snprintf(buf, len,
                     "fits only with CP>=%d: at CP 1 the smallest plan needs %s per GPU (activations %s, with "
                     "activation checkpointing), %s usable; CP %d holds 1/%d of every sequence per rank, at %.1f ms "
                     "of exposed ring traffic per step",
                     min_cp, gb(need1, a, sizeof a), gb(acts1, n1, sizeof n1), gb(c->usable, b, sizeof b), c->cp,
                     c->cp, 1e3 * c->cp_exposed_s);
        else
            snprintf(buf, len, "CP %d: the smallest CP size that fits of those given ({cp} without 1)", min_cp);
    } else if (cp_of(c) > 1) {
        snprintf(buf, len,
                 "CP %d preferred over the best CP 1 plan (%s, efficiency %.1f%%): its %.1f ms of exposed ring "
                 "traffic per step costs less than what CP 1 needs to fit",
                 c->cp, plan_name(&rows[best1], n1, sizeof n1), 100 * rows[best1].efficiency, 1e3 * c->cp_exposed_s);
    } else if (bestc >= 0) {
        const dt_plan_row *o = &rows[bestc];
        snprintf(buf, len,
                 "CP 1 preferred: %s also fits (efficiency %.1f%%) but its ring adds %.1f ms of exposed "
                 "communication per step; CP pays off when a sequence's activations do not fit one GPU",
                 plan_name(o, n1, sizeof n1), 100 * o->efficiency, 1e3 * o->cp_exposed_s);
    } else {
        snprintf(buf, len, "CP 1: no plan with CP>1 fits");
    }
}

/* The best-efficiency row that fits among those whose TP size is 1 (want_tp1) or
 * above 1; -1 when none. */
static int best_fit(const dt_plan_row *rows, int n_rows, int want_tp1) {
    int best = -1;
    for (int i = 0; i < n_rows; i++)
        if (rows[i].fit != DT_PLAN_FIT_NO && (rows[i].tp <= 1) == want_tp1 &&
            (best < 0 || rows[i].efficiency > rows[best].efficiency * 1.001))
            best = i;
    return best;
}

/* Why the cheapest plan has its TP size (plan.h: dt_plan_choice.tp_reason). */
static void tp_reason(const dt_plan_input *in, const dt_plan_row *rows, int n_rows, dt_plan_choice *out) {
    int max_tp = 1, has_tp1 = 0;
    for (int i = 0; i < n_rows; i++) {
        if (rows[i].tp > max_tp) max_tp = rows[i].tp;
        has_tp1 |= rows[i].tp <= 1;
    }
    if (max_tp <= 1) return;
    char *buf = out->tp_reason, n1[96], n2[96], a[32], b[32];
    size_t len = sizeof out->tp_reason;
    if (out->cheapest < 0) {
        snprintf(buf, len, "no plan fits at any TP size up to %d", max_tp);
        return;
    }
    const dt_plan_row *c = &rows[out->cheapest];
    int t1 = best_fit(rows, n_rows, 1), tt = best_fit(rows, n_rows, 0);
    if (c->tp > 1 && t1 < 0) {
        int min_tp = max_tp;
        double need = INFINITY;
        for (int i = 0; i < n_rows; i++) {
            if (rows[i].fit != DT_PLAN_FIT_NO && rows[i].tp < min_tp) min_tp = rows[i].tp;
            if (rows[i].tp <= 1) need = fmin(need, rows[i].total_ckpt);
        }
        if (has_tp1)
            snprintf(buf, len,
                     "fits only with TP>=%d: at TP 1 the smallest plan needs %s per GPU (with activation "
                     "checkpointing), %s usable; TP %d cuts the model states and the TP regions' activations "
                     "over the node's %s link, at %.1f ms of exposed TP communication per step",
                     min_tp, gb(need, a, sizeof a), gb(c->usable, b, sizeof b), c->tp, in->intra.name,
                     1e3 * c->tp_comm_s);
        else
            snprintf(buf, len, "TP %d: the smallest TP size that fits of those given ({tp} without 1)", min_tp);
    } else if (c->tp > 1) {
        const dt_plan_row *o = &rows[t1];
        char why[128];
        if (o->fit == DT_PLAN_FIT_CKPT)
            snprintf(why, sizeof why, "the recomputation TP 1 needs (it fits only with activation checkpointing)");
        else
            snprintf(why, sizeof why, "TP 1's exposed data-parallel communication (%.1f ms per step)",
                     1e3 * o->exposed_s);
        snprintf(buf, len,
                 "TP %d preferred over the best TP 1 plan (%s, efficiency %.1f%%): its %.1f ms of exposed TP "
                 "communication per step costs less than %s",
                 c->tp, plan_name(o, n1, sizeof n1), 100 * o->efficiency, 1e3 * c->tp_comm_s, why);
    } else if (tt >= 0) {
        const dt_plan_row *o = &rows[tt];
        snprintf(buf, len,
                 "TP 1 preferred: %s also fits (efficiency %.1f%%) but its %.1f ms of TP collectives per step are "
                 "on the critical path (each layer waits for its all-reduces), while %s overlaps most of its "
                 "communication with compute (%.1f ms exposed)",
                 plan_name(o, n1, sizeof n1), 100 * o->efficiency, 1e3 * o->tp_comm_s, plan_name(c, n2, sizeof n2),
                 1e3 * c->exposed_s);
    } else {
        snprintf(buf, len, "TP 1: no plan with TP>1 fits");
    }
}

void dt_plan_recommend(const dt_plan_input *in, const dt_plan_row *rows, int n_rows,
                       dt_plan_choice *out) {
    memset(out, 0, sizeof *out);
    out->cheapest = out->fastest = -1;
    for (int i = 0; i < n_rows; i++) {
        const dt_plan_row *r = &rows[i];
        if (r->fit == DT_PLAN_FIT_NO) continue;
        if (out->cheapest < 0) out->cheapest = i;
        else {
            const dt_plan_row *c = &rows[out->cheapest];
            /* efficiencies within 0.1% are a tie: then fewer GPUs, then the shorter
             * step, then the smaller TP x CP x PP, then table order */
            int tie = r->efficiency >= c->efficiency * 0.999;
            int same_n = tie && r->n_gpus == c->n_gpus;
            int step_tie = same_n && fabs(r->step_s - c->step_s) <= 1e-3 * c->step_s;
            if (r->efficiency > c->efficiency * 1.001 || (tie && r->n_gpus < c->n_gpus) ||
                (same_n && !step_tie && r->step_s < c->step_s) ||
                (step_tie && r->tp * cp_of(r) * r->pp < c->tp * cp_of(c) * c->pp))
                out->cheapest = i;
        }
        if (out->fastest < 0 || r->tokens_per_s > rows[out->fastest].tokens_per_s * 1.001)
            out->fastest = i;
    }
    char a[32], b[32], name[96];
    tp_reason(in, rows, n_rows, out);
    cp_reason(rows, n_rows, out);
    if (out->cheapest < 0) {
        double best = INFINITY;
        for (int i = 0; i < n_rows; i++) best = fmin(best, rows[i].total_ckpt);
        snprintf(out->cheapest_reason, sizeof out->cheapest_reason,
                 "nothing fits: the smallest plan needs %s per GPU with activation "
                 "checkpointing, %s usable; try more GPUs, FSDP, tensor parallelism ({tp}), context "
                 "parallelism for long sequences ({cp}), a smaller micro-batch or a larger GPU",
                 gb(best, a, sizeof a), n_rows ? gb(rows[0].usable, b, sizeof b) : "0 GB");
        snprintf(out->fastest_reason, sizeof out->fastest_reason, "%s", out->cheapest_reason);
        return;
    }
    const dt_plan_row *c = &rows[out->cheapest], *f = &rows[out->fastest];
    char ckb[96] = "", fkb[96] = "";
    if (c->fit == DT_PLAN_FIT_CKPT)
        snprintf(ckb, sizeof ckb, " with activation checkpointing (policy %s)",
                 dt_model_recompute_name((dt_model_recompute_t)c->ckpt_policy));
    if (f->fit == DT_PLAN_FIT_CKPT)
        snprintf(fkb, sizeof fkb, " with activation checkpointing (policy %s)",
                 dt_model_recompute_name((dt_model_recompute_t)f->ckpt_policy));
    const char *ck = ckb;
    if (in->price > 0 && in->hours_1gpu > 0)
        snprintf(out->cheapest_reason, sizeof out->cheapest_reason,
                 "%s: fits%s (%s of %s usable) and has the highest scaling "
                 "efficiency of the plans that fit (%.1f%%), so the fewest GPU-hours: "
                 "%.1f h, cost %.2f",
                 plan_name(c, name, sizeof name), ck,
                 gb(c->fit == DT_PLAN_FIT_CKPT ? c->total_ckpt : c->total, a, sizeof a),
                 gb(c->usable, b, sizeof b), 100 * c->efficiency, c->hours, c->cost);
    else
        snprintf(out->cheapest_reason, sizeof out->cheapest_reason,
                 "%s: fits%s (%s of %s usable) and has the highest scaling "
                 "efficiency of the plans that fit (%.1f%%), so the fewest GPU-hours per token",
                 plan_name(c, name, sizeof name), ck,
                 gb(c->fit == DT_PLAN_FIT_CKPT ? c->total_ckpt : c->total, a, sizeof a),
                 gb(c->usable, b, sizeof b), 100 * c->efficiency);
    ck = fkb;
    int len = snprintf(out->fastest_reason, sizeof out->fastest_reason,
                       "%s: fits%s and has the highest throughput, %.0f tokens/s "
                       "(step %.1f ms, %.1f ms of communication exposed, efficiency %.1f%%)",
                       plan_name(f, name, sizeof name), ck, f->tokens_per_s, 1e3 * f->step_s,
                       1e3 * f->exposed_s, 100 * f->efficiency);
    if (f->hours > 0 && len > 0 && (size_t)len < sizeof out->fastest_reason)
        snprintf(out->fastest_reason + len, sizeof out->fastest_reason - (size_t)len,
                 "; done in %.1f h", f->hours);
}
