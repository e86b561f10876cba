/*
 * data.h - training and validation data for the trainer.
 *
 * Sources: plain text files (each byte a token, vocab 256) or llm.c token shards
 * (runtime/tokenize/shard.h: uint16 version 1 or uint32 version 7), given as one
 * path or glob, or as a weighted list of them (a mixture). Files are mapped,
 * validated at open (magic, version, size against the count, token ids against the
 * vocab) and every problem names the file. All sources of a job are the same kind.
 *
 * Samples: each file is cut into windows of seq_len+1 tokens at stride seq_len
 * (inputs are the first seq_len, targets the last seq_len). Shards with a loss mask
 * beside them (shard.h: SHARD.mask, written by `dtrun tokenize --chat`) are masked
 * data instead: their documents (a mask bit marks each start) are packed whole into
 * sequences (data_pack.c; first-fit over a few open sequences, in document order;
 * a document longer than seq_len + 1 tokens is cut there), each with positions
 * restarting at 0 per document so that attention stays inside it, and targets -1
 * where the mask does not train (prompts) and on padding. With no_packing each
 * document has a sequence of its own. Every shard of a masked job needs its mask. Each source visits its
 * training samples in a permutation drawn from (seed, source, epoch) and keeps its
 * own (epoch, cursor).
 *
 * Order: the job draws samples k = 0, 1, 2, ...; sample k comes from the source
 * that (seed, k) picks with the sources' weights (always source 0 with one
 * source), and is that source's next sample. The order is a function of k alone.
 * One micro-step of the whole job consumes world_size * micro_batch consecutive
 * samples; rank r takes the r-th group of micro_batch, and every rank advances all
 * sources over the whole micro-step. So N ranks with accumulation A see, per
 * optimizer step, exactly the samples that 1 rank sees with accumulation N*A, and a
 * position saved at one world size resumes at another.
 *
 * Validation: data.val when given, else the last val_fraction of each source's
 * training samples (held out of training), concatenated, read in order.
 *
 * Read-ahead: with prefetch > 0 a background thread prepares the next `prefetch`
 * micro-batches while the step computes (data_ahead.c); dt_data_next takes them in
 * order and dt_data_get_pos is the position of what was taken, never of what was
 * prepared ahead. The thread starts at the first dt_data_next and is joined by
 * dt_data_set_pos and dt_data_close.
 *
 * Checks and reads: shard sets up to 256 MiB are read through at open (every id
 * checked against the vocab before the first step). Larger sets are not (a run
 * over many GB on network storage would read them all at start): their pages are
 * advised random, each micro-batch's samples are requested together, and each
 * sample's ids are checked as it is read (the same error, at that step).
 * DTRUN_DATA_SCAN_MB overrides the limit.
 *
 * Benchmark knob: DTRUN_DATA_DELAY_US=N in the environment makes every sample read
 * sleep N microseconds (a slow reader for scripts/bench/data_wait.sh and tests).
 */
#ifndef DT_RUNTIME_DATA_H
#define DT_RUNTIME_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define DT_DATA_GPT2_VOCAB 50257
#define DT_DATA_MAX_SOURCES 16

typedef enum dt_data_kind {
    DT_DATA_TEXT = 0,   /* bytes, vocab 256 */
    DT_DATA_TOKENS = 1, /* llm.c token shards, uint16 or uint32 */
} dt_data_kind_t;

/* One source of a mixture: a path or glob and its (unnormalised, > 0) weight. */
typedef struct dt_data_source {
    const char *path;
    double weight;
} dt_data_source;

typedef struct dt_data_opts {
    const char *train;   /* path or glob, when sources is NULL */
    const dt_data_source *sources; /* a mixture (n_sources >= 1), or NULL */
    int n_sources;
    const char *val;     /* path or glob; NULL or "" -> held-out tails of train */
    double val_fraction; /* share of each source's samples held out when val is empty */
    int seq_len;         /* T */
    int vocab_size;      /* model's real vocab: every token must be below it */
    uint64_t seed;
    int rank;
    int world_size;
    int micro_batch; /* B, samples per rank per micro-step */
    int prefetch;    /* micro-batches read ahead on a thread; 0 = read in dt_data_next */
    int no_packing;  /* masked data: one document per sequence, padded (data.packing false) */
} dt_data_opts;

/* Masked data (shards with their loss masks, `dtrun tokenize --chat`): how its
 * documents became sequences. */
typedef struct dt_data_pack_info {
    uint64_t documents;  /* documents of >= 2 tokens, placed */
    uint64_t skipped;    /* documents of one token (nothing to predict) */
    uint64_t truncated;  /* documents longer than seq_len + 1 tokens, cut there */
    uint64_t sequences;
    uint64_t positions;  /* real (non-padding) positions over all sequences */
    uint64_t trained;    /* positions whose target is trained on */
} dt_data_pack_info;

/* Where one source is in its own sample order. */
typedef struct dt_data_src_pos {
    uint64_t epoch;
    uint64_t cursor; /* samples of this epoch consumed by the whole job */
} dt_data_src_pos;

/* Where the job is in the data: saved in checkpoints, restored on resume. */
typedef struct dt_data_pos {
    uint64_t epoch;   /* source 0's epoch and cursor (what single-source checkpoints hold) */
    uint64_t cursor;
    uint64_t samples; /* job-wide samples drawn: the k of the next one */
    int n_sources;    /* entries of src; 0 when only epoch/cursor are known (old checkpoints) */
    dt_data_src_pos src[DT_DATA_MAX_SOURCES];
} dt_data_pos;

typedef struct dt_data dt_data_t;

/* Which kind of data a path or glob holds (by the first file's first bytes);
 * token_bytes (may be NULL) gets 1 for text, else the first shard's token width. */
dt_status_t dt_data_detect(const char *pattern, dt_data_kind_t *kind);
dt_status_t dt_data_detect_width(const char *pattern, dt_data_kind_t *kind, int *token_bytes);
/* The loader's own checks of every file pattern matches, as dt_data_open makes
 * them (each a readable regular file, one kind, shard headers, text bytes and, for
 * sets it reads through at open, token ids below vocab_size), then the files are
 * let go: the launcher's check before any worker starts. key names the config key.
 * With val_fraction >= 0 (the share held out; 0 when data.val is given), files that
 * leave no training sample of seq_len + 1 tokens are DT_STATUS_FORMAT naming the
 * key and pattern; a negative val_fraction skips that check (data.val). */
dt_status_t dt_data_check_files(const char *key, const char *pattern, int seq_len, int vocab_size,
                                double val_fraction);
/* The largest vocabulary size the headers of pattern's shards record
 * (DT_SHARD_HEADER_VOCAB: `dtrun tokenize` writes its tokenizer's): *vocab 0 when
 * none records one (llm.c's shards, text). file (may be NULL) gets that shard. */
dt_status_t dt_data_header_vocab(const char *pattern, int *vocab, char *file, size_t file_len);
/* The vocab a kind implies when the config leaves it at 0: 256 or 50257. */
int dt_data_default_vocab(dt_data_kind_t kind);

dt_status_t dt_data_open(const dt_data_opts *opts, dt_data_t **out);
void dt_data_close(dt_data_t *d);

dt_data_kind_t dt_data_kind(const dt_data_t *d);
uint64_t dt_data_train_samples(const dt_data_t *d); /* all sources */
uint64_t dt_data_val_samples(const dt_data_t *d);
uint64_t dt_data_train_tokens(const dt_data_t *d);
int dt_data_n_sources(const dt_data_t *d);
/* Source i's path or glob, as given. */
const char *dt_data_source_path(const dt_data_t *d, int i);

/* This rank's next micro-batch: inputs and targets, each (B, T) int32. */
dt_status_t dt_data_next(dt_data_t *d, int32_t *inputs, int32_t *targets);
/* The same with positions (B, T): masked data's position of each token in its
 * document (0 at each start; padding is a document of its own), targets -1 where
 * the target is not trained on or is padding. positions may be NULL. */
dt_status_t dt_data_next_pos(dt_data_t *d, int32_t *inputs, int32_t *targets, int32_t *positions);
/* 1 when the data is masked (every sample comes with positions and may hold
 * untrained targets); info (may be NULL) gets how the training sources' documents
 * were packed, summed over them. */
int dt_data_masked(const dt_data_t *d, dt_data_pack_info *info);
/* Validation batch `index` of this rank, (B, T) each; wraps around. 0 samples of
 * validation -> DT_STATUS_NOT_FOUND. */
dt_status_t dt_data_val_batch(dt_data_t *d, uint64_t index, int32_t *inputs, int32_t *targets);
dt_status_t dt_data_val_batch_pos(dt_data_t *d, uint64_t index, int32_t *inputs, int32_t *targets,
                                  int32_t *positions);

dt_data_pos dt_data_get_pos(const dt_data_t *d);
/* Restores a position (stopping the read-ahead, which restarts from it). A
 * position with n_sources 0 sets source 0 from epoch/cursor; one with another
 * number of sources than the data is DT_STATUS_INVALID. */
dt_status_t dt_data_set_pos(dt_data_t *d, dt_data_pos pos);
/* The sample id (index into source 0's unshuffled training samples) of the
 * sample at source 0's position `pos` + offset: lets tests check which samples
 * were seen. */
uint64_t dt_data_sample_id(dt_data_t *d, dt_data_pos pos, uint64_t offset);
/* The source that job-wide sample k comes from (tests: the realised shares). */
int dt_data_pick_source(const dt_data_t *d, uint64_t k);

#endif /* DT_RUNTIME_DATA_H */
