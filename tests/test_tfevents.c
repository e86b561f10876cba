/*
 * test_tfevents.c - TensorBoard event files: CRC-32C against RFC 3720's check
 * values, dtrun's reader on event files TensorBoard's own writer made
 * (tests/fixtures/tensorboard/, scripts/compat/tensorboard_fixture.py: a restart
 * that TensorBoard shows as one curve), dtrun's writer read back (scalars, text, a
 * restart), and broken files: a flipped byte is an error naming the file and the
 * offset, a truncated last record ends the file quietly, a FIFO is refused.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/ckpt/checkpoint.h"
#include "runtime/tools/tfevents.h"

#define FIX "tests/fixtures/tensorboard"

static double value_at(const dt_tfevents_run_t *run, const char *tag, int64_t step, int *found) {
    *found = 0;
    for (size_t i = 0; i < run->n; i++)
        if (run->points[i].step == step && !strcmp(run->points[i].tag, tag)) {
            (*found)++;
            return run->points[i].value;
        }
    return NAN;
}

static size_t count_tag(const dt_tfevents_run_t *run, const char *tag) {
    size_t n = 0;
    for (size_t i = 0; i < run->n; i++) n += !strcmp(run->points[i].tag, tag);
    return n;
}

static const char *text_of(const dt_tfevents_run_t *run, const char *tag) {
    for (size_t i = 0; i < run->n_texts; i++)
        if (!strcmp(run->text_tags[i], tag)) return run->texts[i];
    return NULL;
}

Test(tfevents, crc32c_check_values_and_mask) {
    /* RFC 3720 B.4: 32 zero bytes, 32 0xff bytes, 0..31; the classic "123456789" */
    uint8_t b[32];
    memset(b, 0, 32);
    cr_assert_eq(dt_crc32c(0, b, 32), 0x8a9136aau);
    memset(b, 0xff, 32);
    cr_assert_eq(dt_crc32c(0, b, 32), 0x62a8ab43u);
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)i;
    cr_assert_eq(dt_crc32c(0, b, 32), 0x46dd794eu);
    cr_assert_eq(dt_crc32c(0, "123456789", 9), 0xe3069283u);
    /* TFRecord's masked CRC, as tensorboard.summary.writer.record_writer computes it */
    cr_assert_eq(dt_tfrecord_mask(dt_crc32c(0, "123456789", 9)), 0xc78ab0e5u);
    const uint8_t len13[8] = {13};
    cr_assert_eq(dt_tfrecord_mask(dt_crc32c(0, len13, 8)), 0x34b8373cu);
}

/* TensorBoard's writer made these: file 1 steps 1..8, file 2 a START at 6, then 6..10. */
Test(tfevents, reads_tensorboards_own_files_as_tensorboard_shows_them) {
    dt_tfevents_run_t run;
    cr_assert_eq(dt_tfevents_load_dir(FIX, &run), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(run.n_files, 2);
    cr_assert_eq(count_tag(&run, "train/loss"), 10, "steps 1..10 once each, got %zu", count_tag(&run, "train/loss"));
    cr_assert_eq(count_tag(&run, "train/lr"), 10);
    for (int step = 1; step <= 10; step++) {
        int found;
        double loss = value_at(&run, "train/loss", step, &found);
        cr_assert_eq(found, 1, "step %d", step);
        double want = (step <= 5 ? 1.0 : 2.0) / (step + 1); /* 6..8 of file 1 were dropped by the START */
        cr_assert_float_eq(loss, (float)want, 1e-9, "step %d: %g, want %g", step, loss, want);
        cr_assert_float_eq(value_at(&run, "train/lr", step, &found), (float)(1e-3 * step), 1e-12);
    }
    const char *cfg = text_of(&run, "config");
    cr_assert(cfg && !strcmp(cfg, "{\"train_steps\": 8}"), "config text: %s", cfg ? cfg : "(none)");
    dt_tfevents_run_free(&run);
}

static char tmpdir[64];
static void mk_tmp(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_tfevents_XXXXXX");
    cr_assert(mkdtemp(tmpdir));
}

Test(tfevents, writer_round_trip_with_a_restart) {
    mk_tmp();
    dt_tfevents_writer_t *w;
    cr_assert_eq(dt_tfevents_open(tmpdir, 0, &w), DT_STATUS_OK, "%s", dt_error_detail());
    dt_tfevents_begin(w, 1);
    dt_tfevents_text(w, "config", "{\"a\": \"b\"}\n`code`");
    dt_tfevents_end(w);
    for (int s = 1; s <= 8; s++) {
        dt_tfevents_begin(w, s);
        dt_tfevents_scalar(w, "train/loss", 3.0 + s);
        dt_tfevents_scalar(w, "time/step_ms", 0.25 * s);
        dt_tfevents_scalar(w, "val/loss", NAN); /* skipped, as metrics.jsonl's null */
        dt_tfevents_scalar(w, "train/big", s % 2 ? 1e300 : -1e300); /* past float: infinity, no UB */
        cr_assert_eq(dt_tfevents_end(w), DT_STATUS_OK);
    }
    dt_tfevents_close(w);
    usleep(2000);
    cr_assert_eq(dt_tfevents_open(tmpdir, 5, &w), DT_STATUS_OK, "%s", dt_error_detail());
    for (int s = 5; s <= 12; s++) {
        dt_tfevents_begin(w, s);
        dt_tfevents_scalar(w, "train/loss", -1.0 * s);
        cr_assert_eq(dt_tfevents_end(w), DT_STATUS_OK);
    }
    dt_tfevents_close(w);
    dt_tfevents_run_t run;
    cr_assert_eq(dt_tfevents_load_dir(tmpdir, &run), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(run.n_files, 2);
    cr_assert_eq(count_tag(&run, "train/loss"), 12);
    cr_assert_eq(count_tag(&run, "time/step_ms"), 4, "steps 1..4 stay, 5..8 were purged by the restart");
    cr_assert_eq(count_tag(&run, "val/loss"), 0);
    int found;
    cr_assert(isinf(value_at(&run, "train/big", 1, &found)) && value_at(&run, "train/big", 1, &found) > 0);
    cr_assert(isinf(value_at(&run, "train/big", 2, &found)) && value_at(&run, "train/big", 2, &found) < 0);
    for (int s = 1; s <= 12; s++)
        cr_assert_float_eq(value_at(&run, "train/loss", s, &found), s < 5 ? 3.0 + s : -1.0 * s, 1e-6, "step %d", s);
    cr_assert_str_eq(text_of(&run, "config"), "{\"a\": \"b\"}\n`code`");
    dt_tfevents_run_free(&run);
}

/* One file of 3 scalar events; returns its path in path. */
static void one_file(char *path, size_t len) {
    mk_tmp();
    dt_tfevents_writer_t *w;
    cr_assert_eq(dt_tfevents_open(tmpdir, 0, &w), DT_STATUS_OK);
    for (int s = 1; s <= 3; s++) {
        dt_tfevents_begin(w, s);
        dt_tfevents_scalar(w, "loss", s);
        dt_tfevents_end(w);
    }
    snprintf(path, len, "%s", dt_tfevents_path(w));
    dt_tfevents_close(w);
}

static dt_status_t count_events(void *ctx, const dt_tfevents_event_t *ev) {
    (*(int *)ctx)++;
    return DT_STATUS_OK;
}

Test(tfevents, a_flipped_byte_is_an_error_naming_file_and_offset) {
    char path[4096];
    one_file(path, sizeof path);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    /* every byte of the file, flipped in turn: an error or (never) a silent change */
    FILE *f = fopen(path, "rb");
    uint8_t *orig = malloc((size_t)sb.st_size);
    cr_assert_eq(fread(orig, 1, (size_t)sb.st_size, f), (size_t)sb.st_size);
    fclose(f);
    for (off_t i = 0; i < sb.st_size; i++) {
        uint8_t *b = malloc((size_t)sb.st_size);
        memcpy(b, orig, (size_t)sb.st_size);
        b[i] ^= 0x10;
        f = fopen(path, "wb");
        fwrite(b, 1, (size_t)sb.st_size, f);
        fclose(f);
        free(b);
        int n = 0;
        dt_status_t st = dt_tfevents_read_file(path, count_events, &n);
        if (st == DT_STATUS_OK) {
            /* a flip in a length that makes the record run past the end reads as a
             * truncated tail, as TensorBoard reads it: fewer events, never other ones */
            cr_assert_lt(n, 4, "byte %lld flipped: %d events read as if nothing happened", (long long)i, n);
            continue;
        }
        cr_assert_eq(st, DT_STATUS_FORMAT, "byte %lld: %s", (long long)i, dt_error_detail());
        cr_assert(strstr(dt_error_detail(), path) && strstr(dt_error_detail(), "record at byte"), "byte %lld: %s",
                  (long long)i, dt_error_detail());
    }
    free(orig);
}

Test(tfevents, a_truncated_last_record_ends_the_file_quietly) {
    char path[4096];
    one_file(path, sizeof path);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    cr_assert_eq(truncate(path, sb.st_size - 3), 0);
    int n = 0;
    cr_assert_eq(dt_tfevents_read_file(path, count_events, &n), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(n, 3, "the file_version and 2 whole events, got %d", n); /* of 4 records */
}

Test(tfevents, never_blocks_on_a_fifo) {
    mk_tmp();
    char p[4096];
    snprintf(p, sizeof p, "%s/events.out.tfevents.fifo", tmpdir);
    cr_assert_eq(mkfifo(p, 0600), 0);
    int n = 0;
    dt_status_t st = dt_tfevents_read_file(p, count_events, &n);
    cr_assert_neq(st, DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "FIFO"), "%s", dt_error_detail());
}

Test(tfevents, malformed_buffers_are_errors_not_crashes) {
    /* hand-made Event payloads: a truncated varint, a length past the end, a group */
    const uint8_t bad1[] = {0x10, 0xff};             /* step: varint cut */
    const uint8_t bad2[] = {0x2a, 0x7f, 0x0a, 0x01}; /* summary: 127 bytes of 2 */
    const uint8_t bad3[] = {0x0b};                   /* field 1, wire type 3 */
    const uint8_t bad4[] = {0x2a, 0x04, 0x0a, 0x02, 0x0a, 0x7f}; /* Value.tag past its end */
    const uint8_t *bufs[] = {bad1, bad2, bad3, bad4};
    size_t lens[] = {sizeof bad1, sizeof bad2, sizeof bad3, sizeof bad4};
    for (int i = 0; i < 4; i++) {
        int n = 0;
        cr_assert_eq(dt_tfevents_decode(bufs[i], lens[i], count_events, &n), DT_STATUS_FORMAT, "case %d", i);
        cr_assert_eq(n, 0);
    }
}
