/*
 * data_impl.h - the data loader's structures, private to runtime/train/data*.c:
 * data.c maps and validates files and serves validation, data_mix.c orders the
 * training samples of the sources (the mixture and the per-source permutations),
 * data_ahead.c reads micro-batches ahead on a thread, data_read.c copies a sample
 * out of the maps. Calls run data.c -> data_mix.c -> data_ahead.c, data_read.c.
 */
#ifndef DT_RUNTIME_TRAIN_DATA_IMPL_H
#define DT_RUNTIME_TRAIN_DATA_IMPL_H

#include <pthread.h>

#include "runtime/train/data.h"

typedef struct data_file {
    char *path;
    void *map;
    size_t map_len;
    const uint8_t *bytes; /* DT_DATA_TEXT */
    const void *tokens;   /* DT_DATA_TOKENS: uint16 or uint32, token_bytes wide */
    int token_bytes;      /* 1 for text */
    uint64_t ntok;
    uint64_t nsamples;
    uint64_t first_sample; /* id of this file's first sample in its set */
    /* the loss mask beside a shard (shard.h: SHARD.mask), or NULL */
    const uint8_t *mask; /* one byte per token */
    void *mask_map;
    size_t mask_len;
} data_file;

/* One document's part of a packed sequence (data_pack.c): n + 1 tokens of file
 * `file` from token `off` give n positions (inputs tokens [0, n), targets [1, n]). */
typedef struct pack_seg {
    uint64_t off;
    uint32_t file, n;
} pack_seg;

typedef struct data_set {
    data_file *files;
    int nfiles;
    uint64_t nsamples;
    uint64_t ntokens;
    dt_data_kind_t kind;
    /* Sets over the scan limit (data.c) are not read through at open: their pages
     * are advised random, fetched a micro-batch at a time, and each sample's ids
     * are checked against vocab as it is read. */
    int lazy;
    int vocab;
    /* Masked sets (every shard has its mask): the samples are sequences of whole
     * documents (data_pack.c), not windows: sample i is segs[seq[i] .. seq[i+1]),
     * nsamples of them. */
    int masked;
    uint64_t *seq;  /* (nsamples + 1) */
    pack_seg *segs;
    dt_data_pack_info pack;
} data_set;

/* One training source: its files, the samples it trains on, its permutation. */
typedef struct data_src {
    char *path;       /* the glob as given */
    double cum;       /* cumulative normalised weight: picked when u < cum */
    data_set set;
    uint64_t train_n; /* samples used for training (the rest is its validation tail) */
    uint64_t held;    /* samples held out at the tail */
    uint32_t *perm;   /* permutation of [0, train_n) for perm_epoch */
    uint64_t perm_epoch;
    int perm_valid;
} data_src;

/* One prepared micro-batch and the position after it. */
typedef struct ahead_slot {
    int32_t *inputs, *targets, *positions; /* (B, T); positions NULL unless masked */
    dt_data_pos after;
    dt_status_t st;  /* a bad sample: the status and its detail */
    char err[512];
} ahead_slot;

/* The producer of micro-batches the read-ahead runs (data_mix.c's dt_data_produce_,
 * handed over at init so that data_ahead.c calls nothing above it). */
typedef dt_status_t (*dt_data_produce_fn)(dt_data_t *d, dt_data_pos *pos, int32_t *inputs, int32_t *targets,
                                          int32_t *positions);

/* The read-ahead ring (data_ahead.c). */
typedef struct data_ahead {
    dt_data_produce_fn produce;
    pthread_t thread;
    int running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ahead_slot *slots;
    int depth;
    uint64_t head, tail; /* produced and consumed counts; tail <= head <= tail + depth */
    int stop;
    dt_data_pos next; /* the producer's position */
} data_ahead;

struct dt_data {
    dt_data_opts o;
    data_src src[DT_DATA_MAX_SOURCES];
    int n_src;
    data_set val;        /* data.val; empty when validation comes from the sources' tails */
    uint64_t val_n;
    uint64_t delay_us;   /* DTRUN_DATA_DELAY_US: sleep per sample read */
    struct mine { int src; uint64_t id; } *mine; /* this rank's samples of one micro-batch */
    dt_data_pos pos;     /* consumed */
    data_ahead ahead;
};

/* Copies sample `id` of set s: T+1 tokens -> inputs[0..T), targets[0..T) (data_read.c);
 * a lazy set's ids are checked here (DT_STATUS_FORMAT naming file, index, id). A
 * masked set's sample is its packed sequence (data_pack.c), positions (may be NULL)
 * getting each token's position in its document. */
dt_status_t dt_data_set_sample_(const data_set *s, uint64_t id, int T, int32_t *inp, int32_t *tgt, int32_t *pos);

/* data_pack.c: a masked set's sequences, built at open from its documents (packed
 * first-fit, or one per sequence with packing 0), and the copy of one. */
dt_status_t dt_data_pack_build_(data_set *s, int T, int packing);
dt_status_t dt_data_pack_sample_(const data_set *s, uint64_t id, int T, int32_t *inp, int32_t *tgt, int32_t *pos);
/* Starts reading sample `id`'s pages of a lazy set (no wait), so that the reads of
 * a micro-batch's samples are in flight together rather than one after another. */
void dt_data_set_advise_(const data_set *s, uint64_t id, int T);

/* data_mix.c: the micro-batch of rank o.rank at *pos, advancing *pos over the
 * whole job's micro-step. */
dt_status_t dt_data_produce_(dt_data_t *d, dt_data_pos *pos, int32_t *inputs, int32_t *targets, int32_t *positions);
/* Canonical form of a position (epochs carried, source 0 mirrored in epoch/cursor). */
void dt_data_pos_norm_(const dt_data_t *d, dt_data_pos *pos);

/* data_ahead.c: the ring of d->o.prefetch micro-batches that produce fills. */
dt_status_t dt_data_ahead_init_(dt_data_t *d, dt_data_produce_fn produce);
dt_status_t dt_data_ahead_take_(dt_data_t *d, int32_t *inputs, int32_t *targets, int32_t *positions);
void dt_data_ahead_stop_(dt_data_t *d);
void dt_data_ahead_free_(dt_data_t *d);

#endif /* DT_RUNTIME_TRAIN_DATA_IMPL_H */
