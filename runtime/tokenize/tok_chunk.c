/*
 * tok_chunk.c - whole-text BPE in chunks (tok_internal.h).
 *
 * Tokenizers with no pre-tokenizer split (Mistral-style Prepend/Replace
 * normalizers, Metaspace without split) BPE a whole segment as one word: tokenizers
 * does that with a priority queue over every symbol of the text, and no cache can
 * help. But two adjacent characters a, b can never end up in one token when no
 * vocabulary token holds "ab" and both are tokens themselves (their symbols are
 * characters, and any merge across them would make a token holding "ab"); BPE then
 * merges each side exactly as it would within the whole, in the same rank order.
 * So the text is cut at every such pair into chunks (in practice before each "▁",
 * i.e. words), and each chunk goes through the cached BPE of tok_bpe.c: the ids of
 * the whole text, at the speed of a word-split tokenizer.
 *
 * Not for ignore_merges (it looks a word up whole before merging) nor with fuse_unk
 * across unknown characters (both sides must be tokens anyway).
 */
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "runtime/tokenize/tok_internal.h"
#include "runtime/tokenize/tok_unicode.h"

#define SMALL 129 /* ASCII, and the Metaspace/Prepend "▁" at 128 */
#define WIDE 0x2581

static int small_of(int32_t cp) { return cp < 128 ? cp : cp == WIDE ? 128 : -1; }

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1; }

static void pair_put(dt_tok_t *t, int32_t a, int32_t b) {
    int sa = small_of(a), sb = small_of(b);
    if (sa >= 0 && sb >= 0) {
        t->pair_small[sa * SMALL + sb] = 1;
        return;
    }
    uint64_t k = pair_key(a, b);
    for (size_t i = dt_tok_hash(&k, sizeof k) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        if (t->pair_keys[i] == k) return;
        if (!t->pair_keys[i]) {
            t->pair_keys[i] = k;
            return;
        }
    }
}

static int joined(const dt_tok_t *t, int32_t a, int32_t b) {
    int sa = small_of(a), sb = small_of(b);
    if (sa >= 0 && sb >= 0) return t->pair_small[sa * SMALL + sb];
    uint64_t k = pair_key(a, b);
    for (size_t i = dt_tok_hash(&k, sizeof k) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        if (t->pair_keys[i] == k) return 1;
        if (!t->pair_keys[i]) return 0;
    }
}

/* Is the character alone a vocabulary token? */
static int known(const dt_tok_t *t, int32_t cp) {
    if (cp < 0) return 0;
    if (cp < 0x10000) return (t->known_bmp[cp >> 3] >> (cp & 7)) & 1;
    char u[4];
    int l = dt_uni_put((uint32_t)cp, u);
    return dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len, u, (size_t)l) >= 0;
}

void dt_tok_chunk_init(dt_tok_t *t) {
    if (t->byte_level || t->split != DT_SPLIT_NONE || t->ignore_merges || (t->metaspace && t->meta_split))
        return;
    size_t pairs = 0;
    for (uint32_t id = 0; id < t->nvocab; id++) pairs += t->tokens[id] ? t->tok_len[id] : 0;
    size_t cap = 64;
    while (cap < 2 * pairs) cap <<= 1;
    t->pair_keys = dt_xcalloc(cap, sizeof *t->pair_keys);
    t->pair_mask = cap - 1;
    t->pair_small = dt_xcalloc(SMALL * SMALL, 1);
    t->known_bmp = dt_xcalloc(0x10000 / 8, 1);
    for (uint32_t id = 0; id < t->nvocab; id++) {
        const unsigned char *s = (const unsigned char *)t->tokens[id];
        size_t n = s ? t->tok_len[id] : 0;
        int32_t prev = -1, cp;
        size_t chars = 0;
        for (size_t i = 0; i < n; chars++) {
            i += (size_t)dt_uni_next(s + i, n - i, &cp);
            if (prev >= 0 && cp >= 0) pair_put(t, prev, cp);
            prev = cp;
        }
        if (chars == 1 && cp >= 0 && cp < 0x10000 && dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len,
                                                                      (const char *)s, n) == (int64_t)id)
            t->known_bmp[cp >> 3] |= (uint8_t)(1u << (cp & 7));
    }
    t->chunk_whole = 1;
}

void dt_tok_chunk_free(dt_tok_t *t) {
    free(t->pair_keys);
    free(t->pair_small);
    free(t->known_bmp);
}

void dt_tok_bpe_whole(dt_tok_enc_t *e, const char *w, size_t n, dt_tok_ids *out) {
    const dt_tok_t *t = e->t;
    if (!t->chunk_whole) {
        dt_tok_bpe_word(e, w, n, out);
        return;
    }
    const unsigned char *s = (const unsigned char *)w;
    size_t start = 0;
    int32_t prev = -1;
    int prev_known = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t l = s[i] < 0x80 ? (cp = s[i], 1) : (size_t)dt_uni_next(s + i, n - i, &cp);
        int k = cp >= 0 && cp < 128 ? t->ascii_id[cp] >= 0 : known(t, cp);
        if (i > start && prev_known && k && !joined(t, prev, cp)) {
            if (dt_tok_enc_stop(e))
                return;
            dt_tok_bpe_word(e, w + start, i - start, out);
            start = i;
        }
        prev = cp, prev_known = k;
        i += l;
    }
    if (start < n) dt_tok_bpe_word(e, w + start, n - start, out);
}
