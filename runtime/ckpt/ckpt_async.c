/*
 * ckpt_async.c - the background shard writer of checkpoint.async (see
 * ckpt_async.h): one thread per save (its write, then on rank 0 its commit),
 * joined by the wait.
 */
#include "runtime/ckpt/ckpt_async.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mem.h"

struct dt_ckpt_async {
    pthread_t thread;
    int started;        /* a thread to join */
    atomic_int running; /* the thread has not finished its write or commit */
    int commit;         /* the thread runs dt_ckpt_commit (else the shard write) */
    /* The save's arguments, owned: strings and the range table are copies. */
    dt_ckpt_save_args args;
    char *dir, *strategy, *extra, *run_id;
    dt_ckpt_range *ranges;
    dt_ckpt_save_stats stats;
    dt_status_t st;
    char detail[1024]; /* the writer thread's error detail, for the waiter's thread */
};

dt_status_t dt_ckpt_async_new(dt_ckpt_async_t **out) {
    *out = dt_xcalloc(1, sizeof **out);
    return DT_STATUS_OK;
}

/* Test hook: DTRUN_CKPT_ASYNC_DELAY_MS=MS[:RANK] holds the background write of
 * that rank (every rank without one) for MS ms before it starts, so tests can
 * act while a write is in progress. */
static void test_delay(int rank) {
    const char *env = getenv("DTRUN_CKPT_ASYNC_DELAY_MS");
    if (!env || !*env) return;
    char *end;
    long ms = strtol(env, &end, 10);
    if (*end == ':' && atoi(end + 1) != rank) return;
    if (ms > 0) usleep((useconds_t)ms * 1000);
}

static void *writer_main(void *arg) {
    dt_ckpt_async_t *w = arg;
    if (w->commit) {
        w->st = dt_ckpt_commit(&w->args, &w->stats);
    } else {
        test_delay(w->args.rank);
        w->st = dt_ckpt_write_shard(&w->args, &w->stats);
    }
    if (w->st != DT_STATUS_OK) snprintf(w->detail, sizeof w->detail, "%s", dt_error_detail());
    atomic_store(&w->running, 0);
    return NULL;
}

static void free_args(dt_ckpt_async_t *w) {
    free(w->dir);
    free(w->strategy);
    free(w->extra);
    free(w->run_id);
    free(w->ranges);
    w->dir = w->strategy = w->extra = w->run_id = NULL;
    w->ranges = NULL;
}

/* Runs the write (commit 0) or the commit (1) of w->args in a new thread. */
static dt_status_t start_thread(dt_ckpt_async_t *w, int commit) {
    w->commit = commit;
    w->st = DT_STATUS_OK;
    w->detail[0] = 0;
    atomic_store(&w->running, 1);
    int rc = pthread_create(&w->thread, NULL, writer_main, w);
    if (rc != 0) {
        atomic_store(&w->running, 0);
        return dt_error(DT_STATUS_IO, "checkpoint.async: cannot start the writer thread: %s", strerror(rc));
    }
    w->started = 1;
    return DT_STATUS_OK;
}

static char *dup_or_null(const char *s) { return s ? dt_xstrdup(s) : NULL; }

/* Keeps a copy of a's strings and range table (not the range data) in w. */
static void copy_args(dt_ckpt_async_t *w, const dt_ckpt_save_args *a) {
    const dt_ckpt_save_args in = *a; /* a may be another writer's kept arguments */
    free_args(w);
    w->args = in;
    w->args.dir = w->dir = dup_or_null(in.dir);
    w->args.strategy = w->strategy = dup_or_null(in.strategy);
    w->args.extra_json = w->extra = dup_or_null(in.extra_json);
    w->args.run_id = w->run_id = dup_or_null(in.run_id);
    w->ranges = dt_xcalloc((size_t)in.n_ranges + 1, sizeof *w->ranges);
    if (in.n_ranges > 0) memcpy(w->ranges, in.ranges, (size_t)in.n_ranges * sizeof *w->ranges);
    w->args.ranges = w->ranges;
    w->args.barrier = NULL; /* the caller meets the other ranks on its own thread */
    w->args.barrier_ctx = NULL;
    memset(&w->stats, 0, sizeof w->stats);
}

dt_status_t dt_ckpt_async_start(dt_ckpt_async_t *w, const dt_ckpt_save_args *a) {
    if (w->started) return dt_error(DT_STATUS_INVALID, "checkpoint.async: the previous save was not waited for");
    copy_args(w, a);
    return start_thread(w, 0);
}

dt_status_t dt_ckpt_async_commit_start(dt_ckpt_async_t *w, const dt_ckpt_save_args *a) {
    if (w->started) return dt_error(DT_STATUS_INVALID, "checkpoint.async: the previous commit was not waited for");
    copy_args(w, a);
    return start_thread(w, 1);
}

int dt_ckpt_async_busy(dt_ckpt_async_t *w) { return w->started && atomic_load(&w->running); }

int dt_ckpt_async_pending(const dt_ckpt_async_t *w) { return w->started; }

dt_status_t dt_ckpt_async_wait(dt_ckpt_async_t *w, dt_ckpt_save_stats *stats) {
    if (!w->started) return DT_STATUS_OK;
    pthread_join(w->thread, NULL);
    w->started = 0;
    if (stats) *stats = w->stats;
    if (w->st != DT_STATUS_OK) return dt_error(w->st, "%s", w->detail);
    return DT_STATUS_OK;
}

const dt_ckpt_save_args *dt_ckpt_async_args(const dt_ckpt_async_t *w) { return &w->args; }

void dt_ckpt_async_free(dt_ckpt_async_t *w) {
    if (!w) return;
    if (w->started) pthread_join(w->thread, NULL);
    free_args(w);
    free(w);
}
