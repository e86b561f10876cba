/*
 * test_data.c - the data loader: file validation errors, the sample order across
 * ranks and accumulation, epochs, held-out validation, position save/restore.
 */
#include <criterion/criterion.h>
#include <math.h>
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

/* Writes an llm.c shard of n tokens, token i = (start + i) % mod: uint32 tokens
 * under the uint32 magic, else uint16. */
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
    int width = magic == DT_SHARD_MAGIC_U32 ? 4 : 2;
    for (int i = 0; i < n; i++) {
        uint32_t t32 = (uint32_t)((start + i) % mod);
        uint16_t t16 = (uint16_t)t32;
        fwrite(width == 4 ? (void *)&t32 : (void *)&t16, (size_t)width, 1, f);
    }
    fclose(f);
    if (truncate_by) cr_assert_eq(truncate(path, 1024 + (long)width * n - truncate_by), 0);
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

/* Writes an llm.c uint32 shard (magic 20240801, version 7) of n tokens, token i =
 * start + i. */
static void write_shard32(const char *name, int n, uint32_t start) {
    write_shard(name, n, (int)start, INT32_MAX, DT_SHARD_MAGIC_U32, DT_SHARD_VERSION_U32, 0);
}

Test(data, uint32_shards_read_and_check_the_vocab) {
    write_shard32("w32.bin", 50 * 4 + 1, 100000);
    dt_data_opts o = opts("w32.bin", 4, 2, 0, 1);
    o.vocab_size = 128256;
    dt_data_t *d;
    cr_assert_eq(dt_data_open(&o, &d), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_data_train_samples(d), 50);
    int32_t in[8], tg[8];
    dt_data_next(d, in, tg);
    for (int b = 0; b < 2; b++) {
        cr_assert_geq(in[b * 4], 100000, "ids above 16 bits come through");
        cr_assert_eq((in[b * 4] - 100000) % 4, 0, "a sample starts at a multiple of T");
        for (int t = 0; t < 4; t++) cr_assert_eq(tg[b * 4 + t], in[b * 4 + t] + 1);
    }
    dt_data_close(d);
    dt_data_kind_t k;
    int width;
    cr_assert_eq(dt_data_detect_width(o.train, &k, &width), DT_STATUS_OK);
    cr_assert_eq(k, DT_DATA_TOKENS);
    cr_assert_eq(width, 4);

    o.vocab_size = 100150; /* ids run to 100200 */
    expect_error(&o, DT_STATUS_FORMAT, "w32.bin: token id 100200 at index 200", "vocab size 100150");
    o.vocab_size = 0;
    expect_error(&o, DT_STATUS_CONFIG, "w32.bin", "model.vocab_size");

    /* the same reader takes uint16 shards, and the uint16 id check names the index */
    write_shard("w16.bin", 50 * 4 + 1, 0, 60000, DT_SHARD_MAGIC_U16, 1, 0);
    o = opts("w16.bin", 4, 2, 0, 1);
    o.vocab_size = 150;
    expect_error(&o, DT_STATUS_FORMAT, "w16.bin: token id 200 at index 200", "vocab size 150");
}

/* Two sources: a.bin's tokens start at 0, b.bin's at 30000 (T = 4). The source
 * of a sample and its id in that source, from its first token. */
static void mix_opts(dt_data_opts *o, dt_data_source *src, double wa, double wb, int B, int rank, int world) {
    static char pa[256], pb[256];
    snprintf(pa, sizeof pa, "%s/mix_a.bin", dir);
    snprintf(pb, sizeof pb, "%s/mix_b.bin", dir);
    src[0] = (dt_data_source){pa, wa};
    src[1] = (dt_data_source){pb, wb};
    *o = opts("unused", 4, B, rank, world);
    o->train = NULL;
    o->sources = src;
    o->n_sources = 2;
}

static void write_mix(int na, int nb) {
    write_shard("mix_a.bin", na * 4 + 1, 0, 60000, DT_SHARD_MAGIC_U16, 1, 0);
    write_shard("mix_b.bin", nb * 4 + 1, 30000, 60000, DT_SHARD_MAGIC_U16, 1, 0);
}

static int sample_src(int32_t first, uint64_t *id) {
    *id = (uint64_t)(first >= 30000 ? first - 30000 : first) / 4;
    return first >= 30000;
}

Test(data, mixture_shares_follow_the_weights) {
    write_mix(300, 200);
    dt_data_opts o;
    dt_data_source src[2];
    mix_opts(&o, src, 0.7, 0.3, 8, 0, 1);
    dt_data_t *d;
    cr_assert_eq(dt_data_open(&o, &d), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_data_n_sources(d), 2);
    int n_b = 0, N = 200000;
    for (int k = 0; k < N; k++) n_b += dt_data_pick_source(d, (uint64_t)k);
    cr_assert(fabs((double)n_b / N - 0.3) < 0.005, "share of b %g", (double)n_b / N);
    /* the realised batches too: 250 micro-batches of 8 */
    int32_t in[32], tg[32];
    int got_b = 0;
    for (int i = 0; i < 250; i++) {
        dt_data_next(d, in, tg);
        for (int b = 0; b < 8; b++) {
            uint64_t id;
            got_b += sample_src(in[b * 4], &id);
        }
    }
    cr_assert(fabs(got_b / 2000.0 - 0.3) < 0.03, "realised share of b %g", got_b / 2000.0);
    dt_data_pos p = dt_data_get_pos(d);
    cr_assert_eq(p.samples, 2000);
    cr_assert_eq(p.src[0].epoch * 300 + p.src[0].cursor + p.src[1].epoch * 200 + p.src[1].cursor, 2000);
    dt_data_close(d);
    /* another seed, another (but equally weighted) sequence */
    o.seed = 99;
    cr_assert_eq(dt_data_open(&o, &d), DT_STATUS_OK);
    int diff = 0;
    dt_data_t *d0;
    o.seed = 1234;
    cr_assert_eq(dt_data_open(&o, &d0), DT_STATUS_OK);
    for (int k = 0; k < 1000; k++) diff += dt_data_pick_source(d, (uint64_t)k) != dt_data_pick_source(d0, (uint64_t)k);
    cr_assert_gt(diff, 100, "the pick depends on the seed");
    dt_data_close(d);
    dt_data_close(d0);
}

Test(data, mixture_epoch_visits_each_sample_once_per_source) {
    write_mix(120, 40);
    dt_data_opts o;
    dt_data_source src[2];
    mix_opts(&o, src, 0.5, 0.5, 5, 0, 1);
    dt_data_t *d;
    cr_assert_eq(dt_data_open(&o, &d), DT_STATUS_OK);
    int seen[2][120] = {{0}};
    int32_t in[20], tg[20];
    /* until source b finishes exactly one epoch: every b sample once, a samples once */
    while (dt_data_get_pos(d).src[1].epoch == 0) {
        dt_data_next(d, in, tg);
        for (int b = 0; b < 5; b++) {
            uint64_t id;
            int s = sample_src(in[b * 4], &id);
            seen[s][id]++; /* the last batch may start b's second epoch: counted below */
        }
    }
    dt_data_pos p = dt_data_get_pos(d);
    int b_total = 0, a_total = 0;
    for (int i = 0; i < 40; i++) b_total += seen[1][i];
    for (int i = 0; i < 120; i++) {
        cr_assert_leq(seen[0][i], 1, "a sample %d seen twice within a's first epoch", i);
        a_total += seen[0][i];
    }
    cr_assert_eq(b_total, 40 + (int)p.src[1].cursor);
    for (int i = 0; i < 40; i++) cr_assert_geq(seen[1][i], 1, "b sample %d never seen in its epoch", i);
    cr_assert_eq((uint64_t)a_total, p.src[0].cursor);
    dt_data_close(d);
}

/* Every rank's position after N micro-steps is the serial replay's (1 rank, B *
 * world) and the ranks together see the serial replay's samples. */
Test(data, mixture_positions_match_a_serial_replay_at_any_world_size) {
    write_mix(90, 70);
    enum { B = 2, WORLD = 3, STEPS = 37 };
    dt_data_opts o;
    dt_data_source src[2];
    dt_data_t *r[WORLD], *serial;
    for (int i = 0; i < WORLD; i++) {
        mix_opts(&o, src, 2.0, 1.0, B, i, WORLD);
        cr_assert_eq(dt_data_open(&o, &r[i]), DT_STATUS_OK);
    }
    mix_opts(&o, src, 2.0, 1.0, B * WORLD, 0, 1);
    cr_assert_eq(dt_data_open(&o, &serial), DT_STATUS_OK);
    int32_t in[B * WORLD * 4], tg[B * WORLD * 4], ri[B * 4], rt[B * 4];
    for (int s = 0; s < STEPS; s++) {
        dt_data_next(serial, in, tg);
        for (int i = 0; i < WORLD; i++) {
            dt_data_next(r[i], ri, rt);
            cr_assert_arr_eq(ri, in + i * B * 4, sizeof ri, "step %d rank %d takes its group of the serial batch", s, i);
        }
    }
    dt_data_pos ps = dt_data_get_pos(serial);
    for (int i = 0; i < WORLD; i++) {
        dt_data_pos pr = dt_data_get_pos(r[i]);
        cr_assert_eq(pr.samples, ps.samples);
        for (int k = 0; k < 2; k++) {
            cr_assert_eq(pr.src[k].epoch, ps.src[k].epoch);
            cr_assert_eq(pr.src[k].cursor, ps.src[k].cursor);
        }
    }
    cr_assert_gt(ps.src[1].epoch, 0, "the run wraps an epoch of b");
    /* resume rank 1 of 3's position on 1 rank: the serial stream continues */
    dt_data_t *resumed;
    cr_assert_eq(dt_data_open(&o, &resumed), DT_STATUS_OK);
    cr_assert_eq(dt_data_set_pos(resumed, dt_data_get_pos(r[1])), DT_STATUS_OK);
    int32_t in2[B * WORLD * 4], tg2[B * WORLD * 4];
    for (int s = 0; s < 5; s++) {
        dt_data_next(serial, in, tg);
        dt_data_next(resumed, in2, tg2);
        cr_assert_arr_eq(in, in2, sizeof in);
    }
    for (int i = 0; i < WORLD; i++) dt_data_close(r[i]);
    dt_data_close(serial);
    dt_data_close(resumed);
}

Test(data, mixture_sources_must_be_one_kind) {
    write_text("kind.txt", "some text that is long enough for a sample or two");
    write_shard("kind.bin", 500, 0, 100, DT_SHARD_MAGIC_U16, 1, 0);
    dt_data_opts o = opts("x", 4, 1, 0, 1);
    char pa[256], pb[256];
    snprintf(pa, sizeof pa, "%s/kind.bin", dir);
    snprintf(pb, sizeof pb, "%s/kind.txt", dir);
    dt_data_source src[2] = {{pa, 1}, {pb, 1}};
    o.train = NULL, o.sources = src, o.n_sources = 2;
    expect_error(&o, DT_STATUS_FORMAT, "kind.bin' is token shards but", "kind.txt' is text");
    src[1].weight = 0;
    expect_error(&o, DT_STATUS_CONFIG, "data.train[1].weight: expected a number > 0", NULL);
    snprintf(pb, sizeof pb, "%s/none_*.bin", dir);
    src[1].weight = 1;
    expect_error(&o, DT_STATUS_NOT_FOUND, "data.train[1]: no file matches", "none_*.bin");
}

/* Read-ahead hands out the synchronous stream, and the position is what was
 * taken: restoring it mid-run (the ring is dropped and refilled) continues it. */
Test(data, prefetch_gives_the_same_stream_and_the_consumed_position) {
    write_mix(90, 70);
    dt_data_opts o;
    dt_data_source src[2];
    mix_opts(&o, src, 1.0, 3.0, 3, 1, 2);
    dt_data_t *sync, *ahead, *again;
    cr_assert_eq(dt_data_open(&o, &sync), DT_STATUS_OK);
    o.prefetch = 4;
    cr_assert_eq(dt_data_open(&o, &ahead), DT_STATUS_OK);
    cr_assert_eq(dt_data_open(&o, &again), DT_STATUS_OK);
    int32_t a[12], at[12], b[12], bt[12];
    for (int s = 0; s < 60; s++) {
        dt_data_next(sync, a, at);
        dt_data_next(ahead, b, bt);
        cr_assert_arr_eq(a, b, sizeof a, "step %d", s);
        cr_assert_arr_eq(at, bt, sizeof at);
        dt_data_pos ps = dt_data_get_pos(sync), pa = dt_data_get_pos(ahead);
        cr_assert_eq(pa.samples, ps.samples, "the consumed position, not the prefetched one");
        cr_assert_eq(pa.src[1].cursor, ps.src[1].cursor);
        if (s == 20) { /* a resume into a reader whose thread already ran ahead */
            for (int i = 0; i < 3; i++) dt_data_next(again, b, bt);
            cr_assert_eq(dt_data_set_pos(again, pa), DT_STATUS_OK);
        }
        if (s > 20) {
            dt_data_next(again, b, bt);
            cr_assert_arr_eq(a, b, sizeof a, "resumed step %d", s);
        }
    }
    dt_data_close(sync);
    dt_data_close(ahead);
    dt_data_close(again);
}

/* Over the scan limit (DTRUN_DATA_SCAN_MB=0 here) a set is not read through at
 * open: the stream equals the scanned set's, and a bad id is reported by the read
 * that meets it (naming file, index and id) instead of by dt_data_open. */
Test(data, sets_over_the_scan_limit_check_ids_as_they_are_read) {
    write_shard32("lz.bin", 60 * 4 + 1, 100000);
    dt_data_opts o = opts("lz.bin", 4, 3, 0, 1);
    o.vocab_size = 128256;
    dt_data_t *scanned, *lazy;
    cr_assert_eq(dt_data_open(&o, &scanned), DT_STATUS_OK, "%s", dt_error_detail());
    setenv("DTRUN_DATA_SCAN_MB", "0", 1);
    o.prefetch = 2;
    cr_assert_eq(dt_data_open(&o, &lazy), DT_STATUS_OK, "%s", dt_error_detail());
    int32_t a[12], at[12], b[12], bt[12];
    for (int s = 0; s < 45; s++) {
        cr_assert_eq(dt_data_next(scanned, a, at), DT_STATUS_OK);
        cr_assert_eq(dt_data_next(lazy, b, bt), DT_STATUS_OK, "%s", dt_error_detail());
        cr_assert_arr_eq(a, b, sizeof a, "step %d", s);
        cr_assert_arr_eq(at, bt, sizeof at, "step %d", s);
    }
    dt_data_close(scanned);
    dt_data_close(lazy);

    /* ids run to 100240: with vocab 100200 the open passes and a read fails */
    o.vocab_size = 100200;
    for (int prefetch = 0; prefetch <= 2; prefetch += 2) {
        o.prefetch = prefetch;
        cr_assert_eq(dt_data_open(&o, &lazy), DT_STATUS_OK, "%s", dt_error_detail());
        dt_status_t st = DT_STATUS_OK;
        for (int s = 0; s < 40 && st == DT_STATUS_OK; s++) st = dt_data_next(lazy, b, bt);
        cr_assert_eq(st, DT_STATUS_FORMAT, "prefetch %d: a sample past the vocab is an error", prefetch);
        cr_assert_not_null(strstr(dt_error_detail(), "lz.bin: token id 1002"), "%s", dt_error_detail());
        cr_assert_not_null(strstr(dt_error_detail(), "not below the model's vocab size 100200"), "%s",
                           dt_error_detail());
        cr_assert_eq(dt_data_next(lazy, b, bt), DT_STATUS_FORMAT, "and it stays an error");
        dt_data_close(lazy);
    }
    unsetenv("DTRUN_DATA_SCAN_MB");
}

/* Issue 31: weights [1e308, 1e308] overflowed their sum to inf, every share became
 * 0 and every sample came from the last source. Scaled by the largest first, they
 * are an even mixture; a non-finite weight is refused naming the key. */
Test(data, huge_mixture_weights_do_not_overflow) {
    write_mix(300, 200);
    dt_data_opts o;
    dt_data_source src[2];
    mix_opts(&o, src, 1e308, 1e308, 8, 0, 1);
    dt_data_t *d;
    cr_assert_eq(dt_data_open(&o, &d), DT_STATUS_OK, "%s", dt_error_detail());
    int n_b = 0, N = 100000;
    for (int k = 0; k < N; k++) n_b += dt_data_pick_source(d, (uint64_t)k);
    cr_assert(fabs((double)n_b / N - 0.5) < 0.01, "share of b %g", (double)n_b / N);
    dt_data_close(d);
    mix_opts(&o, src, 1.0, INFINITY, 8, 0, 1);
    cr_assert_eq(dt_data_open(&o, &d), DT_STATUS_CONFIG);
    cr_assert_not_null(strstr(dt_error_detail(), "data.train[1].weight"), "%s", dt_error_detail());
}
