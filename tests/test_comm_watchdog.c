/*
 * test_comm_watchdog.c - the device backends' watchdog (comm_watchdog.h) with
 * injected hooks: an op that never completes fires the abort once, after the
 * timeout and not before, naming the op; ops that complete never fire; an
 * asynchronous error fires at once with its text.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "runtime/comm/comm_watchdog.h"

typedef struct fake {
    _Atomic int complete;   /* what poll answers for every op */
    _Atomic int async_err;
    _Atomic int aborts;
    char why[768];
    double fired_at;
} fake_t;

static int fake_poll(void *ctx, dt_comm_req_t *req, char *d, size_t n) {
    (void)req, (void)d, (void)n;
    return atomic_load(&((fake_t *)ctx)->complete);
}
static int fake_async(void *ctx, char *d, size_t n) {
    if (!atomic_load(&((fake_t *)ctx)->async_err)) return 0;
    snprintf(d, n, "unhandled system error (injected)");
    return 1;
}
static void fake_abort(void *ctx, const char *detail) {
    fake_t *f = ctx;
    snprintf(f->why, sizeof f->why, "%s", detail);
    f->fired_at = dt_now_s();
    atomic_fetch_add(&f->aborts, 1);
}

static void make_req(dt_comm_req_t *r, uint64_t seq) {
    memset(r, 0, sizeof *r);
    r->op_ = DT_COMM_OP_ALL_REDUCE;
    r->dtype_ = DT_COMM_F32;
    r->count_ = 10;
    r->seq_ = seq;
}

Test(comm_watchdog, an_op_that_never_completes_aborts_after_the_timeout) {
    fake_t f = {0};
    dt_comm_watchdog_hooks_t h = {&f, fake_poll, fake_async, fake_abort, NULL};
    dt_comm_watchdog_t wd;
    cr_assert_eq(dt_comm_watchdog_start(&wd, &h, 0.5, 0.02), DT_STATUS_OK);
    dt_comm_req_t r;
    make_req(&r, 7);
    double t0 = dt_now_s();
    dt_comm_watchdog_track(&wd, &r);
    usleep(200 * 1000);
    cr_assert_eq(atomic_load(&f.aborts), 0, "fired before the timeout");
    while (!atomic_load(&f.aborts) && dt_now_s() - t0 < 5) usleep(10 * 1000);
    usleep(200 * 1000);
    dt_comm_watchdog_stop(&wd);
    cr_assert_eq(atomic_load(&f.aborts), 1, "fires once");
    cr_assert_geq(f.fired_at - t0, 0.5);
    cr_assert_lt(f.fired_at - t0, 3.0);
    cr_assert(strstr(f.why, "all_reduce #7 (count 10, f32, sum) did not complete in"), "%s", f.why);
    const char *d = NULL;
    cr_assert(dt_comm_watchdog_fired(&wd, &d));
    cr_assert_str_eq(d, f.why);
}

Test(comm_watchdog, completed_ops_never_fire) {
    fake_t f = {0};
    atomic_store(&f.complete, 1);
    dt_comm_watchdog_hooks_t h = {&f, fake_poll, fake_async, fake_abort, NULL};
    dt_comm_watchdog_t wd;
    cr_assert_eq(dt_comm_watchdog_start(&wd, &h, 0.2, 0.01), DT_STATUS_OK);
    dt_comm_req_t r[5];
    for (int i = 0; i < 5; i++) {
        make_req(&r[i], (uint64_t)i + 1);
        dt_comm_watchdog_track(&wd, &r[i]);
    }
    dt_comm_watchdog_untrack(&wd, &r[4]);
    usleep(600 * 1000);
    dt_comm_watchdog_stop(&wd);
    cr_assert_eq(atomic_load(&f.aborts), 0);
    cr_assert_eq(wd.n, 0);
}

Test(comm_watchdog, an_asynchronous_error_fires_at_once) {
    fake_t f = {0};
    atomic_store(&f.async_err, 1);
    dt_comm_watchdog_hooks_t h = {&f, fake_poll, fake_async, fake_abort, NULL};
    dt_comm_watchdog_t wd;
    cr_assert_eq(dt_comm_watchdog_start(&wd, &h, 100, 0.01), DT_STATUS_OK);
    double t0 = dt_now_s();
    while (!atomic_load(&f.aborts) && dt_now_s() - t0 < 5) usleep(10 * 1000);
    dt_comm_watchdog_stop(&wd);
    cr_assert_eq(atomic_load(&f.aborts), 1);
    cr_assert(strstr(f.why, "asynchronous error: unhandled system error (injected)"), "%s", f.why);
}
