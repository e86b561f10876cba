/*
 * tok.h - Hugging Face tokenizer.json, encoded and decoded in C.
 *
 * Supported: model BPE (vocab + merges by rank, byte_fallback, unk_token,
 * ignore_merges), normalizers NFC / Prepend / Replace / Sequence / null,
 * pre-tokenizers ByteLevel (GPT-2's split when use_regex, add_prefix_space),
 * Split on GPT-2's, Llama 3's and Qwen2's patterns (implemented by hand, exact),
 * Metaspace, Sequence / null; added and special tokens (matched on the raw text
 * first, longest first, lstrip/rstrip); decoders ByteLevel, ByteFallback,
 * Metaspace, Replace, Strip, Fuse, Sequence. Anything else is a DT_STATUS_UNSUPPORTED
 * error naming the type and where it sits in the file.
 *
 * Threads: a dt_tok_t is read-only after load and shared; each thread encodes
 * through its own dt_tok_enc_t (scratch and a cache of pre-token -> ids).
 */
#ifndef DT_RUNTIME_TOKENIZE_TOK_H
#define DT_RUNTIME_TOKENIZE_TOK_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct dt_tok dt_tok_t;
typedef struct dt_tok_enc dt_tok_enc_t;

/* Growable id list; the caller owns ids (free()). */
typedef struct dt_tok_ids {
    uint32_t *ids;
    size_t n, cap;
} dt_tok_ids;

/* Invalid UTF-8 seen by one encoder (offsets are into the text passed to encode;
 * callers that feed pieces add their own base). */
typedef struct dt_tok_stats {
    uint64_t invalid_utf8;        /* bytes that were not part of valid UTF-8 */
    int64_t first_invalid_offset; /* -1 when none */
} dt_tok_stats;

/* path: a tokenizer.json, or a folder holding one (then tokenizer_config.json
 * beside it, when present, names the BOS token). Errors name the file, the JSON key
 * path and, for a syntax error, the line. */
dt_status_t dt_tok_load(const char *path, dt_tok_t **out);
void dt_tok_free(dt_tok_t *t);

/* One past the largest id of the model's vocabulary and the added tokens. */
uint32_t dt_tok_vocab_size(const dt_tok_t *t);
/* The id of a token's exact string (vocab or added), or -1. */
int64_t dt_tok_token_id(const dt_tok_t *t, const char *token);
/* The token string of an id (vocab or added; NULL when no token has it). */
const char *dt_tok_token_str(const dt_tok_t *t, uint32_t id);
/* The default document separator: "<|endoftext|>" when the vocabulary has it, else
 * the BOS token (tokenizer_config.json's bos_token, else the first special token of
 * the post-processor's single template, else "<|begin_of_text|>" or "<s>"); -1 if none. */
int64_t dt_tok_doc_token(const dt_tok_t *t);
/* "BPE (byte-level, GPT-2 split)" and the like: for summaries. */
const char *dt_tok_describe(const dt_tok_t *t);

dt_tok_enc_t *dt_tok_enc_new(const dt_tok_t *t);
void dt_tok_enc_free(dt_tok_enc_t *e);
/* Appends the ids of text[0..len) to out, exactly as tokenizers'
 * `Tokenizer.encode(text, add_special_tokens=False)` would for that text.
 * doc_start: the text begins a document (add_prefix_space, Prepend and Metaspace's
 * "first" scheme apply only there; a piece cut at dt_tok_split_point passes 0).
 * Invalid UTF-8 is encoded byte by byte as the real tokenizer does (byte-level
 * mapping or byte fallback) and counted in the encoder's stats. */
dt_status_t dt_tok_encode(dt_tok_enc_t *e, const char *text, size_t len, int doc_start,
                          dt_tok_ids *out);
dt_tok_stats dt_tok_enc_stats(const dt_tok_enc_t *e);
/* A flag (set by a signal handler) the encoder polls in its long loops: once seen
 * set, dt_tok_encode returns DT_STATUS_CANCELED promptly, its ids incomplete.
 * NULL: never. */
void dt_tok_enc_set_cancel(dt_tok_enc_t *e, volatile sig_atomic_t *flag);

/* A cut position p in [from, len] such that encoding text[0..p) (with doc_start as
 * given) and then text[p..len) (doc_start 0) gives exactly the ids of encoding
 * text[0..len) at once; p = len when no such point lies at or after `from`
 * (e.g. a tokenizer without a pre-tokenizer split). Cheap: scans forward only. */
size_t dt_tok_split_point(const dt_tok_t *t, const char *text, size_t len, size_t from);

/* Decodes ids to text as tokenizers' `decode(ids, skip_special_tokens=False)`;
 * appends to *buf (malloc'ed, grown; *len is its length, kept NUL-terminated).
 * An id not in the vocabulary is DT_STATUS_FORMAT naming it. */
dt_status_t dt_tok_decode(const dt_tok_t *t, const uint32_t *ids, size_t n, char **buf,
                          size_t *len, size_t *cap);

/* Appends one id (grows the list; aborts on out of memory as dt_x* do). */
void dt_tok_ids_push(dt_tok_ids *l, uint32_t id);

#endif /* DT_RUNTIME_TOKENIZE_TOK_H */
