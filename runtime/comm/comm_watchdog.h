/*
 * comm_watchdog.h - a watchdog per communicator for backends whose ops run
 * asynchronously on a device (NCCL): a thread that, every period, asks the
 * backend whether the oldest tracked op completed and whether the
 * communicator reported an asynchronous error; an op pending longer than the
 * timeout, or such an error, fires the abort callback once (NCCL:
 * ncclCommAbort, which releases the kernels stuck on the stream) with a detail
 * naming the op, and marks its flight recorder entry failed. Nobody needs to be
 * waiting in dt_comm_wait for this to happen (the caller may be stuck in a
 * device synchronisation behind the op).
 *
 * The timing logic is here, without CUDA, so that it is tested on a CPU with
 * hooks that never complete (tests/test_comm_watchdog.c); comm_nccl.c fills
 * the hooks with cudaEventQuery, ncclCommGetAsyncError and ncclCommAbort.
 */
#ifndef DT_RUNTIME_COMM_WATCHDOG_H
#define DT_RUNTIME_COMM_WATCHDOG_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "runtime/comm/comm.h"

#define DT_COMM_WATCHDOG_MAX 256 /* ops tracked at once (more: the oldest are still checked first) */

typedef struct dt_comm_watchdog_hooks {
    void *ctx;
    /* 1: req completed; 0: pending; -1: failed (detail filled). Called on the watchdog's thread. */
    int (*poll)(void *ctx, dt_comm_req_t *req, char *detail, size_t len);
    /* 1 when the communicator has an asynchronous error (detail filled). */
    int (*async_error)(void *ctx, char *detail, size_t len);
    /* Called once, with the reason, when the watchdog fires. */
    void (*abort)(void *ctx, const char *detail);
    void (*thread_init)(void *ctx); /* first thing on the thread (select the device); may be NULL */
} dt_comm_watchdog_hooks_t;

typedef struct dt_comm_watchdog {
    dt_comm_watchdog_hooks_t hooks;
    double timeout_s, period_s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, stop;
    dt_comm_req_t *req[DT_COMM_WATCHDOG_MAX];
    uint64_t since_ns[DT_COMM_WATCHDOG_MAX];
    int n;
    _Atomic int fired;
    char detail[768];
} dt_comm_watchdog_t;

/* Starts the thread. period_s: how often it looks (0: min(1 s, timeout / 10)). */
dt_status_t dt_comm_watchdog_start(dt_comm_watchdog_t *wd, const dt_comm_watchdog_hooks_t *hooks, double timeout_s,
                                   double period_s);
/* req was queued on the device: watch it from now. */
void dt_comm_watchdog_track(dt_comm_watchdog_t *wd, dt_comm_req_t *req);
/* req ended (completed or failed, seen by its waiter): forget it. */
void dt_comm_watchdog_untrack(dt_comm_watchdog_t *wd, dt_comm_req_t *req);
/* 1 once it fired; *detail then says why (the watchdog's own buffer). */
int dt_comm_watchdog_fired(dt_comm_watchdog_t *wd, const char **detail);
/* Stops and joins the thread. */
void dt_comm_watchdog_stop(dt_comm_watchdog_t *wd);

#endif /* DT_RUNTIME_COMM_WATCHDOG_H */
