/*
 * tokenize_run.h - `dtrun tokenize`'s pipeline: text files, jsonl files and stdin
 * -> documents -> token ids (in parallel, byte-identical whatever the job count)
 * -> llm.c token shards (shard.h).
 *
 * Documents: a text file (or stdin) is one document, a jsonl line is one (its
 * `field` string). Each non-empty document is preceded by the document token.
 * Large documents are cut at dt_tok_split_point into pieces that a pool of
 * threads encodes (one dt_tok_enc_t each); pieces are written in input order.
 *
 * Output: PREFIX_val_000000.bin with the first val_tokens tokens (none when 0),
 * then PREFIX_train_NNNNNN.bin of shard_tokens tokens each (the last shorter).
 * Every shard is written under a temporary name in the same folder and fsync'ed;
 * only when the whole run succeeded are they renamed to their final names, so a
 * failure, a cancel or a signal never leaves a shard under a final name (nor a
 * temporary: the run removes its own).
 */
#ifndef DT_RUNTIME_TOKENIZE_TOKENIZE_RUN_H
#define DT_RUNTIME_TOKENIZE_TOKENIZE_RUN_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/tokenize/tok.h"

/* stdin is held in bounded memory: at most this much of it past the last cut (a
 * jsonl line, or text with no exact cut point, longer than this is an error). */
#define DT_TOKENIZE_STDIN_STRETCH_MAX (16u << 20)

/* What the progress callback and the summary see. */
typedef struct dt_tokenize_progress {
    uint64_t bytes_done, bytes_total; /* input bytes encoded; total 0 when unknown (stdin) */
    uint64_t tokens;                  /* tokens written so far (document tokens included) */
    uint64_t documents;               /* non-empty documents */
    uint64_t empty_documents;         /* skipped: no text */
    int shards;                       /* shard files (val and train) */
    uint64_t val_tokens, train_tokens;
    double seconds;                   /* since the pipeline started */
    int jobs;
    double serial_s;                  /* the serial part: cutting pieces + writing shards */
    uint64_t pieces;
    uint64_t invalid_utf8;            /* bytes of invalid UTF-8 in the input */
    char first_invalid[512];          /* "FILE:offset N" or "FILE:line N" of the first */
    int stale_removed;                /* temporaries of killed runs of this prefix, removed */
    int existing;                     /* the run was refused: shards of the prefix exist */
    int no_train;                     /* refused: tokens (all of them) <= val_tokens */
} dt_tokenize_progress;

/* A document's loss mask, a byte per id (shard.h: DT_MASK_*); the caller owns bytes. */
typedef struct dt_tok_mask {
    uint8_t *bytes;
    size_t n, cap;
} dt_tok_mask;

/* Which tokens of a conversation --chat trains on. */
typedef enum {
    DT_TOKENIZE_MASK_ASSISTANT = 0, /* every assistant turn */
    DT_TOKENIZE_MASK_LAST = 1,      /* the last assistant turn */
    DT_TOKENIZE_MASK_ALL = 2,       /* every token */
} dt_tokenize_mask_mode;

struct dt_chat;

/* How inputs are read: by name (*.jsonl are jsonl, the rest and stdin text), or all
 * as one format. */
typedef enum { DT_TOKENIZE_AUTO = 0, DT_TOKENIZE_TEXT, DT_TOKENIZE_JSONL } dt_tokenize_format;

typedef struct dt_tokenize_opts {
    const dt_tok_t *tok;
    const char *const *inputs; /* paths; "-" is stdin (streamed); *.jsonl are jsonl unless format */
    int n_inputs;
    const char *field;         /* jsonl field (default "text") */
    const char *field_hint;    /* how to pick another field, said when a line lacks it; may be NULL */
    dt_tokenize_format format;
    const char *out_prefix;
    uint64_t shard_tokens;     /* > 0, at most INT32_MAX */
    uint64_t val_tokens;
    int jobs;                  /* >= 1 */
    uint32_t doc_token;
    int force;                 /* replace existing shards of the prefix */
    size_t piece_bytes;        /* 0: chosen from the input size and jobs (<= 1 MB) */
    /* Set (by a signal handler) to stop: the run removes its temporaries and
     * returns DT_STATUS_CANCELED. May be NULL. */
    volatile sig_atomic_t *cancel;
    /* Called from the writing thread about every progress_ms (0: 100 ms; < 0: at
     * every pass of its loop, the first pass included, so that even a run shorter
     * than any interval draws the line). May be NULL. */
    void (*progress)(void *ctx, const dt_tokenize_progress *p);
    void *progress_ctx;
    int progress_ms;
    /* --chat: jsonl documents (conversations, prompt/completion, text) with their
     * loss masks beside the shards (tokenize_chat.c); chat is the template (NULL:
     * conversations are refused), eos_token appended to completions (-1: none) */
    int chat_mode;
    const struct dt_chat *chat;
    dt_tokenize_mask_mode mask_mode;
    int64_t eos_token;
} dt_tokenize_opts;

/* Checks what can be checked before any work: every input exists and is readable
 * (a regular file or "-", given once), the output folder exists and is writable,
 * and no shard of the prefix exists unless o->force. Errors name the path; when
 * shards exist, *existing is their count (else 0: the caller says how to force). */
dt_status_t dt_tokenize_check(const dt_tokenize_opts *o, int *existing);

/* Runs the pipeline (dt_tokenize_check first: sum->existing as its *existing).
 * On success *sum holds the totals;
 * on failure nothing is left under the prefix by this run. A jsonl line that is
 * not JSON or lacks the field is DT_STATUS_FORMAT naming file:line; input
 * without a single token of text is DT_STATUS_INVALID. */
dt_status_t dt_tokenize_run(const dt_tokenize_opts *o, dt_tokenize_progress *sum);

/* One jsonl document (the parsed line) of a --chat run: its ids appended to ids and
 * a mask byte per id to mask (tokenize_chat.c). Errors say what is wrong with the
 * line (the caller adds file:line). */
struct cJSON;
dt_status_t dt_tokenize_chat_doc(const dt_tokenize_opts *o, dt_tok_enc_t *e, const struct cJSON *j, dt_tok_ids *ids,
                                 dt_tok_mask *mask);

#endif /* DT_RUNTIME_TOKENIZE_TOKENIZE_RUN_H */
