/*
 * metrics.h - what a run reports: per-step metrics (metrics.jsonl), the final
 * summary (summary.json), the progress line, and the GPU peak table lookup (a
 * device's own peak comes from its op table: dt_ops_t.peak_flops).
 */
#ifndef DT_RUNTIME_METRICS_H
#define DT_RUNTIME_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

typedef struct dt_step_metrics {
    int64_t step; /* 1-based optimizer step */
    int64_t total_steps;
    double loss;  /* mean over every token of the global batch */
    double lr;
    double grad_norm;
    double tokens_per_s;
    double mfu; /* fraction of peak, 0 when unknown */
    double step_ms, compute_ms, comm_ms, data_ms;
    double tp_comm_ms; /* the part of comm_ms in tensor-parallel collectives; NAN: no TP */
    /* pipeline parallelism (NAN without): the stages' mean bubble this step (time
     * blocked on a neighbour / the forward-backward passes' time), the schedule's
     * ideal, the ms a stage waited (mean over ranks), the bytes sent point to point by
     * all ranks; written when pp_bubble_ideal > 0 */
    double pp_bubble, pp_bubble_ideal, pp_wait_ms, p2p_bytes;
    /* the ranks' compute ms this step (stragglers.h), written when have_ranks */
    int have_ranks, slowest_rank;
    double slowest_ms, median_ms;
    /* every rank's compute ms this step (have_ranks; written for worlds of up to
     * DT_METRICS_MAX_RANK_COLUMNS ranks) */
    const double *rank_compute_ms;
    int n_ranks;
    double mem_peak_mb; /* rank 0's accounted peak so far (common/mem.h); 0: not written */
    double val_loss; /* NAN when not evaluated at this step */
    double eta_s;    /* seconds left, <0 unknown */
    int world_size;  /* ranks in this step (elastic runs change it); 0: not written */
} dt_step_metrics;

#define DT_METRICS_MAX_RANK_COLUMNS 64

typedef struct dt_metrics dt_metrics_t;

/* Creates log_dir (and parents) and opens metrics.jsonl for appending
 * (truncating when `fresh`, i.e. not resuming). */
dt_status_t dt_metrics_open(const char *log_dir, int fresh, dt_metrics_t **out);
void dt_metrics_close(dt_metrics_t *m);
/* Also writes every line's figures as TensorBoard scalars into a new event file in
 * dir (runtime/tools/tfevents.h), tagged <group>/<metrics.jsonl key> (train/loss,
 * time/step_ms, ...; a list such as every rank's compute ms as
 * rank_compute_ms/rank_<r>), and
 * config_text (may be NULL) as the text "config". start_step: the step the run
 * resumes from (0: fresh): TensorBoard drops what older files hold from step
 * start_step + 1 on, so a resumed or restarted run continues its curves and a fresh
 * run in the same folder replaces them. */
dt_status_t dt_metrics_tensorboard(dt_metrics_t *m, const char *dir, int64_t start_step, const char *config_text);
/* Appends one JSON object line and flushes it (and the TensorBoard event). */
dt_status_t dt_metrics_log(dt_metrics_t *m, const dt_step_metrics *s);
/* Writes <log_dir>/<name> atomically (temporary file, fsync, rename). */
dt_status_t dt_metrics_write_file(const char *log_dir, const char *name, const char *text);
/* The human line for stdout: "step 10/1000 | loss 2.3456 | lr 1.00e-03 | ...". */
void dt_metrics_format(const dt_step_metrics *s, char *buf, size_t len);

/* Dense bf16 tensor-core FLOP/s of a GPU by its name (e.g. "NVIDIA H200"), or 0
 * when unknown; DTRUN_PEAK_TFLOPS overrides. */
double dt_peak_flops_gpu(const char *device_name);

#endif /* DT_RUNTIME_METRICS_H */
