/*
 * jinja_str.c - Python's str operations as templates call them: strip with or
 * without characters, replace, split and rsplit (whitespace runs or a separator,
 * maxsplit), splitlines, case mapping (Python's full mappings and final sigma, from
 * jinja_unicode_tables.c), padding, str.format and printf-style `%`.
 * Indexes count code points, as Python's do.
 */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/tokenize/jinja_internal.h"
#include "runtime/tokenize/tok_unicode.h" /* defines: dt_uni_next, dt_uni_class */

dt_status_t jj_need_str(jj_render *r, jv v, const char *what, uint32_t line) {
    if (v.kind == JV_STR) return DT_STATUS_OK;
    if (v.kind == JV_UNDEF) return jj_undef_fail(r, v, line);
    return jj_fail(r, line, DT_STATUS_INVALID, "%s must be str, not %s", what, jj_type_name(v));
}

dt_status_t jj_need_int(jj_render *r, jv v, const char *what, uint32_t line) {
    if (v.kind == JV_INT || v.kind == JV_BOOL) return DT_STATUS_OK;
    if (v.kind == JV_UNDEF) return jj_undef_fail(r, v, line);
    return jj_fail(r, line, DT_STATUS_INVALID, "%s: '%s' object cannot be interpreted as an integer", what,
                   jj_type_name(v));
}

static jv mkstr(jv like, const char *p, size_t n) {
    jv v = jv_str(p, n);
    v.sub = like.sub;
    return v;
}

/* ---- strings ---- */

/* Whether the code point at p (len k) is one of chars' code points. */
static int in_chars(const char *p, int k, jv chars) {
    for (size_t i = 0, c; i < chars.u.s.n; i += c) {
        c = jj_utf8_next(chars.u.s.p + i, chars.u.s.n - i);
        if (c == (size_t)k && memcmp(chars.u.s.p + i, p, c) == 0) return 1;
    }
    return 0;
}

static int strip_here(const char *p, size_t n, const jv *chars, int *k) {
    int32_t cp;
    *k = dt_uni_next((const unsigned char *)p, n, &cp);
    return chars ? in_chars(p, *k, *chars) : jj_py_isspace(cp);
}

dt_status_t jj_str_strip(jj_render *r, jv s, const jv *chars, int left, int right, uint32_t line, jv *out) {
    DT_CHECK(jj_need_str(r, s, "strip's string", line));
    if (chars && chars->kind == JV_NONE) chars = NULL;
    if (chars) DT_CHECK(jj_need_str(r, *chars, "strip arg", line));
    size_t a = 0, b = s.u.s.n;
    int k;
    while (left && a < b && strip_here(s.u.s.p + a, b - a, chars, &k)) a += (size_t)k;
    while (right && b > a) {
        size_t st = jj_utf8_prev(s.u.s.p, a, b);
        if (!strip_here(s.u.s.p + st, b - st, chars, &k)) break;
        b = st;
    }
    *out = mkstr(s, s.u.s.p + a, b - a);
    return DT_STATUS_OK;
}

dt_status_t jj_str_replace(jj_render *r, jv s, jv old, jv new_, int64_t count, uint32_t line, jv *out) {
    DT_CHECK(jj_need_str(r, old, "replace() argument 1", line));
    DT_CHECK(jj_need_str(r, new_, "replace() argument 2", line));
    jj_buf b;
    jj_buf_init(&b);
    dt_status_t st = DT_STATUS_OK;
    size_t i = 0;
    int64_t done = 0;
    if (old.u.s.n == 0) { /* between every character, and at both ends */
        while (st == DT_STATUS_OK && (count < 0 || done < count)) {
            st = jj_buf_put(r, &b, new_.u.s.p, new_.u.s.n);
            done++;
            if (i >= s.u.s.n) break;
            size_t j = i + jj_utf8_next(s.u.s.p + i, s.u.s.n - i);
            if (st == DT_STATUS_OK) st = jj_buf_put(r, &b, s.u.s.p + i, j - i);
            i = j;
        }
    } else {
        while (st == DT_STATUS_OK && (count < 0 || done < count)) {
            const char *hit = memmem(s.u.s.p + i, s.u.s.n - i, old.u.s.p, old.u.s.n);
            if (!hit) break;
            size_t h = (size_t)(hit - s.u.s.p);
            st = jj_buf_put(r, &b, s.u.s.p + i, h - i);
            if (st == DT_STATUS_OK) st = jj_buf_put(r, &b, new_.u.s.p, new_.u.s.n);
            i = h + old.u.s.n;
            done++;
        }
    }
    if (st == DT_STATUS_OK) st = jj_buf_put(r, &b, s.u.s.p + i, s.u.s.n - i);
    if (st == DT_STATUS_OK) st = jj_buf_take(r, &b, out);
    free(b.p);
    out->sub = s.sub;
    return st;
}

/* ---- case mapping (jinja_unicode_tables.c) ---- */

int jj_uni_in(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0]) hi = mid;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

enum { TO_LOWER, TO_UPPER, TO_TITLE };

/* The UTF-8 of cp's mapping into buf (it holds 16); its length. */
static int map_case(int32_t cp, int to, char *buf) {
    static const jj_case_run *const runs[] = {jj_uni_lower, jj_uni_upper, jj_uni_title};
    static const jj_case_full *const fulls[] = {jj_uni_lower_full, jj_uni_upper_full, jj_uni_title_full};
    const size_t *nruns[] = {&jj_uni_lower_n, &jj_uni_upper_n, &jj_uni_title_n};
    const size_t *nfulls[] = {&jj_uni_lower_full_n, &jj_uni_upper_full_n, &jj_uni_title_full_n};
    if (cp < 0) return 0;
    uint32_t c = (uint32_t)cp;
    if (c < 0x80) {
        int up = to != TO_LOWER, letter = (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
        buf[0] = (char)(letter ? (up ? (c & ~0x20u) : (c | 0x20u)) : c);
        return 1;
    }
    const jj_case_full *f = fulls[to];
    size_t lo = 0, hi = *nfulls[to];
    while (lo < hi) { /* sorted by code point */
        size_t mid = (lo + hi) / 2;
        if (c < f[mid].cp) hi = mid;
        else if (c > f[mid].cp) lo = mid + 1;
        else {
            size_t n = strlen(f[mid].s);
            memcpy(buf, f[mid].s, n);
            return (int)n;
        }
    }
    const jj_case_run *r = runs[to];
    lo = 0;
    hi = *nruns[to];
    while (lo < hi) { /* the last run starting at or before c */
        size_t mid = (lo + hi) / 2;
        if (r[mid].first <= c) lo = mid + 1;
        else hi = mid;
    }
    if (lo && c <= r[lo - 1].last && (c - r[lo - 1].first) % (uint32_t)r[lo - 1].stride == 0)
        c = (uint32_t)((int64_t)c + r[lo - 1].delta);
    return dt_uni_put(c, buf);
}

static int cased(int32_t cp) { return cp >= 0 && jj_uni_in(jj_uni_cased, jj_uni_cased_n, (uint32_t)cp); }

static int case_ignorable(int32_t cp) {
    return cp >= 0 && jj_uni_in(jj_uni_case_ignorable, jj_uni_case_ignorable_n, (uint32_t)cp);
}

/* The code point before byte offset i of p[a..); -1 at a. Sets *start. */
static int32_t cp_before(const char *p, size_t a, size_t i, size_t *start) {
    if (i <= a) return -1;
    size_t st = jj_utf8_prev(p, a, i);
    int32_t cp;
    dt_uni_next((const unsigned char *)p + st, i - st, &cp);
    *start = st;
    return cp;
}

/* CPython's final-sigma rule for the capital sigma at p[i] within p[a..b):
 * preceded by a cased letter and not followed by one, case-ignorables between. */
static int final_sigma(const char *p, size_t a, size_t b, size_t i) {
    size_t j = i, st;
    int32_t cp;
    while ((cp = cp_before(p, a, j, &st)) >= 0 && case_ignorable(cp)) j = st;
    if (cp < 0 || !cased(cp)) return 0;
    for (j = i + 2; j < b;) { /* sigma is two bytes */
        int k = dt_uni_next((const unsigned char *)p + j, b - j, &cp);
        if (!case_ignorable(cp)) return !cased(cp);
        j += (size_t)k;
    }
    return 1;
}

/* jinja's title filter splits words at these. */
static int title_sep(int32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || jj_py_isspace(cp);
}

dt_status_t jj_str_case(jj_render *r, jv s, int how, uint32_t line, jv *out) {
    static const char *const names[] = {"lower", "upper", "capitalize", "title", "title"};
    DT_CHECK(jj_need_str(r, s, names[how], line));
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (n > r->lim.max_output / 3)
        return jj_fail(r, line, DT_STATUS_LIMIT, "%s() of a string longer than %zu MiB", names[how], r->lim.max_output >> 20);
    char *o = jj_alloc(&r->arena, 3 * n + 1); /* a mapping is at most 3x the bytes (e.g. U+0390) */
    if (!o) return jj_oom(r);
    size_t k = 0, rest = 0; /* jinja's title filter: where the current item's lower() part starts */
    int start = 1, prev_cased = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int len = dt_uni_next((const unsigned char *)p + i, n - i, &cp), to;
        size_t ctx = 0; /* final sigma looks within p[ctx..n) */
        switch (how) {
        case 0: to = TO_LOWER; break;
        case 1: to = TO_UPPER; break;
        case 2: to = i == 0 ? TO_TITLE : TO_LOWER; break;
        case 3: /* jinja: item[0].upper() + item[1:].lower() for each item of the split */
            if (title_sep(cp)) {
                start = 1;
                to = TO_LOWER;
            } else {
                if (start) rest = i + (size_t)len;
                to = start ? TO_UPPER : TO_LOWER;
                ctx = rest;
                start = 0;
            }
            break;
        default: /* str.title */
            to = prev_cased ? TO_LOWER : TO_TITLE;
            prev_cased = cased(cp);
            break;
        }
        if (cp < 0) { /* an invalid byte passes through */
            o[k++] = p[i];
        } else if (to == TO_LOWER && cp == 0x3A3) {
            size_t end = n;
            if (how == 3) /* the item ends at the next separator */
                for (end = i + 2; end < n;) {
                    int32_t c2;
                    int l2 = dt_uni_next((const unsigned char *)p + end, n - end, &c2);
                    if (title_sep(c2)) break;
                    end += (size_t)l2;
                }
            k += (size_t)dt_uni_put(final_sigma(p, ctx, end, i) ? 0x3C2 : 0x3C3, o + k);
        } else {
            k += (size_t)map_case(cp, to, o + k);
        }
        i += (size_t)len;
    }
    o[k] = 0;
    *out = mkstr(s, o, k);
    return DT_STATUS_OK;
}

/* 1 for a cased letter outside ASCII (str.islower/isupper need more tables). */
int jj_case_unknown(int32_t cp) { return cp >= 0x80 && cased(cp); }

static int line_break(int32_t cp) {
    return cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

dt_status_t jj_str_splitlines(jj_render *r, const char *p, size_t n, int keepends, jj_list **out) {
    jj_list *l = jj_list_new(r, 0);
    if (!l) return jj_oom(r);
    size_t a = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = dt_uni_next((const unsigned char *)p + i, n - i, &cp);
        if (!line_break(cp)) {
            i += (size_t)k;
            continue;
        }
        size_t end = i + (size_t)k;
        if (cp == '\r' && end < n && p[end] == '\n') end++;
        DT_CHECK(jj_list_push(r, l, jv_str(p + a, (keepends ? end : i) - a)));
        a = i = end;
    }
    if (a < n) DT_CHECK(jj_list_push(r, l, jv_str(p + a, n - a)));
    *out = l;
    return DT_STATUS_OK;
}

dt_status_t jj_str_split(jj_render *r, jv s, jv sep, int64_t maxsplit, int from_right, uint32_t line, jv *out) {
    jj_list *l = jj_list_new(r, 0);
    if (!l) return jj_oom(r);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (sep.kind == JV_NONE) { /* runs of whitespace; no empty strings */
        jv parts[2];
        jj_list *tmp = jj_list_new(r, 0);
        if (!tmp) return jj_oom(r);
        jv rest = s;
        DT_CHECK(jj_str_strip(r, rest, NULL, !from_right, from_right, line, &rest));
        int64_t done = 0;
        while (rest.u.s.n) {
            if (maxsplit >= 0 && done == maxsplit) {
                DT_CHECK(jj_list_push(r, tmp, rest));
                break;
            }
            /* the next word from the chosen end */
            size_t a = 0, b = rest.u.s.n;
            int k;
            if (!from_right) {
                size_t i = 0;
                while (i < b && !strip_here(rest.u.s.p + i, b - i, NULL, &k)) i += (size_t)k;
                parts[0] = jv_str(rest.u.s.p, i);
                parts[1] = jv_str(rest.u.s.p + i, b - i);
            } else {
                size_t i = b;
                while (i > a) {
                    size_t st = jj_utf8_prev(rest.u.s.p, 0, i);
                    if (strip_here(rest.u.s.p + st, i - st, NULL, &k)) break;
                    i = st;
                }
                parts[0] = jv_str(rest.u.s.p + i, b - i);
                parts[1] = jv_str(rest.u.s.p, i);
            }
            DT_CHECK(jj_list_push(r, tmp, parts[0]));
            done++;
            DT_CHECK(jj_str_strip(r, parts[1], NULL, !from_right, from_right, line, &rest));
        }
        if (from_right)
            for (size_t i = tmp->n; i-- > 0;) DT_CHECK(jj_list_push(r, l, tmp->v[i]));
        else
            l = tmp;
    } else {
        DT_CHECK(jj_need_str(r, sep, "separator", line));
        if (!sep.u.s.n) return jj_fail(r, line, DT_STATUS_INVALID, "empty separator");
        int64_t done = 0;
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                const char *hit = (maxsplit < 0 || done < maxsplit) ? memmem(p + i, n - i, sep.u.s.p, sep.u.s.n) : NULL;
                if (!hit) break;
                DT_CHECK(jj_list_push(r, l, jv_str(p + i, (size_t)(hit - p) - i)));
                i = (size_t)(hit - p) + sep.u.s.n;
                done++;
            }
            DT_CHECK(jj_list_push(r, l, jv_str(p + i, n - i)));
        } else {
            jj_list *tmp = jj_list_new(r, 0);
            if (!tmp) return jj_oom(r);
            size_t end = n;
            while (maxsplit < 0 || done < maxsplit) {
                size_t hit = (size_t)-1;
                for (size_t j = end; j >= sep.u.s.n; j--)
                    if (memcmp(p + j - sep.u.s.n, sep.u.s.p, sep.u.s.n) == 0) {
                        hit = j - sep.u.s.n;
                        break;
                    }
                if (hit == (size_t)-1) break;
                DT_CHECK(jj_list_push(r, tmp, jv_str(p + hit + sep.u.s.n, end - hit - sep.u.s.n)));
                end = hit;
                done++;
            }
            DT_CHECK(jj_list_push(r, tmp, jv_str(p, end)));
            for (size_t i = tmp->n; i-- > 0;) DT_CHECK(jj_list_push(r, l, tmp->v[i]));
        }
    }
    *out = (jv){.kind = JV_LIST, .sub = JL_LIST, .u.l = l};
    return DT_STATUS_OK;
}

dt_status_t jj_str_pad(jj_render *r, jv s, jv width, jv fill, int how, uint32_t line, jv *out) {
    DT_CHECK(jj_need_int(r, width, "width", line));
    if (fill.kind != JV_STR || jj_utf8_count(fill.u.s.p, fill.u.s.n) != 1)
        return jj_fail(r, line, DT_STATUS_INVALID, "The fill character must be exactly one character long");
    int64_t len = (int64_t)jj_utf8_count(s.u.s.p, s.u.s.n), w = width.u.i;
    if (w <= len) {
        *out = s;
        return DT_STATUS_OK;
    }
    int64_t marg = w - len, left = how == 0 ? marg / 2 + (marg & w & 1) : how == 1 ? 0 : marg;
    jj_buf b;
    jj_buf_init(&b);
    dt_status_t st = DT_STATUS_OK;
    for (int64_t i = 0; i < left && st == DT_STATUS_OK; i++) st = jj_buf_put(r, &b, fill.u.s.p, fill.u.s.n);
    if (st == DT_STATUS_OK) st = jj_buf_put(r, &b, s.u.s.p, s.u.s.n);
    for (int64_t i = 0; i < marg - left && st == DT_STATUS_OK; i++) st = jj_buf_put(r, &b, fill.u.s.p, fill.u.s.n);
    if (st == DT_STATUS_OK) st = jj_buf_take(r, &b, out);
    free(b.p);
    return st;
}

/* ---- str.format and % ---- */

static dt_status_t fmt_field(jj_render *r, const char *f, size_t n, const jv *args, size_t nargs, const jj_dict *kw,
                             size_t *autoidx, uint32_t line, jj_buf *b) {
    size_t i = 0;
    while (i < n && f[i] != '!' && f[i] != ':' && f[i] != '.' && f[i] != '[') i++;
    jv v;
    if (i == 0) {
        if (*autoidx >= nargs) return jj_fail(r, line, DT_STATUS_INVALID, "Replacement index %zu out of range", *autoidx);
        v = args[(*autoidx)++];
    } else if (f[0] >= '0' && f[0] <= '9') {
        size_t k = (size_t)strtoul(f, NULL, 10);
        if (k >= nargs) return jj_fail(r, line, DT_STATUS_INVALID, "Replacement index %zu out of range", k);
        v = args[k];
    } else {
        jv *p = kw ? jj_dict_getn(kw, f, i) : NULL;
        if (!p) return jj_fail(r, line, DT_STATUS_INVALID, "KeyError: '%.*s'", (int)i, f);
        v = *p;
    }
    if (i < n && (f[i] == '.' || f[i] == '['))
        return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "str.format with attribute or index fields ('{%.*s}')", (int)n, f);
    int conv = 's';
    if (i < n && f[i] == '!') {
        if (i + 1 >= n || (f[i + 1] != 's' && f[i + 1] != 'r'))
            return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "str.format conversion in '{%.*s}'", (int)n, f);
        conv = f[i + 1];
        i += 2;
    }
    if (i < n && f[i] == ':' && i + 1 < n)
        return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "str.format with a format spec ('{%.*s}')", (int)n, f);
    return conv == 'r' ? jj_repr_into(r, b, v, line) : jj_str_into(r, b, v, line);
}

dt_status_t jj_str_format(jj_render *r, jv s, const jv *args, size_t nargs, const jj_dict *kw, uint32_t line,
                              jv *out) {
    jj_buf b;
    jj_buf_init(&b);
    dt_status_t st = DT_STATUS_OK;
    size_t autoidx = 0;
    const char *p = s.u.s.p;
    for (size_t i = 0; i < s.u.s.n && st == DT_STATUS_OK;) {
        char c = p[i];
        if ((c == '{' || c == '}') && i + 1 < s.u.s.n && p[i + 1] == c) {
            st = jj_buf_put(r, &b, &c, 1);
            i += 2;
        } else if (c == '{') {
            const char *end = memchr(p + i, '}', s.u.s.n - i);
            if (!end) {
                st = jj_fail(r, line, DT_STATUS_INVALID, "Single '{' encountered in format string");
                break;
            }
            st = fmt_field(r, p + i + 1, (size_t)(end - p) - i - 1, args, nargs, kw, &autoidx, line, &b);
            i = (size_t)(end - p) + 1;
        } else if (c == '}') {
            st = jj_fail(r, line, DT_STATUS_INVALID, "Single '}' encountered in format string");
        } else {
            st = jj_buf_put(r, &b, &c, 1);
            i++;
        }
    }
    if (st == DT_STATUS_OK) st = jj_buf_take(r, &b, out);
    free(b.p);
    return st;
}

/* One %-conversion of Python's printf-style formatting. */
static dt_status_t percent_one(jj_render *r, const char *spec, size_t sn, char conv, jv v, uint32_t line, jj_buf *b) {
    char cfmt[48], out[512];
    if (sn > 20) return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "%%-format spec too long");
    if (conv == 's' || conv == 'r' || conv == 'a') {
        jv s;
        if (conv == 's') {
            DT_CHECK(jj_to_str(r, v, line, &s));
        } else {
            jj_buf t;
            jj_buf_init(&t);
            dt_status_t st = jj_repr_into(r, &t, v, line);
            if (st == DT_STATUS_OK) st = jj_buf_take(r, &t, &s);
            free(t.p);
            DT_CHECK(st);
        }
        if (!sn) return jj_buf_put(r, b, s.u.s.p, s.u.s.n);
        /* width and precision count characters */
        int left = memchr(spec, '-', sn) != NULL;
        const char *dot = memchr(spec, '.', sn);
        size_t prec = dot ? (size_t)strtoul(dot + 1, NULL, 10) : (size_t)-1;
        size_t wi = 0;
        while (wi < sn && strchr("-+ #0", spec[wi])) wi++;
        size_t width = (size_t)strtoul(spec + wi, NULL, 10);
        size_t len = jj_utf8_count(s.u.s.p, s.u.s.n);
        if (len > prec) {
            s.u.s.n = jj_utf8_offset(s.u.s.p, s.u.s.n, prec);
            len = prec;
        }
        for (size_t i = len; !left && i < width; i++) DT_CHECK(jj_buf_put(r, b, " ", 1));
        DT_CHECK(jj_buf_put(r, b, s.u.s.p, s.u.s.n));
        for (size_t i = len; left && i < width; i++) DT_CHECK(jj_buf_put(r, b, " ", 1));
        return DT_STATUS_OK;
    }
    if (v.kind == JV_UNDEF) return jj_undef_fail(r, v, line);
    if (v.kind != JV_INT && v.kind != JV_BOOL && v.kind != JV_FLOAT)
        return jj_fail(r, line, DT_STATUS_INVALID, "%%%c format: a real number is required, not %s", conv,
                       jj_type_name(v));
    if (strchr("diuxXoc", conv)) {
        if (conv == 'c') return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "%%c formatting");
        if (v.kind == JV_FLOAT && strchr("xXo", conv))
            return jj_fail(r, line, DT_STATUS_INVALID, "%%%c format: an integer is required, not float", conv);
        long long x = v.kind == JV_FLOAT ? (long long)v.u.f : (long long)v.u.i;
        snprintf(cfmt, sizeof cfmt, "%%%.*sll%c", (int)sn, spec, conv == 'u' ? 'd' : conv);
        snprintf(out, sizeof out, cfmt, x);
    } else {
        snprintf(cfmt, sizeof cfmt, "%%%.*s%c", (int)sn, spec, conv);
        snprintf(out, sizeof out, cfmt, v.kind == JV_FLOAT ? v.u.f : (double)v.u.i);
    }
    return jj_buf_put(r, b, out, strlen(out));
}

dt_status_t jj_str_percent(jj_render *r, jv fmt, jv args, uint32_t line, jv *out) {
    if (fmt.sub == JS_MARKUP) return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "Markup %% (it escapes its arguments)");
    const jv *items = &args;
    size_t nitems = 1, next = 0;
    const jj_dict *map = NULL;
    if (args.kind == JV_LIST && args.sub == JL_TUPLE) {
        items = args.u.l->v;
        nitems = args.u.l->n;
    } else if (args.kind == JV_DICT) {
        map = args.u.d;
    }
    /* Python takes any non-tuple with __getitem__ as a mapping: no "not all converted" */
    int mapping_like = args.kind == JV_DICT || args.kind == JV_UNDEF ||
                       (args.kind == JV_LIST && args.sub != JL_TUPLE && args.sub != JL_GEN);
    jj_buf b;
    jj_buf_init(&b);
    dt_status_t st = DT_STATUS_OK;
    const char *p = fmt.u.s.p;
    size_t n = fmt.u.s.n, run = 0;
    for (size_t i = 0; i < n && st == DT_STATUS_OK;) {
        if (p[i] != '%') {
            run++;
            i++;
            continue;
        }
        st = jj_buf_put(r, &b, p + i - run, run);
        run = 0;
        if (st != DT_STATUS_OK) break;
        size_t j = i + 1;
        jv v;
        int have = 0;
        if (j < n && p[j] == '(') {
            const char *close = memchr(p + j, ')', n - j);
            jv *got = close && map ? jj_dict_getn(map, p + j + 1, (size_t)(close - p) - j - 1) : NULL;
            if (!got) {
                st = jj_fail(r, line, DT_STATUS_INVALID, map ? "KeyError in %%(...) format" : "format requires a mapping");
                break;
            }
            v = *got;
            have = 1;
            j = (size_t)(close - p) + 1;
        }
        size_t spec = j;
        while (j < n && strchr("-+ #0123456789.", p[j])) j++;
        if (j >= n) {
            st = jj_fail(r, line, DT_STATUS_INVALID, "incomplete format");
            break;
        }
        char conv = p[j];
        if (conv == '%') {
            st = jj_buf_put(r, &b, "%", 1);
        } else if (!strchr("sradiuxXoeEfFgGc", conv)) {
            st = jj_fail(r, line, DT_STATUS_INVALID, "unsupported format character '%c'", conv);
        } else if (memchr(p + spec, '*', j - spec)) {
            st = jj_fail(r, line, DT_STATUS_UNSUPPORTED, "'*' width in %%-formatting");
        } else {
            if (!have) {
                if (map) v = args;
                else if (next >= nitems) {
                    st = jj_fail(r, line, DT_STATUS_INVALID, "not enough arguments for format string");
                    break;
                } else v = items[next++];
            }
            st = percent_one(r, p + spec, j - spec, conv, v, line, &b);
        }
        i = j + 1;
    }
    if (st == DT_STATUS_OK) st = jj_buf_put(r, &b, p + n - run, run);
    if (st == DT_STATUS_OK && !mapping_like && next < nitems)
        st = jj_fail(r, line, DT_STATUS_INVALID, "not all arguments converted during string formatting");
    if (st == DT_STATUS_OK) st = jj_buf_take(r, &b, out);
    free(b.p);
    return st;
}
