/*
 * comm_watchdog.c - the per-communicator watchdog of device backends
 * (comm_watchdog.h): tracked requests, the thread that polls them and the
 * asynchronous error, and the one abort.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "runtime/comm/comm_impl.h"
#include "runtime/comm/comm_watchdog.h"
#include "runtime/comm/flight.h"

/* Only the watchdog's thread fires (look, under wd->mu): the detail is written
 * before `fired` is published, so a thread that sees fired reads it whole. */
static void fire(dt_comm_watchdog_t *wd, dt_comm_req_t *req, const char *detail) {
    if (atomic_load(&wd->fired)) return;
    snprintf(wd->detail, sizeof wd->detail, "%s", detail);
    atomic_store(&wd->fired, 1);
    if (req) dt_comm_flight_state_(req, DT_FLIGHT_FAILED);
    DT_LOG_ERROR("comm watchdog: %s; aborting the communicator", wd->detail);
    wd->hooks.abort(wd->hooks.ctx, wd->detail);
}

/* One look: the oldest pending op, then the asynchronous error. Called with wd->mu held. */
static void look(dt_comm_watchdog_t *wd) {
    char why[600];
    while (wd->n > 0) {
        dt_comm_req_t *req = wd->req[0];
        int r = wd->hooks.poll(wd->hooks.ctx, req, why, sizeof why);
        if (r == 0) break;
        if (r < 0) {
            fire(wd, req, why);
            return;
        }
        memmove(wd->req, wd->req + 1, sizeof(wd->req[0]) * (size_t)(wd->n - 1)); /* done: the next oldest */
        memmove(wd->since_ns, wd->since_ns + 1, sizeof(wd->since_ns[0]) * (size_t)(wd->n - 1));
        wd->n--;
    }
    if (wd->hooks.async_error && wd->hooks.async_error(wd->hooks.ctx, why, sizeof why)) {
        char msg[768];
        snprintf(msg, sizeof msg, "asynchronous error: %s", why);
        fire(wd, wd->n ? wd->req[0] : NULL, msg);
        return;
    }
    if (wd->n == 0) return;
    double waited = (double)(dt_now_ns() - wd->since_ns[0]) * 1e-9;
    if (waited < wd->timeout_s) return;
    char what[200], msg[768];
    dt_comm_describe_(wd->req[0], what, sizeof what);
    snprintf(msg, sizeof msg, "%s did not complete in %.1f s (comm.timeout_s %.1f)", what, waited, wd->timeout_s);
    fire(wd, wd->req[0], msg);
}

static void *watchdog_thread(void *arg) {
    dt_comm_watchdog_t *wd = arg;
    pthread_setname_np(pthread_self(), "dtwatchdog");
    if (wd->hooks.thread_init) wd->hooks.thread_init(wd->hooks.ctx);
    pthread_mutex_lock(&wd->mu);
    while (!wd->stop) {
        if (!atomic_load(&wd->fired)) look(wd);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)(wd->period_s * 1e9);
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&wd->cv, &wd->mu, &ts);
    }
    pthread_mutex_unlock(&wd->mu);
    return NULL;
}

dt_status_t dt_comm_watchdog_start(dt_comm_watchdog_t *wd, const dt_comm_watchdog_hooks_t *hooks, double timeout_s,
                                   double period_s) {
    memset(wd, 0, sizeof *wd);
    wd->hooks = *hooks;
    wd->timeout_s = timeout_s;
    wd->period_s = period_s > 0 ? period_s : (timeout_s / 10 < 1.0 ? timeout_s / 10 : 1.0);
    pthread_mutex_init(&wd->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wd->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&wd->thread, NULL, watchdog_thread, wd) != 0) {
        pthread_mutex_destroy(&wd->mu);
        pthread_cond_destroy(&wd->cv);
        return dt_error(DT_STATUS_SYS, "comm watchdog: cannot start its thread");
    }
    wd->started = 1;
    return DT_STATUS_OK;
}

void dt_comm_watchdog_track(dt_comm_watchdog_t *wd, dt_comm_req_t *req) {
    if (!wd->started) return;
    pthread_mutex_lock(&wd->mu);
    if (wd->n < DT_COMM_WATCHDOG_MAX) {
        wd->req[wd->n] = req;
        wd->since_ns[wd->n] = dt_now_ns();
        wd->n++;
    }
    pthread_mutex_unlock(&wd->mu);
}

void dt_comm_watchdog_untrack(dt_comm_watchdog_t *wd, dt_comm_req_t *req) {
    if (!wd->started) return;
    pthread_mutex_lock(&wd->mu);
    for (int i = 0; i < wd->n; i++) {
        if (wd->req[i] != req) continue;
        memmove(wd->req + i, wd->req + i + 1, sizeof(wd->req[0]) * (size_t)(wd->n - i - 1));
        memmove(wd->since_ns + i, wd->since_ns + i + 1, sizeof(wd->since_ns[0]) * (size_t)(wd->n - i - 1));
        wd->n--;
        break;
    }
    pthread_mutex_unlock(&wd->mu);
}

int dt_comm_watchdog_fired(dt_comm_watchdog_t *wd, const char **detail) {
    if (!atomic_load(&wd->fired)) return 0;
    if (detail) *detail = wd->detail;
    return 1;
}

void dt_comm_watchdog_stop(dt_comm_watchdog_t *wd) {
    if (!wd->started) return;
    pthread_mutex_lock(&wd->mu);
    wd->stop = 1;
    pthread_cond_broadcast(&wd->cv);
    pthread_mutex_unlock(&wd->mu);
    pthread_join(wd->thread, NULL);
    pthread_mutex_destroy(&wd->mu);
    pthread_cond_destroy(&wd->cv);
    wd->started = 0;
}
