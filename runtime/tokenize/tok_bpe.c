/*
 * tok_bpe.c - the BPE model: vocabulary and merge hash maps, GPT-2's byte ->
 * character table, and the merge loop over one pre-token with the encoder's cache.
 *
 * Merges apply lowest rank first, leftmost first among equal ranks (as tokenizers'
 * priority queue does). Short words scan their pairs directly; long ones (a whole
 * document under byte fallback without a pre-tokenizer) use a binary heap of
 * (rank, position) with stale entries skipped, O(n log n).
 */
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xmalloc, dt_xcalloc, dt_xrealloc */
#include "runtime/tokenize/tok_internal.h"
#include "runtime/tokenize/tok_unicode.h"

#define CACHE_SLOTS 65536u      /* power of two */
#define CACHE_MAX_WORD 256u     /* longer words are not cached */
#define CACHE_ARENA (16u << 20) /* bytes of keys and ids before the cache is cleared */
#define HEAP_FROM 12            /* words with more symbols use the heap */

uint64_t dt_tok_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ (v * 0xbf58476d1ce4e5b9ull)) * 0x94d049bb133111ebull;
        h ^= h >> 29;
        s += 8, n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h = (h ^ (v * 0xbf58476d1ce4e5b9ull)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

static size_t pow2_above(size_t n) {
    size_t s = 16;
    while (s < n * 2)
        s *= 2;
    return s;
}

void dt_tok_strmap_init(dt_tok_strmap *m, size_t n) {
    size_t s = pow2_above(n);
    m->slot = dt_xcalloc(s, sizeof *m->slot);
    m->mask = s - 1;
}

void dt_tok_strmap_put(dt_tok_strmap *m, char *const *tokens, const uint32_t *lens, uint32_t id) {
    size_t i = dt_tok_hash(tokens[id], lens[id]) & m->mask;
    while (m->slot[i]) {
        uint32_t o = m->slot[i] - 1;
        if (lens[o] == lens[id] && !memcmp(tokens[o], tokens[id], lens[id]))
            return;
        i = (i + 1) & m->mask;
    }
    m->slot[i] = id + 1;
}

int64_t dt_tok_strmap_get(const dt_tok_strmap *m, char *const *tokens, const uint32_t *lens, const char *s,
                          size_t n) {
    if (!m->slot)
        return -1;
    size_t i = dt_tok_hash(s, n) & m->mask;
    while (m->slot[i]) {
        uint32_t o = m->slot[i] - 1;
        if (lens[o] == n && !memcmp(tokens[o], s, n))
            return o;
        i = (i + 1) & m->mask;
    }
    return -1;
}

void dt_tok_mergemap_init(dt_tok_mergemap *m, size_t n) {
    size_t s = pow2_above(n);
    m->key = dt_xcalloc(s, sizeof *m->key);
    m->rank = dt_xmalloc(s * sizeof *m->rank);
    m->merged = dt_xmalloc(s * sizeof *m->merged);
    m->mask = s - 1;
}

static inline size_t pair_slot(uint64_t k, size_t mask) {
    k *= 0x9E3779B97F4A7C15ull;
    return (size_t)(k >> 20) & mask;
}

int dt_tok_mergemap_put(dt_tok_mergemap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t merged) {
    uint64_t k = ((uint64_t)a << 32 | b) + 1;
    size_t i = pair_slot(k, m->mask);
    while (m->key[i]) {
        if (m->key[i] == k)
            return 0;
        i = (i + 1) & m->mask;
    }
    m->key[i] = k, m->rank[i] = rank, m->merged[i] = merged;
    return 1;
}

/* The rank of merging (a, b) and the merged id in *merged; UINT32_MAX when none. */
static inline uint32_t pair_rank(const dt_tok_mergemap *m, uint32_t a, uint32_t b, uint32_t *merged) {
    uint64_t k = ((uint64_t)a << 32 | b) + 1;
    size_t i = pair_slot(k, m->mask);
    while (m->key[i]) {
        if (m->key[i] == k) {
            *merged = m->merged[i];
            return m->rank[i];
        }
        i = (i + 1) & m->mask;
    }
    return UINT32_MAX;
}

/* ---- GPT-2's bytes_to_unicode ---- */

char dt_tok_byte_chars[256][3];
uint8_t dt_tok_byte_char_len[256];
static int16_t char_byte[324]; /* code point -> byte; every mapped code point is < 324 */
static int bytes_ready;

void dt_tok_bytes_init(void) {
    if (__atomic_load_n(&bytes_ready, __ATOMIC_ACQUIRE))
        return;
    char(*chars)[3] = dt_tok_byte_chars;
    uint8_t *lens = dt_tok_byte_char_len;
    for (int i = 0; i < 324; i++)
        char_byte[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t cp = printable ? (uint32_t)b : 256u + (uint32_t)extra++;
        char buf[4];
        lens[b] = (uint8_t)dt_uni_put(cp, buf);
        memcpy(chars[b], buf, lens[b]);
        char_byte[cp] = (int16_t)b;
    }
    __atomic_store_n(&bytes_ready, 1, __ATOMIC_RELEASE);
}

int dt_tok_char_byte(uint32_t cp) { return cp < 324 ? char_byte[cp] : -1; }

/* ---- the merge loop ---- */

static void grow_syms(dt_tok_enc_t *e, size_t n) {
    if (n <= e->sym_cap)
        return;
    e->sym_cap = n * 2;
    e->sym = dt_xrealloc(e->sym, e->sym_cap * sizeof *e->sym);
    e->prev = dt_xrealloc(e->prev, e->sym_cap * sizeof *e->prev);
    e->next = dt_xrealloc(e->next, e->sym_cap * sizeof *e->next);
}

static void push_unk(dt_tok_enc_t *e, size_t *n, int *last_unk) {
    const dt_tok_t *t = e->t;
    if (t->unk_id < 0)
        return;
    if (t->fuse_unk && *last_unk)
        return;
    e->sym[(*n)++] = (uint32_t)t->unk_id;
    *last_unk = 1;
}

/* 1 when the vocabulary has the <0xNN> token of each of the n bytes at s. */
static int byte_tokens_of(const dt_tok_t *t, const char *s, size_t n) {
    for (size_t j = 0; j < n; j++)
        if (t->byte_id[(unsigned char)s[j]] < 0) return 0;
    return 1;
}

/* Initial symbols of a word: one per byte (byte-level) or per character. */
static size_t init_syms(dt_tok_enc_t *e, const char *w, size_t n) {
    const dt_tok_t *t = e->t;
    grow_syms(e, n * 4 + 1);
    size_t k = 0;
    int last_unk = 0;
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++) {
            unsigned char b = (unsigned char)w[i];
            if (t->bytelevel_id[b] >= 0) {
                e->sym[k++] = (uint32_t)t->bytelevel_id[b], last_unk = 0;
            } else if (t->byte_fallback && byte_tokens_of(t, dt_tok_byte_chars[b], dt_tok_byte_char_len[b])) {
                for (int j = 0; j < dt_tok_byte_char_len[b]; j++) /* the character's own bytes */
                    e->sym[k++] = (uint32_t)t->byte_id[(unsigned char)dt_tok_byte_chars[b][j]];
                last_unk = 0;
            } else { /* as tokenizers: <0xNN> tokens only when the vocabulary has them all */
                push_unk(e, &k, &last_unk);
            }
        }
        return k;
    }
    for (size_t i = 0; i < n;) {
        unsigned char c0 = (unsigned char)w[i];
        if (c0 < 0x80 && t->ascii_id[c0] >= 0) { /* the common case, without hashing */
            e->sym[k++] = (uint32_t)t->ascii_id[c0], last_unk = 0;
            i++;
            continue;
        }
        int32_t cp;
        size_t l = (size_t)dt_uni_next((const unsigned char *)w + i, n - i, &cp);
        int64_t id = cp < 0 ? -1 : dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len, w + i, l);
        if (id >= 0) {
            e->sym[k++] = (uint32_t)id, last_unk = 0;
        } else if (t->byte_fallback && byte_tokens_of(t, w + i, l)) {
            for (size_t j = 0; j < l; j++)
                e->sym[k++] = (uint32_t)t->byte_id[(unsigned char)w[i + j]];
            last_unk = 0;
        } else {
            push_unk(e, &k, &last_unk);
        }
        i += l;
    }
    return k;
}

static void merge_small(const dt_tok_t *t, uint32_t *s, size_t *np) {
    size_t n = *np;
    while (n > 1) {
        uint32_t best = UINT32_MAX, best_m = 0;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            uint32_t m, r = pair_rank(&t->merges, s[i], s[i + 1], &m);
            if (r < best)
                best = r, best_m = m, at = i;
        }
        if (best == UINT32_MAX)
            break;
        s[at] = best_m;
        memmove(s + at + 1, s + at + 2, (n - at - 2) * sizeof *s);
        n--;
    }
    *np = n;
}

static void heap_push(dt_tok_enc_t *e, size_t *hn, uint64_t v) {
    if (*hn == e->heap_cap) {
        e->heap_cap = e->heap_cap ? e->heap_cap * 2 : 1024;
        e->heap = dt_xrealloc(e->heap, e->heap_cap * sizeof *e->heap);
    }
    size_t i = (*hn)++;
    while (i > 0 && e->heap[(i - 1) / 2] > v) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = v;
}

static uint64_t heap_pop(dt_tok_enc_t *e, size_t *hn) {
    uint64_t top = e->heap[0], v = e->heap[--*hn];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && e->heap[c + 1] < e->heap[c])
            c++;
        if (e->heap[c] >= v)
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n)
        e->heap[i] = v;
    return top;
}

static void merge_heap(dt_tok_enc_t *e, size_t *np) {
    const dt_tok_t *t = e->t;
    size_t n = *np, hn = 0;
    uint32_t *s = e->sym;
    int32_t *prev = e->prev, *next = e->next;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        if ((i & 0xffff) == 0xffff && dt_tok_enc_stop(e))
            return;
        uint32_t m, r = pair_rank(&t->merges, s[i], s[i + 1], &m);
        if (r != UINT32_MAX)
            heap_push(e, &hn, (uint64_t)r << 32 | i);
    }
    for (uint32_t polled = 0; hn; polled++) {
        if ((polled & 0xffff) == 0xffff && dt_tok_enc_stop(e))
            break;
        uint64_t top = heap_pop(e, &hn);
        uint32_t rank = (uint32_t)(top >> 32), pos = (uint32_t)top, m = 0;
        int32_t nx = next[pos];
        if (s[pos] == UINT32_MAX || nx < 0 || pair_rank(&t->merges, s[pos], s[nx], &m) != rank)
            continue; /* stale: a neighbour merged since */
        s[pos] = m;
        s[nx] = UINT32_MAX;
        next[pos] = next[nx];
        if (next[nx] >= 0)
            prev[next[nx]] = (int32_t)pos;
        uint32_t m2, r;
        if (prev[pos] >= 0 && (r = pair_rank(&t->merges, s[prev[pos]], s[pos], &m2)) != UINT32_MAX)
            heap_push(e, &hn, (uint64_t)r << 32 | (uint32_t)prev[pos]);
        if (next[pos] >= 0 && (r = pair_rank(&t->merges, s[pos], s[next[pos]], &m2)) != UINT32_MAX)
            heap_push(e, &hn, (uint64_t)r << 32 | pos);
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0 && (size_t)i < n; i = next[i])
        s[k++] = s[i];
    *np = k;
}

/* ---- the cache ---- */

static void cache_clear(dt_tok_enc_t *e) {
    memset(e->c_hash, 0, (e->c_mask + 1) * sizeof *e->c_hash);
    e->c_keys_len = 0;
    e->c_count = 0;
}

static int cache_get(dt_tok_enc_t *e, uint64_t h, const char *w, size_t n, dt_tok_ids *out) {
    if (!e->c_hash)
        return 0;
    size_t i = h & e->c_mask;
    while (e->c_hash[i]) {
        if (e->c_hash[i] == h && e->c_klen[i] == n && !memcmp(e->c_keys + e->c_off[i], w, n)) {
            const char *p = e->c_keys + e->c_off[i] + ((n + 3) & ~(size_t)3);
            for (uint32_t j = 0; j < e->c_nid[i]; j++) {
                uint32_t id;
                memcpy(&id, p + 4 * j, 4);
                dt_tok_ids_push(out, id);
            }
            return 1;
        }
        i = (i + 1) & e->c_mask;
    }
    return 0;
}

static void cache_put(dt_tok_enc_t *e, uint64_t h, const char *w, size_t n, const uint32_t *ids, size_t nid) {
    size_t kb = (n + 3) & ~(size_t)3, need = kb + 4 * nid;
    if (!e->c_hash) {
        e->c_mask = CACHE_SLOTS - 1;
        e->c_hash = dt_xcalloc(CACHE_SLOTS, sizeof *e->c_hash);
        e->c_off = dt_xmalloc(CACHE_SLOTS * sizeof *e->c_off);
        e->c_klen = dt_xmalloc(CACHE_SLOTS * sizeof *e->c_klen);
        e->c_nid = dt_xmalloc(CACHE_SLOTS * sizeof *e->c_nid);
        e->c_keys_cap = CACHE_ARENA;
        e->c_keys = dt_xmalloc(e->c_keys_cap);
    }
    if (e->c_count * 2 >= CACHE_SLOTS || e->c_keys_len + need > e->c_keys_cap)
        cache_clear(e);
    size_t i = h & e->c_mask;
    while (e->c_hash[i])
        i = (i + 1) & e->c_mask;
    e->c_hash[i] = h;
    e->c_off[i] = (uint32_t)e->c_keys_len;
    e->c_klen[i] = (uint32_t)n;
    e->c_nid[i] = (uint32_t)nid;
    memcpy(e->c_keys + e->c_keys_len, w, n);
    memcpy(e->c_keys + e->c_keys_len + kb, ids, 4 * nid);
    e->c_keys_len += need;
    e->c_count++;
}

void dt_tok_bpe_word(dt_tok_enc_t *e, const char *w, size_t n, dt_tok_ids *out) {
    const dt_tok_t *t = e->t;
    if (n == 0)
        return;
    uint64_t h = 0;
    int cacheable = n < CACHE_MAX_WORD;
    if (cacheable) {
        h = dt_tok_hash(w, n) | 1;
        if (cache_get(e, h, w, n, out))
            return;
    }
    size_t k = 0;
    int64_t whole = -1;
    if (t->ignore_merges) {
        if (t->byte_level) { /* the word's byte-level spelling */
            if (e->buf2_cap < n * 2 + 1) {
                e->buf2_cap = n * 2 + 1;
                e->buf2 = dt_xrealloc(e->buf2, e->buf2_cap);
            }
            size_t m = 0;
            for (size_t i = 0; i < n; i++) {
                unsigned char b = (unsigned char)w[i];
                memcpy(e->buf2 + m, dt_tok_byte_chars[b], dt_tok_byte_char_len[b]);
                m += dt_tok_byte_char_len[b];
            }
            whole = dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len, e->buf2, m);
        } else {
            whole = dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len, w, n);
        }
    }
    if (whole >= 0) {
        grow_syms(e, 1);
        e->sym[0] = (uint32_t)whole;
        k = 1;
    } else {
        k = init_syms(e, w, n);
        if (k < HEAP_FROM)
            merge_small(t, e->sym, &k);
        else
            merge_heap(e, &k);
    }
    for (size_t i = 0; i < k; i++)
        dt_tok_ids_push(out, e->sym[i]);
    if (cacheable && !e->canceled)
        cache_put(e, h, w, n, e->sym, k);
}
