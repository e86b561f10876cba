/*
 * tok_internal.h - the loaded tokenizer (struct dt_tok) and the pieces of the
 * encoder that tok_load.c, tok_pretok.c, tok_bpe.c and tok.c share. Not a contract.
 */
#ifndef DT_RUNTIME_TOKENIZE_TOK_INTERNAL_H
#define DT_RUNTIME_TOKENIZE_TOK_INTERNAL_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/tokenize/tok.h"

/* How far past the number of entries (vocab + added tokens) an id may lie: gaps
 * are allowed, up to this many ids in all (a test tokenizer puts an id at 70000 to
 * exercise uint32 shards); the id table stays a few MB past the entries. */
#define DT_TOK_ID_SLACK (1u << 17)

/* String -> id, open addressing over power-of-two slots. */
typedef struct dt_tok_strmap {
    uint32_t *slot; /* id + 1, 0 = empty */
    size_t mask;
} dt_tok_strmap;

/* (left id, right id) -> (rank, merged id). */
typedef struct dt_tok_mergemap {
    uint64_t *key; /* (left << 32 | right) + 1, 0 = empty */
    uint32_t *rank, *merged;
    size_t mask;
} dt_tok_mergemap;

typedef enum { DT_NORM_NFC, DT_NORM_PREPEND, DT_NORM_REPLACE } dt_tok_norm_kind;
typedef struct dt_tok_norm {
    dt_tok_norm_kind kind;
    char *a, *b; /* PREPEND: a; REPLACE: a -> b */
} dt_tok_norm;

/* The pre-tokenizer splits as one of these regexes, all written by hand. */
typedef enum { DT_SPLIT_NONE, DT_SPLIT_GPT2, DT_SPLIT_LLAMA3, DT_SPLIT_QWEN2 } dt_tok_split_kind;

typedef enum { DT_DEC_BYTELEVEL, DT_DEC_BYTEFALLBACK, DT_DEC_METASPACE, DT_DEC_REPLACE, DT_DEC_STRIP,
               DT_DEC_FUSE } dt_tok_dec_kind;
typedef struct dt_tok_dec {
    dt_tok_dec_kind kind;
    char *a, *b; /* REPLACE: a -> b; STRIP: a the content; METASPACE: a the replacement */
    int start, stop; /* STRIP; METASPACE: start = prepend scheme is not "never" */
} dt_tok_dec;

typedef struct dt_tok_added {
    char *content;
    size_t len;
    uint32_t id;
    int special, lstrip, rstrip, single_word, normalized;
} dt_tok_added;

struct dt_tok {
    char *path;
    /* model */
    uint32_t nvocab;    /* one past the largest id */
    uint64_t id_limit;  /* ids are below it: entries + DT_TOK_ID_SLACK (tok_load.c) */
    char **tokens;      /* id -> token string (NULL for gaps) */
    uint32_t *tok_len;
    dt_tok_strmap vocab; /* the model's vocabulary */
    dt_tok_mergemap merges;
    int byte_fallback, ignore_merges, fuse_unk;
    int64_t unk_id;
    int64_t byte_id[256];      /* <0xAB> tokens (byte fallback), -1 when absent */
    int64_t bytelevel_id[256]; /* the token of each byte's GPT-2 character, -1 when absent */
    int64_t ascii_id[128];     /* the token of each ASCII character alone, -1 when absent */
    /* normalizer, pre-tokenizer */
    dt_tok_norm *norms;
    int nnorms;
    int byte_level;                   /* a ByteLevel pre-tokenizer maps bytes to characters */
    int add_prefix_space;             /* ByteLevel's */
    dt_tok_split_kind split;
    int metaspace, meta_split, meta_scheme; /* scheme: 0 never, 1 first, 2 always */
    char *meta_repl;
    /* added tokens, longest first */
    dt_tok_added *added;
    int nadded;
    /* added[added_idx[added_first[c] .. added_first[c + 1])]: the added tokens whose
     * content starts with byte c, longest first (a byte no token starts with costs
     * one lookup: Llama 3 has 256 special tokens, all starting with '<') */
    int added_first[257];
    int *added_idx;
    int added_newline_or_lstrip; /* an added token holds '\n' or strips left: no cut points */
    /* For tokenizers that BPE the whole text (no split): nl_then[c] = some vocab
     * token holds "\n" followed by ASCII c, so a cut between them could change
     * the merges (tok.c, dt_tok_split_point). */
    uint8_t nl_then[128];
    /* Whole-text BPE in chunks (tok_chunk.c): the character pairs some vocab token
     * holds (ASCII and "▁" in pair_small, the rest hashed) and the characters that
     * are tokens alone (known_bmp, below U+10000). */
    int chunk_whole;
    uint8_t *pair_small;
    uint64_t *pair_keys; /* (a << 32 | b) + 1, 0 = empty */
    size_t pair_mask;
    uint8_t *known_bmp;
    /* Cut points between letters (tok_cut.c): hashes of the token prefixes a
     * token over the cut would show, the longest such prefix and token (bytes). */
    uint64_t *cut_keys; /* NULL: no letter cuts for this tokenizer */
    size_t cut_mask, cut_npre, cut_maxpre, cut_maxtok;
    int cut_nfc;
    dt_tok_dec *decs;
    int ndecs;
    int64_t doc_token;
    char describe[160];
};

/* A pre-token -> ids cache entry lives in the encoder (tok_bpe.c). */
struct dt_tok_enc {
    const dt_tok_t *t;
    dt_tok_stats stats;
    volatile sig_atomic_t *cancel; /* dt_tok_enc_set_cancel; may be NULL */
    int canceled;                  /* seen set: the encode being run gives up */
    /* scratch */
    char *buf, *buf2;
    size_t buf_cap, buf2_cap;
    uint32_t *sym;
    int32_t *prev, *next;
    size_t sym_cap;
    uint64_t *heap;
    size_t heap_cap;
    /* cache: open addressing, cleared when full */
    uint64_t *c_hash;
    uint32_t *c_off; /* into c_keys: key bytes, then ids */
    uint32_t *c_klen, *c_nid;
    char *c_keys;
    size_t c_keys_len, c_keys_cap, c_count, c_mask;
};

/* Polled by the long loops (every pre-token, chunk, and every 64K merges of one
 * word): 1 once the encoder's cancel flag was seen set. */
static inline int dt_tok_enc_stop(dt_tok_enc_t *e) {
    if (e->cancel && *e->cancel)
        e->canceled = 1;
    return e->canceled;
}

uint64_t dt_tok_hash(const void *p, size_t n);
void dt_tok_strmap_init(dt_tok_strmap *m, size_t n);
void dt_tok_strmap_put(dt_tok_strmap *m, char *const *tokens, const uint32_t *lens, uint32_t id);
/* -1 when absent. */
int64_t dt_tok_strmap_get(const dt_tok_strmap *m, char *const *tokens, const uint32_t *lens, const char *s,
                          size_t n);
void dt_tok_mergemap_init(dt_tok_mergemap *m, size_t n);
/* Returns 0 when the pair was already present (the first rank wins). */
int dt_tok_mergemap_put(dt_tok_mergemap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t merged);

/* GPT-2's byte -> character table: the UTF-8 of each byte's character. */
extern char dt_tok_byte_chars[256][3];
extern uint8_t dt_tok_byte_char_len[256];
void dt_tok_bytes_init(void);
/* The byte of a GPT-2 character, or -1. */
int dt_tok_char_byte(uint32_t cp);

/* Length of the pre-token starting at s[i] (i < n) under the split kind. */
size_t dt_tok_pretok_next(dt_tok_split_kind k, const unsigned char *s, size_t n, size_t i);

/* BPE of one pre-token (already byte-mapped or normalized: the model's alphabet),
 * through the encoder's cache; bytes is the raw piece when byte_level. */
void dt_tok_bpe_word(dt_tok_enc_t *e, const char *w, size_t n, dt_tok_ids *out);

/* tok_chunk.c: builds the pair tables after load (a no-op for tokenizers that split
 * or ignore merges), frees them, and BPEs a whole segment chunk by chunk. */
void dt_tok_chunk_init(dt_tok_t *t);
void dt_tok_chunk_free(dt_tok_t *t);
void dt_tok_bpe_whole(dt_tok_enc_t *e, const char *w, size_t n, dt_tok_ids *out);

/* tok_cut.c: builds the token-prefix set after load (none where letter cuts never
 * apply), frees it, and finds the first cut between two letters in [from, to)
 * (len when none; text[0] begins a piece or a document). */
void dt_tok_cut_init(dt_tok_t *t);
void dt_tok_cut_free(dt_tok_t *t);
size_t dt_tok_letter_cut(const dt_tok_t *t, const char *text, size_t len, size_t from, size_t to);

#endif /* DT_RUNTIME_TOKENIZE_TOK_INTERNAL_H */
