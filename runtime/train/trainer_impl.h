/*
 * trainer_impl.h - what trainer.c shares with train_check.c (the launcher's checks
 * before workers start: the config's data sources and the model spec the workers
 * will build, so that the checks and the run read the config the same way) and with
 * train_parallel.c (the trainer's state: the model-parallel parts of the loop).
 */
#ifndef DT_RUNTIME_TRAINER_IMPL_H
#define DT_RUNTIME_TRAINER_IMPL_H

#include "common/rng.h"
#include "common/torchenv.h"           /* defines: dt_torchenv_t */
#include "kernels/kernels.h"
#include "runtime/ckpt/hf_weights.h"   /* defines: dt_hf_weights_t */
#include "runtime/ckpt/safetensors.h"  /* defines: dt_st_file_t */
#include "runtime/comm/comm.h"         /* defines: dt_comm_t */
#include "runtime/config/config.h"     /* defines: dt_config_t */
#include "runtime/model/lora.h"        /* defines: dt_lora_t, dt_lora_spec */
#include "runtime/model/model.h"       /* defines: dt_model_spec */
#include "runtime/model/net.h"         /* defines: dt_net_t */
#include "runtime/parallel/dp.h"       /* defines: dt_dp_t */
#include "runtime/parallel/pp.h"       /* defines: dt_pp_t */
#include "runtime/parallel/tp.h"       /* defines: dt_tp_t, dt_tp_place */
#include "runtime/train/data.h"        /* defines: dt_data_source */
#include "runtime/train/metrics.h"     /* defines: dt_metrics_t */
#include "runtime/train/stragglers.h"  /* defines: dt_stragglers_t */
#include "runtime/train/train_async.h" /* defines: dt_train_async */
#include "runtime/train/train_ckpt.h"  /* defines: DT_TRAIN_RUN_ID_LEN */

typedef struct dt_trainer {
    const dt_config_t *cfg;
    const dt_torchenv_t *env;
    dt_device_t *dev;
    dt_model_layout layout;
    dt_hf_weights_t *hf; /* model.pretrained's weights (NULL: from the seed) */
    /* LoRA (lora.r > 0; train_lora.c): layout is then the adapters' (what dp,
     * the optimizer and checkpoints hold), base_layout the model the net computes,
     * frozen in lora's buffers; lora_init the adapter file of lora.init (or NULL). */
    dt_model_layout base_layout;
    dt_lora_t lora;
    dt_st_file_t *lora_init;
    dt_net_t net;
    dt_data_t *data; /* token models; NULL for feature models (synthetic data) */
    dt_comm_t *comm; /* NULL on one rank */
    /* Tensor parallelism (runtime/parallel/tp.h): this rank's place, the TP and DP
     * groups (NULL when of one rank) and the net's TP collectives. */
    dt_tp_place place;
    dt_comm_t *tp_comm, *pp_comm, *dp_comm;
    dt_tp_t *tp;
    /* Pipeline parallelism (runtime/parallel/pp.h): the engine, and one step's
     * micro-batches (accum of them, host) it runs; NULL at pipeline.stages 1. */
    dt_pp_t *pp;
    int32_t *mb_tokens, *mb_targets;
    dt_batch *mb_batches;
    int *pp_bounds; /* the partition: chunk k holds blocks [pp_bounds[k], pp_bounds[k+1]) */
    double pp_span_ms, pp_compute_ms; /* summed over the run's steps (summary.json) */
    int64_t pp_steps;
    int pp_arenas;
    dt_dp_t *dp;     /* owns parameters, gradients and optimizer state */
    int B, T, accum;
    int32_t *tokens, *targets; /* host (B, T) */
    float *features;           /* host (B, in_features), feature models */
    uint64_t mlp_cursor;       /* global samples consumed (synthetic feature data) */
    dt_metrics_t *metrics;
    dt_stragglers_t *stragglers; /* the ranks' compute times at logged steps */
    double peak_flops;
    char log_dir[4096];
    dt_rng rng;         /* the trainer's stream (saved in checkpoints; nothing draws from it yet) */
    int64_t start_step; /* the step a resumed run continues after (0: a fresh run) */
    int64_t saved_step; /* the step of the last checkpoint written or loaded */
    int resumed_world_size;       /* the checkpoint resumed from: its world size at save (0: none) */
    int64_t resumed_accumulation; /* and its gradient_accumulation_steps (0: unknown) */
    char run_id[DT_TRAIN_RUN_ID_LEN]; /* this run's, in its checkpoints (keep_last prunes only these) */
    dt_train_async *async; /* checkpoint.async's pending save and staging (NULL until the first) */
} dt_trainer_t;

/* data.train's sources into out (DT_DATA_MAX_SOURCES): the config's list, or its
 * one path with weight 1. Returns how many. */
int dt_trainer_sources_(const dt_config_t *cfg, dt_data_source *out);

/* The configured model's spec; a token model's vocabulary 0 comes from the data. */
dt_status_t dt_trainer_spec_(const dt_config_t *cfg, dt_model_spec *spec);

/* ---- train_mem.c ---- */

/* Before the model state and activations are allocated (the device is open, t->B,
 * t->accum and the layout set): DT_STATUS_CONFIG naming the shortfall, the biggest
 * consumer and the cheapest change that fits when `dtrun plan`'s bytes for this rank
 * exceed what it can get. DTRUN_SKIP_MEMORY_CHECK=1 skips it. */
dt_status_t dt_train_mem_check_(dt_trainer_t *t, const dt_model_spec *spec);

/* ---- train_lora.c ---- */

/* The config's lora section for a compute dtype (DT_STATUS_CONFIG naming the key). */
dt_status_t dt_train_lora_spec_(const dt_config_t *cfg, dt_dtype_t compute, dt_lora_spec *out);
/* With lora.r > 0, after dt_train_layout_ and the device: t->layout becomes the
 * adapters', t->base_layout the model, its weights read from model.pretrained
 * (t->hf) into t->lora's frozen buffers. */
dt_status_t dt_train_lora_setup_(dt_trainer_t *t);
/* The adapters' initial elements [offset, offset + count): lora.init's, else PEFT's init. */
dt_status_t dt_train_lora_fill_(dt_trainer_t *t, size_t offset, size_t count, float *dst);
void dt_train_lora_free_(dt_trainer_t *t);

/* ---- train_parallel.c ---- */

/* This rank's piece of the model into t->layout: its TP piece of its pipeline stage
 * (the partition printed by rank 0). */
dt_status_t dt_train_layout_(dt_trainer_t *t, const dt_model_spec *spec);
/* pipeline.schedule as the engine's kind. */
dt_pp_schedule_t dt_train_pp_schedule_(const dt_config_t *cfg);
/* The pipeline engine over t->net and t->dp (after dt_dp_init); nothing at PP 1. */
dt_status_t dt_train_pp_init_(dt_trainer_t *t);
/* One step's micro-batches read and run through the pipeline: *loss_sum is the sum of
 * their mean losses on the last stage (NAN elsewhere); *data_s += the read time. */
dt_status_t dt_train_pp_step_(dt_trainer_t *t, double *loss_sum, double *data_s);
/* After a step (collective over all ranks): out gets the stages' mean bubble (the
 * share of the pipeline's span, its longest stage's passes, a stage did not compute),
 * the schedule's ideal, the mean ms a stage did not compute and the bytes all ranks
 * sent point to point; this rank's compute and the span add to the run's. */
dt_status_t dt_train_pp_figures_(dt_trainer_t *t, double out[4]);
/* x := the mean of the last stage's ranks' x (collective over all ranks). */
dt_status_t dt_train_mean_loss_(dt_trainer_t *t, double *x);
/* The whole model's fp32 parameters (the global layout) on every rank into *out
 * (dt_mem_alloc'd): dp's gather of this rank's piece, then every TP and PP piece of
 * this DP rank's model-parallel group, put in its place (collective over all ranks). */
dt_status_t dt_train_gather_params_(dt_trainer_t *t, float **out);

/* ---- train_summary.c ---- */

/* The memory figures one rank reports (its peak, model state by kind, buffers,
 * activations, pipeline and offload figures): every rank's are gathered for the summary. */
enum { DT_TRAIN_MEM_N = 18 };
void dt_train_my_memory_(dt_trainer_t *t, double *v);
/* Rank 0: <log_dir>/summary.json; mem holds DT_TRAIN_MEM_N figures per rank. */
dt_status_t dt_train_write_summary_(dt_trainer_t *t, double final_loss, double final_val, double tokens,
                                    double wall_s, int64_t steps, const double *mem);

#endif /* DT_RUNTIME_TRAINER_IMPL_H */
