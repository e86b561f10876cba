/*
 * train_ckpt.h - what the trainer saves and restores through checkpoint.h:
 * parameters, Adam m and v (the ranges this rank owns), the data position, the
 * trainer's RNG, the step (which fixes the schedule and Adam's bias correction) and
 * the resolved config; resume (auto: latest complete, falling back with a warning
 * to older ones; or a path); preemption (SIGTERM, SIGUSR1, SIGUSR2: the step in
 * progress finishes, a checkpoint is saved, the worker exits 0).
 *
 * Under the launcher a preempted agent forwards the signal, its workers save and
 * exit 0, and the agent itself exits 128+N as torchrun does (N the signal): the job
 * was ended, not finished. The next launch with `checkpoint.resume: auto` resumes
 * from the saved step.
 */
#ifndef DT_RUNTIME_TRAIN_CKPT_H
#define DT_RUNTIME_TRAIN_CKPT_H

#include <stdint.h>

#include "common/rng.h"
#include "common/status.h"
#include "kernels/kernels.h"     /* defines: dt_device_t */
#include "runtime/ckpt/checkpoint.h"  /* defines: dt_ckpt_barrier_fn, dt_ckpt_range */
#include "runtime/config/config.h"      /* defines: dt_config_t */
#include "runtime/train/data.h"        /* defines: dt_data_t */
#include "runtime/model/model.h"       /* defines: dt_model_layout */

/* A range of a buffer this rank owns: global element offset and count, with the
 * device pointer of its first element (params in the compute dtype, m and v fp32). */
typedef struct dt_train_ckpt_owned {
    uint64_t offset, count;
    void *params;
    float *m, *v;
} dt_train_ckpt_owned;

typedef struct dt_train_ckpt {
    const dt_config_t *cfg;
    const dt_model_layout *layout;
    dt_device_t *dev;
    int rank, world_size;
    /* The ranges this rank saves and loads. n_owned 0: the whole buffers below are
     * replicated on every rank, and each rank saves an even slice of them; -1: this
     * rank saves nothing (another replica of its shard does). */
    const dt_train_ckpt_owned *owned;
    int n_owned;
    void *params; /* full replicas (device), used when n_owned is 0 */
    /* ZeRO-1/2 with owned ranges: parameters are replicated though m and v are not;
     * set this (and params) so resume reads the whole parameter buffer. */
    int load_full_params;
    int params_fp32; /* the params pointers are fp32 masters, not the compute dtype */
    int state_host;  /* params (fp32 masters), m and v are host memory (optimizer offload) */
    /* A strategy that loads its own way (dt_dp_load_ranges: collective, then
     * all-gathers): called with the open, checked checkpoint instead of reading
     * the ranges above; it reads with dt_train_ckpt_read_range. Called with c NULL
     * when a failed attempt overwrote part of the state and no checkpoint loads:
     * it then puts back the freshly initialised state (dt_model_init_params, m and v
     * zero). */
    dt_status_t (*load)(void *ctx, dt_ckpt_t *c);
    void *load_ctx;
    /* Several ranks: *ok in, the AND over all ranks out (an all-reduce), so every
     * rank resumes from the same checkpoint or all fall back together. */
    dt_status_t (*agree)(void *ctx, int *ok);
    void *agree_ctx;
    float *m, *v;
    dt_data_t *data;      /* NULL for the MLP */
    uint64_t *mlp_cursor; /* the MLP's synthetic-data position */
    dt_rng *rng;          /* the trainer's RNG stream (NULL: none) */
    dt_ckpt_barrier_fn barrier; /* NULL with one rank */
    void *barrier_ctx;
    /* This run's id (DT_TRAIN_RUN_ID_LEN bytes the trainer keeps; NULL: none):
     * resume fills it with the id of the checkpoint it continues, or a new one;
     * saves write it into meta.json and keep_last prunes only its checkpoints. */
    char *run_id;
} dt_train_ckpt;

#define DT_TRAIN_RUN_ID_LEN 40

/* ---- the run's resume state ---------------------------------------------------------
 * An object the trainer holds (owns no memory): where the run continues from, what it
 * last saved, the checkpoint it resumed from (an elastic resize reports it) and this
 * run's id. */
typedef struct dt_train_resume {
    int64_t start_step; /* the step a resumed run continues after (0: a fresh run) */
    int64_t saved_step; /* the step of the last checkpoint written or loaded */
    int resumed_world_size;       /* the checkpoint resumed from: its world size at save (0: none) */
    int64_t resumed_accumulation; /* and its gradient_accumulation_steps (0: unknown) */
    char run_id[DT_TRAIN_RUN_ID_LEN]; /* this run's, in its checkpoints (keep_last prunes only these) */
} dt_train_resume;

/* A fresh run's: nothing resumed, nothing saved, no run id yet (dt_train_ckpt_resume
 * gives one). */
void dt_train_resume_init_(dt_train_resume *r);
/* While the checkpoint resumed from is loaded (every rank): its world size and
 * accumulation at save. */
void dt_train_resume_note_checkpoint_(dt_train_resume *r, const dt_ckpt_t *c);

/* Before anything starts (the agent, and a worker's first attempt): with
 * checkpoint.resume "never" and saving on, a checkpoint.dir that already holds
 * checkpoints is DT_STATUS_CONFIG naming the folder and the choices (resume: auto,
 * another dir, checkpoint.overwrite: true), unless checkpoint.overwrite is true. */
dt_status_t dt_train_ckpt_check_start(const dt_config_t *cfg);
/* One run per checkpoint folder: rank 0 takes a POSIX lock on
 * <checkpoint.dir>/.dtrun.lock (recording its pid, host and start) and holds it
 * until its process ends; a folder another run holds is DT_STATUS_CONFIG naming that
 * run. Restarts and resizes of one launch take it again (the old ranks are gone).
 * Rank 0 takes it, not the launcher: a node that joins a running elastic job, or
 * returns to it, starts while the job holds it. */
dt_status_t dt_train_ckpt_lock(const dt_config_t *cfg, int rank);

/* Checkpoints are on: checkpoint.every_steps > 0 and a directory. */
int dt_train_ckpt_enabled(const dt_config_t *cfg);
/* Saves step `step` (why: "every_steps", "final", "SIGTERM", ...): logs the time
 * and GB/s. */
dt_status_t dt_train_ckpt_save(const dt_train_ckpt *t, int64_t step, const char *why);
/* A shard ready to save (checkpoint.async and dt_train_ckpt_save): the host
 * ranges, rank 0's extra meta (data position, RNG, scheduler, config) and the save
 * arguments over them, as of the step it was staged at. */
typedef struct dt_train_ckpt_shard {
    dt_ckpt_save_args args;
    dt_ckpt_range *ranges;
    int n_ranges;
    float **staged; /* per-range copies (no arena) */
    int n_staged;
    char *extra;
    double stage_s; /* the copy to host */
} dt_train_ckpt_shard;
/* Floats this rank's shard stages (params, m and v of its ranges). */
uint64_t dt_train_ckpt_stage_elems(const dt_train_ckpt *t);
/* Copies this rank's state to host for a save of `step`: into arena
 * (dt_train_ckpt_stage_elems floats, e.g. pinned host memory) when given, so the
 * ranges stay valid while training goes on; without one, host state is written from
 * where it lives and device state is copied to fresh buffers. */
dt_status_t dt_train_ckpt_stage(const dt_train_ckpt *t, int64_t step, const char *why, float *arena,
                                dt_train_ckpt_shard *out);
void dt_train_ckpt_shard_free(dt_train_ckpt_shard *s);
/* Rank 0's log line of a completed save. */
void dt_train_ckpt_log_saved(const dt_train_ckpt *t, int64_t step, const char *why, const dt_ckpt_save_stats *stats,
                             double total_s, double stage_s);
/* Resume per checkpoint.resume: "never" -> *step = 0; "auto" -> the newest
 * loadable checkpoint of checkpoint.dir (bad ones skipped with a warning), or 0
 * when there is none; a path -> that checkpoint or an error naming the problem.
 * Restores buffers, data position, RNG; *step is the step to continue after. */
dt_status_t dt_train_ckpt_resume(const dt_train_ckpt *t, int64_t *step);

/* Reads [offset, offset+count) of params, m and v (any may be NULL) from c into
 * device buffers of t's device (staged through host memory off the CPU). */
dt_status_t dt_train_ckpt_read_range(const dt_train_ckpt *t, dt_ckpt_t *c, uint64_t offset, uint64_t count,
                                     void *params, float *m, float *v);

/* Preemption: handlers for SIGTERM, SIGUSR1 and SIGUSR2 that only record the
 * signal; dt_train_ckpt_preempted() returns it (0 when none arrived). A SIGTERM
 * the agent queued with DT_STOP_GROUP_FAILURE (common/torchenv.h: another rank
 * failed) instead ends the process at once, exit 143, without a save. */
void dt_train_ckpt_catch_preemption(void);
int dt_train_ckpt_preempted(void);
/* What the next launch of this config will do after a preemption (saved: a
 * checkpoint was saved), for the message that promises it: resume (auto), start
 * over or be refused (never), start from the named checkpoint again (PATH); with the
 * override that continues from the one just saved. */
void dt_train_ckpt_next_launch(const dt_config_t *cfg, int saved, char *out, size_t len);

/* Keeps only the lines of <log_dir>/metrics.jsonl with "step" <= step (a resumed
 * run redoes the steps after its checkpoint); *last gets the newest step the file
 * held (0 when none). */
dt_status_t dt_train_ckpt_trim_metrics(const char *log_dir, int64_t step, int64_t *last);

/* Fault injection for tests: DTRUN_FAULT_KILL_STEP=N (and optionally
 * DTRUN_FAULT_KILL_RANK=R, default 0) SIGKILLs that rank after step N in the first
 * attempt (TORCHELASTIC_RESTART_COUNT 0 or unset); DTRUN_FAULT_TERM_PARENT_STEP=N
 * sends SIGTERM to the parent (the agent) after step N, as a preempting scheduler
 * would. */
void dt_train_ckpt_fault_point(int rank, int64_t step);

#endif /* DT_RUNTIME_TRAIN_CKPT_H */
