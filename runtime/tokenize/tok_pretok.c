/*
 * tok_pretok.c - the pre-tokenizer regexes of GPT-2, Llama 3 and Qwen2, written as
 * scanners. Each returns the length of the match the regex's alternation would
 * find at a position (the first alternative that matches, each greedy, with the
 * backtracking the patterns need spelled out):
 *
 *   GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
 *            | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   Qwen2:   Llama 3's with \p{N} for \p{N}{1,3}.
 *
 * `\s+(?!\S)` takes a whitespace run whole at the end of the text, else the run
 * less its last character (which then leads the next token), else (a run of one)
 * falls through to `\s+`. `\s*[\r\n]+` ends at the run's last \r or \n. An
 * invalid UTF-8 byte is one character of no class (like punctuation).
 */
#include "runtime/tokenize/tok_internal.h"
#include "runtime/tokenize/tok_unicode.h"

enum { L = DT_UNI_LETTER, N = DT_UNI_NUMBER, S = DT_UNI_SPACE };

/* Class of the character at s[j] and its length in *len. */
static inline int cls_at(const unsigned char *s, size_t n, size_t j, size_t *len) {
    if (s[j] < 0x80) {
        *len = 1;
        return dt_uni_class(s[j]);
    }
    int32_t cp;
    *len = (size_t)dt_uni_next(s + j, n - j, &cp);
    return dt_uni_class(cp);
}

/* End of the run of characters of class k (k = 0: neither L, N nor S) from j. */
static inline size_t run_of(const unsigned char *s, size_t n, size_t j, int k) {
    while (j < n) {
        size_t l;
        if (cls_at(s, n, j, &l) != k)
            break;
        j += l;
    }
    return j;
}

static inline int lower_is(unsigned char c, char want) { return (c | 0x20) == want; }

/* Length of a contraction at s[i] == '\'' (0 when none); nocase for (?i:...). */
static size_t contraction(const unsigned char *s, size_t n, size_t i, int nocase) {
    if (i + 1 >= n)
        return 0;
    unsigned char a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
    if (!nocase) {
        if (a == 's' || a == 't' || a == 'm' || a == 'd')
            return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return 3;
        return 0;
    }
    if (lower_is(a, 's') || lower_is(a, 't') || lower_is(a, 'm') || lower_is(a, 'd'))
        return 2;
    if (a == 0xC5 && b == 0xBF) /* U+017F LATIN SMALL LETTER LONG S folds to s */
        return 3;
    if ((lower_is(a, 'r') && lower_is(b, 'e')) || (lower_is(a, 'v') && lower_is(b, 'e')) ||
        (lower_is(a, 'l') && lower_is(b, 'l')))
        return 3;
    return 0;
}

/* `\s+(?!\S)|\s+` from i, s[i] being whitespace. */
static size_t spaces(const unsigned char *s, size_t n, size_t i) {
    size_t j = i, last = i, l;
    while (j < n && cls_at(s, n, j, &l) == S)
        last = j, j += l;
    if (j == n || last == i)
        return j - i;
    return last - i;
}

static size_t gpt2(const unsigned char *s, size_t n, size_t i) {
    size_t l, l2;
    if (s[i] == '\'') {
        size_t c = contraction(s, n, i, 0);
        if (c)
            return c;
    }
    int k = cls_at(s, n, i, &l);
    if (s[i] == ' ' && i + 1 < n) {
        int k2 = cls_at(s, n, i + 1, &l2);
        if (k2 != S)
            return run_of(s, n, i + 1, k2) - i;
    }
    if (k != S)
        return run_of(s, n, i, k) - i;
    return spaces(s, n, i);
}

static size_t llama(const unsigned char *s, size_t n, size_t i, int max_digits) {
    size_t l, l2;
    if (s[i] == '\'') {
        size_t c = contraction(s, n, i, 1);
        if (c)
            return c;
    }
    int k = cls_at(s, n, i, &l);
    if (k == L)
        return run_of(s, n, i, L) - i;
    if (k != N && s[i] != '\r' && s[i] != '\n' && i + l < n && cls_at(s, n, i + l, &l2) == L)
        return run_of(s, n, i + l, L) - i;
    if (k == N) {
        size_t j = i;
        for (int d = 0; d < max_digits && j < n && cls_at(s, n, j, &l2) == N; d++)
            j += l2;
        return j - i;
    }
    size_t from = k == 0 ? i : (s[i] == ' ' && i + 1 < n && cls_at(s, n, i + 1, &l2) == 0) ? i + 1 : n;
    if (from < n) { /* ` ?[^\s\p{L}\p{N}]+[\r\n]*` */
        size_t j = run_of(s, n, from, 0);
        while (j < n && (s[j] == '\r' || s[j] == '\n'))
            j++;
        return j - i;
    }
    /* k == S: `\s*[\r\n]+` ends at the run's last \r or \n */
    size_t j = i, nl = n;
    while (j < n && cls_at(s, n, j, &l2) == S) {
        if (s[j] == '\r' || s[j] == '\n')
            nl = j;
        j += l2;
    }
    if (nl < n)
        return nl + 1 - i;
    return spaces(s, n, i);
}

size_t dt_tok_pretok_next(dt_tok_split_kind k, const unsigned char *s, size_t n, size_t i) {
    switch (k) {
    case DT_SPLIT_GPT2:
        return gpt2(s, n, i);
    case DT_SPLIT_LLAMA3:
        return llama(s, n, i, 3);
    case DT_SPLIT_QWEN2:
        return llama(s, n, i, 1);
    default:
        return n - i;
    }
}
