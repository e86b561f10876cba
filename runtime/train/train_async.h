/*
 * train_async.h - checkpoint.async: periodic saves that block training only for
 * the copy of the rank's shard into host staging (pinned memory on CUDA).
 *
 * A periodic save (dt_train_async_save) first waits for the previous one's write
 * on this rank (the staging arena and the writer are reused; not for its commit),
 * copies params, m, v and rank 0's meta (data position, RNG, scheduler, config) as
 * of this step into the staging arena, and starts the background writer
 * (runtime/ckpt/ckpt_async.h). After every step dt_train_async_settle asks all
 * ranks (one small all-gather, only while a save is pending) whether their writes
 * are over; once they all are, rank 0 starts the commit (meta.json, rename,
 * `latest`, pruning: dt_ckpt_commit) in a background thread, as a synchronous save
 * commits after its barrier: `latest` never names a step whose shards are not all
 * durable. Rank 0 collects (logs) the commit at a later settle; the next commit
 * starts only after it (`latest` in step order). The final save and preemption
 * saves stay synchronous and settle the pending one first (dt_train_async_settle
 * with block 1: this rank's write, the agreement, rank 0's commit).
 */
#ifndef DT_RUNTIME_TRAIN_ASYNC_H
#define DT_RUNTIME_TRAIN_ASYNC_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/kernels.h"         /* defines: dt_device_t */
#include "runtime/parallel/dp.h"     /* defines: dt_dp_t */
#include "runtime/train/train_ckpt.h"

typedef struct dt_train_async dt_train_async;

/* Before the first step (checkpoint.async on): creates *a and its staging arena
 * for t's shard, so the first save does not pay for the allocation; a failure is
 * a warning (the first save tries again and reports). */
void dt_train_async_prepare(dt_train_async **a, const dt_train_ckpt *t);
/* The periodic save of `step` in the background; *a is created on first use. A
 * failure to stage is reported (training goes on) and the other ranks learn of it
 * at the next settle. Collective over dp's ranks (the settle of the previous save). */
dt_status_t dt_train_async_save(dt_train_async **a, const dt_train_ckpt *t, dt_dp_t *dp, int64_t step,
                                const char *why);
/* After every step, and before a synchronous save or an elastic stop (block 1: wait for this rank's
 * write first, and on rank 0 for the commit): commits the pending save once every
 * rank's write is over (rank 0, in the background; logged once done); a
 * failed write anywhere drops it with an error in the log (the previous checkpoint
 * stays `latest`). Collective over dp's ranks while a save is pending (the same
 * steps on every rank); nothing when a is NULL or nothing is pending. */
dt_status_t dt_train_async_settle(dt_train_async *a, dt_dp_t *dp, int block);
/* Saves so far, and the mean ms each blocked training (the staging copy, the
 * checks after each step, waits for its write or commit by the next periodic save;
 * not a synchronous save's wait for it, which that save logs) and took in the
 * background (0 when none). */
void dt_train_async_figures(const dt_train_async *a, int *saves, double *blocked_ms, double *write_ms);
/* Adds ckpt_async_saves, ckpt_blocked_ms and ckpt_write_ms (the means above) to
 * summary (a cJSON object) when a (may be NULL) committed any save. */
struct cJSON;
void dt_train_async_summary(const dt_train_async *a, struct cJSON *summary);
/* Waits for a write in progress (it is not committed) and frees the staging. */
void dt_train_async_free(dt_train_async *a);

#endif /* DT_RUNTIME_TRAIN_ASYNC_H */
