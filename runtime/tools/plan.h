/*
 * plan.h - `dtrun plan`'s arithmetic: per-GPU memory, step time, scaling
 * efficiency and cost of training a model under DDP, ZeRO-1, ZeRO-2, FSDP and
 * hybrid sharding at several GPU counts, and a recommendation.
 *
 * Units: bytes, seconds, FLOP/s, bytes/s. Printed figures use GB = 1e9 bytes, as
 * the ZeRO paper and the usual "16 bytes per parameter" tables do.
 *
 * Model states (Ψ parameters, N ranks, G GPUs per node):
 *   mixed precision (GPU, bf16): 2Ψ bf16 params + 2Ψ bf16 grads + 12Ψ optimizer
 *     (fp32 master 4Ψ + Adam m 4Ψ + v 4Ψ) = 16Ψ.
 *   fp32 (CPU, or bf16 off): 4Ψ params + 4Ψ grads + 8Ψ optimizer (m, v) = 16Ψ.
 *   DDP all replicated; ZeRO-1 shards the optimizer (bf16: 4Ψ + 12Ψ/N, fp32:
 *   8Ψ + 8Ψ/N); ZeRO-2 also the grads (2Ψ + 14Ψ/N, fp32 4Ψ + 12Ψ/N); FSDP
 *   (ZeRO-3) everything, 16Ψ/N (padded per FSDP unit); hybrid shards within a node
 *   and replicates across nodes, 16Ψ/G.
 *
 * Activations per GPU at micro-batch B and sequence T (GPT: C width, L layers,
 * NH heads, Vp padded vocab, d bytes of the compute dtype): exactly the arena
 * runtime/model/net.c allocates (every slot rounded up to 64 bytes; a unit test holds
 * the two together):
 *   per layer  18·B·T·C·d  (ln1, atty, attproj, res2, ln2, fcproj, res3: 7BTC;
 *                           qkv 3BTC; fch, fch_gelu 2·4BTC)
 *            + 4·B·T·4     (LayerNorm mean/rstd ×2, fp32)
 *   (Llama, A = NH·HD the attention width, Q = (NH + 2·NKV)·HD the fused qkv row,
 *   I the intermediate size: per layer 6·BTC + B·T·A + B·T·Q + B·T·2I + B·T·I
 *   elements of d bytes, 2·B·T·4 RMSNorm rstd, the attention's saved bytes; once
 *   as GPT's but with a (T, C) zero position table, one norm statistic, dtmp
 *   B·T·max(C, A), dqkv B·T·Q, dfch B·T·2I, dswi B·T·I)
 *            + attention:  B·NH·T·T probabilities, fp32 on the CPU, in the compute
 *                          dtype d on the GPU (kernels/cuda/cuda_attention.cu);
 *                          the fused GPU kernel (DTRUN_CUDA_ATTENTION=fused, head
 *                          size <= 128): B·NH·T·4 log-sum-exp + B·T·C·d out copy
 *   once       2·B·T·4 (tokens, targets) + 2·B·T·C·d (encoded, lnf)
 *            + 3·B·T·4 (lnf mean/rstd, losses) + B·T·Vp·d (logits)
 *            + 13·B·T·C·d backward scratch (dres, dtmp, dqkv, dfch, dfch_gelu)
 *            + attention scratch: CPU 4·threads·min(T, 64)·T; GPU NH·T·T·d;
 *                          fused B·NH·T·4
 *   with activation recomputation (recompute: dt_model_recompute_t; model.recompute_every
 *   K: n = ceil(L / K) of the L blocks checkpointed, L the blocks of the largest
 *   chunk): a checkpointed block keeps `keep` = its output res3, B·T·C·d (full), or
 *   res3 + res2 + qkv B·T·Q·d + the MLP's first output B·T·mlp_in·d (selective); one
 *   block's set less keep is the scratch the recompute refills:
 *     (L − n)·layer + n·keep + (layer − keep) + once.
 *   Recompute cost: full reruns a checkpointed block's forward up to the MLP
 *   activation (≈ a forward: compute × 4/3 with every block), selective only the
 *   attention core (its 4·A·T FLOPs per token per block) and the elementwise ops.
 *   MLP: B·4 targets + B·in·d features + B·4 losses + 2·B·max(dims)·d scratch
 *   + 2·B·out·d per layer (pre- and post-activation); no checkpointing.
 * Communication buffers: none at N = 1; DDP/ZeRO-1/ZeRO-2 two gradient buckets
 * (reduce_bucket_size elements in the communication dtype); FSDP/hybrid two
 * gathered units (the largest unit: the one computing and the one prefetched) in
 * the compute dtype plus one unsharded unit gradient awaiting its reduce-scatter.
 * "Fits" when the total is at most the GPU memory less a reserve (default 10% for
 * the CUDA context, allocator fragmentation and workspaces); "ckpt" when it fits
 * only with activation checkpointing (one extra forward: compute × 4/3).
 *
 * Step (one optimizer step; each GPU runs `accum` micro-batches of B·T tokens):
 *   compute = flops_per_token · tokens per GPU / (peak · mfu); forward = 1/3 of it,
 *   backward = 2/3.
 *   ring collectives over n ranks on a link of bandwidth bw, latency α:
 *     all-reduce 2(n−1)/n · S/bw, reduce-scatter and all-gather (n−1)/n · S/bw,
 *     plus α per collective (one per bucket or FSDP unit).
 *   S = Ψ × bytes of the communication dtype (gradients) or of the compute dtype
 *   (parameter gathers). Within a node the intra link is used, a ring that spans
 *   nodes runs at the inter-node link's per-GPU rate (one NIC per GPU).
 *   DDP: all-reduce of the gradients in buckets, once per step, overlapped with
 *     the last micro-batch's backward; the last bucket is always exposed.
 *   ZeRO-1: reduce-scatter once per step (overlapped as DDP) + all-gather of the
 *     updated parameters after the optimizer (not overlapped). Same volume as DDP.
 *   ZeRO-2: as ZeRO-1 but the reduce-scatter runs every micro-batch.
 *   FSDP: every micro-batch, all-gather per unit in forward and again in backward,
 *     reduce-scatter per unit in backward (1.5× DDP's volume); prefetch overlaps
 *     them with forward + backward; the first unit's gather and the last unit's
 *     reduce-scatter are always exposed.
 *   hybrid: FSDP within the node (intra link, G ranks) + an all-reduce of the 1/G
 *     gradient shard across the M = N/G nodes (inter link) in the last
 *     micro-batch's backward.
 *   exposed = max(overlappable − overlap window, always-exposed part) + serial part;
 *   step = compute + exposed; the optimizer's own time is not modelled.
 *
 * Tensor parallelism (TP size T, Megatron-style, within a node; DP = N/T):
 *   model states come from rank 0's TP layout (dt_model_layout_init_tp: tensors cut
 *   by rows or columns hold 1/T, norms, row-parallel biases and positions stay
 *   whole): Ψ_T = that layout's n_params, then divided by the strategy over the DP
 *   size as above (units padded per DP size), which is what the trainer allocates.
 *   Activations: the TP regions' slots (qkv, attention output and saved state with
 *   NH/T heads, the MLP's two activations, the logits B·T·Vp/T, and their backward
 *   scratch) use the local width; the other slots (norm inputs and outputs, the
 *   residual stream, the norms' per-row statistics, dres) keep B·T rows, or B·T/T
 *   with sequence parallelism; tokens, targets and losses stay B·T (the
 *   vocabulary-parallel embedding and loss read every token); dtmp keeps B·T rows of
 *   max(C, A/T) (the partial sums of d(norm output) before their all-reduce or
 *   reduce-scatter); sequence parallelism adds two B·T·C slots (the gathered norm
 *   output the column-parallel matmuls read; a row-parallel matmul's partial sums,
 *   the gathered residual gradient in the backward), this rank's rows of a reduced
 *   gradient and a layer's partial norm gradients; TP adds the loss's 3 fp32 per row.
 *   Compute: FLOPs per token / T per rank (each rank runs 1/T of every matmul).
 *   Communication on the intra-node link, S = B·T·C bytes of the compute dtype, per
 *   micro-batch, as the models issue them: forward 2 all-reduces of S per layer + 1
 *   (the vocabulary-parallel embedding's sum), backward 2 per layer + 1 (the head's
 *   input gradient). With sequence parallelism the forward has per layer 2
 *   all-gathers (norm outputs) + 2 reduce-scatters (row-parallel outputs), + the
 *   embedding's reduce-scatter and the final norm's all-gather; the backward per
 *   layer 4 all-gathers (the residual gradient twice, the norm outputs again) + 2
 *   reduce-scatters + 1 all-reduce of the layer's partial norm gradients, + the
 *   head's reduce-scatter, the final norm's all-reduce and the embedding's
 *   all-gather. The vocabulary-parallel loss all-reduces the rows' max (4·B·T bytes)
 *   then their sums and target logits (8·B·T): small beside S but 2 latencies. A
 *   recomputed forward (activation checkpointing)
 *   repeats the forward's collectives. All of it is exposed: the next op reads the
 *   result (no overlap modelled).
 * Pipeline parallelism (P ranks of V chunks, m = accum micro-batches per step, world
 * N = TP x P x DP, TP innermost in a node, then PP, then DP; plan_pp.c):
 *   stages: a config's model from the model layer (dt_model_pp_partition,
 *   dt_model_layout_init_stage of TP rank 0, dt_model_pp_chunk_cost); a sized model
 *   (dt_plan_model_set_pp) as L identical blocks, the vocabulary rows TP cuts (the
 *   embedding, and an untied head) and the rest (positions, final norm) on the first
 *   and last stages, FLOPs per chunk 6 x its parameters + 12·C·T per block, a tied
 *   head's 6·V·C on the last chunk; uniform, parameters or flops partitions minimise
 *   the largest chunk's cost, the extra blocks to the later chunks.
 *   memory by stage: its n_params divided by the strategy over DP as above (units
 *   padded per DP size), + on the last stage of a tied model without the embedding a
 *   copy of the embedding's rows, param + grad in the compute dtype (no optimizer
 *   state: the engine refreshes it from stage 0 after each step) = 2·(Vp/T)·C·d,
 *   + dt_pp_arenas(schedule, P, V, m, stage) x the stage's ONE arena: the per-block
 *   slots of its largest chunk, tokens only on the first stage, targets, final norm,
 *   logits, losses and the TP loss statistics only on the last (net.c's bytes). With
 *   activation checkpointing each arena is the checkpointed one. The row is the worst
 *   stage's; the job fits (or fits with recompute) when every stage does.
 *   time: per stage and micro-batch t_s = its FLOPs per token x B·T / T_tp / (peak ·
 *   mfu) (x 4/3 recomputing) + its TP collectives (its blocks); the pipeline takes
 *   (m + P − 1) x max t_s (gpipe, 1f1b), (V·m + P − 1) x the slowest chunk's time
 *   (interleaved); compute = m x max t_s's compute, bubble = the rest, ideal bubble
 *   dt_pp_bubble_ideal. P2P: per micro-batch, each of the P·V − 1 chunk boundaries
 *   carries the activation forward and its gradient back, B·T·C·d bytes each (/ T_tp
 *   with sequence parallelism), on the inter-node link when the two pipeline ranks'
 *   GPUs are on different nodes; sends are asynchronous and overlap compute, so one
 *   message per boundary per step is counted exposed (the pipeline's fill), and the
 *   row shows what the busiest stage sends per step. DP collectives: each stage's
 *   own (its parameters, its last backward as the overlap window), the largest
 *   exposed of the stages. step = compute + bubble + exposed (TP + P2P + DP);
 *   efficiency = the whole model's FLOPs over the TP x P GPUs of a replica / step.
 *   Recommendation ties (efficiency within 0.1%): fewer GPUs, the shorter step,
 *   then the smaller TP x CP x PP.
 * Context parallelism (CP size C, ring attention; world N = TP x CP x PP x DP, a CP
 * group's ranks TP apart; runtime/model/net_cp.c):
 *   activations: a CP rank's arena is the formulas above at T/C rows (T = seq_len),
 *   except the attention's slots: saved per layer the log-sum-exp only, 4·B·NH·T/C
 *   (every attention kind); the scratch slot holds the block kernel's scratch (CPU:
 *   4·threads·min(T/C, 64)·(2·T/C + HS + 2)), two key/value blocks in the compute
 *   dtype (B·T/C·2·KV·d each, KV = NKV·HS), their two fp32 gradients (·4 each), the
 *   fp32 running output (B·T/C·A·4) and delta (B·NH·T/C·4), each rounded to 64
 *   bytes; the positions slot is 4·B·T/C·(3 + C) (positions, each row's global
 *   index and first visible key, every rank's key indices).
 *   model states: replicated over CP as over DP; the gradients are reduced over the
 *   DP x CP ranks, so ZeRO/FSDP shard over DP·C ranks and the DP collectives run
 *   over them.
 *   compute: each rank runs B·T/C tokens per micro-batch, flops_per_token each.
 *   the ring, per micro-batch and layer, blocks of K = B·T/C·2·KV·d bytes: forward
 *   (C−1) blocks sent, each overlapping one block's attention (causal: on average
 *   2·A·B·(T/C)² FLOPs forward, twice that backward), exposed (C−1)·max(0, t(K) −
 *   t_block); backward (C−1) blocks overlapped the same way plus C fp32 gradient
 *   blocks (B·T/C·2·KV·4 bytes) sent after each block, all exposed. t(x) = x/bw +
 *   α on the intra-node link when TP x CP <= GPUs per node, else the inter-node
 *   one. A recomputed checkpointed block runs its forward ring again. The ring's
 *   exposed time is part of exposed_s (cp_exposed_s), its bytes per step cp_bytes.
 * Scaling efficiency e = ideal / planned = compute without recompute / step.
 * Work: H one-GPU hours (given, or tokens · flops_per_token / (peak · mfu));
 * time at N GPUs H/(N·e), cost N · price · H/(N·e).
 */
#ifndef DT_RUNTIME_PLAN_H
#define DT_RUNTIME_PLAN_H

#include <stddef.h>

#include "common/status.h" /* defines: dt_status_t */
#include "runtime/layout/strategy.h" /* defines: dt_strategy_t, the strategy table */
#include "runtime/model/model.h" /* defines: dt_model_layout */

/* Strategies are the config's (dt_strategy_t), their facts the strategy table's
 * (runtime/layout/strategy.h): what each shards over which group. The tables print
 * dt_strategy_label ("hybrid" for hsdp); --strategy takes dt_strategy_parse's names
 * ("zero3" for fsdp, "hsdp" for hybrid). */

/* ---- the inputs messages name ------------------------------------------- */

/* A message of plan's functions (dt_error details, dt_plan_choice's reasons) names
 * the input it is about as "{name}", a name of this table, never a command's flag:
 * the caller expands each with its own words (dt_plan_msg_expand) -- `dtrun plan`
 * with its flags ("{tp}" -> "--tp", "{virtual_stages}" -> "--virtual-stages"),
 * the memory check before the first step with the config's keys. A placeholder is
 * as long as its flag ("{tp}" and "--tp" are both 4 bytes), so a message cut to a
 * buffer's size is cut at the same place once `dtrun plan` expands it.
 *   params hidden layers heads kv_heads seq vocab ffn  the model's sizes
 *   tp pp virtual_stages schedule accum cp              the layout and the schedule
 *   gpus gpus_per_node nodes                            the GPU counts and the node shape
 *   base_dtype                                          LoRA's frozen base */
#define DT_PLAN_INPUT_MAP(X)                                                                       \
    X(params) X(hidden) X(layers) X(heads) X(kv_heads) X(seq) X(vocab) X(ffn) X(tp) X(pp)          \
    X(virtual_stages) X(schedule) X(accum) X(gpus) X(gpus_per_node) X(nodes) X(base_dtype) X(cp)

typedef enum {
#define DT_PLAN_INPUT_ENUM_(name) DT_PLAN_INPUT_##name,
    DT_PLAN_INPUT_MAP(DT_PLAN_INPUT_ENUM_)
#undef DT_PLAN_INPUT_ENUM_
    DT_PLAN_INPUT_COUNT
} dt_plan_input_name_t;

/* msg with every "{name}" of the table replaced by words[DT_PLAN_INPUT_<name>]
 * (one left as it is where that word is NULL; other braces are copied), into out
 * (len > 0 bytes, always terminated, cut as snprintf cuts). Returns out. */
char *dt_plan_msg_expand(const char *msg, const char *const words[DT_PLAN_INPUT_COUNT], char *out, size_t len);

/* ---- hardware tables ------------------------------------------------------ */

/* GPU models: the one table is in common/gpuinfo.h (dt_gpu_spec_*). */

typedef struct dt_plan_link {
    const char *name;
    double gbps;     /* GB/s (1e9) per GPU per direction */
    double alpha_us; /* latency per collective */
    const char *note;
} dt_plan_link;

int dt_plan_link_count(void);
const dt_plan_link *dt_plan_link_at(int i);
const dt_plan_link *dt_plan_link_find(const char *name);
void dt_plan_link_names(char *buf, size_t len);

/* ---- the model as the arithmetic sees it ---------------------------------- */

typedef struct dt_plan_model {
    const char *type; /* the model's name (model.type): "gpt" for sizes given by flags */
    int feature_rows; /* samples are feature rows (the mlp's arena), not token sequences */
    double n_params;         /* Ψ as held in the flat buffer (padded vocab) */
    double n_params_unpadded;
    /* token models (the model's dt_model_dims): n_embd the hidden width, head_dim
     * the query/key/value head size; mlp_in/mlp_act the MLP's widths (gpt 4C, 4C;
     * llama 2I, I), norm_stats fp32 values a norm saves per row (2 LayerNorm, 1
     * RMSNorm) */
    int n_layer, n_head, n_embd, seq_len, vocab_padded;
    int n_kv_head, head_dim, mlp_in, mlp_act, norm_stats;
    int in_dim, hidden_dim, n_hidden_layers, n_classes;     /* mlp */
    double flops_per_token; /* training FLOPs per token (per sample for mlp) */
    double largest_unit;    /* elements of the largest FSDP unit */
    int n_units;
    /* elements of every unit when known (from a layout), else NULL */
    double *unit_numel;
    /* tensor parallelism: the model as rank 0 of a TP group of tp_size holds it
     * (1 without TP). n_params, the units and largest_unit are that rank's piece;
     * n_params_global the whole model's; n_replicated the elements every TP rank
     * holds whole (their gradients are all-reduced in the TP group with sequence
     * parallelism). flops_per_token and the sizes above stay the whole model's. */
    int tp_size, sequence_parallel;
    double n_params_global, n_replicated;
    /* sized models (dt_plan_model_from_sizes / _from_shape): a block's elements and
     * those of them TP cuts; tied: the head reads the embedding's rows */
    double size_block, size_block_cut;
    int tied;
    /* pipeline parallelism (dt_plan_model_set_pp*): pp_size ranks of pp_virtual
     * chunks each, stages[s] what pipeline rank s holds (NULL at pp_size 1). In the
     * view of one stage that dt_plan_row_stage prices: pp_blocks the blocks it runs
     * (its TP collectives; 0: n_layer), pp_no_first 1 when it holds no first chunk
     * (its arena has no tokens), pp_no_head 1 when it holds no last chunk (no targets,
     * final norm, logits, losses or loss statistics). */
    int pp_size, pp_virtual, pp_partition;
    struct dt_plan_stage *stages;
    int pp_blocks, pp_no_first, pp_no_head;
    /* activation recomputation: every K-th block of a chunk checkpointed (0 = 1) */
    int recompute_every;
    /* context parallelism (dt_plan_model_set_cp; 0 or 1 = off): each rank holds
     * seq_len / cp_size positions of every sequence (dt_plan_model_rows) */
    int cp_size;
    int cp_ulysses; /* context_parallel.mode ulysses: all-to-all over heads, not the ring */
} dt_plan_model;

/* From the exact tensor table (dtrun's own models). Free with dt_plan_model_free. */
dt_status_t dt_plan_model_from_layout(const dt_model_layout *l, dt_plan_model *out);
/* For models dtrun does not build: Ψ, L, C, NH, T, V. FLOPs per token
 * 6Ψ + 12·L·C·T (PaLM); units: L blocks of 12C²+13C and the rest as one
 * embedding unit. Returns DT_STATUS_USAGE naming the flag (--params, ...). */
dt_status_t dt_plan_model_from_sizes(double params, int layers, int hidden, int heads, int seq,
                                     int vocab, dt_plan_model *out);
/* A Llama-shaped sized model (--kv-heads, --ffn): blocks of C·(NH + 2·NKV)·hd
 * q/k/v + NH·hd·C output + 3·C·I SwiGLU + 2C RMSNorm elements, untied head, FLOPs
 * per token 6Ψ + 12·L·C·T. DT_STATUS_USAGE naming the flag. */
dt_status_t dt_plan_model_from_shape(double params, int layers, int hidden, int heads, int kv_heads, int ffn,
                                     int seq, int vocab, dt_plan_model *out);
void dt_plan_model_free(dt_plan_model *m);
/* Turns a model from dt_plan_model_from_sizes into rank 0's piece at TP size tp
 * (sequence_parallel sp): each block's 12C² + 7C matrix and cut-bias elements and
 * the vocabulary's V·C rows divide by tp, the norms, the row-parallel biases (6C
 * per block) and the rest of the embedding unit (positions) stay whole. A model
 * from a layout gets its TP piece from dt_model_layout_init_tp instead.
 * DT_STATUS_USAGE naming --tp when tp does not divide the heads or the vocabulary. */
dt_status_t dt_plan_model_set_tp(dt_plan_model *m, int tp, int sp);
/* Makes m a context-parallel rank's at CP size cp (1: off). DT_STATUS_USAGE naming
 * --cp when the model has no context parallelism (only token models with a
 * pipeline: gpt, llama) or 2 x cp does not divide the sequence. */
dt_status_t dt_plan_model_set_cp(dt_plan_model *m, int cp);
/* The positions per sequence a rank computes: seq_len, or seq_len / cp_size. */
int dt_plan_model_rows(const dt_plan_model *m);

/* ---- inputs and results --------------------------------------------------- */

typedef enum dt_plan_precision {
    DT_PLAN_PRECISION_BF16 = 0, /* mixed: bf16 params/grads/compute, fp32 master + Adam */
    DT_PLAN_PRECISION_FP32 = 1,
} dt_plan_precision_t;

typedef struct dt_plan_input {
    dt_plan_model model;
    int micro_batch; /* B per GPU */
    int accum;       /* micro-batches per optimizer step */
    dt_plan_precision_t precision;
    int comm_bytes;      /* bytes per gradient element on the wire (2 bf16, 4 fp32) */
    int gpu_attention;   /* 1: the CUDA attention (B·NH·T·T in the compute dtype); 0: CPU (fp32) */
    int gpu_attention_fused; /* with gpu_attention: the fused kernel (DTRUN_CUDA_ATTENTION=fused;
                                default 0, as the backend's default) */
    int cpu_threads;     /* threads per rank when !gpu_attention (attention scratch) */
    double mem_bytes;    /* per device */
    int mem_shared;      /* 1: mem_bytes is one host's memory shared by its ranks (CPU) */
    double peak_flops;   /* per device */
    double mfu;
    double reserve;      /* fraction of memory not usable, 0.10 */
    dt_plan_link intra, inter;
    int gpus_per_node;     /* G */
    double bucket_elems;   /* reduce_bucket_size (elements) */
    double hours_1gpu;     /* H; 0 = unknown */
    double price;          /* per GPU-hour; 0 = not given */
    /* pipeline schedule (runtime/layout/pp_sched.h dt_pp_schedule_t), used when
     * the model has pp_size > 1; micro-batches per step m = accum */
    int pp_schedule;
} dt_plan_input;

/* Defaults: micro_batch 1, accum 1, bf16, comm 2 bytes, GPU attention, mfu 0.4, reserve
 * 0.10, nvlink4 intra, ib400 inter, 8 GPUs per node, 6553600 bucket elements. */
void dt_plan_input_defaults(dt_plan_input *in);

typedef enum dt_plan_fit {
    DT_PLAN_FIT_NO = 0,
    DT_PLAN_FIT_YES = 1,
    DT_PLAN_FIT_CKPT = 2, /* fits only with activation checkpointing (row.ckpt_policy) */
} dt_plan_fit_t;

typedef struct dt_plan_mem {
    double params, grads, optim; /* model states, bytes per GPU */
} dt_plan_mem;

typedef struct dt_plan_row {
    dt_strategy_t strategy;
    int n_gpus, n_nodes, shard; /* shard: ranks the states are divided by */
    int tp, dp;                 /* TP size (the model's) and DP size n_gpus / tp */
    int micro_batch, accum;     /* of the input it was computed from */
    /* memory per GPU, bytes */
    double params, grads, optim, acts, acts_ckpt, comm_buf;
    int ckpt_policy; /* the policy acts_ckpt is for: selective when it fits, else full */
    double total, total_ckpt, usable;
    dt_plan_fit_t fit;
    /* one optimizer step, seconds (with recompute when fit is CKPT); comm_s and
     * exposed_s include tp_comm_s, the TP collectives (all exposed) */
    double compute_s, comm_s, overlapped_s, exposed_s, step_s, tp_comm_s;
    double n_collectives; /* per step (buckets or units x kinds x micro-batches) */
    double efficiency;
    double tokens_per_s; /* whole job */
    double hours, cost;  /* 0 when the work (or price) is unknown */
    /* pipeline (pp 1, virtual_stages 1 without): memory is the worst stage's
     * (worst_stage, holding `arenas` activation arenas), time the slowest stage's
     * (slowest_stage); compute_s the slowest stage's busy time, bubble_s its idle
     * pipeline time (step = compute + bubble + exposed); bubble_ideal the formula
     * (dt_pp_bubble_ideal); p2p_bytes what a stage sends per step, p2p_s the time of
     * those sends, p2p_exposed_s the part counted exposed (in comm_s / exposed_s),
     * p2p_inter 1 when a stage boundary crosses nodes */
    int pp, virtual_stages, schedule, partition;
    int worst_stage, slowest_stage, arenas;
    double bubble_s, bubble_ideal, p2p_bytes, p2p_s, p2p_exposed_s;
    int p2p_inter;
    /* context parallelism (cp 1 without): the ring's bytes a rank sends per step,
     * their time, the part counted exposed (in comm_s / exposed_s), cp_inter 1 when
     * a CP group spans nodes */
    int cp;
    double cp_bytes, cp_s, cp_exposed_s;
    int cp_inter;
} dt_plan_row;

/* Model-state bytes per GPU for a strategy at n ranks (g GPUs per node). */
dt_plan_mem dt_plan_model_states(const dt_plan_model *m, dt_plan_precision_t p,
                                 dt_strategy_t s, int n, int g);
/* The `attention` argument of dt_plan_activation_bytes for the CUDA backend's two
 * kinds (kernels.h dt_attention_kind_t); a positive value is the CPU's threads. */
#define DT_PLAN_ATTENTION_CUBLAS 0
#define DT_PLAN_ATTENTION_FUSED (-1)

/* Compute time x this with recomputation policy `recompute` (full: 1 + n/(3L); selective:
 * 1 + n·4·A·T / flops_per_token; none: 1). */
double dt_plan_recompute_factor(const dt_plan_model *m, int recompute);
/* Activation bytes per GPU for one micro-batch of B sequences (a CP rank's: its
 * seq_len / cp_size rows of each). attention: DT_PLAN_ATTENTION_CUBLAS or _FUSED for
 * the CUDA backend's attention (fused falls back to cuBLAS's sizes above head size
 * 128, as the backend does), else the CPU threads whose scratch rows the CPU
 * attention (and under CP the CPU block kernel) uses. */
double dt_plan_activation_bytes(const dt_plan_model *m, int micro_batch, int compute_bytes,
                                int attention, int recompute);
/* The same for in's device, precision and micro-batch (one arena). */
double dt_plan_input_activation_bytes(const dt_plan_input *in, const dt_plan_model *m, int recompute);

/* Ring collective times (seconds) of a buffer of `bytes` over n ranks, one
 * collective, including its latency; 0 when n <= 1. */
double dt_plan_all_reduce_s(double bytes, int n, double bytes_per_s, double alpha_s);
double dt_plan_reduce_scatter_s(double bytes, int n, double bytes_per_s, double alpha_s);
double dt_plan_all_gather_s(double bytes, int n, double bytes_per_s, double alpha_s);

/* TP communication (the TP formulas above) of a model with tp_size > 1, on the
 * intra-node link: one micro-batch's forward and backward, seconds and collectives.
 * All zero at tp_size 1. */
typedef struct dt_plan_tp_comm {
    double fwd_s, bwd_s;
    double fwd_coll, bwd_coll;
} dt_plan_tp_comm;
dt_plan_tp_comm dt_plan_tp_comm_time(const dt_plan_model *m, int micro_batch, int compute_bytes,
                                     const dt_plan_link *intra);

/* The ring of context parallelism (the CP formulas above) of a model with cp_size >
 * 1, on link: one micro-batch's forward and backward over its blocks (pp_blocks, else
 * n_layer), bytes a rank sends, seconds of transfer and the part exposed. rate: the
 * FLOP/s a rank computes at (peak x mfu). All zero at cp_size 1. */
typedef struct dt_plan_cp_ring {
    double fwd_bytes, bwd_bytes, fwd_s, bwd_s, fwd_exposed_s, bwd_exposed_s;
} dt_plan_cp_ring;
dt_plan_cp_ring dt_plan_cp_ring_time(const dt_plan_model *m, int micro_batch, int compute_bytes, double rate,
                                     const dt_plan_link *link);

/* Time H/(N·e) and cost N·p·H/(N·e) of H one-GPU hours on n GPUs. */
void dt_plan_cost(double hours_1gpu, int n, double price, double efficiency, double *hours,
                  double *cost);

/* One row, at the model's TP and CP sizes. DT_STATUS_USAGE (naming --gpus) when
 * n_gpus spans nodes and is not a multiple of gpus_per_node, (naming --tp or --cp)
 * when TP (x CP x PP) does not divide n_gpus or TP the GPUs per node. */
dt_status_t dt_plan_row_compute(const dt_plan_input *in, dt_strategy_t s, int n_gpus,
                                dt_plan_row *out);

/* ---- pipeline parallelism (plan_pp.c) -------------------------------------- */

/* What one pipeline rank holds and computes (rank 0's TP piece). */
#define DT_PLAN_MAX_CHUNKS 64
typedef struct dt_plan_stage {
    int blocks;          /* blocks it runs, all its chunks */
    int arena_blocks;    /* its largest chunk's blocks: the per-block slots of its arena */
    int first, last;     /* it holds the embedding / the final norm, head and loss */
    double n_params;     /* elements of its flat buffer */
    double tied_copy;    /* elements of its copy of the tied embedding (0: none) */
    double largest_unit; /* elements of its largest unit */
    int n_units;
    double flops_per_token;  /* its chunks' training FLOPs per token (whole TP group) */
    double chunk_flops_max;  /* its largest chunk's */
    double *unit_numel;      /* its units' elements (from a layout: FSDP pads each), else NULL */
    int n_chunks;            /* V: its chunks, blocks [chunk_l0[j], chunk_l1[j]) */
    int chunk_l0[DT_PLAN_MAX_CHUNKS], chunk_l1[DT_PLAN_MAX_CHUNKS];
} dt_plan_stage;

/* A sized model (after dt_plan_model_set_tp) cut into pp ranks of virtual_stages
 * chunks (partition: dt_model_layout's uniform 0, parameters 1, flops 2): the blocks
 * as even as possible (the extra blocks to the last chunks), or contiguous chunks
 * minimising the largest chunk's parameters or FLOPs (formulas above). Stage 0
 * holds the embedding, the last chunk's rank the final norm and head (and, tied,
 * a copy of the embedding's rows). DT_STATUS_USAGE naming --pp or
 * --virtual-stages when pp x V exceeds the layers (pp need not divide them: the
 * trainer runs such a cut too). */
dt_status_t dt_plan_model_set_pp(dt_plan_model *m, int pp, int virtual_stages, int partition);

/* The config's model (spec) as pp ranks of virtual_stages chunks at TP size tp
 * (sequence parallelism sp), from the model layer: dt_model_pp_partition's chunks
 * (partition: dt_pp_partition_t), each rank's dt_model_layout_init_stage of TP rank
 * 0 (n_params, units, its largest chunk's blocks, first/last, the tied copy: the
 * embedding's TP piece) and dt_model_pp_chunk_cost's FLOPs. m must be the model
 * at that TP size. DT_STATUS_USAGE naming --pp / --virtual-stages. */
dt_status_t dt_plan_model_set_pp_layout(dt_plan_model *m, const dt_model_spec *spec, int tp, int sp, int pp,
                                        int virtual_stages, int partition);

/* One pipeline rank's row as if it ran alone: its states (view->n_params divided
 * over DP = n_gpus / (TP x pp) by the strategy), ONE activation arena, its DP
 * collectives and its compute at view->flops_per_token. recompute: -1 when the
 * stage's own fit decides, else 0 or 1. dt_plan_row_compute with pp_size 1 is this
 * with pp 1 and recompute -1. */
dt_status_t dt_plan_row_stage(const dt_plan_input *in, const dt_plan_model *view, dt_strategy_t s,
                              int n_gpus, int pp, int recompute, dt_plan_row *out);

/* The view of stage k of a pipeline model (for dt_plan_row_stage); no allocation. */
void dt_plan_stage_view(const dt_plan_model *m, int k, dt_plan_model *view);

/* A pipeline row (the pipeline formulas above) and, when stage_rows is not NULL,
 * each stage's (pp_size entries: memory with its arenas and tied copy, compute_s
 * its busy time). Called by dt_plan_row_compute for models with pp_size > 1. */
dt_status_t dt_plan_row_compute_pp(const dt_plan_input *in, dt_strategy_t s, int n_gpus, dt_plan_row *out,
                                   dt_plan_row *stage_rows);

typedef struct dt_plan_choice {
    int cheapest, fastest; /* indices into rows, -1 when nothing fits */
    char cheapest_reason[512], fastest_reason[512];
    /* "" when every row is TP 1; else why the cheapest plan's TP size (fits only
     * with TP >= k, or TP 1 preferred because TP's collectives are exposed) */
    char tp_reason[512];
    /* "" when every row is CP 1; else why the cheapest plan's CP size (fits only
     * with CP >= k: long sequences, or CP 1 preferred: the ring's exposed time) */
    char cp_reason[512];
} dt_plan_choice;

/* Cheapest that fits: the highest efficiency (cost = p·H/e), then fewer GPUs, then
 * the shorter step, then the smaller TP x CP x PP, then the simpler strategy; fastest that fits: the highest
 * tokens/s. */
void dt_plan_recommend(const dt_plan_input *in, const dt_plan_row *rows, int n_rows,
                       dt_plan_choice *out);

#endif /* DT_RUNTIME_PLAN_H */
