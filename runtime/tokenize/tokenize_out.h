/*
 * tokenize_out.h - the shard files of one `dtrun tokenize` run (private to
 * runtime/tokenize): a stream of ids cut into PREFIX_val_000000.bin (the first
 * val_tokens) and PREFIX_train_NNNNNN.bin (shard_tokens each), written under
 * temporary names and renamed only by dt_shard_out_commit.
 */
#ifndef DT_RUNTIME_TOKENIZE_TOKENIZE_OUT_H
#define DT_RUNTIME_TOKENIZE_TOKENIZE_OUT_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct dt_shard_out {
    char *prefix;
    int token_bytes;
    uint32_t vocab; /* the tokenizer's vocabulary size, in each header (DT_SHARD_HEADER_VOCAB) */
    uint64_t shard_tokens, val_tokens;
    char **tmp, **final; /* every shard of this run, in order */
    int n, cap;
    int fd;              /* the open shard (-1 between shards) */
    int fd_is_val;
    uint64_t in_shard;   /* tokens in the open shard */
    uint64_t total, val_written;
    unsigned char *buf;  /* tokens not yet written to fd */
    size_t buf_len, buf_cap;
    int no_train;        /* commit refused: no token past the val_tokens */
    /* masked runs (dt_shard_out_write_masked): each shard's loss mask beside it
     * (SHARD.mask, shard.h), written alongside; shards then hold whole documents */
    int masked;
    int mfd;
    unsigned char *mbuf;
    size_t mbuf_len;
} dt_shard_out;

/* Starts a run; nothing is created until the first token. */
void dt_shard_out_init(dt_shard_out *w, const char *prefix, int token_bytes, uint64_t shard_tokens,
                       uint64_t val_tokens);
/* Appends n ids (each must fit token_bytes). */
dt_status_t dt_shard_out_write(dt_shard_out *w, const uint32_t *ids, size_t n);
/* A masked run: appends n ids and their mask bytes (shard.h: DT_MASK_*; mask[0]
 * must start a document). Documents are never cut between shards: one that does not
 * fit the open shard's room starts the next (a document longer than a shard makes
 * that shard longer), and the validation shard takes whole documents until it holds
 * val_tokens or more. Every write of a run must be masked or none. */
dt_status_t dt_shard_out_write_masked(dt_shard_out *w, const uint32_t *ids, const uint8_t *mask, size_t n);
/* Closes the last shard and renames every temporary to its final name (after
 * fsync), then with force removes the prefix's other shards (from an older run).
 * A shard of an unmasked run loses any mask an older run left beside its name.
 * A run without a single train token is DT_STATUS_INVALID (and aborted; no_train). */
dt_status_t dt_shard_out_commit(dt_shard_out *w, int force);
/* Closes and removes every temporary; frees. Safe after commit (then only frees). */
void dt_shard_out_abort(dt_shard_out *w);

/* The existing shards of prefix (PREFIX_{val,train}_NNNNNN.bin), malloc'ed paths
 * in *paths (free each and the array); *n their count. Errors name the folder. */
dt_status_t dt_shard_out_existing(const char *prefix, char ***paths, int *n);

/* Removes the prefix's temporaries (PREFIX_*_NNNNNN.bin.tmp.PID) whose run is gone
 * (no process PID: it was killed before it could clean up). Returns how many. */
int dt_shard_out_clean_stale(const char *prefix);

#endif /* DT_RUNTIME_TOKENIZE_TOKENIZE_OUT_H */
