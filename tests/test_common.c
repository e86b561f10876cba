/*
 * test_common.c - the base layer: status table, error detail, exit codes, memory
 * accounting, the filesystem helpers, torchrun's worker environment.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/status.h"
#include "common/torchenv.h"

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

/* The common "prefix the detail to itself" form: the argument is the buffer being
 * written (it came out as "lora.init: lora.init: zz/tests/..."). */
Test(status, error_detail_can_prefix_itself) {
    dt_error(DT_STATUS_CONFIG, "/work/tests/fixtures/lora/adapter_config.json: r is %d", 8);
    dt_error(DT_STATUS_CONFIG, "lora.init: %s", dt_error_detail());
    cr_assert_str_eq(dt_error_detail(), "lora.init: /work/tests/fixtures/lora/adapter_config.json: r is 8");
}

/* Issue 31: a message that quotes the detail it replaces came out garbled (the
 * prefix overwrote the reason while vsnprintf was still reading it). */
Test(status, error_that_quotes_the_detail_keeps_it) {
    dt_error(DT_STATUS_IO, "cannot open /data/x.bin: No such file or directory");
    dt_error(DT_STATUS_CONFIG, "lora.init: %s", dt_error_detail());
    cr_assert_str_eq(dt_error_detail(), "lora.init: cannot open /data/x.bin: No such file or directory");
    dt_error(DT_STATUS_IO, "short read");
    cr_assert_eq(dt_error_prefix(DT_STATUS_FORMAT, "tokenizer %s", "/t/tokenizer.json"), DT_STATUS_FORMAT);
    cr_assert_str_eq(dt_error_detail(), "tokenizer /t/tokenizer.json: short read");
    dt_error_clear();
    dt_error_prefix(DT_STATUS_IO, "alone");
    cr_assert_str_eq(dt_error_detail(), "alone", "no \": \" without a detail");
    char longest[2000];
    memset(longest, 'x', sizeof longest - 1);
    longest[sizeof longest - 1] = '\0';
    dt_error(DT_STATUS_IO, "%s", longest);
    dt_error_prefix(DT_STATUS_IO, "p");
    cr_assert_eq(strlen(dt_error_detail()), 1023, "cut to the buffer");
    cr_assert(!strncmp(dt_error_detail(), "p: xxx", 6));
}

Test(status, errno_translation) {
    cr_assert_eq(dt_status_from_errno(ETIMEDOUT), DT_STATUS_TIMEOUT);
    cr_assert_eq(dt_status_from_errno(ECONNREFUSED), DT_STATUS_REFUSED);
    cr_assert_eq(dt_status_from_errno(EPIPE), DT_STATUS_CLOSED);
    cr_assert_eq(dt_status_from_errno(ENOSPC), DT_STATUS_IO);
    cr_assert_eq(dt_status_from_errno(0), DT_STATUS_OK);
}

Test(status, exit_codes_follow_the_contract) {
    cr_assert_eq(dt_status_exit_code(DT_STATUS_OK), DT_EXIT_OK);
    cr_assert_eq(DT_EXIT_OK, 0);
    cr_assert_eq(DT_EXIT_FAILED, 1);
    cr_assert_eq(DT_EXIT_USAGE, 2);
    cr_assert_eq(DT_EXIT_NETWORK, 3);
    const dt_status_t usage[] = {DT_STATUS_USAGE, DT_STATUS_CONFIG, DT_STATUS_INVALID, DT_STATUS_FORMAT,
                                 DT_STATUS_NOT_FOUND};
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++)
        cr_assert_eq(dt_status_exit_code(usage[i]), DT_EXIT_USAGE, "%s", dt_status_name(usage[i]));
    const dt_status_t net[] = {DT_STATUS_RENDEZVOUS, DT_STATUS_TIMEOUT, DT_STATUS_CLOSED, DT_STATUS_REFUSED,
                               DT_STATUS_PROTOCOL};
    for (size_t i = 0; i < sizeof net / sizeof net[0]; i++)
        cr_assert_eq(dt_status_exit_code(net[i]), DT_EXIT_NETWORK, "%s", dt_status_name(net[i]));
    const dt_status_t failed[] = {DT_STATUS_IO, DT_STATUS_NOMEM, DT_STATUS_SYS, DT_STATUS_WORKER_FAILED,
                                  DT_STATUS_CUDA, DT_STATUS_NCCL, DT_STATUS_CHECKSUM, DT_STATUS_MISMATCH};
    for (size_t i = 0; i < sizeof failed / sizeof failed[0]; i++)
        cr_assert_eq(dt_status_exit_code(failed[i]), DT_EXIT_FAILED, "%s", dt_status_name(failed[i]));
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

/* ---- fs ---------------------------------------------------------------------- */

/* A fresh directory under /tmp for one test; removed by the test itself. */
static void tmp_dir(char *buf, size_t len) {
    snprintf(buf, len, "/tmp/dt-test-fs-XXXXXX");
    cr_assert_not_null(mkdtemp(buf));
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

Test(fs, mkdir_p_creates_parents_and_accepts_existing) {
    char root[64], p[PATH_MAX];
    tmp_dir(root, sizeof root);
    snprintf(p, sizeof p, "%s/a/b//c/", root);
    cr_assert_eq(dt_fs_mkdir_p(p), DT_STATUS_OK, "%s", dt_error_detail());
    snprintf(p, sizeof p, "%s/a/b/c", root);
    cr_assert(is_dir(p));
    cr_assert_eq(dt_fs_mkdir_p(p), DT_STATUS_OK, "an existing directory is fine");
    cr_assert_eq(dt_fs_rm_rf(root), DT_STATUS_OK);
}

Test(fs, mkdir_p_through_a_file_names_the_path) {
    char root[64], file[256], p[PATH_MAX];
    tmp_dir(root, sizeof root);
    snprintf(file, sizeof file, "%s/a-file", root);
    write_text(file, "x");
    snprintf(p, sizeof p, "%s/ck/step", file);
    cr_assert_eq(dt_fs_mkdir_p(p), DT_STATUS_IO);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "cannot create directory %s/ck: ", file);
    cr_assert(strstr(dt_error_detail(), want) != NULL, "detail: %s", dt_error_detail());
    /* the path itself is a file: not a directory, so not done */
    cr_assert_eq(dt_fs_mkdir_p(file), DT_STATUS_IO);
    cr_assert(strstr(dt_error_detail(), "Not a directory") != NULL, "detail: %s", dt_error_detail());
    cr_assert_eq(dt_fs_mkdir_p(""), DT_STATUS_INVALID);
    cr_assert_eq(dt_fs_mkdir_p("/proc/no/such"), DT_STATUS_IO, "a missing filesystem is an I/O failure too");
    cr_assert_eq(dt_fs_rm_rf(root), DT_STATUS_OK);
}

Test(fs, rm_rf_removes_the_tree_without_following_links) {
    char root[64], outside[64], p[PATH_MAX], keep[PATH_MAX];
    tmp_dir(root, sizeof root);
    tmp_dir(outside, sizeof outside);
    snprintf(keep, sizeof keep, "%s/keep.txt", outside);
    write_text(keep, "still here");
    snprintf(p, sizeof p, "%s/x/y/z", root);
    cr_assert_eq(dt_fs_mkdir_p(p), DT_STATUS_OK);
    snprintf(p, sizeof p, "%s/x/y/file", root);
    write_text(p, "gone");
    snprintf(p, sizeof p, "%s/x/link", root);
    cr_assert_eq(symlink(outside, p), 0);
    cr_assert_eq(dt_fs_rm_rf(root), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(access(root, F_OK), -1, "the tree is gone");
    cr_assert_eq(access(keep, F_OK), 0, "what a link inside pointed to is kept");
    cr_assert_eq(dt_fs_rm_rf(root), DT_STATUS_OK, "a missing path is fine");
    cr_assert_eq(dt_fs_rm_rf(outside), DT_STATUS_OK);
}

Test(fs, read_file_whole_limited_and_missing) {
    char root[64], p[PATH_MAX];
    tmp_dir(root, sizeof root);
    snprintf(p, sizeof p, "%s/t.txt", root);
    /* larger than the first 4 KiB buffer: the read must grow it */
    char *big = malloc(10001);
    for (int i = 0; i < 10000; i++) big[i] = (char)('a' + i % 26);
    big[10000] = '\0';
    write_text(p, big);
    char *out = NULL;
    size_t len = 0;
    cr_assert_eq(dt_fs_read_file(p, 1 << 20, &out, &len), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(len, 10000);
    cr_assert_str_eq(out, big);
    free(out);
    cr_assert_eq(dt_fs_read_file(p, 10000, &out, NULL), DT_STATUS_OK, "exactly max bytes is fine");
    free(out);
    cr_assert_eq(dt_fs_read_file(p, 9999, &out, &len), DT_STATUS_LIMIT);
    cr_assert_null(out);
    snprintf(p, sizeof p, "%s/missing", root);
    cr_assert_eq(dt_fs_read_file(p, 100, &out, &len), DT_STATUS_NOT_FOUND);
    cr_assert(strstr(dt_error_detail(), p) != NULL, "detail names the path: %s", dt_error_detail());
    snprintf(p, sizeof p, "%s/empty", root);
    write_text(p, "");
    cr_assert_eq(dt_fs_read_file(p, 100, &out, &len), DT_STATUS_OK);
    cr_assert_eq(len, 0);
    cr_assert_str_eq(out, "");
    free(out);
    free(big);
    cr_assert_eq(dt_fs_rm_rf(root), DT_STATUS_OK);
}

Test(fs, self_exe_is_this_binary) {
    char exe[PATH_MAX], want[PATH_MAX];
    cr_assert_eq(dt_fs_self_exe(exe, sizeof exe), DT_STATUS_OK, "%s", dt_error_detail());
    ssize_t n = readlink("/proc/self/exe", want, sizeof want - 1);
    cr_assert_gt(n, 0);
    want[n] = '\0';
    cr_assert_str_eq(exe, want);
    const char *base = strrchr(exe, '/');
    cr_assert_str_eq(base, "/test_common");
    char tiny[8];
    cr_assert_eq(dt_fs_self_exe(tiny, sizeof tiny), DT_STATUS_LIMIT);
}

/* ---- torchenv ------------------------------------------------------------------ */

static void clear_torchenv(void) {
    const char *names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                           "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unsetenv(names[i]);
}

Test(torchenv, unset_is_one_process) {
    clear_torchenv();
    dt_torchenv_t env;
    cr_assert_eq(dt_torchenv_read(&env), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(env.rank, 0);
    cr_assert_eq(env.world_size, 1);
    cr_assert_eq(env.local_rank, 0);
    cr_assert_eq(env.local_world_size, 1);
    cr_assert_eq(env.group_rank, 0);
    cr_assert_null(env.master_addr);
    cr_assert_eq(env.master_port, 0);
    cr_assert_eq(env.restart_count, 0);
    cr_assert_str_eq(env.run_id, "none");
    cr_assert_eq(env.launched, 0);
    cr_assert_eq(dt_torchenv_require_store(&env), DT_STATUS_CONFIG);
    cr_assert_str_eq(dt_error_detail(), "environment variable MASTER_ADDR is not set");
}

Test(torchenv, reads_what_the_agent_sets) {
    clear_torchenv();
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("GROUP_RANK", "1", 1);
    setenv("MASTER_ADDR", "10.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
    setenv("TORCHELASTIC_RUN_ID", "job7", 1);
    dt_torchenv_t env;
    cr_assert_eq(dt_torchenv_read(&env), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(env.rank, 5);
    cr_assert_eq(env.world_size, 8);
    cr_assert_eq(env.local_rank, 1);
    cr_assert_eq(env.local_world_size, 4);
    cr_assert_eq(env.group_rank, 1);
    cr_assert_str_eq(env.master_addr, "10.0.0.1");
    cr_assert_eq(env.master_port, 29500);
    cr_assert_eq(env.restart_count, 2);
    cr_assert_str_eq(env.run_id, "job7");
    cr_assert_eq(env.launched, 1);
    cr_assert_eq(dt_torchenv_require_store(&env), DT_STATUS_OK);
    /* without LOCAL_RANK, the rank's place in its node of LOCAL_WORLD_SIZE */
    unsetenv("LOCAL_RANK");
    cr_assert_eq(dt_torchenv_read(&env), DT_STATUS_OK);
    cr_assert_eq(env.local_rank, 1);
    unsetenv("MASTER_PORT");
    cr_assert_eq(dt_torchenv_read(&env), DT_STATUS_OK);
    cr_assert_eq(dt_torchenv_require_store(&env), DT_STATUS_CONFIG);
    cr_assert_str_eq(dt_error_detail(), "environment variable MASTER_PORT is not set");
}

Test(torchenv, bad_values_name_the_variable_and_value) {
    clear_torchenv();
    dt_torchenv_t env;
    setenv("WORLD_SIZE", "4", 1);
    setenv("RANK", "4", 1);
    cr_assert_eq(dt_torchenv_read(&env), DT_STATUS_CONFIG);
    cr_assert_str_eq(dt_error_detail(), "environment variable RANK=\"4\": expected an integer in [0, 3]");
    setenv("RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "two", 1);
    cr_assert_eq(dt_torchenv_read(&env), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "LOCAL_WORLD_SIZE=\"two\"") != NULL, "%s", dt_error_detail());
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("LOCAL_RANK", "2", 1);
    cr_assert_eq(dt_torchenv_read(&env), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "LOCAL_RANK=\"2\"") != NULL, "%s", dt_error_detail());
    unsetenv("LOCAL_RANK");
    setenv("MASTER_PORT", "70000", 1);
    cr_assert_eq(dt_torchenv_read(&env), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "MASTER_PORT=\"70000\"") != NULL, "%s", dt_error_detail());
}
