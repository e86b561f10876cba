/*
 * test_checkpoint_strided.c - strided checkpoint ranges, as a tensor-parallel rank
 * saves its columns of every row of a row-parallel weight: T ranks each own the
 * columns [r*in/T, (r+1)*in/T) of a (rows, in) region of the buffer as one strided
 * range, plain ranges hold the rest. Random global reads and whole buffers come back
 * exactly; a flipped byte in strided data is a checksum error naming the file;
 * overlapping or malformed strided ranges are refused at commit, at open and at
 * write, naming the range; meta.json stays small for a 4096-row cut; a read of a
 * 4096-row tensor over 4 shards checks each block once (timed, printed).
 */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/status.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/model/model.h"

static char dir[64];

static void make_dir(void) {
    strcpy(dir, "/tmp/dt-ckpts-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void rm_dir(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(ckpt_strided, .init = make_dir, .fini = rm_dir, .timeout = 120);

static const char *bufs[3] = {"params", "m", "v"};

static void gpt_layout(dt_model_layout *l, int n_layer, int n_embd) {
    dt_model_spec s = {.ops = &dt_model_gpt, .n_layer = n_layer, .n_head = 2, .n_embd = n_embd, .seq_len = 16,
                       .vocab_size = 256, .vocab_pad_multiple = 64};
    cr_assert_eq(dt_model_layout_init(&s, l), DT_STATUS_OK);
}

/* Distinct values per (buffer, element), exact in fp32. */
static float value(int buf, size_t i) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(buf * 7 + 5);
    x ^= x >> 29;
    return (float)((double)(x & 0xffffff) / 16777216.0 - 0.5) * (float)(1 + buf);
}

/* A (rows, in) region at element `base` cut into T column blocks; ranks own one
 * block each (strided) and a T-th of the elements before and after (plain). */
typedef struct tp_cut {
    uint64_t base, rows, in;
    int T;
} tp_cut;

static uint64_t col(const tp_cut *t, int r) { return (uint64_t)r * t->in / (uint64_t)t->T; }

/* Rank r's ranges of buffer b into out (at most 3); packed strided data goes to
 * *packed (caller frees). */
static int rank_ranges(const tp_cut *t, uint64_t n, int nbuf, int r, const float *src, dt_ckpt_range *out,
                       float **packed) {
    int k = 0;
    uint64_t end = t->base + t->rows * t->in;
    for (int b = 0; b < nbuf; b++) {
        const float *s = src + (size_t)b * n;
        uint64_t lo = t->base * (uint64_t)r / (uint64_t)t->T, hi = t->base * (uint64_t)(r + 1) / (uint64_t)t->T;
        if (hi > lo) out[k++] = (dt_ckpt_range){.buffer = bufs[b], .offset = lo, .count = hi - lo, .data = s + lo};
        uint64_t c0 = col(t, r), cn = col(t, r + 1) - c0;
        float *p = packed[b] = malloc(t->rows * cn * sizeof(float) + 1);
        for (uint64_t row = 0; row < t->rows; row++)
            memcpy(p + row * cn, s + t->base + row * t->in + c0, cn * sizeof(float));
        out[k++] = (dt_ckpt_range){.buffer = bufs[b], .offset = t->base + c0, .count = cn, .data = p,
                                   .stride = t->in, .reps = t->rows};
        lo = end + (n - end) * (uint64_t)r / (uint64_t)t->T, hi = end + (n - end) * (uint64_t)(r + 1) / (uint64_t)t->T;
        if (hi > lo) out[k++] = (dt_ckpt_range){.buffer = bufs[b], .offset = lo, .count = hi - lo, .data = s + lo};
    }
    return k;
}

/* Saves nbuf buffers of l->n_params from T ranks as cut; returns the commit's status. */
static dt_status_t save_tp(const dt_model_layout *l, const float *src, int nbuf, int64_t step, const tp_cut *t) {
    dt_ckpt_save_args a = {.dir = dir, .step = step, .world_size = t->T, .strategy = "tp", .layout = l};
    dt_ckpt_range ranges[9];
    for (int r = 0; r < t->T; r++) {
        float *packed[3] = {0};
        a.rank = r;
        a.ranges = ranges;
        a.n_ranges = rank_ranges(t, l->n_params, nbuf, r, src, ranges, packed);
        dt_status_t st = dt_ckpt_write_shard(&a, NULL);
        for (int b = 0; b < 3; b++) free(packed[b]);
        if (st != DT_STATUS_OK) return st;
    }
    a.rank = 0;
    return dt_ckpt_commit(&a, NULL);
}

static float *make_src(size_t n, int nbuf) {
    float *s = malloc((size_t)nbuf * n * sizeof(float));
    for (int b = 0; b < nbuf; b++)
        for (size_t i = 0; i < n; i++) s[(size_t)b * n + i] = value(b, i);
    return s;
}

static char *read_meta(int64_t step) {
    char p[128];
    snprintf(p, sizeof p, "%s/step_%08lld/meta.json", dir, (long long)step);
    FILE *f = fopen(p, "rb");
    cr_assert_not_null(f, "%s", p);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    return text;
}

/* Mixed plain and strided ranges, uneven column cuts (in = 66 over 4), several
 * layouts of the region: whole buffers and 300 random reads are exact. */
Test(ckpt_strided, random_reads_over_plain_and_strided_ranges) {
    dt_model_layout l;
    gpt_layout(&l, 2, 64);
    size_t n = l.n_params;
    float *src = make_src(n, 3), *got = malloc(n * sizeof(float));
    tp_cut cuts[] = {{1000, 300, 64, 4}, {0, 500, 66, 4}, {7, 1, 200, 4}, {n - 4096 * 16, 4096, 16, 4}};
    srand(17);
    for (int ci = 0; ci < 4; ci++) {
        const tp_cut *t = &cuts[ci];
        cr_assert_eq(save_tp(&l, src, 3, ci + 1, t), DT_STATUS_OK, "%s", dt_error_detail());
        dt_ckpt_t *c;
        cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_OK, "%s", dt_error_detail());
        cr_assert_eq(dt_ckpt_step(c), ci + 1);
        for (int b = 0; b < 3; b++) {
            memset(got, 0xff, n * sizeof(float));
            cr_assert_eq(dt_ckpt_read(c, bufs[b], 0, n, got), DT_STATUS_OK, "%s", dt_error_detail());
            cr_assert(memcmp(got, src + (size_t)b * n, n * sizeof(float)) == 0, "cut %d buffer %s differs", ci, bufs[b]);
        }
        for (int i = 0; i < 300; i++) {
            int b = rand() % 3;
            uint64_t off = (uint64_t)rand() % n, cnt = 1 + (uint64_t)rand() % (i % 3 == 0 ? 40 : 5000);
            if (i % 4 == 0) off = t->base + (uint64_t)rand() % (t->rows * t->in); /* inside the cut */
            if (off + cnt > n) cnt = n - off;
            cr_assert_eq(dt_ckpt_read(c, bufs[b], off, cnt, got), DT_STATUS_OK, "%s", dt_error_detail());
            cr_assert(memcmp(got, src + (size_t)b * n + off, cnt * sizeof(float)) == 0,
                      "cut %d: read of %s [%llu, +%llu) differs", ci, bufs[b], (unsigned long long)off,
                      (unsigned long long)cnt);
        }
        dt_ckpt_close(c);
        /* The strided ranges are listed once each, with stride and reps. */
        const char *meta = read_meta(ci + 1);
        cr_assert(strstr(meta, "\"stride\":") && strstr(meta, "\"reps\":"), "meta.json lacks stride/reps");
        cJSON *m = cJSON_Parse(meta);
        cr_assert_eq(cJSON_GetObjectItem(m, "version")->valueint, 2);
        cJSON_Delete(m);
    }
    free(got);
    free(src);
    dt_model_layout_free(&l);
}

/* A checkpoint of plain ranges only keeps format version 1 and no stride keys. */
Test(ckpt_strided, plain_ranges_keep_version_1) {
    dt_model_layout l;
    gpt_layout(&l, 1, 64);
    float *src = make_src(l.n_params, 1);
    dt_ckpt_range r = {.buffer = "params", .offset = 0, .count = l.n_params, .data = src};
    dt_ckpt_save_args a = {.dir = dir, .step = 1, .world_size = 1, .layout = &l, .ranges = &r, .n_ranges = 1};
    cr_assert_eq(dt_ckpt_save(&a, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    const char *meta = read_meta(1);
    cr_assert_null(strstr(meta, "stride"));
    cJSON *m = cJSON_Parse(meta);
    cr_assert_eq(cJSON_GetObjectItem(m, "version")->valueint, 1);
    cJSON_Delete(m);
    free(src);
    dt_model_layout_free(&l);
}

/* The file offset of rank r's strided range of params, from meta.json. */
static uint64_t strided_file_offset(int64_t step, int rank) {
    cJSON *m = cJSON_Parse(read_meta(step)), *sh = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "shards"), rank), *r;
    uint64_t at = 0;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(sh, "ranges")) {
        if (cJSON_GetObjectItem(r, "stride") && !at) at = (uint64_t)cJSON_GetObjectItem(r, "file_offset")->valuedouble;
    }
    cJSON_Delete(m);
    cr_assert_gt(at, 0);
    return at;
}

Test(ckpt_strided, flipped_byte_in_strided_data_names_the_file) {
    dt_model_layout l;
    gpt_layout(&l, 2, 64);
    size_t n = l.n_params;
    float *src = make_src(n, 3), *got = malloc(n * sizeof(float));
    tp_cut t = {1000, 300, 64, 4};
    cr_assert_eq(save_tp(&l, src, 3, 5, &t), DT_STATUS_OK, "%s", dt_error_detail());
    char p[128];
    snprintf(p, sizeof p, "%s/step_00000005/shard_00002.bin", dir);
    int fd = open(p, O_RDWR);
    cr_assert_geq(fd, 0);
    off_t at = (off_t)strided_file_offset(5, 2) + 4 * 700 + 1; /* row 43 of rank 2's columns */
    unsigned char byte;
    cr_assert_eq(pread(fd, &byte, 1, at), 1);
    byte ^= 0x20;
    cr_assert_eq(pwrite(fd, &byte, 1, at), 1);
    close(fd);
    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_ckpt_read(c, "params", 0, n, got), DT_STATUS_CHECKSUM);
    cr_assert(strstr(dt_error_detail(), "shard_00002.bin") && strstr(dt_error_detail(), "checksum") &&
                  strstr(dt_error_detail(), "pieces of"),
              "%s", dt_error_detail());
    /* Again: a failed block is not kept as verified. */
    uint64_t row = 43, c2 = t.base + row * t.in + col(&t, 2);
    cr_assert_eq(dt_ckpt_read(c, "params", c2, 1, got), DT_STATUS_CHECKSUM);
    /* Rank 1's columns of the same rows, and the other buffers, read fine. */
    cr_assert_eq(dt_ckpt_read(c, "params", t.base + row * t.in + col(&t, 1), col(&t, 2) - col(&t, 1), got), DT_STATUS_OK,
                 "%s", dt_error_detail());
    cr_assert_eq(dt_ckpt_read(c, "m", 0, n, got), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert(memcmp(got, src + n, n * sizeof(float)) == 0);
    dt_ckpt_close(c);
    free(got);
    free(src);
    dt_model_layout_free(&l);
}

/* Rank 1's columns start one column early: they overlap rank 0's in every row. */
Test(ckpt_strided, overlapping_strided_ranges_refused_at_commit) {
    dt_model_layout l;
    gpt_layout(&l, 2, 64);
    size_t n = l.n_params;
    float *src = make_src(n, 1);
    float *p0 = calloc(300 * 32, sizeof(float)), *p1 = calloc(300 * 33, sizeof(float)), *rest = src;
    dt_ckpt_range r0[2] = {{.buffer = "params", .offset = 0, .count = 1000, .data = rest},
                           {.buffer = "params", .offset = 1000, .count = 32, .data = p0, .stride = 64, .reps = 300}};
    dt_ckpt_range r1[2] = {{.buffer = "params", .offset = 1000 + 300 * 64, .count = n - 1000 - 300 * 64, .data = rest},
                           {.buffer = "params", .offset = 1031, .count = 33, .data = p1, .stride = 64, .reps = 300}};
    dt_ckpt_save_args a = {.dir = dir, .step = 3, .world_size = 2, .layout = &l, .ranges = r0, .n_ranges = 2};
    cr_assert_eq(dt_ckpt_write_shard(&a, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    a.rank = 1, a.ranges = r1;
    cr_assert_eq(dt_ckpt_write_shard(&a, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    a.rank = 0;
    cr_assert_eq(dt_ckpt_commit(&a, NULL), DT_STATUS_FORMAT);
    const char *d = dt_error_detail();
    cr_assert(strstr(d, "overlaps") && strstr(d, "300 pieces of 32 at 1000 + k*64") && strstr(d, "shard_00000.bin") &&
                  strstr(d, "300 pieces of 33 at 1031 + k*64") && strstr(d, "shard_00001.bin") &&
                  strstr(d, "element 1031"),
              "%s", d);
    char p[128];
    snprintf(p, sizeof p, "%s/latest", dir);
    cr_assert_neq(access(p, F_OK), 0, "a refused checkpoint became latest");
    /* A plain range inside another rank's strided piece is refused too. */
    r1[1] = (dt_ckpt_range){.buffer = "params", .offset = 1000 + 64 * 299 + 5, .count = 2, .data = p1};
    a.rank = 1;
    cr_assert_eq(dt_ckpt_write_shard(&a, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    a.rank = 0;
    cr_assert_eq(dt_ckpt_commit(&a, NULL), DT_STATUS_FORMAT);
    cr_assert(strstr(dt_error_detail(), "overlaps") && strstr(dt_error_detail(), "[20141, 20143)"), "%s",
              dt_error_detail());
    /* Rank 1's columns start one column late: no overlap, so committed, but the
     * loader finds the gap. */
    r1[1] = (dt_ckpt_range){.buffer = "params", .offset = 1033, .count = 31, .data = p1, .stride = 64, .reps = 300};
    a.rank = 1;
    cr_assert_eq(dt_ckpt_write_shard(&a, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    a.rank = 0;
    cr_assert_eq(dt_ckpt_commit(&a, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_FORMAT);
    cr_assert(strstr(dt_error_detail(), "covers") && strstr(dt_error_detail(), "gap"), "%s", dt_error_detail());
    /* Malformed strided ranges are refused when written. */
    r1[1] = (dt_ckpt_range){.buffer = "params", .offset = 1032, .count = 40, .data = p1, .stride = 32, .reps = 3};
    a.rank = 1;
    cr_assert_eq(dt_ckpt_write_shard(&a, NULL), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "stride 32 must be >= count 40"), "%s", dt_error_detail());
    r1[1] = (dt_ckpt_range){.buffer = "params", .offset = 1032, .count = 4, .data = p1, .reps = 3};
    cr_assert_eq(dt_ckpt_write_shard(&a, NULL), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "reps 3 without a stride"), "%s", dt_error_detail());
    free(p0);
    free(p1);
    free(src);
    dt_model_layout_free(&l);
}

/* meta.json edited so that two ranks' strided ranges overlap, a range's stride is
 * below its count, or its size disagrees with the file or its checksums: open
 * names the problem. */
Test(ckpt_strided, bad_strided_meta_refused_at_open) {
    dt_model_layout l;
    gpt_layout(&l, 2, 64);
    float *src = make_src(l.n_params, 1);
    tp_cut t = {1000, 300, 64, 4};
    cr_assert_eq(save_tp(&l, src, 1, 4, &t), DT_STATUS_OK, "%s", dt_error_detail());
    char p[128], *orig = strdup(read_meta(4));
    snprintf(p, sizeof p, "%s/step_00000004/meta.json", dir);
    struct { const char *key; double delta; const char *want; } cases[] = {
        {"offset", -1, "overlaps"},          /* rank 1 one column early */
        {"stride", -60, "stride 4 < count 16"},
        {"reps", +1, "starts at file byte"}, /* its data no longer ends where the next range's starts */
        {"count", +1000000, "checksums"},    /* the CRC list no longer matches */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *m = cJSON_Parse(orig), *sh = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "shards"), 1), *r, *hit = NULL;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(sh, "ranges")) {
            if (cJSON_GetObjectItem(r, "stride")) hit = r;
        }
        cr_assert_not_null(hit);
        cJSON *v = cJSON_GetObjectItem(hit, cases[i].key);
        cJSON_SetNumberValue(v, v->valuedouble + cases[i].delta);
        char *text = cJSON_Print(m);
        FILE *f = fopen(p, "w");
        fputs(text, f);
        fclose(f);
        free(text);
        cJSON_Delete(m);
        dt_ckpt_t *c;
        cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_FORMAT, "case %zu opened", i);
        cr_assert(strstr(dt_error_detail(), cases[i].want) && strstr(dt_error_detail(), "meta.json"), "case %zu: %s", i,
                  dt_error_detail());
        if (i == 0) cr_assert(strstr(dt_error_detail(), "shard_00001.bin"), "%s", dt_error_detail());
    }
    free(orig);
    free(src);
    dt_model_layout_free(&l);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A (4096, 1536) row-parallel weight cut over 4 ranks: 4 x 4096 pieces of 384,
 * 1.5M elements (two checksum blocks) per shard. meta.json lists 4 ranges; reading
 * the tensor, whole or row by row, reads and checks each of the 8 blocks once. */
Test(ckpt_strided, tensor_of_4096_rows_reads_each_block_once) {
    dt_model_layout l;
    gpt_layout(&l, 4, 384);
    size_t n = l.n_params;
    tp_cut t = {1234, 4096, 1536, 4};
    uint64_t numel = t.rows * t.in, per_rank = numel / 4;
    cr_assert_geq(n, t.base + numel + 1000);
    cr_assert_gt(per_rank, (uint64_t)DT_CKPT_BLOCK_BYTES / 4);
    float *src = make_src(n, 1), *got = malloc(numel * sizeof(float));
    cr_assert_eq(save_tp(&l, src, 1, 9, &t), DT_STATUS_OK, "%s", dt_error_detail());

    /* meta.json: the shards' entries stay small whatever the row count. */
    const char *meta = read_meta(9);
    cJSON *m = cJSON_Parse(meta);
    char *shards = cJSON_PrintUnformatted(cJSON_GetObjectItem(m, "shards"));
    fprintf(stderr, "strided 4096-row cut: meta.json %zu bytes, its shards list %zu bytes\n", strlen(meta),
            strlen(shards));
    cr_assert_lt(strlen(shards), 2048, "shards list of %zu bytes", strlen(shards));
    free(shards);
    cJSON_Delete(m);

    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_OK, "%s", dt_error_detail());
    uint64_t blocks_per_rank = (per_rank + DT_CKPT_BLOCK_BYTES / 4 - 1) / (DT_CKPT_BLOCK_BYTES / 4);
    double t0 = now_s();
    cr_assert_eq(dt_ckpt_read(c, "params", t.base, numel, got), DT_STATUS_OK, "%s", dt_error_detail());
    double whole_s = now_s() - t0;
    cr_assert(memcmp(got, src + t.base, numel * sizeof(float)) == 0, "tensor differs");
    cr_assert_eq(dt_ckpt_blocks_verified(c), 4 * blocks_per_rank);
    cr_assert_eq(dt_ckpt_bytes_read(c), numel * sizeof(float));
    dt_ckpt_close(c);

    /* Row by row (each row: a piece from each of the 4 shards), a fresh handle. */
    cr_assert_eq(dt_ckpt_open(dir, &c), DT_STATUS_OK, "%s", dt_error_detail());
    memset(got, 0, numel * sizeof(float));
    t0 = now_s();
    for (uint64_t row = 0; row < t.rows; row++)
        cr_assert_eq(dt_ckpt_read(c, "params", t.base + row * t.in, t.in, got + row * t.in), DT_STATUS_OK, "%s",
                     dt_error_detail());
    double rows_s = now_s() - t0;
    cr_assert(memcmp(got, src + t.base, numel * sizeof(float)) == 0, "tensor read by rows differs");
    cr_assert_eq(dt_ckpt_blocks_verified(c), 4 * blocks_per_rank);
    cr_assert_eq(dt_ckpt_bytes_read(c), numel * sizeof(float));
    dt_ckpt_close(c);
    fprintf(stderr,
            "strided 4096-row cut over 4 shards: %llu blocks verified; whole tensor (%.1f MB) in %.1f ms, "
            "4096 row reads in %.1f ms\n",
            (unsigned long long)(4 * blocks_per_rank), numel * 4 / 1e6, whole_s * 1e3, rows_s * 1e3);
    free(got);
    free(src);
    dt_model_layout_free(&l);
}
