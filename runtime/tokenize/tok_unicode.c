/*
 * tok_unicode.c - UTF-8 decoding, character classes and NFC over the generated
 * tables. ASCII never reaches a table: the classes have a 128-entry fast path and
 * NFC returns text below U+0300 unchanged (no composition or reordering there).
 */
#include "runtime/tokenize/tok_unicode.h"

#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "common/mem.h" /* defines: dt_xrealloc */

int dt_uni_next(const unsigned char *s, size_t n, int32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = (int32_t)c;
        return 1;
    }
    int len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2, v = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, v = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        *cp = -1;
        return 1;
    }
    if ((size_t)len > n) {
        *cp = -1;
        return 1;
    }
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = -1;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v < 0xE000)) {
        *cp = -1;
        return 1;
    }
    *cp = (int32_t)v;
    return len;
}

int dt_uni_put(uint32_t cp, char *b) {
    if (cp < 0x80) {
        b[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        b[0] = (char)(0xC0 | (cp >> 6)), b[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = (char)(0xE0 | (cp >> 12)), b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (char)(0xF0 | (cp >> 18)), b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), b[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0])
            hi = mid;
        else if (cp > r[mid][1])
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

static unsigned char ascii_class[128];
static int ascii_ready;

int dt_uni_class(int32_t cp) {
    if (cp < 0)
        return 0;
    if (cp < 128) {
        if (!__atomic_load_n(&ascii_ready, __ATOMIC_ACQUIRE)) {
            for (int c = 0; c < 128; c++) {
                int k = 0;
                if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
                    k = DT_UNI_LETTER;
                else if (c >= '0' && c <= '9')
                    k = DT_UNI_NUMBER;
                else if (c == ' ' || (c >= 9 && c <= 13))
                    k = DT_UNI_SPACE;
                ascii_class[c] = (unsigned char)k;
            }
            __atomic_store_n(&ascii_ready, 1, __ATOMIC_RELEASE);
        }
        return ascii_class[cp];
    }
    uint32_t u = (uint32_t)cp;
    if (in_ranges(dt_uni_letter, dt_uni_letter_n, u))
        return DT_UNI_LETTER;
    if (in_ranges(dt_uni_number, dt_uni_number_n, u))
        return DT_UNI_NUMBER;
    if (in_ranges(dt_uni_space, dt_uni_space_n, u))
        return DT_UNI_SPACE;
    return 0;
}

/* ---- NFC ---- */

enum { HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7,
       HANGUL_LN = 19, HANGUL_VN = 21, HANGUL_TN = 28, HANGUL_N = HANGUL_VN * HANGUL_TN,
       HANGUL_SN = HANGUL_LN * HANGUL_N };

static int ccc_of(int32_t cp) {
    if (cp < 0x300)
        return 0;
    size_t lo = 0, hi = dt_uni_ccc_n;
    uint32_t u = (uint32_t)cp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (u < dt_uni_ccc[mid][0])
            hi = mid;
        else if (u > dt_uni_ccc[mid][1])
            lo = mid + 1;
        else
            return (int)dt_uni_ccc[mid][2];
    }
    return 0;
}

/* Appends cp's full canonical decomposition to d (cap checked by caller: at most 4). */
static int decompose(int32_t cp, int32_t *d) {
    if (cp >= HANGUL_S && cp < HANGUL_S + HANGUL_SN) {
        int s = cp - HANGUL_S;
        d[0] = HANGUL_L + s / HANGUL_N;
        d[1] = HANGUL_V + (s % HANGUL_N) / HANGUL_TN;
        if (s % HANGUL_TN) {
            d[2] = HANGUL_T + s % HANGUL_TN;
            return 3;
        }
        return 2;
    }
    if (cp >= 0xC0) {
        size_t lo = 0, hi = dt_uni_decomp_n;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if ((uint32_t)cp < dt_uni_decomp[mid][0])
                hi = mid;
            else if ((uint32_t)cp > dt_uni_decomp[mid][0])
                lo = mid + 1;
            else {
                int n = (int)dt_uni_decomp[mid][2];
                for (int i = 0; i < n; i++)
                    d[i] = (int32_t)dt_uni_decomp_pool[dt_uni_decomp[mid][1] + i];
                return n;
            }
        }
    }
    d[0] = cp;
    return 1;
}

static int32_t compose(int32_t a, int32_t b) {
    if (a >= HANGUL_L && a < HANGUL_L + HANGUL_LN && b >= HANGUL_V && b < HANGUL_V + HANGUL_VN)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_VN + (b - HANGUL_V)) * HANGUL_TN;
    if (a >= HANGUL_S && a < HANGUL_S + HANGUL_SN && (a - HANGUL_S) % HANGUL_TN == 0 && b > HANGUL_T &&
        b < HANGUL_T + HANGUL_TN)
        return a + (b - HANGUL_T);
    size_t lo = 0, hi = dt_uni_comp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t ma = dt_uni_comp[mid][0], mb = dt_uni_comp[mid][1];
        if ((uint32_t)a < ma || ((uint32_t)a == ma && (uint32_t)b < mb))
            hi = mid;
        else if ((uint32_t)a > ma || (uint32_t)b > mb)
            lo = mid + 1;
        else
            return (int32_t)dt_uni_comp[mid][2];
    }
    return -1;
}

int dt_uni_nfc_inert(int32_t cp) {
    if (cp < 0x300)
        return 1;
    int32_t d[4];
    if (ccc_of(cp) != 0 || decompose(cp, d) != 1 || d[0] != cp)
        return 0;
    if (cp >= HANGUL_L && cp < HANGUL_T + HANGUL_TN) /* conjoining jamo compose among themselves */
        return 0;
    for (size_t i = 0; i < dt_uni_comp_n; i++) /* a second of a composition (some vowel signs) */
        if (dt_uni_comp[i][1] == (uint32_t)cp)
            return 0;
    return 1;
}

static void put_bytes(char **out, size_t *len, size_t *cap, const void *p, size_t n) {
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *out = dt_xrealloc(*out, *cap);
    }
    memcpy(*out + *len, p, n);
    *len += n;
    (*out)[*len] = 0;
}

/* Code points of the text being normalized; an invalid byte b is stored as
 * -1 - b so that it can be written back unchanged. */
void dt_uni_nfc(const char *s, size_t n, char **out, size_t *len, size_t *cap) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n && u[i] < 0xCC) /* below U+0300 nothing composes or reorders */
        i++;
    if (i == n) {
        put_bytes(out, len, cap, s, n);
        return;
    }
    /* Back up to the start of the character holding i, and one more starter. */
    while (i > 0 && (u[i] & 0xC0) == 0x80)
        i--;
    if (i > 0) {
        i--;
        while (i > 0 && (u[i] & 0xC0) == 0x80)
            i--;
    }
    put_bytes(out, len, cap, s, i);
    size_t cn = 0, ccap = (n - i) * 4 + 8;
    int32_t *cps = dt_xmalloc(ccap * sizeof *cps);
    while (i < n) {
        int32_t cp;
        int k = dt_uni_next(u + i, n - i, &cp);
        if (cp < 0)
            cps[cn++] = -1 - (int32_t)u[i];
        else
            cn += (size_t)decompose(cp, cps + cn);
        i += (size_t)k;
    }
    /* Canonical ordering: stable sort of each run of non-starters by class. */
    for (size_t a = 0; a < cn; a++) {
        if (cps[a] < 0 || ccc_of(cps[a]) == 0)
            continue;
        size_t b = a;
        while (b < cn && cps[b] >= 0 && ccc_of(cps[b]) != 0)
            b++;
        for (size_t x = a + 1; x < b; x++) {
            int32_t v = cps[x];
            int cv = ccc_of(v);
            size_t y = x;
            while (y > a && ccc_of(cps[y - 1]) > cv) {
                cps[y] = cps[y - 1];
                y--;
            }
            cps[y] = v;
        }
        a = b;
    }
    /* Canonical composition. */
    size_t w = 0;
    ssize_t starter = -1;
    int last_ccc = -1;
    for (size_t r = 0; r < cn; r++) {
        int32_t c = cps[r];
        int cc = c < 0 ? 0 : ccc_of(c);
        if (c >= 0 && starter >= 0 && (last_ccc < cc || (last_ccc == 0 && (size_t)starter == w - 1))) {
            int32_t m = compose(cps[starter], c);
            if (m >= 0) {
                cps[starter] = m;
                continue;
            }
        }
        if (c < 0) {
            starter = -1;
            last_ccc = -1;
        } else if (cc == 0) {
            starter = (ssize_t)w;
            last_ccc = 0;
        } else {
            last_ccc = cc;
        }
        cps[w++] = c;
    }
    for (size_t r = 0; r < w; r++) {
        char b[4];
        if (cps[r] < 0) {
            b[0] = (char)(-1 - cps[r]);
            put_bytes(out, len, cap, b, 1);
        } else {
            put_bytes(out, len, cap, b, (size_t)dt_uni_put((uint32_t)cps[r], b));
        }
    }
    free(cps);
}
