/*
 * tfevents.h - TensorBoard event files, written and read without TensorFlow: the
 * TFRecord framing (little-endian u64 length, masked CRC-32C of the length, the
 * record, masked CRC-32C of the record) around `Event` protocol buffers encoded
 * by hand (tensorflow/core/util/event.proto, framework/summary.proto).
 *
 * What is written, as PyTorch's SummaryWriter writes it, so that TensorBoard, its
 * EventAccumulator and the tools that import TensorBoard logs (W&B, MLflow) read it:
 *   - the first record of a file: Event{wall_time, file_version "brain.Event:2"};
 *   - a restart: Event{step S, session_log START}; TensorBoard then drops the
 *     events of steps >= S that earlier files hold (a resumed run's curves continue
 *     instead of doubling back);
 *   - one Event per logged step: Summary values, each a scalar (simple_value, a
 *     float) or a text (a string tensor with plugin "text").
 * File names: events.out.tfevents.<seconds, 10 digits>.<microseconds, 6>.<host>.<pid>:
 * TensorBoard reads a directory's files in name order, which is creation order.
 *
 * The reader checks both CRCs of every record and decodes the fields above; any
 * other field is skipped by its wire type. A truncated last record (a file being
 * written, or cut by a kill) ends the file quietly, as TensorBoard's does; a bad
 * CRC or a malformed buffer is DT_STATUS_FORMAT naming the file and the offset.
 */
#ifndef DT_RUNTIME_TOOLS_TFEVENTS_H
#define DT_RUNTIME_TOOLS_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* TFRecord's mask of a CRC-32C (runtime/ckpt's dt_crc32c). */
uint32_t dt_tfrecord_mask(uint32_t crc);

/* ---- writing ------------------------------------------------------------- */

typedef struct dt_tfevents_writer dt_tfevents_writer_t;

/* Creates dir (and parents) and a new event file in it (never an existing name
 * or a link), writes the file_version record and, when restart_step > 0, a
 * SessionLog START at that step. */
dt_status_t dt_tfevents_open(const char *dir, int64_t restart_step, dt_tfevents_writer_t **out);
/* The file's path. */
const char *dt_tfevents_path(const dt_tfevents_writer_t *w);
/* Starts the event of step `step`; values are added until dt_tfevents_end. */
void dt_tfevents_begin(dt_tfevents_writer_t *w, int64_t step);
/* A scalar (written as a float; a NaN or infinity is skipped, as metrics.jsonl
 * writes null). */
void dt_tfevents_scalar(dt_tfevents_writer_t *w, const char *tag, double value);
/* A text value (TensorBoard's text plugin renders it as Markdown). */
void dt_tfevents_text(dt_tfevents_writer_t *w, const char *tag, const char *text);
/* Frames the event, writes it and flushes the file (a live TensorBoard sees it). */
dt_status_t dt_tfevents_end(dt_tfevents_writer_t *w);
void dt_tfevents_close(dt_tfevents_writer_t *w);

/* ---- reading ------------------------------------------------------------- */

typedef enum dt_tfevents_kind {
    DT_TFEVENTS_SCALAR = 1, /* simple_value */
    DT_TFEVENTS_TEXT = 2,   /* a string tensor (first string_val) */
    DT_TFEVENTS_OTHER = 3,  /* an image, histogram, ... : tag only */
} dt_tfevents_kind_t;

typedef struct dt_tfevents_value {
    const char *tag; /* NUL-terminated copies, valid during the callback */
    dt_tfevents_kind_t kind;
    double value;     /* SCALAR */
    const char *text; /* TEXT */
    size_t text_len;
} dt_tfevents_value_t;

typedef struct dt_tfevents_event {
    double wall_time;
    int64_t step;
    const char *file_version; /* NULL unless this is a file_version record */
    int session_status;       /* SessionLog status: 1 START, 2 STOP, 3 CHECKPOINT; 0 none */
    int n_values;
    const dt_tfevents_value_t *values;
} dt_tfevents_event_t;

/* Called per event in file order; a non-OK return stops the read and is returned. */
typedef dt_status_t (*dt_tfevents_fn)(void *ctx, const dt_tfevents_event_t *ev);

/* Decodes one Event buffer (the payload of a record). */
dt_status_t dt_tfevents_decode(const uint8_t *buf, size_t len, dt_tfevents_fn fn, void *ctx);
/* Reads every record of one event file. Records over 64 MiB are refused. */
dt_status_t dt_tfevents_read_file(const char *path, dt_tfevents_fn fn, void *ctx);

/* ---- a run's scalars, as TensorBoard shows them ---------------------------- */

/* One scalar of the run: the last value written for (tag, step). */
typedef struct dt_tfevents_point {
    int64_t step;
    char *tag;
    double value;
} dt_tfevents_point_t;

typedef struct dt_tfevents_run {
    dt_tfevents_point_t *points; /* sorted by step, then tag */
    size_t n, cap;
    char **texts, **text_tags; /* the latest text per tag */
    size_t n_texts;
    int n_files;
} dt_tfevents_run_t;

/* Reads every events.out.tfevents.* file of dir in name order as TensorBoard
 * does: a SessionLog START at step S drops what earlier records held for steps
 * >= S. NOT_FOUND when dir holds no event file. */
dt_status_t dt_tfevents_load_dir(const char *dir, dt_tfevents_run_t *run);
void dt_tfevents_run_free(dt_tfevents_run_t *run);

#endif /* DT_RUNTIME_TOOLS_TFEVENTS_H */
