/*
 * ckpt_async.h - a background writer for one checkpoint shard at a time
 * (checkpoint.async).
 *
 * The caller stages its shard into host memory that stays untouched until the
 * write is over, then dt_ckpt_async_start() copies the save's arguments (strings,
 * the range table, the extra JSON; not the range data) and a thread runs
 * dt_ckpt_write_shard(): the same file, the same bytes, checksums and fsync as a
 * synchronous save. Deciding when to commit stays the caller's (it learns on its
 * own thread that every rank's write is over); rank 0 then runs the commit
 * (dt_ckpt_commit: meta.json, renames, `latest`, pruning, each fsynced) in the
 * background too, on a second writer given the first one's arguments, so the next
 * save's write can start while it runs. A crash during the
 * background write leaves step_N.tmp behind and `latest` at the previous complete
 * checkpoint.
 *
 *     dt_ckpt_async_t *w, *c;  dt_ckpt_async_new(&w);  dt_ckpt_async_new(&c);
 *     dt_ckpt_async_start(w, &args);        // returns at once
 *     ... training goes on ...
 *     if (!dt_ckpt_async_busy(w)) st = dt_ckpt_async_wait(w, &stats);
 *     ... every rank's write is over (the caller's collective) ...
 *     if (st == OK && rank == 0) dt_ckpt_async_commit_start(c, dt_ckpt_async_args(w));
 *     ... training goes on (w may start the next write); later dt_ckpt_async_wait(c, &cstats) ...
 *     dt_ckpt_async_free(w);                // waits for a write or commit in progress
 *
 * Test hook: DTRUN_CKPT_ASYNC_DELAY_MS=MS[:RANK] holds a background write (of that
 * rank only, with RANK) for MS ms before it starts; DTRUN_CKPT_KILL_AT=shard_range
 * (checkpoint.h) then kills the process in the middle of the background write.
 */
#ifndef DT_RUNTIME_CKPT_ASYNC_H
#define DT_RUNTIME_CKPT_ASYNC_H

#include "common/status.h"
#include "runtime/ckpt/checkpoint.h"

typedef struct dt_ckpt_async dt_ckpt_async_t;

dt_status_t dt_ckpt_async_new(dt_ckpt_async_t **out);
/* Joins a write in progress, frees everything (NULL is fine). */
void dt_ckpt_async_free(dt_ckpt_async_t *w);

/* Starts writing a's shard in a background thread (a's barrier is not used).
 * DT_STATUS_INVALID when a write started before has not been waited for. The
 * ranges' data must stay valid and unchanged until dt_ckpt_async_wait returns. */
dt_status_t dt_ckpt_async_start(dt_ckpt_async_t *w, const dt_ckpt_save_args *a);
/* Starts the commit of save a (its arguments are copied) in a background thread
 * of w; dt_ckpt_async_wait(w) returns its status, stats->path the step directory.
 * Only once every rank's shard of a is durable, and after the previous commit was
 * waited for (`latest` moves in step order). */
dt_status_t dt_ckpt_async_commit_start(dt_ckpt_async_t *w, const dt_ckpt_save_args *a);
/* 1 while the background write (or commit) runs, 0 once it is over (or none was started). */
int dt_ckpt_async_busy(dt_ckpt_async_t *w);
/* 1 between a start and its wait. */
int dt_ckpt_async_pending(const dt_ckpt_async_t *w);
/* Waits for the write (or commit) to be over and returns its status (the detail on this
 * thread); stats (may be NULL) gets its bytes, write time and step path. */
dt_status_t dt_ckpt_async_wait(dt_ckpt_async_t *w, dt_ckpt_save_stats *stats);
/* The arguments of the last started save (for dt_ckpt_commit); valid until the
 * next start. */
const dt_ckpt_save_args *dt_ckpt_async_args(const dt_ckpt_async_t *w);

#endif /* DT_RUNTIME_CKPT_ASYNC_H */
