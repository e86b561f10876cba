/*
 * test_common.c - the base layer: status table, error detail, memory accounting.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/status.h"

Test(status, names_and_messages_cover_every_code) {
    for (int s = 0; s < DT_STATUS_COUNT_; s++) {
        cr_assert_str_neq(dt_status_name((dt_status_t)s), "UNKNOWN");
        cr_assert(strlen(dt_strerror((dt_status_t)s)) > 0);
    }
    cr_assert_str_eq(dt_status_name(DT_STATUS_TIMEOUT), "TIMEOUT");
    cr_assert_str_eq(dt_strerror(DT_STATUS_TIMEOUT), "timed out");
    cr_assert_str_eq(dt_status_name((dt_status_t)999), "UNKNOWN");
}

Test(status, error_detail_is_per_thread_and_returns_code) {
    dt_status_t st = dt_error(DT_STATUS_TIMEOUT, "waited %d s for %s", 30, "key");
    cr_assert_eq(st, DT_STATUS_TIMEOUT);
    cr_assert_str_eq(dt_error_detail(), "waited 30 s for key");
    dt_error_clear();
    cr_assert_str_eq(dt_error_detail(), "");
}

Test(status, errno_translation) {
    cr_assert_eq(dt_status_from_errno(ETIMEDOUT), DT_STATUS_TIMEOUT);
    cr_assert_eq(dt_status_from_errno(ECONNREFUSED), DT_STATUS_REFUSED);
    cr_assert_eq(dt_status_from_errno(EPIPE), DT_STATUS_CLOSED);
    cr_assert_eq(dt_status_from_errno(ENOSPC), DT_STATUS_IO);
    cr_assert_eq(dt_status_from_errno(0), DT_STATUS_OK);
}

static dt_status_t check_helper(int fail, int *reached) {
    DT_CHECK(fail ? DT_STATUS_IO : DT_STATUS_OK);
    *reached = 1;
    return DT_STATUS_OK;
}

Test(status, check_macros) {
    int reached = 0;
    cr_assert_eq(check_helper(1, &reached), DT_STATUS_IO);
    cr_assert_eq(reached, 0);
    cr_assert_eq(check_helper(0, &reached), DT_STATUS_OK);
    cr_assert_eq(reached, 1);
    dt_status_t st = DT_STATUS_OK;
    DT_CHECK_GOTO(DT_STATUS_CLOSED, st, out_label);
    cr_assert_fail("DT_CHECK_GOTO did not jump");
out_label:
    cr_assert_eq(st, DT_STATUS_CLOSED);
}

Test(mem, accounting_current_and_peak_exact) {
    int64_t base = dt_mem_current(DT_MEM_PARAMS);
    void *a = dt_mem_alloc(DT_MEM_PARAMS, 1000);
    void *b = dt_mem_alloc(DT_MEM_PARAMS, 24);
    cr_assert_not_null(a);
    cr_assert_not_null(b);
    cr_assert_eq((uintptr_t)a % 64, 0, "64-byte aligned");
    cr_assert_eq(((unsigned char *)a)[999], 0, "zero-filled");
    cr_assert_eq(dt_mem_size(a), 1000);
    cr_assert_eq(dt_mem_current(DT_MEM_PARAMS), base + 1024);
    dt_mem_free(a);
    cr_assert_eq(dt_mem_current(DT_MEM_PARAMS), base + 24);
    cr_assert_geq(dt_mem_peak(DT_MEM_PARAMS), base + 1024);
    dt_mem_reset_peaks();
    cr_assert_eq(dt_mem_peak(DT_MEM_PARAMS), base + 24);
    dt_mem_free(b);
    dt_mem_account(DT_MEM_GRADS, 4096);
    cr_assert_eq(dt_mem_current(DT_MEM_GRADS), 4096);
    dt_mem_account(DT_MEM_GRADS, -4096);
    cr_assert_eq(dt_mem_current(DT_MEM_GRADS), 0);
    cr_assert_eq(dt_mem_peak(DT_MEM_GRADS), 4096);
    cr_assert_str_eq(dt_mem_category_name(DT_MEM_OPTIM), "optim");
}

Test(mem, huge_allocation_fails_cleanly) {
    void *p = dt_mem_alloc(DT_MEM_ACTIVATIONS, SIZE_MAX - 10);
    cr_assert_null(p);
    cr_assert(strstr(dt_error_detail(), "activations") != NULL);
}

static void *alloc_loop(void *arg) {
    for (int i = 0; i < 2000; i++) dt_mem_free(dt_mem_alloc(DT_MEM_COMM, 128));
    return arg;
}

Test(mem, concurrent_accounting_balances) {
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, alloc_loop, NULL);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    cr_assert_eq(dt_mem_current(DT_MEM_COMM), 0);
    cr_assert_leq(dt_mem_peak(DT_MEM_COMM), 4 * 128);
    cr_assert_geq(dt_mem_peak(DT_MEM_COMM), 128);
}

Test(clock, monotonic_and_sleep) {
    uint64_t t0 = dt_now_ns();
    dt_sleep_ms(20);
    uint64_t dt = dt_now_ns() - t0;
    cr_assert_geq(dt, 20000000ull);
    cr_assert_lt(dt, 2000000000ull);
    char buf[32];
    dt_wall_str(0, buf, sizeof buf);
    cr_assert_eq(strlen(buf), 19);
}

Test(log, level_parse) {
    cr_assert_eq(dt_log_level_parse("debug"), DT_LOG_DEBUG);
    cr_assert_eq(dt_log_level_parse("WARN"), DT_LOG_WARN);
    cr_assert_eq(dt_log_level_parse("warning"), DT_LOG_WARN);
    cr_assert_eq(dt_log_level_parse("loud"), -1);
    dt_log_set_level(DT_LOG_ERROR);
    cr_assert_eq(dt_log_get_level(), DT_LOG_ERROR);
}
