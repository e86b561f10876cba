/*
 * test_checkpoint_traps.c - a checkpoint directory that someone else can write into
 * must not make dtrun write or delete outside it: symbolic links named step_N,
 * step_N.tmp, latest.tmp or latest; a FIFO as meta.json or a shard; a step folder
 * holding files that are not dtrun's; and keep_last pruning only the checkpoints of
 * the run that saves (meta.json's run_id). Each trap is set in a temporary
 * directory with a "victim" folder beside the checkpoint root, and the test checks
 * the victim is untouched.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/status.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/model/model.h"

static char top[64], dir[128], victim[128];

static void make_dirs(void) {
    strcpy(top, "/tmp/dt-cktrap-XXXXXX");
    cr_assert_not_null(mkdtemp(top));
    snprintf(dir, sizeof dir, "%s/ck", top);
    snprintf(victim, sizeof victim, "%s/victim", top);
    cr_assert_eq(mkdir(dir, 0755), 0);
    cr_assert_eq(mkdir(victim, 0755), 0);
}

static void rm_dirs(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", top);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(ckpt_traps, .init = make_dirs, .fini = rm_dirs, .timeout = 30);

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

static int exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* Entries of a folder besides . and .. */
static int n_entries(const char *path) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq 0", path);
    int n = 0;
    if (system(cmd) != 0) n = 1;
    return n;
}

static dt_model_layout layout;
static float *params;

static void small_model(void) {
    dt_model_spec s = {.ops = &dt_model_gpt, .n_layer = 1, .n_head = 2, .n_embd = 32, .seq_len = 16,
                       .vocab_size = 256, .vocab_pad_multiple = 64};
    cr_assert_eq(dt_model_layout_init(&s, &layout), DT_STATUS_OK);
    params = calloc(layout.n_params, sizeof(float));
    for (size_t i = 0; i < layout.n_params; i++) params[i] = (float)i * 0.001f;
}

/* One rank saves step `step` of run `run_id` (NULL: none) keeping keep_last. */
static dt_status_t save(int64_t step, int64_t keep_last, const char *run_id) {
    if (!params) small_model();
    dt_ckpt_range r = {.buffer = "params", .offset = 0, .count = layout.n_params, .data = params};
    dt_ckpt_save_args a = {.dir = dir, .step = step, .world_size = 1, .layout = &layout, .ranges = &r,
                           .n_ranges = 1, .keep_last = keep_last, .run_id = run_id};
    return dt_ckpt_save(&a, NULL);
}

static void path_in(char *out, size_t len, const char *base, const char *name) { snprintf(out, len, "%s/%s", base, name); }

/* A step_* symbolic link to another folder is not a checkpoint: pruning with
 * keep_last 1 leaves the folder and its files alone. */
Test(ckpt_traps, step_symlink_is_not_pruned) {
    char p[256], link[256];
    path_in(p, sizeof p, victim, "precious.txt");
    write_file(p, "keep me\n");
    path_in(link, sizeof link, dir, "step_00000001");
    cr_assert_eq(symlink(victim, link), 0);
    cr_assert_eq(save(5, 1, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(save(6, 1, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert(exists(p), "pruning emptied the folder a step_ symlink points to");
    path_in(p, sizeof p, dir, "step_00000005");
    cr_assert(!exists(p), "step 5 was not pruned with keep_last 1");
}

/* A latest.tmp symbolic link: the save replaces the link, never writes its target. */
Test(ckpt_traps, latest_tmp_symlink_target_untouched) {
    char target[256], link[256], buf[64] = {0};
    path_in(target, sizeof target, victim, "target");
    write_file(target, "original\n");
    path_in(link, sizeof link, dir, "latest.tmp");
    cr_assert_eq(symlink(target, link), 0);
    cr_assert_eq(save(3, 0, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    FILE *f = fopen(target, "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(buf, sizeof buf, f));
    fclose(f);
    cr_assert_str_eq(buf, "original\n", "the save wrote through latest.tmp into its target");
    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_ckpt_step(c), 3);
    dt_ckpt_close(c);
}

/* A step_N.tmp symbolic link: no shard and no meta.json land in its target; the
 * save fails naming the link. */
Test(ckpt_traps, step_tmp_symlink_receives_nothing) {
    char link[256];
    path_in(link, sizeof link, dir, "step_00000004.tmp");
    cr_assert_eq(symlink(victim, link), 0);
    dt_status_t st = save(4, 0, NULL);
    cr_assert_eq(n_entries(victim), 0, "the save wrote into the folder step_00000004.tmp points to");
    cr_assert_neq(st, DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "step_00000004.tmp") && strstr(dt_error_detail(), "symbolic link"), "%s",
              dt_error_detail());
}

/* A stale .tmp symbolic link of an older step: pruning does not empty its target. */
Test(ckpt_traps, stale_tmp_symlink_target_not_emptied) {
    char p[256], link[256];
    path_in(p, sizeof p, victim, "shard_00000.bin");
    write_file(p, "not a shard\n");
    path_in(link, sizeof link, dir, "step_00000001.tmp");
    cr_assert_eq(symlink(victim, link), 0);
    cr_assert_eq(save(2, 1, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert(exists(p), "pruning a stale .tmp link emptied its target");
}

/* A step folder holding someone's file besides dtrun's: pruning removes dtrun's
 * files and leaves the folder with the stranger's file. */
Test(ckpt_traps, prune_removes_only_dtrun_files) {
    cr_assert_eq(save(1, 1, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    char p[256], m[256];
    snprintf(p, sizeof p, "%s/step_00000001/notes.txt", dir);
    write_file(p, "mine\n");
    cr_assert_eq(save(2, 1, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert(exists(p), "pruning deleted a file dtrun did not write");
    snprintf(m, sizeof m, "%s/step_00000001/meta.json", dir);
    cr_assert(!exists(m), "step 1 was not pruned");
}

/* keep_last counts and deletes only this run's checkpoints. */
Test(ckpt_traps, keep_last_spares_other_runs) {
    cr_assert_eq(save(1, 0, "run-a"), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(save(2, 0, "run-a"), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(save(3, 1, "run-b"), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(save(4, 1, "run-b"), DT_STATUS_OK, "%s", dt_error_detail());
    char p[256];
    snprintf(p, sizeof p, "%s/step_00000001", dir);
    cr_assert(exists(p), "run-b pruned run-a's step 1");
    snprintf(p, sizeof p, "%s/step_00000002", dir);
    cr_assert(exists(p), "run-b pruned run-a's step 2");
    snprintf(p, sizeof p, "%s/step_00000003", dir);
    cr_assert(!exists(p), "run-b's own step 3 was kept past keep_last 1");
    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_str_eq(dt_ckpt_run_id(c), "run-b");
    dt_ckpt_close(c);
}

/* `latest` as a symbolic link to a file outside: refused before reading, and
 * nothing of the file appears in the error. */
Test(ckpt_traps, latest_symlink_outside_refused_unread) {
    char target[256], link[256];
    path_in(target, sizeof target, victim, "passwd");
    write_file(target, "root-secret-line:x:0:0\n");
    path_in(link, sizeof link, dir, "latest");
    cr_assert_eq(symlink(target, link), 0);
    dt_ckpt_t *c;
    cr_assert_neq(dt_ckpt_open(dir, &c), DT_STATUS_OK);
    cr_assert_null(strstr(dt_error_detail(), "secret"), "%s", dt_error_detail());
    cr_assert(strstr(dt_error_detail(), "latest") && strstr(dt_error_detail(), "not a regular file"), "%s",
              dt_error_detail());
    char **paths;
    int n;
    cr_assert_eq(dt_ckpt_candidates(dir, &paths, &n), DT_STATUS_OK);
    cr_assert_eq(n, 0);
    dt_ckpt_free_list(paths, n);
}

/* `latest` naming a step that is a symbolic link to a folder outside: refused. */
Test(ckpt_traps, latest_naming_a_symlinked_step_refused) {
    char other[256], link[256], p[600];
    cr_assert_eq(save(1, 0, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    snprintf(other, sizeof other, "%s/step_00000001", dir);
    snprintf(p, sizeof p, "mv %s %s/moved", other, victim);
    cr_assert_eq(system(p), 0);
    snprintf(p, sizeof p, "%s/moved", victim);
    path_in(link, sizeof link, dir, "step_00000001");
    cr_assert_eq(symlink(p, link), 0);
    dt_ckpt_t *c;
    cr_assert_neq(dt_ckpt_open(dir, &c), DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "step_00000001") && strstr(dt_error_detail(), "not a directory"), "%s",
              dt_error_detail());
}

/* Control characters in `latest` are escaped in the error, never printed raw. */
Test(ckpt_traps, latest_garbage_escaped) {
    char p[256];
    path_in(p, sizeof p, dir, "latest");
    write_file(p, "step_\033[31mred");
    dt_ckpt_t *c;
    cr_assert_neq(dt_ckpt_open(dir, &c), DT_STATUS_OK);
    cr_assert_null(strchr(dt_error_detail(), '\033'), "%s", dt_error_detail());
    cr_assert(strstr(dt_error_detail(), "\\x1b"), "%s", dt_error_detail());
}

/* A FIFO as meta.json, or as a shard: an error at once, not a hang in open(). */
Test(ckpt_traps, fifo_meta_json_and_shard_refused) {
    cr_assert_eq(save(1, 0, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    char meta[256], shard[256];
    snprintf(meta, sizeof meta, "%s/step_00000001/meta.json", dir);
    snprintf(shard, sizeof shard, "%s/step_00000001/shard_00000.bin", dir);
    char *keep = NULL;
    {
        FILE *f = fopen(meta, "r");
        cr_assert_not_null(f);
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        rewind(f);
        keep = calloc(1, (size_t)n + 1);
        cr_assert_eq(fread(keep, 1, (size_t)n, f), (size_t)n);
        fclose(f);
    }
    cr_assert_eq(unlink(meta), 0);
    cr_assert_eq(mkfifo(meta, 0644), 0);
    dt_ckpt_t *c;
    alarm(10); /* a hang fails the test (SIGALRM) instead of reaching the suite timeout */
    cr_assert_neq(dt_ckpt_open(dir, &c), DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "meta.json") && strstr(dt_error_detail(), "not a regular file"), "%s",
              dt_error_detail());
    cr_assert_eq(unlink(meta), 0);
    write_file(meta, keep);
    cr_assert_eq(unlink(shard), 0);
    cr_assert_eq(mkfifo(shard, 0644), 0);
    cr_assert_neq(dt_ckpt_open(dir, &c), DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "shard_00000.bin") && strstr(dt_error_detail(), "not a regular file"), "%s",
              dt_error_detail());
    alarm(0);
    free(keep);
}
