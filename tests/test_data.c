/*
 * test_data.c - the data loader: file validation errors, the sample order across
 * ranks and accumulation, epochs, held-out validation, position save/restore.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/tokenize/shard.h"
#include "runtime/train/data.h"

static char dir[64];

static void make_dir(void) {
    strcpy(dir, "/tmp/dt-data-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void rm_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Writes an llm.c shard of n tokens, token i = (start + i) % mod. */
static void write_shard(const char *name, int n, int start, int mod, int magic, int version,
                        long truncate_by) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    int32_t hdr[256] = {0};
    hdr[0] = magic;
    hdr[1] = version;
    hdr[2] = n;
    fwrite(hdr, sizeof hdr, 1, f);
    for (int i = 0; i < n; i++) {
        uint16_t t = (uint16_t)((start + i) % mod);
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
    if (truncate_by) cr_assert_eq(truncate(path, 1024 + 2L * n - truncate_by), 0);
}

static void write_text(const char *name, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

static dt_data_opts opts(const char *pattern, int T, int B, int rank, int world) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s/%s", dir, pattern);
    dt_data_opts o = {.train = buf, .seq_len = T, .vocab_size = 50257, .seed = 1234,
                      .rank = rank, .world_size = world, .micro_batch = B};
    return o;
}

TestSuite(data, .init = make_dir, .fini = rm_dir);

Test(data, shard_inputs_and_targets_shift_by_one) {
    write_shard("a.bin", 1001, 0, 60000, DT_SHARD_MAGIC_U16, 1, 0);
    dt_data_opts o = opts("a.bin", 10, 4, 0, 1);
    dt_data_t *d;
    cr_assert_eq(dt_data_open(&o, &d), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_data_kind(d), DT_DATA_TOKENS);
    cr_assert_eq(dt_data_train_samples(d), 100);
    int32_t in[40], tg[40];
    dt_data_next(d, in, tg);
    for (int b = 0; b < 4; b++) {
        cr_assert_eq(in[b * 10] % 10, 0, "a sample starts at a multiple of seq_len");
        for (int t = 0; t < 10; t++) {
            cr_assert_eq(tg[b * 10 + t], in[b * 10 + t] + 1);
            if (t) cr_assert_eq(in[b * 10 + t], in[b * 10 + t - 1] + 1);
        }
    }
    dt_data_close(d);
}

Test(data, text_files_are_bytes) {
    write_text("t.txt", "hello world, hello dtrun!");
    dt_data_opts o = opts("t.txt", 4, 1, 0, 1);
    o.vocab_size = 256;
    dt_data_t *d;
    cr_assert_eq(dt_data_open(&o, &d), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_data_kind(d), DT_DATA_TEXT);
    cr_assert_eq(dt_data_train_samples(d), 6); /* (25 - 1) / 4 */
    int32_t in[4], tg[4];
    dt_data_next(d, in, tg);
    const char *text = "hello world, hello dtrun!";
    int found = 0;
    for (int off = 0; off + 4 < 25; off += 4) {
        int ok = 1;
        for (int t = 0; t < 4; t++)
            ok &= in[t] == (unsigned char)text[off + t] && tg[t] == (unsigned char)text[off + t + 1];
        found |= ok;
    }
    cr_assert(found, "the sample is a window of the text at a multiple of seq_len");
    dt_data_kind_t k;
    cr_assert_eq(dt_data_detect(o.train, &k), DT_STATUS_OK);
    cr_assert_eq(k, DT_DATA_TEXT);
    cr_assert_eq(dt_data_default_vocab(k), 256);
    dt_data_close(d);
}

static void expect_error(dt_data_opts *o, dt_status_t want, const char *needle1, const char *needle2) {
    dt_data_t *d = NULL;
    dt_status_t st = dt_data_open(o, &d);
    cr_assert_eq(st, want, "status %s (%s)", dt_status_name(st), dt_error_detail());
    cr_assert_null(d);
    cr_assert(strstr(dt_error_detail(), needle1), "'%s' lacks '%s'", dt_error_detail(), needle1);
    if (needle2) cr_assert(strstr(dt_error_detail(), needle2), "'%s' lacks '%s'", dt_error_detail(), needle2);
}

Test(data, bad_files_name_file_and_problem) {
    write_shard("trunc.bin", 500, 0, 100, DT_SHARD_MAGIC_U16, 1, 7);
    dt_data_opts o = opts("trunc.bin", 8, 1, 0, 1);
    expect_error(&o, DT_STATUS_FORMAT, "trunc.bin", "truncated");

    write_shard("magic.bin", 500, 0, 100, 12345, 1, 0);
    o = opts("magic.bin", 8, 1, 0, 1);
    expect_error(&o, DT_STATUS_FORMAT, "magic.bin", "magic is 12345");

    write_shard("version.bin", 500, 0, 100, DT_SHARD_MAGIC_U16, 7, 0);
    o = opts("version.bin", 8, 1, 0, 1);
    expect_error(&o, DT_STATUS_FORMAT, "version.bin", "version 7");

    write_shard("vocab.bin", 500, 0, 300, DT_SHARD_MAGIC_U16, 1, 0);
    o = opts("vocab.bin", 8, 1, 0, 1);
    o.vocab_size = 256;
    expect_error(&o, DT_STATUS_FORMAT, "token id 299", "vocab size 256");

    o = opts("nothing*.bin", 8, 1, 0, 1);
    expect_error(&o, DT_STATUS_NOT_FOUND, "no file matches", "nothing*.bin");

    write_shard("short.bin", 5, 0, 100, DT_SHARD_MAGIC_U16, 1, 0);
    o = opts("short.bin", 8, 1, 0, 1);
    expect_error(&o, DT_STATUS_FORMAT, "no training sample of seq_len 8", NULL);

    write_text("mix1.bin.txt", "some text that is long enough");
    write_shard("mix2.bin", 500, 0, 100, DT_SHARD_MAGIC_U16, 1, 0);
    o = opts("mix*", 8, 1, 0, 1);
    expect_error(&o, DT_STATUS_FORMAT, "mixes text files and token shards", NULL);
}

/* Collects, per optimizer step, the sorted sample ids seen by all ranks. */
static void seen_per_step(int world, int B, int accum, int steps, uint64_t *out) {
    int T = 4;
    dt_data_t *d[4];
    for (int r = 0; r < world; r++) {
        dt_data_opts o = opts("ident.bin", T, B, r, world);
        cr_assert_eq(dt_data_open(&o, &d[r]), DT_STATUS_OK, "%s", dt_error_detail());
    }
    int32_t in[64], tg[64];
    int per_step = world * B * accum, n = 0;
    for (int s = 0; s < steps; s++)
        for (int a = 0; a < accum; a++)
            for (int r = 0; r < world; r++) {
                dt_data_next(d[r], in, tg);
                for (int b = 0; b < B; b++) out[n++] = (uint64_t)in[b * T] / (uint64_t)T;
            }
    for (int s = 0; s < steps; s++) { /* sort each step's ids */
        uint64_t *v = out + s * per_step;
        for (int i = 1; i < per_step; i++)
            for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
                uint64_t t = v[j];
                v[j] = v[j - 1];
                v[j - 1] = t;
            }
    }
    for (int r = 0; r < world; r++) dt_data_close(d[r]);
}

Test(data, n_ranks_see_what_one_rank_sees_with_accumulation) {
    /* 103 samples: steps of 12 cross epoch boundaries. */
    write_shard("ident.bin", 103 * 4 + 1, 0, 60000, DT_SHARD_MAGIC_U16, 1, 0);
    enum { STEPS = 20, B = 2 };
    for (int world = 2; world <= 3; world++) {
        int accum = 2;
        uint64_t one[STEPS * 3 * B * 2], many[STEPS * 3 * B * 2];
        seen_per_step(1, B, accum * world, STEPS, one);
        seen_per_step(world, B, accum, STEPS, many);
        cr_assert_arr_eq(one, many, sizeof(uint64_t) * STEPS * world * B * accum,
                         "world %d differs from 1 rank with accumulation", world);
    }
}

Test(data, every_epoch_visits_each_sample_once_in_a_new_order) {
    write_shard("ep.bin", 50 * 4 + 1, 0, 60000, DT_SHARD_MAGIC_U16, 1, 0);
    dt_data_opts o = opts("ep.bin", 4, 5, 0, 1);
    dt_data_t *d;
    cr_assert_eq(dt_data_open(&o, &d), DT_STATUS_OK);
    int32_t in[20], tg[20];
    int count[2][50] = {{0}};
    int order[2][50];
    for (int e = 0; e < 2; e++)
        for (int step = 0; step < 10; step++) {
            dt_data_next(d, in, tg);
            for (int b = 0; b < 5; b++) {
                count[e][in[b * 4] / 4]++;
                order[e][step * 5 + b] = in[b * 4] / 4;
            }
        }
    for (int i = 0; i < 50; i++) {
        cr_assert_eq(count[0][i], 1);
        cr_assert_eq(count[1][i], 1);
    }
    cr_assert(memcmp(order[0], order[1], sizeof order[0]) != 0, "epochs reshuffle");
    cr_assert_eq(dt_data_get_pos(d).epoch, 2);
    dt_data_close(d);
}

Test(data, position_restore_reproduces_the_stream) {
    write_shard("pos.bin", 77 * 8 + 1, 0, 60000, DT_SHARD_MAGIC_U16, 1, 0);
    dt_data_opts o = opts("pos.bin", 8, 3, 1, 2);
    dt_data_t *a, *b;
    cr_assert_eq(dt_data_open(&o, &a), DT_STATUS_OK);
    cr_assert_eq(dt_data_open(&o, &b), DT_STATUS_OK);
    int32_t ia[24], ta[24], ib[24], tb[24];
    for (int i = 0; i < 17; i++) dt_data_next(a, ia, ta);
    dt_data_set_pos(b, dt_data_get_pos(a));
    for (int i = 0; i < 30; i++) {
        dt_data_next(a, ia, ta);
        dt_data_next(b, ib, tb);
        cr_assert_arr_eq(ia, ib, sizeof ia);
        cr_assert_arr_eq(ta, tb, sizeof ta);
    }
    dt_data_close(a);
    dt_data_close(b);
}

Test(data, held_out_tail_never_trains) {
    write_shard("val.bin", 40 * 4 + 1, 0, 60000, DT_SHARD_MAGIC_U16, 1, 0);
    dt_data_opts o = opts("val.bin", 4, 4, 0, 1);
    o.val_fraction = 0.1;
    dt_data_t *d;
    cr_assert_eq(dt_data_open(&o, &d), DT_STATUS_OK);
    cr_assert_eq(dt_data_train_samples(d), 36);
    cr_assert_eq(dt_data_val_samples(d), 4);
    int32_t in[16], tg[16];
    for (int i = 0; i < 30; i++) {
        dt_data_next(d, in, tg);
        for (int b = 0; b < 4; b++) cr_assert_lt(in[b * 4] / 4, 36);
    }
    cr_assert_eq(dt_data_val_batch(d, 0, in, tg), DT_STATUS_OK);
    for (int b = 0; b < 4; b++) cr_assert_eq(in[b * 4] / 4, 36 + b);
    dt_data_close(d);
}

Test(data, separate_val_files) {
    write_shard("tr.bin", 100 * 4 + 1, 0, 60000, DT_SHARD_MAGIC_U16, 1, 0);
    write_shard("va.bin", 10 * 4 + 1, 30000, 60000, DT_SHARD_MAGIC_U16, 1, 0);
    dt_data_opts o = opts("tr.bin", 4, 2, 1, 2);
    char val[256];
    snprintf(val, sizeof val, "%s/va.bin", dir);
    o.val = val;
    dt_data_t *d;
    cr_assert_eq(dt_data_open(&o, &d), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_data_train_samples(d), 100);
    cr_assert_eq(dt_data_val_samples(d), 10);
    int32_t in[8], tg[8];
    cr_assert_eq(dt_data_val_batch(d, 0, in, tg), DT_STATUS_OK);
    cr_assert_eq(in[0], 30000 + 2 * 4, "rank 1 takes the second group of its batch");
    dt_data_close(d);
}
