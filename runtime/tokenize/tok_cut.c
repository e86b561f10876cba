/*
 * tok_cut.c - cut points between two letters (tok_internal.h), for text with no
 * "\n" cut point for a long stretch: a script written without spaces (Chinese,
 * Japanese, Thai), or a stream without newlines (200 MB of Cyrillic on a pipe).
 *
 * A cut between letters L1 | L2 in a run of letters is exact when:
 * - the pre-tokenizer splits the run there in neither text: every supported
 *   pattern takes a letter run whole (` ?\p{L}+`, `[^\r\n\p{L}\p{N}]?\p{L}+`), and a
 *   piece that begins with a letter begins such a match; no apostrophe in the
 *   three bytes before (`'s|'t|'re|'ve|'m|'ll|'d` would end differently);
 * - no merge joins symbols across it: every merge makes a vocabulary token, and a
 *   token joining them would occur in the text over the cut. So no token (nor an
 *   added token) may start at c - i and hold text[c - i .. c + 1) as a prefix, for
 *   every i up to the longest token: one lookup each in a set of the hashes of all
 *   token prefixes (a collision only forgoes a cut). BPE then merges each side as
 *   it would within the whole, in the same rank order;
 * - the normalizer leaves the window alone: NFC-inert characters only
 *   (dt_uni_nfc_inert), no Replace pattern holding a letter;
 * - unknown characters cannot fuse across it (fuse_unk: both sides are tokens);
 * - ignore_merges looks a word up whole: both words are longer than any token.
 * The prefix set holds, in text bytes (byte-level tokens mapped back), the prefixes
 * whose bytes hold no ASCII character other than letters: a window reaching such
 * a character (a space, a digit, punctuation) is not a cut.
 */
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "runtime/tokenize/tok_internal.h"
#include "runtime/tokenize/tok_unicode.h"

static int ascii_other(unsigned char b) { return b < 0x80 && !((b | 0x20) >= 'a' && (b | 0x20) <= 'z'); }

static uint64_t key_of(const void *p, size_t n) {
    uint64_t h = dt_tok_hash(p, n);
    return h ? h : 1;
}

static void pre_put(dt_tok_t *t, uint64_t k) {
    for (size_t i = k & t->cut_mask;; i = (i + 1) & t->cut_mask) {
        if (t->cut_keys[i] == k) return;
        if (!t->cut_keys[i]) {
            t->cut_keys[i] = k;
            return;
        }
    }
}

static int pre_has(const dt_tok_t *t, const void *p, size_t n) {
    uint64_t k = key_of(p, n);
    for (size_t i = k & t->cut_mask;; i = (i + 1) & t->cut_mask) {
        if (t->cut_keys[i] == k) return 1;
        if (!t->cut_keys[i]) return 0;
    }
}

/* The prefixes of s[0..n) worth a lookup (see the top). */
static void put_prefixes(dt_tok_t *t, const unsigned char *s, size_t n) {
    if (n > t->cut_maxtok) t->cut_maxtok = n;
    for (size_t k = 1; k <= n && !ascii_other(s[k - 1]); k++) {
        if (k < 2) continue;
        if (t->cut_keys) pre_put(t, key_of(s, k));
        else t->cut_npre++;
        if (k > t->cut_maxpre) t->cut_maxpre = k;
    }
}

/* Every token in text bytes: byte-level tokens mapped back to bytes (and as
 * written, in case some are not byte-level characters), added tokens as written. */
static void put_all(dt_tok_t *t) {
    unsigned char *buf = NULL;
    size_t cap = 0;
    for (uint32_t id = 0; id < t->nvocab; id++) {
        const unsigned char *s = (const unsigned char *)t->tokens[id];
        size_t n = s ? t->tok_len[id] : 0;
        if (!n) continue;
        put_prefixes(t, s, n);
        if (!t->byte_level) continue;
        if (cap < n) buf = dt_xrealloc(buf, cap = n);
        size_t m = 0;
        int ok = 1;
        for (size_t i = 0; i < n && ok;) {
            int32_t cp;
            i += (size_t)dt_uni_next(s + i, n - i, &cp);
            int b = cp < 0 ? -1 : dt_tok_char_byte((uint32_t)cp);
            if (b < 0) ok = 0;
            else buf[m++] = (unsigned char)b;
        }
        if (ok) put_prefixes(t, buf, m);
    }
    free(buf);
    for (int k = 0; k < t->nadded; k++) put_prefixes(t, (const unsigned char *)t->added[k].content, t->added[k].len);
}

void dt_tok_cut_init(dt_tok_t *t) {
    if (t->added_newline_or_lstrip || (t->split == DT_SPLIT_NONE && (t->byte_level || t->ignore_merges)) ||
        (t->split != DT_SPLIT_NONE && t->metaspace) || (t->metaspace && t->meta_scheme == 2))
        return; /* (Metaspace "always" prepends to every piece) */
    for (int k = 0; k < t->nnorms; k++) {
        const dt_tok_norm *nm = &t->norms[k];
        if (nm->kind != DT_NORM_REPLACE) continue;
        if (t->split == DT_SPLIT_NONE && strcmp(nm->a, " ") != 0) return;
        for (const unsigned char *p = (const unsigned char *)nm->a; *p; p++)
            if (!ascii_other(*p)) return; /* a pattern with a letter could span the cut */
    }
    put_all(t); /* counts */
    size_t cap = 64;
    while (cap < 2 * t->cut_npre) cap <<= 1;
    t->cut_keys = dt_xcalloc(cap, sizeof *t->cut_keys);
    t->cut_mask = cap - 1;
    t->cut_maxpre = 0;
    put_all(t);
    t->cut_nfc = 0;
    for (int k = 0; k < t->nnorms; k++) t->cut_nfc |= t->norms[k].kind == DT_NORM_NFC;
}

void dt_tok_cut_free(dt_tok_t *t) { free(t->cut_keys); }

/* Is the character at s[i] (a character boundary) a vocabulary token alone? */
static int char_known(const dt_tok_t *t, const unsigned char *s, size_t n) {
    return dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len, (const char *)s, n) >= 0;
}

/* Is c (a boundary between the letters L1 = s[a..c) and L2 = s[c..c + l2)) a cut? */
static int letter_cut_ok(const dt_tok_t *t, const unsigned char *s, size_t len, size_t a, size_t c, size_t l2) {
    /* A token over the cut starts at most maxtok - 1 bytes left of c; its bytes up
     * to c hold no ASCII non-letter (else neither does its prefix in the set). */
    size_t w = t->cut_maxtok > 1 ? t->cut_maxtok - 1 : 1, look = t->cut_maxpre > 1 ? t->cut_maxpre - 1 : 1;
    if (w > c) w = c;
    if (look > w) look = w;
    for (size_t i = 1; i <= 3 && i <= c; i++)
        if (s[c - i] == '\'') return 0;
    for (size_t i = 1; i <= w; i++)
        if (ascii_other(s[c - i])) return 0;
    if (t->ignore_merges) { /* both words longer than any token */
        size_t m = t->cut_maxtok + 1;
        if (c < m || len - c < m) return 0;
        for (size_t i = c - m; i < c + m; i++)
            if (ascii_other(s[i])) return 0;
    }
    if (t->cut_nfc) { /* every character of the window and the one after L2 */
        size_t i = c - w;
        while (i > 0 && (s[i] & 0xC0) == 0x80) i--;
        size_t end = c + l2 < len ? c + l2 + 1 : len;
        while (i < end) {
            int32_t cp;
            i += (size_t)dt_uni_next(s + i, len - i, &cp);
            if (cp < 0 || !dt_uni_nfc_inert(cp)) return 0;
        }
    }
    if (t->fuse_unk && t->unk_id >= 0 && (!char_known(t, s + a, c - a) || !char_known(t, s + c, l2))) return 0;
    for (size_t i = 1; i <= look; i++) /* longer prefixes are in no token */
        if (pre_has(t, s + c - i, i + 1)) return 0;
    return 1;
}

size_t dt_tok_letter_cut(const dt_tok_t *t, const char *text, size_t len, size_t from, size_t to) {
    if (!t->cut_keys) return len;
    const unsigned char *s = (const unsigned char *)text;
    size_t i = from;
    while (i < to && (s[i] & 0xC0) == 0x80) i++;
    if (i == 0 || i >= to) return len;
    size_t a = i - 1; /* start of the character before i */
    while (a > 0 && (s[a] & 0xC0) == 0x80) a--;
    int32_t cp;
    int prev_letter = (size_t)dt_uni_next(s + a, len - a, &cp) == i - a && (dt_uni_class(cp) & DT_UNI_LETTER);
    while (i < to) {
        size_t l = (size_t)dt_uni_next(s + i, len - i, &cp);
        int letter = (dt_uni_class(cp) & DT_UNI_LETTER) != 0;
        if (prev_letter && letter && letter_cut_ok(t, s, len, a, i, l)) return i;
        prev_letter = letter;
        a = i;
        i += l;
    }
    return len;
}
