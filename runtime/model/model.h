/*
 * model.h - models as a tensor table over one flat parameter buffer, and the
 * model table (dt_model_ops) every model file fills.
 *
 * A model's parameters live in one contiguous buffer (llm.c style); gradients,
 * master weights and Adam m/v are buffers of the same layout. The tensor table
 * names each tensor (the names export writes: Hugging Face GPT-2 names for gpt),
 * its shape, its element offset, its FSDP unit and whether weight decay applies.
 * Units are contiguous ranges in forward order (gpt: 0 = embeddings, 1..L = the
 * blocks, L+1 = final LayerNorm, the LM head tied to unit 0; llama the same with
 * lm_head in unit L+1 unless tied; mlp: one unit per layer). DDP buckets are byte
 * ranges of the same buffer; FSDP shards units; a pipeline stage owns whole
 * units (dt_model_layout_init_stage); a tensor-parallel shard is a strided range of
 * one tensor, found here by name, shape and offset.
 *
 * The model table, as the device table (kernels/kernels.h) and the communicator
 * table (runtime/comm/comm_impl.h): one file per model fills a dt_model_ops
 * (runtime/model/gpt.c, llama.c, mlp.c) and runtime/model/registry.c lists them.
 * Callers never test which model they hold: they ask spec.ops. A new model is its
 * own file filling every slot not marked optional, plus one line in registry.c:
 *   name, help, data kind          "gpt", shown in errors and `dtrun config --keys`
 *   keys                           its model.* config keys (int, double or 0/1 int
 *                                  fields of the spec, its own sizes in spec.priv:
 *                                  path, bounds, default, help, kind); keys of the same
 *                                  path in two models are one key (the first wins)
 *   validate, build                checks the spec naming the bad field, then adds
 *                                  its tensors (dt_model_add_tensor) and sets
 *                                  seq_len / in_features / vocab_padded / tied_head
 *   init_params                    deterministic for a seed (dt_model_init_tensor)
 *   flops_per_token, describe      training FLOPs per token (per sample); a line
 *                                  for people (`dtrun plan`)
 *   arena_slots/arena_sizes,       the activation arena and the compute over
 *   forward, backward, logits_slot kernels.h (net.h; runtime/model/net_impl.h); a
 *                                  decoder stack fills stack (its embedding, block
 *                                  and final norm math) and takes net.c's chunk
 *                                  driver as forward, backward and stage_buf
 *   export_shape                   the shape export writes, and whether the
 *                                  tensor is stored transposed
 *   synthetic_batch                (feature data) the samples the trainer uses
 * and optionally config_check, unpadded_params, net_check, init_range, dims (token
 * models, for `dtrun plan`), and the KV-cache decode slots (decode_slots,
 * decode_sizes, decode, decode_logits_slot).
 */
#ifndef DT_RUNTIME_MODEL_H
#define DT_RUNTIME_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/rng.h"
#include "common/status.h"
#include "kernels/kernels.h" /* defines: dt_device_t */

#define DT_MODEL_MAX_DIMS 4
#define DT_MODEL_NAME_LEN 48

typedef struct dt_model_ops dt_model_ops;

/* A model's shape. ops says which model; each model reads its own fields (its
 * config keys) and ignores the rest. The named fields are GPT's and the MLP's; a new
 * model keeps sizes of its own in priv: a struct of its file laid over it
 * (DT_MODEL_PRIV), its keys pointing into it (DT_MODEL_PRIV_KEY), so adding a model
 * adds no field here. Config parsing, dt_model_spec_copy and the checkpoint's
 * meta.json go through the keys, so they carry priv's fields like the others. */
#define DT_MODEL_PRIV_BYTES 128
typedef struct dt_model_spec {
    const dt_model_ops *ops;
    /* gpt */
    int n_layer, n_head, n_embd, seq_len;
    int vocab_size;         /* real vocab V (0 in a config: from the data) */
    int vocab_pad_multiple; /* Vp = V rounded up to this (1 = no padding) */
    /* mlp: in_dim -> hidden_dim (x n_hidden_layers, ReLU) -> n_classes */
    int in_dim, hidden_dim, n_hidden_layers, n_classes;
    /* a model's own sizes (see above) */
    _Alignas(8) unsigned char priv[DT_MODEL_PRIV_BYTES];
} dt_model_spec;

/* The model file's struct over spec->priv (type must fit: check it with
 * DT_MODEL_PRIV_FITS(type) in the model's file). */
#define DT_MODEL_PRIV(spec, type) ((type *)(void *)(spec)->priv)
#define DT_MODEL_PRIV_FITS(type) \
    _Static_assert(sizeof(type) <= DT_MODEL_PRIV_BYTES, #type " does not fit dt_model_spec.priv")
/* dt_model_key.offset of field `field` of the model's struct in priv. */
#define DT_MODEL_PRIV_KEY(type, field) (offsetof(dt_model_spec, priv) + offsetof(type, field))

typedef struct dt_tensor_info {
    char name[DT_MODEL_NAME_LEN];
    int ndim;
    int64_t shape[DT_MODEL_MAX_DIMS];
    size_t offset; /* in elements, into the flat buffer */
    size_t numel;
    int unit;
    int decay; /* AdamW weight decay applies (matmul weights, not biases/LN/embeddings) */
    int init;  /* how it is initialised: DT_MODEL_INIT_* */
    /* Tensor parallelism (dt_model_layout_init_tp): how the tensor is cut across the
     * TP group, and where this rank's piece sits in the global tensor. At TP size 1
     * gshape = shape and goffset = offset. */
    int tp_split; /* dt_tp_split_t */
    int tp_parts; /* equal blocks along the split dimension, each cut alike (gpt's
                     fused c_attn rows q|k|v: 3); 1 otherwise */
    int64_t gshape[DT_MODEL_MAX_DIMS]; /* global shape */
    size_t goffset;                    /* offset in the global (TP 1) layout */
} dt_tensor_info;

/* How tensor parallelism (Megatron) cuts a tensor over the T ranks of a TP group. */
typedef enum dt_tp_split {
    DT_TP_REPLICATED = 0, /* every rank holds it whole (norms, row-parallel biases, wpe) */
    DT_TP_ROWS = 1,       /* dimension 0 cut in T: column-parallel weights (out features)
                             and their biases, vocabulary rows of an embedding / head */
    DT_TP_COLS = 2,       /* dimension 1 cut in T: row-parallel weights (in features) */
} dt_tp_split_t;

typedef struct dt_unit_info {
    size_t offset; /* first element */
    size_t numel;
    int gunit;            /* the unit's number in the whole model (= its index but in a stage layout) */
    int tensor0, n_tensors; /* its tensors in the table: [tensor0, tensor0 + n_tensors) */
} dt_unit_info;

/* Pipeline parallelism (models with ops->pipeline): the blocks cut into chunks
 * (virtual stages) in pipeline order. A chunk runs blocks [l0, l1); first: it holds
 * the embedding (unit 0) and starts from the tokens; last: it holds the final unit
 * (final norm, the head and the loss). */
#define DT_MODEL_MAX_CHUNKS 64
typedef struct dt_model_chunk {
    int l0, l1;
    int first, last;
} dt_model_chunk;

typedef struct dt_model_layout {
    dt_model_spec spec;
    int seq_len;      /* positions per sample: rows of the loss per sample (1: feature rows) */
    int in_features;  /* features per sample (feature data), else 0 */
    int vocab_padded; /* width of the logits / embedding rows (token models), else 0 */
    int tied_head;    /* the LM head is unit 0's embedding used again (net.h: the hook
                         order; gpt 1, llama per tie_word_embeddings) */
    dt_tensor_info *tensors;
    int n_tensors;
    dt_unit_info *units;
    int n_units;
    size_t n_params; /* elements in the flat buffer */
    /* Tensor parallelism: this layout is rank tp_rank's piece of a model cut over
     * tp_size ranks (tensor shapes are local; gshape/goffset say where each piece
     * sits in `global`, the whole model's layout, owned; NULL at tp_size 1).
     * sequence_parallel: activations between the TP regions are cut along the
     * tokens (the model's arena and forward read it). */
    int tp_size, tp_rank, sequence_parallel;
    struct dt_model_layout *global;
    /* Pipeline parallelism (dt_model_layout_init_stage): this layout holds the units
     * of its chunks only (in global order; tensors[].unit and the hooks number them
     * locally, units[].gunit globally) and, like a TP piece, keeps the whole model's
     * layout in `global` (goffset: the offset there). Whole-model layouts: pp_size 1,
     * n_chunks 1, chunks[0] = {0, L, 1, 1} (L blocks; {0, 0, 1, 1} for a model
     * without ops->pipeline). */
    int pp_size, pp_rank;
    int n_chunks;                               /* the chunks held (virtual stages), >= 1 */
    dt_model_chunk chunks[DT_MODEL_MAX_CHUNKS]; /* in pipeline order */
    int tied;          /* the whole model's head is tied to the embedding (tied_head of a
                          stage layout is 1 only when it holds both) */
    int has_tied_copy; /* it holds the last chunk, the head is tied to the embedding, and
                          the embedding is not here: the head's weight is net->head_w */
    /* Activation recomputation (dt_model_layout_set_recompute; 0 = none after init):
     * the policy (dt_model_recompute_t) of the checkpointed blocks and every K: block j
     * of its chunk (the whole model: block l) is checkpointed when j % K == 0. The
     * arena sizes from it and forward/backward follow it (dt_model_block_recompute). */
    int recompute, recompute_every;
    /* Context parallelism (dt_model_layout_set_cp; 0 or 1 = off): this rank computes
     * seq_len / cp_size positions of every sequence, the chunks cp_rank and
     * 2 cp_size - 1 - cp_rank of 2 cp_size (dt_model_cp_row); the arena, the stage buffers and the loss rows are that many
     * per sequence (dt_model_rows), and the attention passes key/value blocks around
     * the CP group (net.h: dt_net_cp_ops). */
    int cp_size, cp_rank;
    int cp_ulysses; /* the attention exchanges heads (all-to-all), not key/value blocks */
} dt_model_layout;

/* Context parallelism's load balance: a sequence of T positions is cut into 2C chunks
 * of T / 2C and CP rank r holds chunks r and 2C - 1 - r (the causal attention's work
 * is then equal on every rank). The global position of local row t (0 <= t < T / C)
 * of rank r; T % 2C == 0 (C 1: t). */
static inline int dt_model_cp_row(int T, int cp_size, int cp_rank, int t) {
    if (cp_size <= 1) return t;
    int L = T / (2 * cp_size);
    return t < L ? cp_rank * L + t : (2 * cp_size - 1 - cp_rank) * L + (t - L);
}

/* The positions per sequence this rank computes: seq_len, or seq_len / cp_size. */
static inline int dt_model_rows(const dt_model_layout *l) {
    return l->cp_size > 1 ? l->seq_len / l->cp_size : l->seq_len;
}
/* Makes layout l a context-parallel rank's (before the net is made); ulysses: the
 * all-to-all over heads instead of the ring. */
static inline void dt_model_layout_set_cp(dt_model_layout *l, int cp_size, int cp_rank, int ulysses) {
    l->cp_size = cp_size > 1 ? cp_size : 0;
    l->cp_rank = cp_size > 1 ? cp_rank : 0;
    l->cp_ulysses = cp_size > 1 && ulysses;
}

/* Activation recomputation policies (config activation_checkpointing.policy).
 * none: a block keeps every activation its backward reads. selective: it keeps its
 * GEMM outputs (qkv, the MLP's first matmul, the residual after attention) and its
 * output; its backward first recomputes the cheap parts (norms, attention with its
 * saved probabilities, the MLP activation) into one block's scratch. full: it keeps
 * its output only (the next block's input); its backward first reruns its forward
 * from its input up to the MLP activation (the last GEMM's output is not needed). A
 * recomputed block gets FWD_PRE/FWD_POST hooks around the recompute, inside the
 * backward and just before its BWD_PRE (net.h), so FSDP gathers its unit first. The
 * recompute runs the forward's ops in the forward's order, so gradients equal those
 * without recomputation bitwise on a deterministic device. */
/* X(enum suffix, name) in numeric order: the names of dt_model_recompute_name and of
 * the config's activation_checkpointing.policy. */
#define DT_MODEL_RECOMPUTE_MAP(X) X(NONE, "none") X(SELECTIVE, "selective") X(FULL, "full")
typedef enum dt_model_recompute {
    DT_MODEL_RECOMPUTE_NONE = 0,
    DT_MODEL_RECOMPUTE_SELECTIVE = 1,
    DT_MODEL_RECOMPUTE_FULL = 2,
} dt_model_recompute_t;

/* What a model trains on. */
typedef enum dt_model_data {
    DT_MODEL_DATA_TOKENS = 0,   /* token sequences (B, T) from data.train */
    DT_MODEL_DATA_FEATURES = 1, /* feature rows (B, in_features) and class labels, synthetic */
} dt_model_data_t;

/* How dt_model_init_tensor fills a tensor. */
typedef enum dt_model_init {
    DT_MODEL_INIT_NORMAL = 0, /* normal(0, std) */
    DT_MODEL_INIT_RESIDUAL = 1, /* normal(0, resid_std) */
    DT_MODEL_INIT_ZERO = 2,
    DT_MODEL_INIT_ONE = 3,
    DT_MODEL_INIT_EMBED = 4, /* normal(0, std) */
} dt_model_init_t;

/* What a model key's field holds, and how config, meta.json and `dtrun config
 * --keys` read and write it. */
typedef enum dt_model_key_kind {
    DT_MODEL_KEY_INT = 0,   /* an int field; JSON integers */
    DT_MODEL_KEY_FLOAT = 1, /* a double field; JSON numbers (rope_theta, rms_norm_eps) */
    DT_MODEL_KEY_BOOL = 2,  /* an int field holding 0 or 1; JSON true/false only */
} dt_model_key_kind_t;

/* One model.* config key: a field of dt_model_spec (a named one, or one in priv:
 * DT_MODEL_PRIV_KEY) of the key's kind. min and max bound INT and FLOAT keys
 * (inclusive); BOOL keys ignore them. */
typedef struct dt_model_key {
    const char *path;  /* "model.n_layer" */
    size_t offset;     /* offsetof(dt_model_spec, field), or DT_MODEL_PRIV_KEY(type, field) */
    double min, max;
    const char *def;   /* default as JSON text */
    const char *help;
    dt_model_key_kind_t kind;
} dt_model_key;

/* Bytes of a key's field: sizeof(double) for FLOAT, sizeof(int) otherwise. */
size_t dt_model_key_size(const dt_model_key *k);
/* A key's value in spec as a double (an int or 0/1 exactly), and setting it
 * (INT and BOOL fields get the value converted to int; the caller checks bounds). */
double dt_model_key_get(const dt_model_spec *spec, const dt_model_key *k);
void dt_model_key_set(dt_model_spec *spec, const dt_model_key *k, double v);
/* The key of ops whose path is path ("model.rope_theta"), or NULL. */
const dt_model_key *dt_model_key_find(const dt_model_ops *ops, const char *path);

/* A decoder-only transformer's widths, for `dtrun plan`'s activation formula
 * (runtime/tools/plan.h restates the arena's arithmetic from them; a unit test
 * holds the two together). */
typedef struct dt_model_dims {
    int n_layer, hidden, n_head, n_kv_head, head_dim;
    int mlp_in;     /* width of the MLP's first matmul output: 4C (gpt), 2I gate|up (llama) */
    int mlp_act;    /* width of its activation output: 4C (gelu), I (swiglu) */
    int norm_stats; /* fp32 values saved per row by a norm: 2 (LayerNorm), 1 (RMSNorm) */
} dt_model_dims;

struct dt_net;

struct dt_model_ops {
    const char *name; /* model.type */
    const char *help; /* "GPT-2 on text/tokens" */
    dt_model_data_t data;
    const dt_model_key *keys;
    int n_keys;
    /* Rules across the model's keys of a config (vocab_size may be 0): 0, or 1 with
     * the message ("model.n_embd: expected ...") in msg. */
    int (*config_check)(const dt_model_spec *s, char *msg, size_t len); /* (optional) */

    /* layout */
    dt_status_t (*validate)(const dt_model_spec *s);
    void (*build)(dt_model_layout *l);
    void (*init_params)(const dt_model_layout *l, uint64_t seed, float *params);
    /* (optional) elements [offset, offset + count) of what init_params writes, into
     * dst (count floats), so a rank initialises only what it holds
     * (dt_model_init_tensor_range); NULL: dt_model_init_range builds the whole buffer */
    void (*init_range)(const dt_model_layout *l, uint64_t seed, size_t offset, size_t count, float *dst);
    size_t (*unpadded_params)(const dt_model_layout *l); /* (optional) NULL: n_params */
    double (*flops_per_token)(const dt_model_layout *l);
    /* One line for people (`dtrun plan`): "gpt, 4 layers, ..., N parameters"; note
     * (may be "") says where the vocabulary came from. */
    void (*describe)(const dt_model_layout *l, const char *note, char *buf, size_t len);
    /* (optional; NULL: the model has no tensor-parallel forward) the model's own rules
     * for a TP size (heads, widths divisible by tp): 0, or 1 with the message naming
     * the model key. dt_model_tp_check adds the generic ones. */
    int (*tp_check)(const dt_model_spec *s, int tp, char *msg, size_t len);
    /* (optional) the attention's query and key/value heads (context parallelism's
     * Ulysses mode cuts them) */
    void (*heads)(const dt_model_spec *s, int *n_head, int *n_kv_head);
    /* 1 when the model can be cut into pipeline stages: its units are [embedding =
     * unit 0][block l = unit 1 + l, l < L][final = unit L + 1: the final norm, and the
     * head when untied], tensor 0 is the (Vp, C) embedding a tied head uses, and
     * forward/backward run the layout's chunk net->chunk (net.h). 0: whole model only. */
    int pipeline;

    /* compute (net.h): slots 0-4 of the arena are DT_NET_SLOT_TOKENS, _TARGETS,
     * _FEATURES, _LOSSES and _POSITIONS (a token model sizes it in every chunk, B*T
     * ints, for packed batches); sizes[] comes zeroed */
    int (*arena_slots)(const dt_model_layout *l);
    void (*arena_sizes)(const dt_device_t *dev, const dt_model_layout *l, int B, size_t *sizes);
    dt_status_t (*net_check)(const dt_model_layout *l); /* (optional) at dt_net_init */
    /* (optional; token models: `dtrun plan` needs it) the widths above */
    void (*dims)(const dt_model_layout *l, dt_model_dims *out);
    /* Forward from the uploaded batch; the losses (rows floats) into the losses slot
     * when with_loss. */
    void (*forward)(struct dt_net *net, int with_loss);
    void (*backward)(struct dt_net *net, float dscale);
    /* (optional; pipeline models) the model's embedding, block and final norm math
     * that net.c's chunk driver runs (net_impl.h: dt_net_stack); forward, backward
     * and stage_buf are then the driver's */
    const struct dt_net_stack *stack;
    int logits_slot; /* arena slot of the (B*T, vocab_padded) logits; -1: none */
    /* (pipeline models) the device buffer of the current arena and chunk behind
     * net.h's dt_net_stage_buf (which: dt_net_stage_io) */
    void *(*stage_buf)(struct dt_net *net, int which);

    /* (optional) KV-cache decoding (net.h: dt_net_decode_init, dt_net_decode): one
     * sequence, one position at a time, each position's keys and values kept in a
     * cache in the decode arena, so generating n tokens computes n positions instead
     * of n full forwards. decode_slots/decode_sizes size that arena as
     * arena_slots/arena_sizes do the training one, for B = 1 and T = 1 plus the cache
     * of seq_len positions (net.h's five slots first; only the tokens slot is used).
     * decode runs position pos (0 <= pos < seq_len) of the token in the tokens
     * slot, positions 0..pos-1 having been decoded before: it writes the cache rows of
     * pos and the logits (vocab_padded) into decode_logits_slot. NULL decode:
     * sampling runs the full forward at every step. */
    int (*decode_slots)(const dt_model_layout *l);
    void (*decode_sizes)(const dt_device_t *dev, const dt_model_layout *l, size_t *sizes);
    void (*decode)(struct dt_net *net, int pos);
    int decode_logits_slot;

    /* export: the shape written for tensor t (ndim <= 2); 1 when the tensor is
     * written transposed ((out, in) stored as (in, out), HF Conv1D) */
    int (*export_shape)(const dt_model_layout *l, int t, int64_t shape[2], int *ndim);

    /* (optional; feature data needs it) n samples from global sample id `first`
     * on; a sample depends only on (seed, id). x: (n, in_features), y: (n). */
    void (*synthetic_batch)(const dt_model_layout *l, uint64_t seed, uint64_t first, int n, float *x,
                            int32_t *y);
};

/* ---- the registry (registry.c) ---- */

/* The models dtrun ships, for code that must name one (tests); everything else
 * goes through the registry. A new model needs a line here only if something names
 * it. */
extern const dt_model_ops dt_model_gpt; /* gpt.c */
extern const dt_model_ops dt_model_llama; /* llama.c */
extern const dt_model_ops dt_model_mlp; /* mlp.c */

/* The model called name, or NULL. */
const dt_model_ops *dt_model_lookup(const char *name);
int dt_model_count(void);
const dt_model_ops *dt_model_at(int i);
/* "gpt, mlp" into buf. */
void dt_model_names(char *buf, size_t len);

/* ---- layouts (model.c) ---- */

/* Checks the spec (names the bad field) and builds the table. */
dt_status_t dt_model_layout_init(const dt_model_spec *spec, dt_model_layout *out);
void dt_model_layout_free(dt_model_layout *l);
/* The layout of rank tp_rank's piece of the model cut over tp_size ranks (build
 * marks each tensor's split with dt_model_add_tensor_tp; the shapes become local, the
 * global layout is kept in out->global). tp_size 1 is dt_model_layout_init. The TP
 * size must pass dt_model_tp_check. */
dt_status_t dt_model_layout_init_tp(const dt_model_spec *spec, int tp_size, int tp_rank, int sequence_parallel,
                                    dt_model_layout *out);
/* Whether a model can be cut over tp ranks: 0, or 1 with a message naming the key
 * (tensor_parallel.size, or the model key that does not divide). */
int dt_model_tp_check(const dt_model_spec *spec, int tp, char *msg, size_t len);
/* The pieces of local elements [offset, offset + count) of a TP layout in the global
 * layout, in local order (global offsets increase too): fn(ctx, local_offset,
 * global_offset, n, replicated), replicated = 1 for tensors every TP rank holds
 * whole (when tp_size > 1). A TP-1 layout gives one call per tensor. */
typedef void (*dt_model_segment_fn)(void *ctx, size_t local_offset, size_t global_offset, size_t n, int replicated);
void dt_model_tp_segments(const dt_model_layout *l, size_t offset, size_t count, dt_model_segment_fn fn, void *ctx);
/* Reads from the global layout: elements [goffset, goffset + n) into dst. */
typedef dt_status_t (*dt_model_global_read_fn)(void *ctx, size_t goffset, size_t n, float *dst);
/* Local elements [offset, offset + count) of l into dst, read from the global
 * layout through read in spans of at most a few MiB (so a row-parallel weight's
 * thousands of short rows cost one read per span, not one each). At tp_size 1 one
 * read of [offset, offset + count). */
dt_status_t dt_model_tp_fill(const dt_model_layout *l, size_t offset, size_t count, float *dst,
                             dt_model_global_read_fn read, void *ctx);

/* ---- pipeline stages (stage.c) ---- */

/* X(enum suffix, name) in numeric order: the names of dt_pp_partition_name and of the
 * config's pipeline.partition. */
#define DT_PP_PARTITION_MAP(X) X(UNIFORM, "uniform") X(PARAMETERS, "parameters") X(FLOPS, "flops")
typedef enum dt_pp_partition {
    DT_PP_PARTITION_UNIFORM = 0,    /* as even block counts as possible */
    DT_PP_PARTITION_PARAMETERS = 1, /* balance the parameters held */
    DT_PP_PARTITION_FLOPS = 2,      /* balance the training FLOPs per token */
} dt_pp_partition_t;

/* "uniform", "parameters", "flops"; parsing: 0, or -1 for another name. */
const char *dt_pp_partition_name(dt_pp_partition_t kind);
int dt_pp_partition_parse(const char *name, dt_pp_partition_t *out);
/* The blocks of the whole model (global: a whole-model layout of a pipeline model) cut
 * into n = stages * virtual_stages chunks in pipeline order (chunk k = virtual stage
 * k: rank k % stages, its chunk k / stages; Megatron's interleaving): chunk k holds
 * blocks [bounds[k], bounds[k+1]), bounds[0] = 0, bounds[n] = L, each chunk >= 1
 * block (bounds has n + 1 entries). uniform: as even as possible, the extra blocks to
 * the LAST chunks (the first holds the embedding); parameters / flops: contiguous
 * ranges minimising the largest chunk's cost (dt_model_pp_chunk_cost), ties giving
 * the later chunks more blocks. DT_STATUS_CONFIG naming pipeline.stages,
 * pipeline.virtual_stages and the model's layers when n > L or the model has no
 * pipeline stages. */
dt_status_t dt_model_pp_partition(const dt_model_layout *global, int stages, int virtual_stages,
                                  dt_pp_partition_t kind, int *bounds);
/* Chunk k's (of bounds, n chunks where bounds[n] = L) parameters and training FLOPs
 * per token. Parameters: the numel of its units, chunk 0 with the embedding unit,
 * the last with the final unit. FLOPs: per block 6 x its parameters + its share of
 * the attention term of dt_model_flops_per_token, the head 6 x C x Vp (+ 6 x the
 * final norm's), the embedding lookup 0; the chunks' FLOPs sum to
 * dt_model_flops_per_token. */
void dt_model_pp_chunk_cost(const dt_model_layout *global, const int *bounds, int k, double *params, double *flops);
/* The layout of pipeline rank pp_rank (0..pp_size-1) holding chunks k = pp_rank +
 * j * pp_size (j < virtual_stages) of bounds (pp_size * virtual_stages chunks), of TP
 * piece (tp_size, tp_rank, sp): the units of its chunks in global order (unit 0 when
 * it holds chunk 0, its blocks' units, unit L+1 when it holds the last chunk), their
 * tensors with local offsets in one flat buffer and goffset their offset in the whole
 * model's (TP 1, PP 1) layout, kept in out->global. pp_size 1 with virtual_stages 1
 * is dt_model_layout_init_tp. */
dt_status_t dt_model_layout_init_stage(const dt_model_spec *spec, int tp_size, int tp_rank, int sp, int pp_size,
                                       int pp_rank, int virtual_stages, const int *bounds, dt_model_layout *out);
/* The local number of whole-model unit gunit in l, or -1 when l does not hold it. */
int dt_model_local_unit(const dt_model_layout *l, int gunit);
/* The most blocks a chunk of l runs (what its arena is sized for). */
int dt_model_max_chunk_blocks(const dt_model_layout *l);
/* 1 when l holds a first / a last chunk. */
int dt_model_has_first(const dt_model_layout *l);
int dt_model_has_last(const dt_model_layout *l);

/* ---- activation recomputation (stage.c) ---- */

/* "none", "selective", "full"; parsing: 0, or -1 for another name. */
const char *dt_model_recompute_name(dt_model_recompute_t policy);
int dt_model_recompute_parse(const char *name, dt_model_recompute_t *out);
/* Sets l's policy and K (every >= 1) before its net is made (the arena sizes from it). */
void dt_model_layout_set_recompute(dt_model_layout *l, dt_model_recompute_t policy, int every);
/* The policy block j of a chunk (its position there) runs under: l's policy when
 * j % every == 0, else none. */
dt_model_recompute_t dt_model_block_recompute(const dt_model_layout *l, int j);
/* The same for whole-model block `block` of the chunk that holds it in l (NONE when
 * l holds it in no chunk): what the data-parallel use sequence asks. */
dt_model_recompute_t dt_model_gblock_recompute(const dt_model_layout *l, int block);
/* Checkpointed blocks among the first n of a chunk: ceil(n / every), 0 under none. */
int dt_model_recompute_count(const dt_model_layout *l, int n);

/* A model's per-block arena slots under recomputation (gpt.c, llama.c): `first` slots
 * before the blocks', per_block (<= 32) per block, and keep[policy] the bit set of the
 * slots a block keeps from its forward to its backward under that policy (every slot
 * under NONE). After the slots of the most blocks a chunk of the layout runs comes one
 * block's scratch set: the slots checkpointed blocks drop, rewritten by the next block
 * and refilled by the block's recompute in its backward. */
typedef struct dt_model_block_slots {
    int first, per_block;
    unsigned keep[3]; /* by dt_model_recompute_t */
} dt_model_block_slots;
/* Arena slot of block slot s of the block at position j of its chunk. */
int dt_model_block_slot(const dt_model_layout *l, const dt_model_block_slots *b, int j, int s);
/* The arena's slot count: first + (most blocks of a chunk + 1) x per_block. */
int dt_model_block_slot_count(const dt_model_layout *l, const dt_model_block_slots *b);
/* sizes[] of the block slots (and the scratch set) from one block's whole set of
 * per_block sizes: each block what its policy keeps, the scratch set what
 * checkpointed blocks drop. */
void dt_model_block_sizes(const dt_model_layout *l, const dt_model_block_slots *b, const size_t *set, size_t *sizes);

/* vocab_size rounded up to vocab_pad_multiple (the rows of the embedding and head). */
int dt_model_vocab_padded(const dt_model_spec *spec);

/* Index of the tensor called name, or -1. */
int dt_model_find(const dt_model_layout *l, const char *name);
/* Parameters the model would have without vocab padding (GPT-2 124M: 124,439,808). */
size_t dt_model_unpadded_params(const dt_model_layout *l);
/* Fills params (fp32, n_params) as the model does (gpt: normal(0, 0.02), residual
 * projections normal(0, 0.02/sqrt(2*n_layer)), biases 0, LayerNorm weights 1, padded
 * vocab rows 0). Identical on every rank for the same seed. */
void dt_model_init_params(const dt_model_layout *l, uint64_t seed, float *params);
/* Elements [offset, offset + count) of dt_model_init_params' buffer into dst, the
 * same values; without a whole buffer when the model has init_range. */
void dt_model_init_range(const dt_model_layout *l, uint64_t seed, size_t offset, size_t count, float *dst);
/* Training FLOPs per token (forward + backward): 6*N + 12*L*C*T for gpt (N the
 * non-embedding-position matmul parameters as in the PaLM appendix: all params
 * but wpe), 6*N for mlp (per sample). */
double dt_model_flops_per_token(const dt_model_layout *l);
/* dst gets src's fields that are keys of src->ops (the rest 0) and ops. */
void dt_model_spec_copy(const dt_model_spec *src, dt_model_spec *dst);

/* For model files: appends a tensor to unit `unit` (units in order, tensors of a
 * unit contiguous); name is printf-formatted. */
void dt_model_add_tensor(dt_model_layout *l, int unit, int decay, dt_model_init_t init, int ndim,
                         const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
/* The same for a tensor cut by tensor parallelism: shape is the global shape; in a
 * TP layout the tensor gets its local shape (dimension 0 or 1 divided by tp_size). */
void dt_model_add_tensor_tp(dt_model_layout *l, int unit, int decay, dt_model_init_t init, dt_tp_split_t split,
                            int parts, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));
/* For model files: fills tensor i per its init kind from its own RNG stream (seed, i),
 * with std for NORMAL/EMBED and resid_std for RESIDUAL. */
void dt_model_init_tensor(const dt_model_layout *l, int i, uint64_t seed, float *params, double std,
                          double resid_std);
/* For model files: the part of tensor i that falls in the flat range [offset,
 * offset + count), written at dst[its element offset - offset]: the values
 * dt_model_init_tensor gives (its stream is generated up to the range's end). */
void dt_model_init_tensor_range(const dt_model_layout *l, int i, uint64_t seed, size_t offset, size_t count,
                                float *dst, double std, double resid_std);

#endif /* DT_RUNTIME_MODEL_H */
