/*
 * data.h - training and validation data for the trainer.
 *
 * Sources: plain text files (each byte a token, vocab 256) or llm.c token shards
 * (a 1024-byte header of 256 int32: magic 20240520, version 1, token count; then
 * uint16 tokens), given as one path or a glob. Files are mapped, validated at open
 * (magic, version, size against the count, token ids against the vocab) and every
 * problem names the file.
 *
 * Samples: each file is cut into windows of seq_len+1 tokens at stride seq_len
 * (inputs are the first seq_len, targets the last seq_len). Every epoch visits the
 * training samples in a permutation drawn from (seed, epoch). One micro-step of the
 * whole job consumes world_size * micro_batch consecutive samples of that order;
 * rank r takes the r-th group of micro_batch. So N ranks with accumulation A see,
 * per optimizer step, exactly the samples that 1 rank sees with accumulation N*A.
 *
 * Validation: data.val when given, else the last val_fraction of the training
 * samples (held out of training), read in order.
 */
#ifndef DT_RUNTIME_DATA_H
#define DT_RUNTIME_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define DT_DATA_SHARD_MAGIC 20240520
#define DT_DATA_SHARD_VERSION 1
#define DT_DATA_SHARD_HEADER_BYTES 1024
#define DT_DATA_GPT2_VOCAB 50257

typedef enum dt_data_kind {
    DT_DATA_TEXT = 0,   /* bytes, vocab 256 */
    DT_DATA_TOKENS = 1, /* llm.c uint16 token shards */
} dt_data_kind_t;

typedef struct dt_data_opts {
    const char *train;   /* path or glob (required) */
    const char *val;     /* path or glob; NULL or "" -> held-out tail of train */
    double val_fraction; /* share of train samples held out when val is empty */
    int seq_len;         /* T */
    int vocab_size;      /* model's real vocab: every token must be below it */
    uint64_t seed;
    int rank;
    int world_size;
    int micro_batch; /* B, samples per rank per micro-step */
} dt_data_opts;

/* Where the job is in the data: saved in checkpoints, restored on resume. */
typedef struct dt_data_pos {
    uint64_t epoch;
    uint64_t cursor; /* samples of this epoch consumed by the whole job */
} dt_data_pos;

typedef struct dt_data dt_data_t;

/* Which kind of data a path or glob holds (by the first file's first bytes). */
dt_status_t dt_data_detect(const char *pattern, dt_data_kind_t *kind);
/* The vocab a kind implies when the config leaves it at 0: 256 or 50257. */
int dt_data_default_vocab(dt_data_kind_t kind);

dt_status_t dt_data_open(const dt_data_opts *opts, dt_data_t **out);
void dt_data_close(dt_data_t *d);

dt_data_kind_t dt_data_kind(const dt_data_t *d);
uint64_t dt_data_train_samples(const dt_data_t *d);
uint64_t dt_data_val_samples(const dt_data_t *d);
uint64_t dt_data_train_tokens(const dt_data_t *d);

/* This rank's next micro-batch: inputs and targets, each (B, T) int32. */
void dt_data_next(dt_data_t *d, int32_t *inputs, int32_t *targets);
/* Validation batch `index` of this rank, (B, T) each; wraps around. 0 samples of
 * validation -> DT_STATUS_NOT_FOUND. */
dt_status_t dt_data_val_batch(dt_data_t *d, uint64_t index, int32_t *inputs, int32_t *targets);

dt_data_pos dt_data_get_pos(const dt_data_t *d);
void dt_data_set_pos(dt_data_t *d, dt_data_pos pos);
/* The global sample id (index into the unshuffled training samples) of the
 * sample at position `pos` + offset: lets tests check which samples were seen. */
uint64_t dt_data_sample_id(dt_data_t *d, dt_data_pos pos, uint64_t offset);

#endif /* DT_RUNTIME_DATA_H */
