/*
 * train_parallel.h - the trainer's model-parallel part (train_parallel.c): this rank's
 * piece of the model (its TP piece of its pipeline stage), and the pipeline's state as
 * an object the trainer holds, dt_train_pp: the engine, one step's micro-batches, the
 * partition and the run's figures, with its own init/free and its part of
 * summary.json. Calls below itself only: the data loader, runtime/parallel, the model.
 */
#ifndef DT_RUNTIME_TRAIN_PARALLEL_H
#define DT_RUNTIME_TRAIN_PARALLEL_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/kernels.h"           /* defines: dt_device_t */
#include "runtime/comm/comm.h"         /* defines: dt_comm_t */
#include "runtime/config/config.h"     /* defines: dt_config_t */
#include "runtime/model/model.h"       /* defines: dt_model_spec, dt_model_layout */
#include "runtime/model/net.h"         /* defines: dt_net_t, dt_batch */
#include "runtime/parallel/dp.h"       /* defines: dt_dp_t */
#include "runtime/parallel/pp.h"       /* defines: dt_pp_t */
#include "runtime/parallel/tp.h"       /* defines: dt_tp_t, dt_tp_place */
#include "runtime/train/data.h"        /* defines: dt_data_t */

struct cJSON;

/* The pipeline of a run (pipeline.*; runtime/parallel/pp.h): no engine at
 * pipeline.stages 1. */
typedef struct dt_train_pp {
    const dt_config_t *cfg;
    dt_tp_place place;   /* this rank's (TP, PP, DP) coordinates */
    int virtual_stages;  /* chunks per stage */
    int micro_batches;   /* a step's (gradient_accumulation_steps) */
    dt_pp_schedule_t schedule;
    dt_pp_t *engine;     /* NULL at pipeline.stages 1 */
    int32_t *mb_tokens, *mb_targets; /* one step's micro-batches (host) */
    dt_batch *mb_batches;
    size_t rows;         /* B x T of a micro-batch */
    int *bounds;         /* the partition: chunk k holds blocks [bounds[k], bounds[k+1]) */
    double span_ms, compute_ms; /* summed over the run's steps (summary.json) */
    int64_t steps;
    int arenas;          /* the most activation arenas a step held */
} dt_train_pp;

/* Before the layout: the run's pipeline from the config, for the rank at place
 * (nothing allocated). */
void dt_train_pp_init_(dt_train_pp *pp, const dt_config_t *cfg, dt_tp_place place);
void dt_train_pp_free_(dt_train_pp *pp);
/* 1 when the pipeline runs (an engine: pipeline.stages > 1 and started). */
int dt_train_pp_on_(const dt_train_pp *pp);

/* This rank's piece of the model into *out: its TP piece of its pipeline stage (the
 * partition printed when print, into pp->bounds). */
dt_status_t dt_train_layout_(dt_train_pp *pp, const dt_model_spec *spec, int print, dt_model_layout *out);
/* The pipeline engine over net and dp (after dt_dp_init), micro-batches of B x T;
 * nothing at PP 1. */
dt_status_t dt_train_pp_start_(dt_train_pp *pp, dt_device_t *dev, dt_net_t *net, dt_dp_t *dp, dt_comm_t *pp_comm,
                               dt_tp_t *tp, int B, int T);
/* One step's micro-batches read from data and run through the pipeline (n_rows: the
 * net's rows of a micro-batch): *loss_sum is the sum of their mean losses on the last
 * stage (NAN elsewhere); *data_s += the read time. */
dt_status_t dt_train_pp_step_(dt_train_pp *pp, dt_data_t *data, int n_rows, double *loss_sum, double *data_s);
/* The same over micro-batches already read (masked data: train_mask.h), each row's
 * loss gradient scaled by dscale. */
dt_status_t dt_train_pp_step_batches_(dt_train_pp *pp, const dt_batch *batches, float dscale, double *loss_sum);
/* After a step (collective over all ranks of dp): out gets the stages' mean bubble
 * (the share of the pipeline's span, its longest stage's passes, a stage did not
 * compute), the schedule's ideal, the mean ms a stage did not compute and the bytes
 * all ranks sent point to point; this rank's compute and the span add to the run's. */
dt_status_t dt_train_pp_figures_(dt_train_pp *pp, dt_dp_t *dp, double out[4]);
/* x := the mean of the last stage's ranks' x (collective over all ranks of dp). */
dt_status_t dt_train_mean_loss_(const dt_train_pp *pp, dt_dp_t *dp, double *x);
/* The whole model's fp32 parameters (the global layout of layout) on every rank into
 * *out (dt_mem_alloc'd): dp's gather of this rank's piece, then every TP and PP piece
 * of this DP rank's model-parallel group (split from all), put in its place
 * (collective over all ranks). */
dt_status_t dt_train_gather_params_(const dt_train_pp *pp, const dt_model_layout *layout, dt_device_t *dev,
                                     dt_dp_t *dp, dt_comm_t *all, float **out);

/* ---- summary.json ---- */

/* The figures of one rank the pipeline reports (its stage, bubble, compute ms per
 * step, arenas): every rank's are gathered for the summary. */
enum { DT_TRAIN_PP_FIGS = 4 };
void dt_train_pp_my_figures_(const dt_train_pp *pp, double v[DT_TRAIN_PP_FIGS]);
/* The pipeline's keys of summary.json's "parallel" object (nothing without one). */
void dt_train_pp_write_summary_(const dt_train_pp *pp, struct cJSON *parallel);
/* A rank's "pipeline" object from its gathered figures v (nothing without one). */
void dt_train_pp_write_rank_summary_(const dt_train_pp *pp, const double v[DT_TRAIN_PP_FIGS], struct cJSON *rank);

#endif /* DT_RUNTIME_TRAIN_PARALLEL_H */
