/*
 * tok.c - encoding, decoding and cut points over a loaded tokenizer (tok_load.c).
 *
 * Encoding follows tokenizers' pipeline: added tokens split the raw text first
 * (leftmost, longest; lstrip/rstrip absorb whitespace); each segment between them
 * is normalized, pre-tokenized (ByteLevel's prefix space, Metaspace, a regex
 * split) and each pre-token goes through BPE (tok_bpe.c). Segment-start effects
 * (Prepend, add_prefix_space) apply to every segment, as tokenizers applies them
 * to each piece it normalizes, except the first when the text does not begin a
 * document. Added tokens are matched on the raw text even when marked
 * "normalized" (exact when normalizing leaves their text unchanged).
 */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xmalloc, dt_xrealloc */
#include "runtime/tokenize/tok_internal.h"
#include "runtime/tokenize/tok_unicode.h"

void dt_tok_ids_push(dt_tok_ids *l, uint32_t id) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 256;
        l->ids = dt_xrealloc(l->ids, l->cap * sizeof *l->ids);
    }
    l->ids[l->n++] = id;
}

uint32_t dt_tok_vocab_size(const dt_tok_t *t) { return t->nvocab; }

int64_t dt_tok_token_id(const dt_tok_t *t, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, token, n))
            return t->added[i].id;
    return dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len, token, n);
}

const char *dt_tok_token_str(const dt_tok_t *t, uint32_t id) { return id < t->nvocab ? t->tokens[id] : NULL; }

int64_t dt_tok_doc_token(const dt_tok_t *t) { return t->doc_token; }

const char *dt_tok_describe(const dt_tok_t *t) { return t->describe; }

dt_tok_enc_t *dt_tok_enc_new(const dt_tok_t *t) {
    dt_tok_enc_t *e = dt_xcalloc(1, sizeof *e);
    e->t = t;
    e->stats.first_invalid_offset = -1;
    return e;
}

void dt_tok_enc_free(dt_tok_enc_t *e) {
    if (!e)
        return;
    free(e->buf), free(e->buf2);
    free(e->sym), free(e->prev), free(e->next), free(e->heap);
    free(e->c_hash), free(e->c_off), free(e->c_klen), free(e->c_nid), free(e->c_keys);
    free(e);
}

dt_tok_stats dt_tok_enc_stats(const dt_tok_enc_t *e) { return e->stats; }

/* ---- growable byte strings ---- */

typedef struct str {
    char *p;
    size_t n, cap;
} str;

static void str_put(str *s, const void *p, size_t n) {
    if (s->n + n + 1 > s->cap) {
        s->cap = (s->n + n + 1) * 2;
        s->p = dt_xrealloc(s->p, s->cap);
    }
    memcpy(s->p + s->n, p, n);
    s->n += n;
    s->p[s->n] = 0;
}

/* Replaces every a in s[0..n) by b into out (cleared first). */
static void replace_all(const char *s, size_t n, const char *a, const char *b, str *out) {
    size_t an = strlen(a), bn = strlen(b), i = 0;
    out->n = 0;
    str_put(out, "", 0);
    while (i < n) {
        const char *hit = an <= n - i ? memmem(s + i, n - i, a, an) : NULL;
        if (!hit) {
            str_put(out, s + i, n - i);
            break;
        }
        str_put(out, s + i, (size_t)(hit - (s + i)));
        str_put(out, b, bn);
        i = (size_t)(hit - s) + an;
    }
}

/* ---- one segment between added tokens ---- */

static void count_invalid(dt_tok_enc_t *e, const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int32_t cp;
        int l = dt_uni_next(s + i, n - i, &cp);
        if (cp < 0) {
            if (e->stats.first_invalid_offset < 0)
                e->stats.first_invalid_offset = (int64_t)i;
            e->stats.invalid_utf8++;
        }
        i += (size_t)l;
    }
}

static void pretok_and_bpe(dt_tok_enc_t *e, const char *s, size_t n, int first, dt_tok_ids *out) {
    const dt_tok_t *t = e->t;
    if (t->split == DT_SPLIT_NONE) {
        dt_tok_bpe_whole(e, s, n, out);
        return;
    }
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n && !dt_tok_enc_stop(e);) {
        size_t l = dt_tok_pretok_next(t->split, u, n, i);
        dt_tok_bpe_word(e, s + i, l, out);
        i += l;
    }
    (void)first;
}

static void metaspace(dt_tok_enc_t *e, const char *s, size_t n, int first, dt_tok_ids *out) {
    const dt_tok_t *t = e->t;
    str a = {0}, b = {0};
    replace_all(s, n, " ", t->meta_repl, &a);
    size_t rn = strlen(t->meta_repl);
    int prepend = t->meta_scheme == 2 || (t->meta_scheme == 1 && first);
    if (prepend && !(a.n >= rn && !memcmp(a.p, t->meta_repl, rn))) {
        str_put(&b, t->meta_repl, rn);
        str_put(&b, a.p, a.n);
    } else {
        str_put(&b, a.p, a.n);
    }
    if (!t->meta_split) {
        dt_tok_bpe_whole(e, b.p, b.n, out);
    } else { /* split before each replacement (merged with the next) */
        size_t start = 0;
        for (size_t i = rn; i + rn <= b.n;) {
            if (!memcmp(b.p + i, t->meta_repl, rn)) {
                if (dt_tok_enc_stop(e))
                    break;
                dt_tok_bpe_word(e, b.p + start, i - start, out);
                start = i;
                i += rn;
            } else {
                i++;
            }
        }
        dt_tok_bpe_word(e, b.p + start, b.n - start, out);
    }
    free(a.p), free(b.p);
}

/* seg_start: Prepend and ByteLevel's prefix space apply; doc_first: the first
 * segment of a document (Metaspace's "first"). */
static void encode_segment(dt_tok_enc_t *e, const char *s, size_t n, int seg_start, int doc_first,
                           dt_tok_ids *out) {
    const dt_tok_t *t = e->t;
    if (n == 0)
        return;
    str cur = {0}, tmp = {0};
    const char *p = s;
    size_t pn = n;
    for (int k = 0; k < t->nnorms; k++) {
        const dt_tok_norm *nm = &t->norms[k];
        tmp.n = 0;
        if (nm->kind == DT_NORM_NFC) {
            dt_uni_nfc(p, pn, &tmp.p, &tmp.n, &tmp.cap);
        } else if (nm->kind == DT_NORM_PREPEND) {
            if (!seg_start || pn == 0)
                continue;
            str_put(&tmp, nm->a, strlen(nm->a));
            str_put(&tmp, p, pn);
        } else {
            replace_all(p, pn, nm->a, nm->b, &tmp);
        }
        str sw = cur;
        cur = tmp, tmp = sw;
        p = cur.p, pn = cur.n;
    }
    if (t->metaspace) {
        metaspace(e, p, pn, doc_first, out);
    } else if (t->add_prefix_space && seg_start && pn > 0 && p[0] != ' ') {
        tmp.n = 0;
        str_put(&tmp, " ", 1);
        str_put(&tmp, p, pn);
        pretok_and_bpe(e, tmp.p, tmp.n, seg_start, out);
    } else {
        pretok_and_bpe(e, p, pn, seg_start, out);
    }
    free(cur.p), free(tmp.p);
}

/* ---- added tokens ---- */

static int is_ws_before(const unsigned char *s, size_t lo, size_t at, size_t *len) {
    /* ASCII whitespace is what strips in practice; multibyte spaces are left. */
    (void)lo;
    *len = 1;
    unsigned char c = s[at - 1];
    return c == ' ' || (c >= 9 && c <= 13);
}

static int word_char_at(const unsigned char *s, size_t n, size_t j) {
    int32_t cp;
    dt_uni_next(s + j, n - j, &cp);
    return cp == '_' || (dt_uni_class(cp) & (DT_UNI_LETTER | DT_UNI_NUMBER));
}

static int word_char_before(const unsigned char *s, size_t j) {
    size_t k = j - 1;
    while (k > 0 && (s[k] & 0xC0) == 0x80 && j - k < 4)
        k--;
    return word_char_at(s, j, k);
}

/* The leftmost, longest added token at or after i: [*a, *b) with strips applied,
 * the token in *tok; 0 when none. */
static int find_added(const dt_tok_t *t, const unsigned char *s, size_t n, size_t i, size_t *a, size_t *b,
                      const dt_tok_added **tok) {
    for (size_t j = i; j < n; j++) {
        for (int q = t->added_first[s[j]]; q < t->added_first[s[j] + 1]; q++) {
            const dt_tok_added *d = &t->added[t->added_idx[q]];
            if (d->len > n - j || memcmp(s + j, d->content, d->len) != 0)
                continue;
            if (d->single_word && ((j > 0 && word_char_before(s, j)) || (j + d->len < n && word_char_at(s, n, j + d->len))))
                continue;
            size_t x = j, y = j + d->len, l;
            if (d->lstrip)
                while (x > i && is_ws_before(s, i, x, &l))
                    x -= l;
            if (d->rstrip)
                while (y < n && (s[y] == ' ' || (s[y] >= 9 && s[y] <= 13)))
                    y++;
            *a = x, *b = y, *tok = d;
            return 1;
        }
    }
    return 0;
}

dt_status_t dt_tok_encode(dt_tok_enc_t *e, const char *text, size_t len, int doc_start, dt_tok_ids *out) {
    const dt_tok_t *t = e->t;
    const unsigned char *s = (const unsigned char *)text;
    count_invalid(e, s, len);
    size_t i = 0;
    int first = 1;
    while (i <= len) {
        size_t a = len, b = len;
        const dt_tok_added *tok = NULL;
        if (t->nadded == 0 || !find_added(t, s, len, i, &a, &b, &tok))
            a = b = len;
        encode_segment(e, text + i, a - i, first ? doc_start : 1, first && doc_start, out);
        if (!tok || dt_tok_enc_stop(e))
            break;
        dt_tok_ids_push(out, tok->id);
        i = b;
        first = 0;
    }
    if (e->canceled)
        return dt_error(DT_STATUS_CANCELED, "stopped by a signal");
    return DT_STATUS_OK;
}

void dt_tok_enc_set_cancel(dt_tok_enc_t *e, volatile sig_atomic_t *flag) {
    e->cancel = flag;
    e->canceled = 0;
}

/* ---- cut points ---- */

/* How far past `from` a "\n" cut may lie before cuts between letters are sought. */
#define CUT_NL_REACH (64u << 10)

/* Does an added token end exactly at s[p]? */
static int added_ends_at(const dt_tok_t *t, const char *s, size_t p) {
    for (int k = 0; k < t->nadded; k++) {
        size_t l = t->added[k].len;
        if (l <= p && !memcmp(s + p - l, t->added[k].content, l))
            return 1;
    }
    return 0;
}

/* Cut points, all after a "\n" and before an ASCII letter c:
 * - split tokenizers (GPT-2, Llama 3, Qwen2 patterns): the "\n" follows a printable
 *   ASCII non-space. Every split ends a token at the \n (a letter or symbol run
 *   stops at whitespace; the lone \n is its own token, or joins the symbols before
 *   it in Llama 3's ` ?[^\s\p{L}\p{N}]+[\r\n]*`), and the letter starts a token
 *   (no pattern lets \n lead a letter run).
 * - tokenizers that BPE the whole text (no split: Mistral-style normalizers, or
 *   Metaspace): no vocab token holds "\nc" (no merge can then join symbols across
 *   it, and BPE on each side merges the same pairs in the same order as on the
 *   whole), and c is a token itself (unknown symbols cannot fuse across it). The
 *   normalizer must not move the pair: only Replace of " ", Prepend and NFC (which
 *   composes nothing with "\n" or onto an ASCII letter from before it).
 *   ignore_merges looks words up whole: no cuts.
 * Where a segment's start changes the ids (a prefix space, Prepend, Metaspace), a
 * cut right after an added token would start a new segment: not there.
 * When no such cut lies within CUT_NL_REACH of `from`, the first cut between two
 * letters no token joins (tok_cut.c) is taken instead. */
size_t dt_tok_split_point(const dt_tok_t *t, const char *text, size_t len, size_t from) {
    int whole = t->split == DT_SPLIT_NONE;
    if (t->added_newline_or_lstrip || (whole && (t->byte_level || t->ignore_merges)) || (!whole && t->metaspace))
        return len;
    int seg_effects = whole ? t->metaspace : t->add_prefix_space;
    for (int k = 0; k < t->nnorms; k++) {
        const dt_tok_norm *nm = &t->norms[k];
        if (nm->kind == DT_NORM_REPLACE && (strchr(nm->a, '\n') || (whole && strcmp(nm->a, " ") != 0)))
            return len;
        seg_effects |= nm->kind == DT_NORM_PREPEND;
    }
    const char *s = text;
    size_t p = from < 2 ? 2 : from, nl_cut = len;
    while (p < len) {
        const char *nl = memchr(s + p - 1, '\n', len - (p - 1));
        if (!nl)
            break;
        p = (size_t)(nl - s) + 1;
        if (p >= len)
            break;
        unsigned char before = (unsigned char)s[p - 2], c = (unsigned char)s[p];
        int ok = (c | 0x20) >= 'a' && (c | 0x20) <= 'z' &&
                 (whole ? !t->nl_then[c] && t->ascii_id[c] >= 0 : before > ' ' && before < 0x7F);
        if (ok && !(seg_effects && added_ends_at(t, s, p - 1))) {
            nl_cut = p;
            break;
        }
        p++;
    }
    /* No "\n" cut within reach: one between two letters (tok_cut.c), so that text
     * without newlines or spaces still comes in pieces. */
    if (nl_cut - from <= CUT_NL_REACH)
        return nl_cut;
    for (size_t q = from; q < nl_cut;) {
        q = dt_tok_letter_cut(t, s, len, q, nl_cut);
        if (q >= nl_cut)
            break;
        if (!(seg_effects && added_ends_at(t, s, q)))
            return q;
        q++;
    }
    return nl_cut;
}

/* ---- decoding ---- */

typedef struct toklist {
    str *v;
    size_t n;
} toklist;

static void fuse(toklist *l) {
    for (size_t i = 1; i < l->n; i++) {
        str_put(&l->v[0], l->v[i].p, l->v[i].n);
        free(l->v[i].p);
    }
    if (l->n > 1)
        l->n = 1;
}

static void lossy_utf8(const char *s, size_t n, str *out) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int l = dt_uni_next(u + i, n - i, &cp);
        if (cp < 0)
            str_put(out, "\xEF\xBF\xBD", 3);
        else
            str_put(out, s + i, (size_t)l);
        i += (size_t)l;
    }
}

static void dec_bytelevel(toklist *l) {
    str bytes = {0};
    for (size_t i = 0; i < l->n; i++) {
        const unsigned char *u = (const unsigned char *)l->v[i].p;
        size_t n = l->v[i].n, mark = bytes.n;
        int ok = 1;
        for (size_t j = 0; j < n && ok;) {
            int32_t cp;
            int k = dt_uni_next(u + j, n - j, &cp);
            int b = cp < 0 ? -1 : dt_tok_char_byte((uint32_t)cp);
            if (b < 0) {
                ok = 0;
                break;
            }
            char c = (char)b;
            str_put(&bytes, &c, 1);
            j += (size_t)k;
        }
        if (!ok) { /* a character outside the map: the token's own bytes */
            bytes.n = mark;
            str_put(&bytes, l->v[i].p, n);
        }
        free(l->v[i].p);
    }
    str s = {0};
    str_put(&s, "", 0);
    lossy_utf8(bytes.p, bytes.n, &s);
    free(bytes.p);
    l->v[0] = s;
    l->n = 1;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void dec_bytefallback(toklist *l) {
    size_t w = 0;
    str pend = {0};
    for (size_t i = 0; i <= l->n; i++) {
        int byte = -1;
        if (i < l->n && l->v[i].n == 6 && !memcmp(l->v[i].p, "<0x", 3) && l->v[i].p[5] == '>') {
            int h = hexval(l->v[i].p[3]), g = hexval(l->v[i].p[4]);
            if (h >= 0 && g >= 0)
                byte = h * 16 + g;
        }
        if (byte >= 0) {
            char c = (char)byte;
            str_put(&pend, &c, 1);
            free(l->v[i].p);
            continue;
        }
        if (pend.n) {
            str s = {0};
            str_put(&s, "", 0);
            int valid = 1;
            for (size_t j = 0; j < pend.n && valid;) {
                int32_t cp;
                j += (size_t)dt_uni_next((unsigned char *)pend.p + j, pend.n - j, &cp);
                valid = cp >= 0;
            }
            if (valid)
                str_put(&s, pend.p, pend.n);
            else
                for (size_t j = 0; j < pend.n; j++)
                    str_put(&s, "\xEF\xBF\xBD", 3);
            pend.n = 0;
            l->v[w++] = s;
        }
        if (i < l->n)
            l->v[w++] = l->v[i];
    }
    free(pend.p);
    l->n = w;
}

static void dec_each(toklist *l, const dt_tok_dec *d) {
    for (size_t i = 0; i < l->n; i++) {
        str *s = &l->v[i], o = {0};
        if (d->kind == DT_DEC_REPLACE) {
            replace_all(s->p, s->n, d->a, d->b, &o);
        } else if (d->kind == DT_DEC_METASPACE) {
            /* as tokenizers: the first token loses every replacement, not only a
             * leading one (its whole-word tokens "▁The▁devil" decode "Thedevil") */
            replace_all(s->p, s->n, d->a, i == 0 && d->start ? "" : " ", &o);
        } else { /* STRIP: up to start copies of content at the front, stop at the back */
            size_t cn = strlen(d->a), a = 0, b = s->n;
            for (int k = 0; k < d->start && b - a >= cn && cn && !memcmp(s->p + a, d->a, cn); k++)
                a += cn;
            for (int k = 0; k < d->stop && b - a >= cn && cn && !memcmp(s->p + b - cn, d->a, cn); k++)
                b -= cn;
            str_put(&o, "", 0);
            str_put(&o, s->p + a, b - a);
        }
        free(s->p);
        *s = o;
    }
}

dt_status_t dt_tok_decode(const dt_tok_t *t, const uint32_t *ids, size_t n, char **buf, size_t *len,
                          size_t *cap) {
    toklist l = {dt_xcalloc(n + 1, sizeof(str)), n};
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= t->nvocab || !t->tokens[ids[i]]) {
            for (size_t j = 0; j < i; j++)
                free(l.v[j].p);
            free(l.v);
            return dt_error(DT_STATUS_FORMAT, "id %u at position %zu is not in the vocabulary of %s (size %u)", ids[i],
                            i, t->path, t->nvocab);
        }
        str_put(&l.v[i], t->tokens[ids[i]], t->tok_len[ids[i]]);
    }
    for (int k = 0; k < t->ndecs && l.n; k++) {
        const dt_tok_dec *d = &t->decs[k];
        if (d->kind == DT_DEC_BYTELEVEL)
            dec_bytelevel(&l);
        else if (d->kind == DT_DEC_BYTEFALLBACK)
            dec_bytefallback(&l);
        else if (d->kind == DT_DEC_FUSE)
            fuse(&l);
        else
            dec_each(&l, d);
    }
    str out = {*buf, *len, *cap};
    str_put(&out, "", 0);
    for (size_t i = 0; i < l.n; i++) {
        if (i && t->ndecs == 0) /* tokenizers joins undecoded tokens with spaces */
            str_put(&out, " ", 1);
        str_put(&out, l.v[i].p, l.v[i].n);
        free(l.v[i].p);
    }
    free(l.v);
    *buf = out.p, *len = out.n, *cap = out.cap;
    return DT_STATUS_OK;
}
