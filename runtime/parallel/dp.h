/*
 * dp.h - data parallelism: DDP with overlapped bucketed all-reduce, ZeRO-1/2,
 * FSDP (ZeRO-3) and hybrid sharding, as one object the trainer owns.
 *
 * The object owns the model state (parameters, gradients, Adam m and v) in the
 * form its strategy needs, installs the net's unit hook (net.h) and talks to
 * the communicator (comm.h) while backward runs. The trainer's step becomes:
 *
 *     dt_dp_step_begin(dp);                      // zero gradients
 *     for each micro-step a:
 *         dt_dp_micro_begin(dp, a == accum - 1);
 *         dt_net_forward(...); dt_net_backward(...);   // hooks fire here
 *         dt_dp_micro_end(dp);
 *     dt_dp_reduce_finish(dp);                   // wait for what is left
 *     dt_dp_grad_norm(dp, &norm);                // global, across shards
 *     dt_dp_optimizer_step(dp, &adamw_args);     // local shard, then re-gather
 *
 * Layout. The model's flat buffer (model.h) is cut into buckets of whole units
 * in reverse parameter order: bucket 0 holds the last units (the first whose
 * gradients backward finishes). The first bucket closes at min(1 MiB,
 * reduce_bucket_size), the others at reduce_bucket_size elements; a unit is
 * never split (a unit bigger than the cap is a bucket of its own). FSDP and
 * HSDP use one bucket per unit. Each bucket of `count` elements is sharded over
 * the n_shards ranks of its shard group in padded slices of
 * slice = ceil(count / n_shards): shard rank s owns [s * slice, min((s + 1) *
 * slice, count)) of the bucket. The full buffers of ZeRO-1/2 (parameters, and
 * ZeRO-1's gradients) hold every bucket padded to slice * n_shards (the
 * "padded layout"), so reduce_scatter and all_gather work in place; a rank's
 * shard buffers (m, v, ZeRO-2/FSDP gradients, FSDP parameters) concatenate its
 * slices. DDP is the case n_shards = 1: no padding, everything local.
 *
 * Strategies (CPU fp32: the parameters are the master weights; Ψ elements,
 * Ψp = Σ slice * n_shards the padded count, N the shard group size):
 *   ddp    all_reduce (avg) of each bucket as soon as backward finished its
 *          units, on the last micro-step only. Model state 16Ψ bytes.
 *   zero1  reduce_scatter (avg) of each bucket on the last micro-step into the
 *          full gradient buffer, AdamW on the local slices, all_gather of the
 *          parameters. 4Ψp params + 4Ψp grads + 8Ψp/N m, v.
 *   zero2  gradients go to a bucket working buffer (category COMM) that is
 *          reduce-scattered every micro-step as soon as the bucket is done and
 *          added to the local gradient shard; only the shard is kept.
 *          4Ψp params + 12Ψp/N.
 *   fsdp   parameters kept as shards: each unit is all-gathered into a unit
 *          buffer (COMM) before its forward and again before its backward and
 *          released after; the next two units' gathers are prefetched while the
 *          current one computes. Gradients as zero2, per unit. 16Ψp/N.
 *   hsdp   fsdp within a node (shard group = the ranks of one node); the
 *          reduce-scattered gradient slices are all-reduced (avg) across the
 *          replica groups (same local rank on every node).
 * The bucket and unit working buffers are category COMM, reported apart from
 * the model state. With zero_optimization.overlap_comm false nothing overlaps
 * compute, for comparison: ddp/zero1 reduce after backward; zero2/fsdp, whose
 * gradients live only in per-bucket buffers, reduce each bucket when backward
 * finishes it and wait for it there; FSDP does not prefetch.
 *
 * Every rank must start from identical parameters: dt_dp_init fills only the
 * ranges a rank holds (from the seed or dt_dp_opts.fill), in bounded host chunks,
 * so no rank of a sharded strategy ever holds the whole model in host memory; the
 * ranks compare what the parameters come from (seed or weight files, and the
 * layout) and stop with MISMATCH when it differs. Gradient clipping uses the global norm: sums of squares of
 * the local slices, summed over the shard group in double precision.
 *
 * Errors inside hooks (a failed collective) are recorded and returned by the
 * next dt_dp_* call (micro_end, reduce_finish, ...); the net keeps pointing at
 * valid memory meanwhile.
 *
 * Every strategy runs on any device: state lives in device memory and moves
 * through device ops and the communicator only (gradient shards accumulate in
 * the compute dtype, as ZeRO-2's 2Ψ + 14Ψ/N assumes). With a bf16 compute dtype dp
 * keeps fp32 master weights beside m and v (same layout, category MASTER) and
 * AdamW updates them and writes the bf16 parameters: 2 + 2 + 4 + 4 + 4 = 16 bytes
 * per parameter, as in the ZeRO paper.
 */
#ifndef DT_RUNTIME_DP_H
#define DT_RUNTIME_DP_H

#include <stddef.h>

#include "common/status.h"
#include "kernels/kernels.h" /* defines: dt_device_t, dt_adamw_args_t */
#include "runtime/comm/comm.h"    /* defines: dt_comm_t */
#include "runtime/config/config.h"  /* defines: dt_strategy_t */
#include "runtime/model/model.h"   /* defines: dt_model_layout */
#include "runtime/model/net.h"     /* defines: dt_net_t */

/* ---- plan: buckets, slices and runs (pure arithmetic, no communication) ---- */

typedef struct dt_dp_bucket {
    int unit_lo, unit_hi;  /* units [unit_lo, unit_hi] */
    size_t offset, count;  /* range in the model's flat layout */
    size_t padded_offset;  /* start in the padded layout (full buffers) */
    size_t slice;          /* elements per shard: ceil(count / n_shards) */
    size_t shard_offset;   /* start of the slice in the local shard buffers */
} dt_dp_bucket;

/* A run of this rank's owned elements with one weight-decay flag. */
typedef struct dt_dp_run {
    size_t offset, count;  /* model layout */
    size_t padded_offset;  /* same elements in the padded layout */
    size_t shard_offset;   /* same elements in the shard buffers */
    int decay;
} dt_dp_run;

typedef struct dt_dp_plan {
    int n_shards, shard_rank;
    dt_dp_bucket *buckets; /* reverse parameter order: bucket 0 ends the buffer */
    int n_buckets;
    int *unit_bucket;      /* (n_units) bucket of each unit */
    dt_dp_run *runs;       /* this rank's slices in address order, split at decay changes */
    int n_runs;
    size_t padded_total;   /* Σ slice * n_shards */
    size_t shard_total;    /* Σ slice: elements of each shard buffer */
} dt_dp_plan;

/* Cuts the layout into buckets: the first closes at first_cap elements, the
 * others at cap (cap 0: one bucket per unit). INVALID on bad arguments. */
dt_status_t dt_dp_plan_init(const dt_model_layout *layout, int n_shards, int shard_rank,
                            size_t first_cap, size_t cap, dt_dp_plan *out);
void dt_dp_plan_free(dt_dp_plan *plan);

/* ---- the data-parallel object ---------------------------------------------- */

typedef struct dt_dp dt_dp_t;

typedef struct dt_dp_opts {
    dt_strategy_t strategy;
    int overlap_comm;        /* launch reductions during backward */
    size_t bucket_elems;     /* zero_optimization.reduce_bucket_size */
    int local_world_size;    /* ranks per node (hsdp's shard group); 0 = world */
    uint64_t seed;           /* parameter initialisation */
    /* dtype of gradient all-reduces / reduce-scatters (communication_data_type): when
     * it differs from the compute dtype, ddp and zero1 cast each bucket into a
     * buffer of this dtype on the device, reduce that, and cast the result back
     * (bf16 compute reduced in fp32: one rounding instead of one per hop on NCCL;
     * fp32 compute over bf16: half the bytes on the wire). zero2/fsdp/hsdp reduce
     * in the compute dtype. The zero value is fp32. */
    dt_dtype_t reduce_dtype;
    /* Where the initial parameters come from: NULL = the seed (dt_model_init_range);
     * else fill writes elements [offset, offset + count) of the model's flat fp32
     * buffer into dst (pretrained weights). init_id names the source (a hash of the
     * seed, or of the weight files' headers): ranks compare it. */
    dt_status_t (*fill)(void *ctx, size_t offset, size_t count, float *dst);
    void *fill_ctx;
    uint64_t init_id;
    /* Tensor parallelism (runtime/parallel/tp.h): comm passed to dt_dp_init is then the
     * DP group (the ranks with this rank's TP rank), `all` every rank (agreements and
     * per-rank figures: dt_dp_all_gather_f64, dt_dp_world_size, dt_dp_rank) and `tp`
     * the TP group, over which the gradient norm also sums (the tensors every TP rank
     * holds whole, identical there, counted once). NULL: no tensor parallelism. */
    dt_comm_t *all, *tp;
    /* Pipeline parallelism: the PP group (this rank's stage and the others holding the
     * rest of the model), over which the gradient norm also sums; `all` is then set
     * too. NULL: no pipeline. */
    dt_comm_t *pp;
    /* zero_optimization.offload_optimizer (ZeRO-Offload; zero1/zero2/fsdp/hsdp, not
     * ddp): the fp32 master weights and Adam m, v of this rank's shard live in host
     * memory (dev->ops->host_alloc when offload_pinned, else plain memory), beside a
     * host copy of the gradient shard in the compute dtype. Each bucket's reduced
     * gradient slice goes down (copy_async) as soon as its last micro-step's
     * reduction completes, while backward goes on; the step waits for the copies,
     * runs AdamW on the host (dt_host_adamw, host_threads threads, <= 0: OpenMP's
     * default) run by run, writing the new parameters in the compute dtype over the
     * host gradients, and sends each run back up as soon as it is updated. Device
     * model state: the parameters and gradients of the strategy only. */
    int offload;
    int offload_pinned;
    int host_threads;
} dt_dp_opts;

/* Allocates the model state for the strategy, initialises the parameters from
 * the seed or opts->fill, checks their source across ranks, binds net to them and installs the hook.
 * comm is the world communicator (NULL for one rank); dp does not own it.
 * Collective when comm is given. */
dt_status_t dt_dp_init(dt_dp_t **out, const dt_dp_opts *opts, dt_device_t *dev,
                       const dt_model_layout *layout, dt_net_t *net, dt_comm_t *comm);
/* Waits for anything in flight, releases everything (NULL ok). */
void dt_dp_free(dt_dp_t *dp);

const dt_dp_plan *dt_dp_get_plan(const dt_dp_t *dp);

/* Zeroes the gradients (start of an optimizer step). */
dt_status_t dt_dp_step_begin(dt_dp_t *dp);
/* Before each micro-step's forward; last = 1 on the last of the step. */
void dt_dp_micro_begin(dt_dp_t *dp, int last);
/* After each micro-step's backward: reports hook errors; with overlap off,
 * ZeRO-2/FSDP reduce this micro-step's gradients here. */
dt_status_t dt_dp_micro_end(dt_dp_t *dp);
/* After the last micro-step: launches what was not launched and waits for all
 * gradient reductions; gradients (full or shard) are then averaged over ranks. */
dt_status_t dt_dp_reduce_finish(dt_dp_t *dp);
/* Global L2 norm of the averaged gradient (collective in the shard group). */
dt_status_t dt_dp_grad_norm(dt_dp_t *dp, double *norm);
/* AdamW on this rank's slices, then ZeRO-1/2 all-gather the parameters; FSDP
 * drops its gathered units (they are stale). */
dt_status_t dt_dp_optimizer_step(dt_dp_t *dp, const dt_adamw_args_t *args);
/* Milliseconds the caller's thread spent blocked on communication since the
 * last call (the step's exposed communication time). */
double dt_dp_take_comm_ms(dt_dp_t *dp);
/* Hook errors (after a forward used for evaluation). */
dt_status_t dt_dp_check(dt_dp_t *dp);

/* Collective over all ranks: out[r * n + i] = rank r's vals[i], in double
 * precision (about 48 bits: each value travels as two floats). out has
 * world_size * n entries. Works for one rank without a communicator. */
dt_status_t dt_dp_all_gather_f64(dt_dp_t *dp, const double *vals, int n, double *out);
int dt_dp_world_size(const dt_dp_t *dp);
int dt_dp_rank(const dt_dp_t *dp);

/* Collective over the shard group (every rank of it calls it with the same range):
 * elements [offset, offset + count) of the current parameters, in the compute dtype,
 * into dst (device memory of count elements). FSDP gathers the buckets the range
 * touches; the other strategies copy from their full buffer. (The pipeline's tied
 * head copy.) */
dt_status_t dt_dp_params_range(dt_dp_t *dp, size_t offset, size_t count, void *dst);

/* Collective: the full fp32 parameters in the model's layout (n_params
 * floats, host) on every rank. */
dt_status_t dt_dp_gather_params(dt_dp_t *dp, float *out);

/* ---- checkpoint support -------------------------------------------------------- */

/* A range of the fp32 state this rank holds: global element offset in the
 * model layout, count, and where its master parameters (CPU fp32: the
 * parameters), Adam m and v live. */
typedef struct dt_dp_range {
    size_t offset, count;
    float *param, *m, *v;
    /* With fp32 masters (bf16 compute): the range's parameters in the compute
     * dtype, refreshed from param after a load; NULL when param is the parameters. */
    void *cparam;
    /* 1: param, m and v are host memory (optimizer offload), read and written in
     * place; 0: device memory. */
    int host;
} dt_dp_range;

/* 1 when the parameters are kept in the compute dtype beside fp32 master weights
 * (bf16 compute); dt_dp_range.param then points at the masters. */
int dt_dp_has_master(const dt_dp_t *dp);
/* 1 when the optimizer state is offloaded to host memory (dt_dp_opts.offload). */
int dt_dp_offloaded(const dt_dp_t *dp);

/* Ranges this rank writes in a checkpoint: disjoint across ranks, their union
 * is the whole model. DDP splits the buffer evenly over ranks; ZeRO/FSDP
 * return the rank's slices (HSDP: replica 0 of each shard writes). Returns the
 * number of ranges (at most plan n_buckets); fills at most max of them. */
int dt_dp_owned_ranges(const dt_dp_t *dp, dt_dp_range *out, int max);

/* Fills one range from a checkpoint: param, m and v for [offset, offset + count). */
typedef dt_status_t (*dt_dp_read_fn)(void *ctx, const dt_dp_range *range);
/* Collective: calls read for every range this rank holds (DDP: the whole
 * model; ZeRO/FSDP: its slices; every replica), then makes the parameters
 * consistent on every rank (ZeRO-1/2 all-gather, FSDP drops gathered units). */
dt_status_t dt_dp_load_ranges(dt_dp_t *dp, dt_dp_read_fn read, void *ctx);

/* What overlapped: gradient reductions launched from the backward hooks (as
 * buckets completed) or after backward, and FSDP gathers issued ahead of
 * their unit (prefetch) or when the unit was needed. Counts since init. */
typedef struct dt_dp_stats {
    long reductions_in_backward, reductions_after;
    long gathers_prefetched, gathers_on_demand;
} dt_dp_stats;
void dt_dp_get_stats(const dt_dp_t *dp, dt_dp_stats *out);

/* Model-state bytes per rank the strategy's formula predicts (params, grads,
 * master, optim as in common/mem.h), for reports and tests. */
typedef struct dt_dp_mem {
    size_t params, grads, master, optim, work; /* work: bucket/unit buffers (COMM) */
    /* Optimizer offload: the host's share (category OFFLOAD), master and optim above
     * then 0 (nothing of it on the device): fp32 master 4Ψp/N, Adam 8Ψp/N, the
     * gradient shard in the compute dtype 2Ψp/N (bf16) or 4Ψp/N (fp32). */
    size_t host_master, host_optim, host_grads;
} dt_dp_mem;
void dt_dp_expected_mem(const dt_dp_t *dp, dt_dp_mem *out);

#endif /* DT_RUNTIME_DP_H */
