/*
 * dp_impl.h - the state of a data-parallel object (dt_dp_t), shared by dp.c (init,
 * hook, reductions) and dp_state.c (optimizer step, whole parameters, checkpoint
 * ranges). Private to runtime/parallel.
 */
#ifndef DT_RUNTIME_PARALLEL_DP_IMPL_H
#define DT_RUNTIME_PARALLEL_DP_IMPL_H

#include "runtime/parallel/dp.h"

#define DP_GSLOTS 3 /* gradient working buffers (zero2, fsdp) */
#define DP_PSLOTS 4 /* gathered unit buffers (fsdp): unit 0 (tied head), current, 2 prefetched */
#define DP_PREFETCH 2

typedef struct dp_slot {
    void *buf;
    int owner; /* bucket using it, -1 free */
} dp_slot;

typedef enum { PSTATE_NONE = 0, PSTATE_FLIGHT = 1, PSTATE_READY = 2 } pstate_t;

typedef struct dp_bstate {
    int posts_left;       /* units still to finish backward in this micro-step */
    int launched;         /* gradient reduction launched in this step / micro-step */
    int in_fifo;          /* zero2/fsdp: its reduce_scatter waits in gfifo */
    dt_comm_req_t req;    /* gradient reduction (or zero1/2 all_gather) */
    int req_live;
    int gslot;            /* zero2/fsdp working gradient buffer, -1 none */
    int pslot;            /* fsdp gathered parameters, -1 none */
    pstate_t pstate;
    dt_comm_req_t preq;
    int final;            /* zero2/fsdp: the reduction in flight is the step's last micro-step's */
} dp_bstate;

struct dt_dp {
    dt_dp_opts opts;
    dt_device_t *dev;
    const dt_model_layout *layout;
    dt_net_t *net;
    dt_comm_t *world;      /* not owned */
    dt_comm_t *shard;      /* shard group: world, or the node group (hsdp, owned) */
    dt_comm_t *replica;    /* hsdp: same local rank across nodes (owned); NULL otherwise */
    int own_shard;
    int rank, world_size, n_shards, shard_rank, n_replicas, replica_rank;
    dt_dp_plan plan;
    size_t es;
    int sharded_params;    /* fsdp/hsdp */
    int sharded_grads;     /* zero2/fsdp/hsdp */
    int sharded_optim;     /* all but ddp */
    void *params;          /* full, padded layout (ddp/zero1/zero2) */
    void *grads;           /* full, padded layout (ddp/zero1) */
    void *pshard, *gshard; /* shard buffers (fsdp: params; zero2/fsdp: grads) */
    float *m, *v;          /* shard buffers (ddp: full) */
    void *wire;            /* ddp/zero1 gradients in opts.reduce_dtype (padded layout); NULL: the
                              reductions run on the gradients in the compute dtype */
    size_t wes;            /* bytes per element of wire */
    void *small;           /* device buffer for the host values all_gather_f64 exchanges (GPU jobs) */
    size_t small_bytes;
    float *master;         /* fp32 master weights, laid out as m and v; NULL when the
                              compute dtype is fp32 (the parameters are the masters)
                              and the optimizer is not offloaded */
    /* optimizer offload (dt_dp_opts.offload): master, m and v are host memory, and hbuf
     * (host, shard layout, compute dtype) receives the gradient shard and then holds
     * the updated parameters on their way back up */
    int offload;
    void *hbuf;
    size_t work_elems;     /* largest padded bucket */
    /* tensor parallelism: this rank's gradient ranges of the tensors every TP rank
     * holds whole (the norm counts them once), found once (dp_state.c) */
    const void **rep_ptrs;
    size_t *rep_counts;
    int rep_n, rep_found;
    dp_slot gslots[DP_GSLOTS];
    dp_slot pslots[DP_PSLOTS];
    int n_gslots, n_pslots;
    dp_bstate *bs;
    void *sink;            /* after an error: the memory the rest of the micro-step computes in */
    int *gfifo;            /* buckets with a reduce_scatter in flight, in issue order */
    int gfifo_head, gfifo_len;
    int last_micro;
    /* fsdp use sequence (buckets of each PRE hook in one micro-step) */
    int *seq, *seq_bwd, n_seq, seq_pos;
    double comm_s;
    int in_backward;       /* inside a backward hook */
    dt_dp_stats stats;
    dt_status_t err;
    char err_detail[512];
};

static inline dt_comm_dtype_t comm_dtype(const dt_dp_t *dp) {
    return dp->dev->ops->dtype == DT_DTYPE_BF16 ? DT_COMM_BF16 : DT_COMM_F32;
}

static inline char *at(void *base, size_t elems, size_t es) { return (char *)base + elems * es; }

/* dp.c */
/* Waits for req, adding the time to the step's communication time. */
dt_status_t dp_wait_req(dt_dp_t *dp, dt_comm_req_t *req);
/* Every rank's n doubles, through the device when the job's buffers live there. */
dt_status_t dp_all_gather_f64(dt_dp_t *dp, dt_comm_t *comm, const double *vals, int n, double *out);
/* FSDP: bucket b's gathered parameters are ready / released; all released. */
dt_status_t dp_param_ready(dt_dp_t *dp, int b);
dt_status_t dp_param_release(dt_dp_t *dp, int b);
dt_status_t dp_params_release_all(dt_dp_t *dp);

/* dp_offload.c */
/* Host state of an offloaded optimizer (master, m, v, hbuf); released by dp_offload_free. */
dt_status_t dp_offload_alloc(dt_dp_t *dp);
void dp_offload_free(dt_dp_t *dp);
/* Starts the copy of count reduced gradient elements at src (device) into hbuf at
 * shard offset `shard_offset`. */
dt_status_t dp_offload_grad_down(dt_dp_t *dp, size_t shard_offset, const void *src, size_t count);
/* The AdamW step on the host and the updated parameters back on the device. */
dt_status_t dp_offload_step(dt_dp_t *dp, const dt_adamw_args_t *args);

/* dp_state.c */
/* ZeRO-1/2: every rank's updated slices back into every rank's full buffer. */
dt_status_t dp_gather_full_params(dt_dp_t *dp);
/* Fills the ranges this rank holds (all = every held range; else only those it
 * writes to a checkpoint); returns how many there are. */
int dp_held_ranges(const dt_dp_t *dp, dt_dp_range *out, int max, int all);

#endif /* DT_RUNTIME_PARALLEL_DP_IMPL_H */
