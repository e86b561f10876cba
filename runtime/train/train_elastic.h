/*
 * train_elastic.h - the trainer's side of an elastic run (`--nnodes MIN:MAX`): the
 * global batch kept across world sizes, the resize request obeyed at a checkpoint
 * boundary, and every resize logged and recorded.
 *
 * The agent marks an elastic run with DTRUN_ELASTIC=MIN:MAX in each worker's
 * environment and names a per-round flag file in DTRUN_RESIZE_FILE that it creates
 * when a node waits to be admitted. The rules:
 *   - The run's global batch (train_batch_size) is the config's when it gives one;
 *     else the one saved in the latest checkpoint's meta.json (config.train_batch_size:
 *     a run resumed at another world size keeps it); else, on a fresh run, micro x
 *     accumulation x the first round's data-parallel size.
 *   - The micro-batch is kept (the config's, else the checkpoint's) and
 *     gradient_accumulation_steps = train_batch_size / (micro x DP size); when that
 *     is not an integer the worker exits 1 naming the sizes.
 *   - At each checkpoint boundary (a step saved by checkpoint.every_steps, not the
 *     last) the ranks agree (one all-gather) whether any saw the flag file; if so all
 *     stop after the save and exit DT_EXIT_RESIZE, which the agent treats as
 *     "re-rendezvous", not a failure.
 *   - A resume whose checkpoint was saved by another world size is a resize: rank 0
 *     logs it (old and new world size, accumulation, the step resumed from, the steps
 *     lost) and appends it to <log_dir>/resizes.jsonl, which summary.json lists as
 *     "resizes".
 */
#ifndef DT_RUNTIME_TRAIN_ELASTIC_H
#define DT_RUNTIME_TRAIN_ELASTIC_H

#include <stdint.h>

#include "common/status.h"
#include "runtime/config/config.h" /* defines: dt_config_t */

struct cJSON;
struct dt_dp;
struct dt_train_resume;

/* 1 when the agent started this worker for an elastic run (DTRUN_ELASTIC set). */
int dt_train_elastic_on(void);

/* Before dt_config_resolve, in an elastic run: fixes train_batch_size, the
 * micro-batch and the accumulation for world_size as the rules above say (through
 * dt_config_set_batch). DT_STATUS_FAILED naming the sizes when no integer accumulation
 * gives the global batch; nothing changes outside an elastic run. */
dt_status_t dt_train_elastic_batch(dt_config_t *cfg, int world_size);

/* After each step of an elastic run, local rank 0 records it in the agent's run folder
 * (one pwrite), so that a resize counts the steps it lost from the last one done, not
 * the last one logged. */
void dt_train_elastic_progress(int local_rank, int64_t step);
/* Rank 0, stopped by a signal after step: "step N checkpoint saved|none" into the
 * agent's run folder ($DTRUN_RUN_DIR/preempted), which scripts/slurm/train.sbatch
 * reads before it says a checkpoint was saved and requeues. */
void dt_train_preempt_record(int64_t step, int saved);

/* The launcher's check before workers start (--nnodes MIN:MAX): when the config gives
 * train_batch_size (or the checkpoint a resume starts from holds the run's), every
 * world size nodes x nproc_per_node for nodes in MIN..MAX must divide it by micro x
 * DP size; DT_STATUS_CONFIG naming the sizes that do not. When neither gives it,
 * *pick gets the smallest global batch every size keeps (a multiple of micro x the
 * least common multiple of the DP sizes, at least micro x accumulation x the smallest
 * DP size), which the launcher passes to the workers and says; else 0. */
dt_status_t dt_train_elastic_check(const dt_config_t *cfg, int nnodes_min, int nnodes_max, int nproc_per_node,
                                   int64_t *pick);

/* After a checkpoint boundary's save (collective over every rank, entered by all at
 * each boundary; a no-op outside an elastic run and off the boundaries): *resize = 1
 * when any rank's agent asked for a resize and every rank's save of this step
 * succeeded (else the resize waits for the next boundary). */
dt_status_t dt_train_elastic_poll(const dt_config_t *cfg, int rank, struct dt_dp *dp, const struct dt_train_resume *r,
                                  int64_t step, int *resize);
/* 1 after dt_train_elastic_poll said resize: the worker exits DT_EXIT_RESIZE. */
int dt_train_elastic_resizing(void);

/* After a resume to r->start_step (rank 0 of world_size, restart_count its attempt;
 * last_logged: the newest step metrics.jsonl held before it was trimmed): a resize when
 * the checkpoint's world size (r->resumed_world_size, train_ckpt.h) differs, with
 * accumulation accum now; logged and appended to <log_dir>/resizes.jsonl. A fresh run
 * (start_step 0) removes an old resizes.jsonl. */
void dt_train_elastic_note_resume(const struct dt_train_resume *r, const dt_config_t *cfg, int rank, int world_size,
                                  int restart_count, int accum, const char *log_dir, int64_t last_logged);
/* summary.json's "resizes": the records of <log_dir>/resizes.jsonl (an empty list when none). */
void dt_train_elastic_summary(const char *log_dir, struct cJSON *summary);

#endif /* DT_RUNTIME_TRAIN_ELASTIC_H */
