/*
 * trainer_impl.h - the trainer's state (dt_trainer_t), shared by trainer.c (the loop)
 * and train_summary.c (rank 0's summary.json) only. The state of the run's parts is
 * theirs: the pipeline's (dt_train_pp, train_parallel.c), LoRA's (dt_train_lora,
 * train_lora.c) and the resume state (dt_train_resume, train_ckpt.c), each with its own
 * init/free and its own part of summary.json; the trainer holds them and hands each
 * part what it needs. No part sees dt_trainer_t.
 *
 * The arrows inside runtime/train/ run one way, top to bottom (a file includes and
 * calls only files below it):
 *   trainer.c                                   the loop, on top
 *   train_summary.c                             summary.json, from the parts' writers
 *   train_elastic.c                             resizes (reads the resume state)
 *   train_async.c                               checkpoint.async's saves
 *   train_ckpt.c, train_parallel.c, train_lora.c, train_mem.c, train_check.c, train_trace.c
 *                                               the parts (train_check.c: the launcher's
 *                                               checks, calling train_lora.c's)
 *   train_spec.c                                the config read as the workers do
 *   data.c -> data_mix.c -> data_ahead.c, data_read.c; metrics.c, sched.c, stragglers.c
 *                                               the bottom: the data loader (its read-ahead
 *                                               gets its producer as a function), metrics,
 *                                               LR schedules, stragglers
 * Data types cross the same way: a part's header never includes trainer_impl.h, and
 * trainer.h (the folder's public face) is included by the files that define it.
 */
#ifndef DT_RUNTIME_TRAINER_IMPL_H
#define DT_RUNTIME_TRAINER_IMPL_H

#include "common/rng.h"
#include "common/torchenv.h"              /* defines: dt_torchenv_t */
#include "kernels/kernels.h"
#include "runtime/ckpt/hf_weights.h"      /* defines: dt_hf_weights_t */
#include "runtime/comm/comm.h"            /* defines: dt_comm_t */
#include "runtime/config/config.h"        /* defines: dt_config_t */
#include "runtime/model/model.h"          /* defines: dt_model_layout */
#include "runtime/model/net.h"            /* defines: dt_net_t */
#include "runtime/parallel/dp.h"          /* defines: dt_dp_t */
#include "runtime/parallel/cp.h"          /* defines: dt_cp_t */
#include "runtime/parallel/tp.h"          /* defines: dt_tp_t, dt_tp_place */
#include "runtime/train/data.h"           /* defines: dt_data_t */
#include "runtime/train/metrics.h"        /* defines: dt_metrics_t */
#include "runtime/train/stragglers.h"     /* defines: dt_stragglers_t */
#include "runtime/train/train_async.h"    /* defines: dt_train_async */
#include "runtime/train/train_ckpt.h"     /* defines: dt_train_resume */
#include "runtime/train/train_lora.h"     /* defines: dt_train_lora */
#include "runtime/train/train_mask.h"
#include "runtime/train/train_parallel.h" /* defines: dt_train_pp */

typedef struct dt_trainer {
    const dt_config_t *cfg;
    const dt_torchenv_t *env;
    dt_device_t *dev;
    /* The trained layout: this rank's piece of the model, or under LoRA the adapters'
     * (what dp, the optimizer and checkpoints hold; lora.base_layout is then the
     * model the net computes). */
    dt_model_layout layout;
    dt_hf_weights_t *hf; /* model.pretrained's weights (NULL: from the seed) */
    dt_train_lora lora;  /* LoRA (lora.r > 0; train_lora.h) */
    dt_net_t net;
    dt_data_t *data; /* token models; NULL for feature models (synthetic data) */
    dt_comm_t *comm; /* NULL on one rank */
    /* Tensor parallelism (runtime/parallel/tp.h): this rank's place, the TP and DP
     * groups (NULL when of one rank) and the net's TP collectives. */
    dt_tp_place place;
    dt_comm_t *tp_comm, *pp_comm, *dp_comm, *cp_comm;
    dt_tp_t *tp;
    dt_cp_t *cp; /* context parallelism's ring (NULL at CP 1) */
    dt_train_mask mask; /* masked data (train_mask.h): the loss over the global batch's trained targets */
    dt_train_pp pp;  /* pipeline parallelism (train_parallel.h): no engine at pipeline.stages 1 */
    dt_dp_t *dp;     /* owns parameters, gradients and optimizer state */
    int B, T, accum;
    int32_t *tokens, *targets; /* host (B, T) */
    float *features;           /* host (B, in_features), feature models */
    uint64_t mlp_cursor;       /* global samples consumed (synthetic feature data) */
    dt_metrics_t *metrics;
    dt_stragglers_t *stragglers; /* the ranks' compute times at logged steps */
    double peak_flops;
    char log_dir[4096];
    dt_rng rng;              /* the trainer's stream (saved in checkpoints; nothing draws from it yet) */
    dt_train_resume resume;  /* where the run continues from, what it saved (train_ckpt.h) */
    dt_train_async *async; /* checkpoint.async's pending save and staging (NULL until the first) */
} dt_trainer_t;

/* ---- train_summary.c ---- */

/* The memory figures one rank reports (its peak, model state by kind, buffers,
 * activations, pipeline and offload figures): every rank's are gathered for the summary. */
enum { DT_TRAIN_MEM_N = 18 };
void dt_train_my_memory_(dt_trainer_t *t, double *v);
/* Rank 0: <log_dir>/summary.json; mem holds DT_TRAIN_MEM_N figures per rank. */
dt_status_t dt_train_write_summary_(dt_trainer_t *t, double final_loss, double final_val, double tokens,
                                    double wall_s, int64_t steps, const double *mem);

#endif /* DT_RUNTIME_TRAINER_IMPL_H */
