/*
 * test_checkpoint.c - the checkpoint library: the resharding matrix (saved by N
 * ranks with one split, loaded by M ranks with another, compared exactly), crash
 * during a save (a child SIGKILLed at each point leaves the previous checkpoint and
 * `latest` intact), truncated shard, flipped byte, wrong model, unwritable and full
 * directories, the CRC32C reference values and the resume candidates.
 */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/status.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/model/model.h"

static char dir[64];

static void make_dir(void) {
    strcpy(dir, "/tmp/dt-ckpt-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void rm_dir(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "chmod -R u+w %s 2>/dev/null; rm -rf %s", dir, dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(ckpt, .init = make_dir, .fini = rm_dir, .timeout = 60);

static const char *bufs[3] = {"params", "m", "v"};

static void gpt_layout(dt_model_layout *l, int n_layer, int n_embd) {
    dt_model_spec s = {.ops = &dt_model_gpt, .n_layer = n_layer, .n_head = 2, .n_embd = n_embd, .seq_len = 16,
                       .vocab_size = 256, .vocab_pad_multiple = 64};
    cr_assert_eq(dt_model_layout_init(&s, l), DT_STATUS_OK);
}

/* Distinct values per (buffer, element, version), exact in fp32. */
static float value(int buf, size_t i, int version) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(buf * 7 + version * 131);
    x ^= x >> 29;
    return (float)((double)(x & 0xffffff) / 16777216.0 - 0.5) * (float)(1 + buf + version);
}

static float *make_buffers(size_t n, int version) {
    float *b = malloc(3 * n * sizeof(float));
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < n; i++) b[(size_t)k * n + i] = value(k, i, version);
    return b;
}

/* The ranges rank r of w owns under a split:
 *   0 "rank0": rank 0 owns everything (DDP saving from one replica)
 *   1 "even":  one contiguous slice per rank, padded split as ZeRO does
 *   2 "units": every unit split evenly across the ranks (FSDP: many ranges)
 *   3 "uneven": cut at arbitrary points (odd sizes, crossing 4 MiB blocks) */
static int split_ranges(const dt_model_layout *l, int split, int r, int w, uint64_t *off, uint64_t *cnt, int max) {
    size_t n = l->n_params;
    int k = 0;
    if (split == 0) {
        if (r == 0) off[k] = 0, cnt[k++] = n;
    } else if (split == 1) {
        size_t per = (n + (size_t)w - 1) / (size_t)w, lo = per * (size_t)r, hi = lo + per;
        if (hi > n) hi = n;
        if (lo < hi) off[k] = lo, cnt[k++] = hi - lo;
    } else if (split == 2) {
        for (int u = 0; u < l->n_units && k < max; u++) {
            size_t per = (l->units[u].numel + (size_t)w - 1) / (size_t)w, lo = per * (size_t)r, hi = lo + per;
            if (hi > l->units[u].numel) hi = l->units[u].numel;
            if (lo < hi) off[k] = l->units[u].offset + lo, cnt[k++] = hi - lo;
        }
    } else {
        /* boundaries at i^2/w^2 of n, shifted by 13 elements */
        size_t lo = (size_t)((double)n * r * r / ((double)w * w)), hi = (size_t)((double)n * (r + 1) * (r + 1) / ((double)w * w));
        if (r > 0) lo += 13;
        if (r + 1 < w) hi += 13;
        if (hi > n) hi = n;
        if (lo < hi) off[k] = lo, cnt[k++] = hi - lo;
    }
    return k;
}

static const char *split_name[4] = {"rank0", "even", "units", "uneven"};

/* Saves `data` (3 buffers of n) as world w with a split; ranks simulated in turn. */
static dt_status_t save_as(const dt_model_layout *l, const float *data, int64_t step, int w, int split, int keep) {
    uint64_t off[64], cnt[64];
    dt_ckpt_range ranges[3 * 64];
    dt_ckpt_save_args a = {.dir = dir, .step = step, .world_size = w, .strategy = split_name[split], .layout = l,
                           .extra_json = "{\"data\": {\"epoch\": 3, \"cursor\": 17}}", .keep_last = keep};
    for (int r = 0; r < w; r++) {
        int k = split_ranges(l, split, r, w, off, cnt, 64), nr = 0;
        for (int b = 0; b < 3; b++)
            for (int i = 0; i < k; i++)
                ranges[nr++] = (dt_ckpt_range){.buffer = bufs[b], .offset = off[i], .count = cnt[i],
                                               .data = data + (size_t)b * l->n_params + off[i]};
        a.rank = r;
        a.ranges = ranges;
        a.n_ranges = nr;
        DT_CHECK(dt_ckpt_write_shard(&a, NULL));
    }
    a.rank = 0;
    return dt_ckpt_commit(&a, NULL);
}

/* Loads as world w with a split: every rank reads only its ranges; compares. */
static void load_and_compare(const char *path, const dt_model_layout *l, const float *want, int w, int split) {
    uint64_t off[64], cnt[64];
    float *got = malloc(l->n_params * sizeof(float));
    for (int b = 0; b < 3; b++) {
        memset(got, 0xff, l->n_params * sizeof(float));
        for (int r = 0; r < w; r++) {
            dt_ckpt_t *c;
            cr_assert_eq(dt_ckpt_open(path, &c), DT_STATUS_OK, "%s", dt_error_detail());
            cr_assert_eq(dt_ckpt_check_layout(c, l), DT_STATUS_OK, "%s", dt_error_detail());
            int k = split_ranges(l, split, r, w, off, cnt, 64);
            for (int i = 0; i < k; i++)
                cr_assert_eq(dt_ckpt_read(c, bufs[b], off[i], cnt[i], got + off[i]), DT_STATUS_OK, "%s",
                             dt_error_detail());
            dt_ckpt_close(c);
        }
        cr_assert(memcmp(got, want + (size_t)b * l->n_params, l->n_params * sizeof(float)) == 0,
                  "buffer %s differs after load at %d ranks (%s)", bufs[b], w, split_name[split]);
    }
    free(got);
}

Test(ckpt, crc32c_reference_values) {
    cr_assert_eq(dt_crc32c(0, "123456789", 9), 0xE3069283u);
    unsigned char zeros[32] = {0};
    cr_assert_eq(dt_crc32c(0, zeros, 32), 0x8A9136AAu); /* RFC 3720 B.4 */
    /* Incremental equals one pass, any alignment. */
    char buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (char)(i * 31 + 7);
    uint32_t one = dt_crc32c(0, buf + 3, 990);
    cr_assert_eq(dt_crc32c(dt_crc32c(0, buf + 3, 401), buf + 404, 589), one);
    /* The table version agrees with the instruction version. */
    cr_assert_eq(dt_crc32c_portable(0, "123456789", 9), 0xE3069283u);
    for (int off = 0; off < 9; off++)
        for (size_t len = 0; len < 300; len += 37)
            cr_assert_eq(dt_crc32c_portable(0, buf + off, len), dt_crc32c(0, buf + off, len));
}

/* Save at N in {1..4} x 4 splits, load at M in {1..4} x 4 splits: every buffer
 * exactly as saved. */
Test(ckpt, resharding_matrix) {
    dt_model_layout l;
    gpt_layout(&l, 2, 64);
    float *data = make_buffers(l.n_params, 0);
    int64_t step = 0;
    for (int n = 1; n <= 4; n++)
        for (int ss = 0; ss < 4; ss++) {
            step++;
            cr_assert_eq(save_as(&l, data, step, n, ss, 2), DT_STATUS_OK, "%s", dt_error_detail());
            dt_ckpt_t *c;
            cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_OK, "%s", dt_error_detail());
            cr_assert_eq(dt_ckpt_step(c), step);
            cr_assert_eq(dt_ckpt_world_size(c), n);
            cr_assert_str_eq(dt_ckpt_strategy(c), split_name[ss]);
            const cJSON *d = cJSON_GetObjectItem((const cJSON *)dt_ckpt_meta(c), "data");
            cr_assert_eq(cJSON_GetObjectItem(d, "cursor")->valueint, 17);
            dt_ckpt_close(c);
            for (int m = 1; m <= 4; m++)
                for (int ls = 0; ls < 4; ls++) load_and_compare(dir, &l, data, m, ls);
        }
    /* keep_last 2: only the two newest remain. */
    char **paths;
    int np;
    cr_assert_eq(dt_ckpt_candidates(dir, &paths, &np), DT_STATUS_OK);
    cr_assert_eq(np, 2);
    cr_assert(strstr(paths[0], "step_00000016"));
    cr_assert(strstr(paths[1], "step_00000015"));
    dt_ckpt_free_list(paths, np);
    free(data);
    dt_model_layout_free(&l);
}

/* A model above two checksum blocks: reads at odd offsets crossing block and
 * range boundaries. */
Test(ckpt, reads_across_blocks) {
    dt_model_layout l;
    gpt_layout(&l, 6, 160); /* ~1.9M parameters: 2 blocks per buffer */
    cr_assert_gt(l.n_params, (size_t)(DT_CKPT_BLOCK_BYTES / 4) + 1000);
    float *data = make_buffers(l.n_params, 1);
    cr_assert_eq(save_as(&l, data, 7, 3, 3, 0), DT_STATUS_OK, "%s", dt_error_detail());
    load_and_compare(dir, &l, data, 3, 2);
    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_OK);
    size_t n = l.n_params;
    uint64_t offs[] = {0, 1, (DT_CKPT_BLOCK_BYTES / 4) - 5, n / 9 + 11, n - 7};
    float *got = malloc(n * sizeof(float));
    for (size_t i = 0; i < sizeof offs / sizeof *offs; i++) {
        uint64_t cnt = n - offs[i] < 1000003 ? n - offs[i] : 1000003;
        cr_assert_eq(dt_ckpt_read(c, "v", offs[i], cnt, got), DT_STATUS_OK, "%s", dt_error_detail());
        cr_assert(memcmp(got, data + 2 * n + offs[i], cnt * sizeof(float)) == 0, "read at %llu",
                  (unsigned long long)offs[i]);
    }
    cr_assert_neq(dt_ckpt_read(c, "v", n - 3, 4, got), DT_STATUS_OK);
    cr_assert_neq(dt_ckpt_read(c, "w", 0, 4, got), DT_STATUS_OK);
    dt_ckpt_close(c);
    free(got);
    free(data);
    dt_model_layout_free(&l);
}

/* ---- crash during save ---- */

static const char *kill_point;
static int kill_count, kill_seen;

static void kill_hook(const char *point, void *ctx) {
    (void)ctx;
    if (strcmp(point, kill_point) == 0 && ++kill_seen == kill_count) raise(SIGKILL);
}

static void crash_at(const char *point, int count) {
    dt_model_layout l;
    gpt_layout(&l, 2, 64);
    float *v1 = make_buffers(l.n_params, 1), *v2 = make_buffers(l.n_params, 2);
    cr_assert_eq(save_as(&l, v1, 10, 2, 1, 1), DT_STATUS_OK, "%s", dt_error_detail());
    pid_t pid = fork();
    if (pid == 0) {
        kill_point = point, kill_count = count, kill_seen = 0;
        dt_ckpt_set_test_hook(kill_hook, NULL);
        save_as(&l, v2, 20, 3, 2, 1);
        _exit(0);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the save at %s was not killed", point);
    char latest[128], buf[64] = {0};
    snprintf(latest, sizeof latest, "%s/latest", dir);
    FILE *f = fopen(latest, "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(buf, sizeof buf, f));
    fclose(f);
    cr_assert_str_eq(buf, "step_00000010\n", "latest changed after a crash at %s", point);
    load_and_compare(dir, &l, v1, 1, 1);
    load_and_compare(dir, &l, v1, 4, 2);
    /* The interrupted step directory is never taken for a complete one. */
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%s/step_00000020.tmp", dir);
    dt_ckpt_t *c;
    if (access(tmp, F_OK) == 0) {
        cr_assert_eq(dt_ckpt_open(tmp, &c), DT_STATUS_FORMAT);
        cr_assert(strstr(dt_error_detail(), "incomplete"), "%s", dt_error_detail());
    }
    /* Saving again after the crash works and replaces the leftovers. */
    cr_assert_eq(save_as(&l, v2, 20, 3, 2, 1), DT_STATUS_OK, "%s", dt_error_detail());
    load_and_compare(dir, &l, v2, 2, 3);
    cr_assert_neq(access(tmp, F_OK), 0);
    snprintf(tmp, sizeof tmp, "%s/step_00000010", dir);
    cr_assert_neq(access(tmp, F_OK), 0, "keep_last 1 pruned the old one after the new was complete");
    free(v1);
    free(v2);
    dt_model_layout_free(&l);
}

Test(ckpt, crash_between_ranges_of_a_shard) { crash_at("shard_range", 2); }
Test(ckpt, crash_between_shard_writes) { crash_at("shard_written", 2); }
Test(ckpt, crash_between_shards_and_meta) { crash_at("before_meta", 1); }
Test(ckpt, crash_before_rename) { crash_at("before_rename", 1); }
Test(ckpt, crash_before_latest_switch) { crash_at("before_latest", 1); }

/* A save interrupted at 4 ranks, redone at 2: the leftover shards of ranks 2-3 do
 * not end up in the checkpoint. */
Test(ckpt, leftover_shards_of_a_larger_world_removed) {
    dt_model_layout l;
    gpt_layout(&l, 2, 64);
    float *v = make_buffers(l.n_params, 1);
    pid_t pid = fork();
    if (pid == 0) {
        kill_point = "before_meta", kill_count = 1, kill_seen = 0;
        dt_ckpt_set_test_hook(kill_hook, NULL);
        save_as(&l, v, 20, 4, 1, 0);
        _exit(0);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert_eq(save_as(&l, v, 20, 2, 1, 0), DT_STATUS_OK, "%s", dt_error_detail());
    char p[128];
    snprintf(p, sizeof p, "%s/step_00000020/shard_00002.bin", dir);
    cr_assert_neq(access(p, F_OK), 0);
    load_and_compare(dir, &l, v, 3, 2);
    free(v);
    dt_model_layout_free(&l);
}

/* ---- damaged checkpoints ---- */

Test(ckpt, truncated_shard_named) {
    dt_model_layout l;
    gpt_layout(&l, 2, 64);
    float *data = make_buffers(l.n_params, 0);
    cr_assert_eq(save_as(&l, data, 5, 2, 1, 0), DT_STATUS_OK);
    char p[128];
    snprintf(p, sizeof p, "%s/step_00000005/shard_00001.bin", dir);
    struct stat sb;
    cr_assert_eq(stat(p, &sb), 0);
    cr_assert_eq(truncate(p, sb.st_size - 100), 0);
    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_FORMAT);
    cr_assert(strstr(dt_error_detail(), "shard_00001.bin") && strstr(dt_error_detail(), "truncated"), "%s",
              dt_error_detail());
    free(data);
    dt_model_layout_free(&l);
}

Test(ckpt, flipped_byte_is_a_checksum_error_naming_the_file) {
    dt_model_layout l;
    gpt_layout(&l, 2, 64);
    float *data = make_buffers(l.n_params, 0);
    cr_assert_eq(save_as(&l, data, 5, 2, 1, 0), DT_STATUS_OK);
    char p[128];
    snprintf(p, sizeof p, "%s/step_00000005/shard_00000.bin", dir);
    int fd = open(p, O_RDWR);
    cr_assert_geq(fd, 0);
    unsigned char b;
    off_t at = 4096 + 12345;
    cr_assert_eq(pread(fd, &b, 1, at), 1);
    b ^= 0x10;
    cr_assert_eq(pwrite(fd, &b, 1, at), 1);
    close(fd);
    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_OK); /* sizes are right */
    float *got = malloc(l.n_params * sizeof(float));
    cr_assert_eq(dt_ckpt_read(c, "params", 0, l.n_params, got), DT_STATUS_CHECKSUM);
    cr_assert(strstr(dt_error_detail(), "shard_00000.bin") && strstr(dt_error_detail(), "checksum"), "%s",
              dt_error_detail());
    /* The other shard's ranges still read fine. */
    size_t half = (l.n_params + 1) / 2;
    cr_assert_eq(dt_ckpt_read(c, "params", half, l.n_params - half, got), DT_STATUS_OK, "%s", dt_error_detail());
    dt_ckpt_close(c);
    free(got);
    free(data);
    dt_model_layout_free(&l);
}

Test(ckpt, incomplete_and_not_a_checkpoint) {
    dt_ckpt_t *c;
    char p[128];
    snprintf(p, sizeof p, "%s/step_00000003", dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    cr_assert_eq(dt_ckpt_open(p, &c), DT_STATUS_FORMAT);
    cr_assert(strstr(dt_error_detail(), "no meta.json"), "%s", dt_error_detail());
    snprintf(p, sizeof p, "%s/nothing-here", dir);
    cr_assert_neq(dt_ckpt_open(p, &c), DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "nothing-here"), "%s", dt_error_detail());
    snprintf(p, sizeof p, "%s/step_00000003/meta.json", dir);
    FILE *f = fopen(p, "w");
    fputs("{\"format\": \"dtrun-checkpoint\", \"version\": 1", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/step_00000003", dir);
    cr_assert_eq(dt_ckpt_open(p, &c), DT_STATUS_FORMAT);
    cr_assert(strstr(dt_error_detail(), "meta.json: not valid JSON"), "%s", dt_error_detail());
}

Test(ckpt, wrong_model_names_the_tensor) {
    dt_model_layout l, other, deeper;
    gpt_layout(&l, 2, 64);
    gpt_layout(&other, 2, 32);
    gpt_layout(&deeper, 3, 64);
    float *data = make_buffers(l.n_params, 0);
    cr_assert_eq(save_as(&l, data, 5, 1, 1, 0), DT_STATUS_OK);
    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_OK);
    cr_assert_eq(dt_ckpt_check_layout(c, &other), DT_STATUS_MISMATCH);
    cr_assert(strstr(dt_error_detail(), "wte.weight") && strstr(dt_error_detail(), "(256, 64)") &&
                  strstr(dt_error_detail(), "(256, 32)"),
              "%s", dt_error_detail());
    cr_assert_eq(dt_ckpt_check_layout(c, &deeper), DT_STATUS_MISMATCH);
    cr_assert(strstr(dt_error_detail(), "does not match the model"), "%s", dt_error_detail());
    dt_model_spec s;
    cr_assert_eq(dt_ckpt_model_spec(c, &s), DT_STATUS_OK);
    cr_assert_eq(s.n_embd, 64);
    cr_assert_eq(s.n_layer, 2);
    dt_ckpt_close(c);
    free(data);
    dt_model_layout_free(&l);
    dt_model_layout_free(&other);
    dt_model_layout_free(&deeper);
}

/* A directory that cannot be created (a file in the way): a clear error, the
 * caller's buffers untouched. */
Test(ckpt, unwritable_dir_is_a_clear_error) {
    dt_model_layout l;
    gpt_layout(&l, 2, 64);
    float *data = make_buffers(l.n_params, 0), *copy = make_buffers(l.n_params, 0);
    char file[128], bad[160];
    snprintf(file, sizeof file, "%s/a-file", dir);
    FILE *f = fopen(file, "w");
    fclose(f);
    snprintf(bad, sizeof bad, "%s/ckpt", file);
    dt_ckpt_range r = {.buffer = "params", .offset = 0, .count = l.n_params, .data = data};
    dt_ckpt_save_args a = {.dir = bad, .step = 1, .world_size = 1, .layout = &l, .ranges = &r, .n_ranges = 1};
    dt_status_t st = dt_ckpt_save(&a, NULL);
    cr_assert_neq(st, DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "cannot create directory") && strstr(dt_error_detail(), "a-file"), "%s",
              dt_error_detail());
    cr_assert(memcmp(data, copy, l.n_params * sizeof(float)) == 0);
    free(data);
    free(copy);
    dt_model_layout_free(&l);
}

/* A full disk (file size limit in a child): the save fails naming the shard,
 * the previous checkpoint stays loadable. */
Test(ckpt, full_disk_keeps_previous) {
    dt_model_layout l;
    gpt_layout(&l, 2, 64);
    float *v1 = make_buffers(l.n_params, 1);
    cr_assert_eq(save_as(&l, v1, 1, 1, 1, 0), DT_STATUS_OK);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {.rlim_cur = 64 * 1024, .rlim_max = RLIM_INFINITY};
        setrlimit(RLIMIT_FSIZE, &rl);
        float *v2 = make_buffers(l.n_params, 2);
        dt_status_t st = save_as(&l, v2, 2, 1, 1, 0);
        int ok = st != DT_STATUS_OK && strstr(dt_error_detail(), "shard_00000.bin") &&
                 strstr(dt_error_detail(), "cannot write");
        if (!ok) fprintf(stderr, "status %d: %s\n", st, dt_error_detail());
        _exit(ok ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    load_and_compare(dir, &l, v1, 2, 1);
    free(v1);
    dt_model_layout_free(&l);
}

Test(ckpt, candidates_follow_latest_then_descending) {
    dt_model_layout l;
    gpt_layout(&l, 1, 32);
    float *data = make_buffers(l.n_params, 0);
    for (int s = 1; s <= 3; s++) cr_assert_eq(save_as(&l, data, s * 10, 1, 1, 0), DT_STATUS_OK);
    char p[128];
    snprintf(p, sizeof p, "%s/step_00000040.tmp", dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/latest", dir);
    FILE *f = fopen(p, "w");
    fputs("step_00000020\n", f);
    fclose(f);
    char **paths;
    int n;
    cr_assert_eq(dt_ckpt_candidates(dir, &paths, &n), DT_STATUS_OK);
    cr_assert_eq(n, 3);
    cr_assert(strstr(paths[0], "step_00000020") && strstr(paths[1], "step_00000030") && strstr(paths[2], "step_00000010"));
    dt_ckpt_free_list(paths, n);
    snprintf(p, sizeof p, "%s/empty", dir);
    cr_assert_eq(dt_ckpt_candidates(p, &paths, &n), DT_STATUS_OK);
    cr_assert_eq(n, 0);
    dt_ckpt_free_list(paths, n);
    free(data);
    dt_model_layout_free(&l);
}
