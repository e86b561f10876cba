/*
 * jinja_method.c - what a template can call besides filters: the methods of
 * strings (Python's str methods templates use), dicts, lists and loop.cycle; the
 * globals jinja2 and transformers define (range, namespace, dict,
 * raise_exception, strftime_now); printf-style `"%s" % x`; and the argument
 * binding they share with the filters.
 */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/tokenize/jinja_internal.h"
#include "runtime/tokenize/tok_unicode.h" /* defines: dt_uni_next, dt_uni_class, dt_uni_put */

#define MAX_RANGE 100000 /* jinja2.sandbox.MAX_RANGE */

dt_status_t jj_bind(jj_render *r, const char *fname, const char *const *names, int np, const jv *args, size_t nargs,
                    const char *const *kwn, const size_t *kwl, const jv *kwv, size_t nkw, uint32_t line, jv *out,
                    int *have) {
    for (int i = 0; i < np; i++) have[i] = 0;
    if (nargs > (size_t)np)
        return jj_fail(r, line, DT_STATUS_INVALID, "%s() takes at most %d argument(s) (%zu given)", fname, np, nargs);
    for (size_t i = 0; i < nargs; i++) {
        out[i] = args[i];
        have[i] = 1;
    }
    for (size_t k = 0; k < nkw; k++) {
        int i;
        for (i = 0; i < np; i++)
            if (strlen(names[i]) == kwl[k] && memcmp(names[i], kwn[k], kwl[k]) == 0) break;
        if (i == np)
            return jj_fail(r, line, DT_STATUS_INVALID, "%s() got an unexpected keyword argument '%.*s'", fname,
                           (int)kwl[k], kwn[k]);
        if (have[i])
            return jj_fail(r, line, DT_STATUS_INVALID, "%s() got multiple values for argument '%s'", fname, names[i]);
        out[i] = kwv[k];
        have[i] = 1;
    }
    return DT_STATUS_OK;
}

static dt_status_t need_str(jj_render *r, jv v, const char *what, uint32_t line) {
    if (v.kind == JV_STR) return DT_STATUS_OK;
    if (v.kind == JV_UNDEF) return jj_undef_fail(r, v, line);
    return jj_fail(r, line, DT_STATUS_INVALID, "%s must be str, not %s", what, jj_type_name(v));
}

static dt_status_t need_int(jj_render *r, jv v, const char *what, uint32_t line) {
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
    for (size_t i = 0; i + (size_t)k <= chars.u.s.n; i++)
        if (memcmp(chars.u.s.p + i, p, (size_t)k) == 0 && (i == 0 || ((unsigned char)chars.u.s.p[i] & 0xC0) != 0x80))
            return 1;
    return 0;
}

static int strip_here(const char *p, size_t n, const jv *chars, int *k) {
    int32_t cp;
    *k = dt_uni_next((const unsigned char *)p, n, &cp);
    return chars ? in_chars(p, *k, *chars) : jj_py_isspace(cp);
}

dt_status_t jj_str_strip(jj_render *r, jv s, const jv *chars, int left, int right, uint32_t line, jv *out) {
    DT_CHECK(need_str(r, s, "strip's string", line));
    if (chars && chars->kind == JV_NONE) chars = NULL;
    if (chars) DT_CHECK(need_str(r, *chars, "strip arg", line));
    size_t a = 0, b = s.u.s.n;
    int k;
    while (left && a < b && strip_here(s.u.s.p + a, b - a, chars, &k)) a += (size_t)k;
    while (right && b > a) {
        size_t st = b - 1;
        while (st > a && ((unsigned char)s.u.s.p[st] & 0xC0) == 0x80) st--;
        if (!strip_here(s.u.s.p + st, b - st, chars, &k)) break;
        b = st;
    }
    *out = mkstr(s, s.u.s.p + a, b - a);
    return DT_STATUS_OK;
}

dt_status_t jj_str_replace(jj_render *r, jv s, jv old, jv new_, int64_t count, uint32_t line, jv *out) {
    DT_CHECK(need_str(r, old, "replace() argument 1", line));
    DT_CHECK(need_str(r, new_, "replace() argument 2", line));
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
            size_t j = i + 1;
            while (j < s.u.s.n && ((unsigned char)s.u.s.p[j] & 0xC0) == 0x80) j++;
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

/* Letters that Python maps to another case and this file cannot (no Unicode case
 * tables): every non-ASCII letter outside the scripts that have no case, and the
 * few cased symbols. */
static int case_unknown(int32_t cp) {
    static const int32_t uncased[][2] = {
        {0x0590, 0x08FF}, {0x0900, 0x0DFF}, {0x0E00, 0x0FFF}, {0x1100, 0x11FF}, {0x3040, 0x31FF},
        {0x3400, 0x4DBF}, {0x4E00, 0x9FFF}, {0xA000, 0xA4CF}, {0xAC00, 0xD7AF}, {0xF900, 0xFAFF},
        {0x20000, 0x3FFFF},
    };
    if (cp < 0x80) return 0;
    if (cp == 0x345 || (cp >= 0x2160 && cp <= 0x217F) || (cp >= 0x24B6 && cp <= 0x24E9)) return 1;
    if (!(dt_uni_class(cp) & DT_UNI_LETTER)) return 0;
    for (size_t i = 0; i < sizeof uncased / sizeof uncased[0]; i++)
        if (cp >= uncased[i][0] && cp <= uncased[i][1]) return 0;
    return 1;
}

static int is_ascii_letter(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* jinja's title filter splits words at these. */
static int title_sep(int32_t cp) { return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || jj_py_isspace(cp); }

dt_status_t jj_str_case(jj_render *r, jv s, int how, uint32_t line, jv *out) {
    static const char *const names[] = {"lower", "upper", "capitalize", "title", "title"};
    DT_CHECK(need_str(r, s, names[how], line));
    char *o = jj_alloc(&r->arena, s.u.s.n + 1);
    if (!o) return jj_oom(r);
    int start = 1, prev_cased = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        int32_t cp;
        int k = dt_uni_next((const unsigned char *)s.u.s.p + i, s.u.s.n - i, &cp);
        if (case_unknown(cp))
            return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "%s() of the non-ASCII letter '%.*s' (no Unicode case "
                           "tables here)", names[how], k, s.u.s.p + i);
        memcpy(o + i, s.u.s.p + i, (size_t)k);
        if (k == 1) {
            int c = (unsigned char)o[i], up;
            switch (how) {
            case 0: up = 0; break;
            case 1: up = 1; break;
            case 2: up = i == 0; break;
            case 3: up = start; start = title_sep(cp); break;
            default: up = !prev_cased; prev_cased = is_ascii_letter(c); break;
            }
            if (is_ascii_letter(c)) o[i] = (char)(up ? (c & ~0x20) : (c | 0x20));
        } else {
            start = how == 3 ? title_sep(cp) : 0;
            prev_cased = 0;
        }
        i += (size_t)k;
    }
    *out = mkstr(s, o, s.u.s.n);
    return DT_STATUS_OK;
}

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

static dt_status_t str_split(jj_render *r, jv s, jv sep, int64_t maxsplit, int from_right, uint32_t line, jv *out) {
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
                    size_t st = i - 1;
                    while (st > 0 && ((unsigned char)rest.u.s.p[st] & 0xC0) == 0x80) st--;
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
        DT_CHECK(need_str(r, sep, "separator", line));
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

static dt_status_t str_pad(jj_render *r, jv s, jv width, jv fill, int how, uint32_t line, jv *out) {
    DT_CHECK(need_int(r, width, "width", line));
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

static dt_status_t str_format(jj_render *r, jv s, const jv *args, size_t nargs, const jj_dict *kw, uint32_t line,
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

/* ---- methods ---- */

enum {
    M_UNSUPPORTED, /* a real method of the type, not implemented: fails when called */
    /* str */
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_SPLITLINES, M_STARTSWITH, M_ENDSWITH, M_UPPER, M_LOWER,
    M_TITLE, M_CAPITALIZE, M_REPLACE, M_FIND, M_RFIND, M_INDEX, M_RINDEX, M_COUNT, M_JOIN, M_FORMAT, M_ISDIGIT,
    M_ISALPHA, M_ISALNUM, M_ISSPACE, M_ISLOWER, M_ISUPPER, M_CENTER, M_LJUST, M_RJUST, M_ZFILL, M_REMOVEPREFIX,
    M_REMOVESUFFIX,
    /* dict */
    M_GET, M_ITEMS, M_KEYS, M_VALUES, M_COPY,
    /* list, tuple */
    M_LINDEX, M_LCOUNT,
    /* loop */
    M_CYCLE,
};

static const struct {
    const char *name;
    int id;
} STR_M[] = {
    {"strip", M_STRIP}, {"lstrip", M_LSTRIP}, {"rstrip", M_RSTRIP}, {"split", M_SPLIT}, {"rsplit", M_RSPLIT},
    {"splitlines", M_SPLITLINES}, {"startswith", M_STARTSWITH}, {"endswith", M_ENDSWITH}, {"upper", M_UPPER},
    {"lower", M_LOWER}, {"title", M_TITLE}, {"capitalize", M_CAPITALIZE}, {"replace", M_REPLACE},
    {"find", M_FIND}, {"rfind", M_RFIND}, {"index", M_INDEX}, {"rindex", M_RINDEX}, {"count", M_COUNT},
    {"join", M_JOIN}, {"format", M_FORMAT}, {"isdigit", M_ISDIGIT}, {"isalpha", M_ISALPHA},
    {"isalnum", M_ISALNUM}, {"isspace", M_ISSPACE}, {"islower", M_ISLOWER}, {"isupper", M_ISUPPER},
    {"center", M_CENTER}, {"ljust", M_LJUST}, {"rjust", M_RJUST}, {"zfill", M_ZFILL},
    {"removeprefix", M_REMOVEPREFIX}, {"removesuffix", M_REMOVESUFFIX},
    {"casefold", M_UNSUPPORTED}, {"encode", M_UNSUPPORTED}, {"expandtabs", M_UNSUPPORTED},
    {"format_map", M_UNSUPPORTED}, {"isascii", M_UNSUPPORTED}, {"isdecimal", M_UNSUPPORTED},
    {"isidentifier", M_UNSUPPORTED}, {"isnumeric", M_UNSUPPORTED}, {"isprintable", M_UNSUPPORTED},
    {"istitle", M_UNSUPPORTED}, {"maketrans", M_UNSUPPORTED}, {"partition", M_UNSUPPORTED},
    {"rpartition", M_UNSUPPORTED}, {"swapcase", M_UNSUPPORTED}, {"translate", M_UNSUPPORTED},
}, DICT_M[] = {
    {"get", M_GET}, {"items", M_ITEMS}, {"keys", M_KEYS}, {"values", M_VALUES}, {"copy", M_COPY},
    {"fromkeys", M_UNSUPPORTED},
}, LIST_M[] = {
    {"index", M_LINDEX}, {"count", M_LCOUNT}, {"copy", M_UNSUPPORTED},
};

static int find_m(const char *name, size_t n, const void *table, size_t count) {
    const struct { const char *name; int id; } *t = table;
    for (size_t i = 0; i < count; i++)
        if (strlen(t[i].name) == n && memcmp(t[i].name, name, n) == 0) return t[i].id;
    return -1;
}

int jj_method_lookup(jj_render *r, jv self, const char *name, size_t n, jv *out) {
    int id = -1;
    if (self.kind == JV_STR) id = find_m(name, n, STR_M, sizeof STR_M / sizeof STR_M[0]);
    else if (self.kind == JV_DICT) id = find_m(name, n, DICT_M, sizeof DICT_M / sizeof DICT_M[0]);
    else if (self.kind == JV_LIST && (self.sub == JL_LIST || self.sub == JL_TUPLE || self.sub == JL_RANGE))
        id = find_m(name, n, LIST_M, sizeof LIST_M / sizeof LIST_M[0]);
    else if (self.kind == JV_LOOP && n == 5 && memcmp(name, "cycle", 5) == 0) id = M_CYCLE;
    else if (self.kind == JV_LOOP && n == 7 && memcmp(name, "changed", 7) == 0) id = M_UNSUPPORTED;
    if (id < 0) return 0;
    jj_method *m = jj_alloc(&r->arena, sizeof *m);
    if (!m) return -1;
    m->self = self;
    m->id = id;
    m->name = name;
    m->n = n;
    *out = (jv){.kind = JV_METHOD, .u.meth = m};
    return 1;
}

/* A view of a dict (keys, values or items) as a list. */
static dt_status_t dict_view(jj_render *r, const jj_dict *d, int sub, jv *out) {
    jj_list *l = jj_list_new(r, d->n);
    if (!l) return jj_oom(r);
    for (size_t i = 0; i < d->n; i++) {
        jv v = sub == JL_KEYS ? d->k[i] : d->v[i];
        if (sub == JL_ITEMS) {
            jj_list *pair = jj_list_new(r, 2);
            if (!pair) return jj_oom(r);
            pair->v[0] = d->k[i];
            pair->v[1] = d->v[i];
            pair->n = 2;
            v = (jv){.kind = JV_LIST, .sub = JL_TUPLE, .u.l = pair};
        }
        DT_CHECK(jj_list_push(r, l, v));
    }
    *out = (jv){.kind = JV_LIST, .sub = (uint8_t)sub, .u.l = l};
    return DT_STATUS_OK;
}

/* startswith / endswith: a string or a tuple of strings. */
static dt_status_t affix(jj_render *r, jv s, jv a, int end, uint32_t line, int *out) {
    const jv *cands = &a;
    size_t nc = 1;
    if (a.kind == JV_LIST && a.sub == JL_TUPLE) {
        cands = a.u.l->v;
        nc = a.u.l->n;
    }
    *out = 0;
    for (size_t i = 0; i < nc; i++) {
        if (cands[i].kind != JV_STR)
            return jj_fail(r, line, DT_STATUS_INVALID, "%s first arg must be str or a tuple of str, not %s",
                           end ? "endswith" : "startswith", jj_type_name(cands[i]));
        size_t k = cands[i].u.s.n;
        if (k <= s.u.s.n && memcmp(s.u.s.p + (end ? s.u.s.n - k : 0), cands[i].u.s.p, k) == 0) *out = 1;
    }
    return DT_STATUS_OK;
}

/* str.find / rfind / index / rindex / count on code point indexes. */
static dt_status_t str_search(jj_render *r, jv s, jv sub, int id, uint32_t line, jv *out) {
    DT_CHECK(need_str(r, sub, "substring", line));
    if (id == M_COUNT) {
        int64_t c = 0;
        if (!sub.u.s.n) {
            c = (int64_t)jj_utf8_count(s.u.s.p, s.u.s.n) + 1;
        } else {
            for (size_t i = 0; i + sub.u.s.n <= s.u.s.n;) {
                const char *hit = memmem(s.u.s.p + i, s.u.s.n - i, sub.u.s.p, sub.u.s.n);
                if (!hit) break;
                c++;
                i = (size_t)(hit - s.u.s.p) + sub.u.s.n;
            }
        }
        *out = jv_int(c);
        return DT_STATUS_OK;
    }
    int64_t at = -1;
    if (id == M_FIND || id == M_INDEX) {
        const char *hit = memmem(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n);
        if (hit || !sub.u.s.n) at = hit ? (int64_t)jj_utf8_count(s.u.s.p, (size_t)(hit - s.u.s.p)) : 0;
    } else {
        for (size_t j = s.u.s.n + 1; j-- > 0;)
            if (j + sub.u.s.n <= s.u.s.n && memcmp(s.u.s.p + j, sub.u.s.p, sub.u.s.n) == 0 &&
                (j == s.u.s.n || ((unsigned char)s.u.s.p[j] & 0xC0) != 0x80)) {
                at = (int64_t)jj_utf8_count(s.u.s.p, j);
                break;
            }
    }
    if (at < 0 && (id == M_INDEX || id == M_RINDEX))
        return jj_fail(r, line, DT_STATUS_INVALID, "substring not found");
    *out = jv_int(at);
    return DT_STATUS_OK;
}

static dt_status_t str_is(jj_render *r, jv s, int id, uint32_t line, jv *out) {
    int any = 0, all = 1, cased = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        int32_t cp;
        int k = dt_uni_next((const unsigned char *)s.u.s.p + i, s.u.s.n - i, &cp);
        int cls = cp >= 0 ? dt_uni_class(cp) : 0, ok;
        if ((id == M_ISDIGIT || id == M_ISLOWER || id == M_ISUPPER) && cp >= 0x80 &&
            (id == M_ISDIGIT ? (cls & DT_UNI_NUMBER) != 0 : case_unknown(cp)))
            return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "str.%s() of the non-ASCII character '%.*s'",
                           id == M_ISDIGIT ? "isdigit" : id == M_ISLOWER ? "islower" : "isupper", k, s.u.s.p + i);
        switch (id) {
        case M_ISDIGIT: ok = cp >= '0' && cp <= '9'; break;
        case M_ISALPHA: ok = (cls & DT_UNI_LETTER) != 0; break;
        case M_ISALNUM: ok = (cls & (DT_UNI_LETTER | DT_UNI_NUMBER)) != 0; break;
        case M_ISSPACE: ok = jj_py_isspace(cp); break;
        case M_ISLOWER: ok = !(cp >= 'A' && cp <= 'Z'); cased |= cp >= 'a' && cp <= 'z'; break;
        default: ok = !(cp >= 'a' && cp <= 'z'); cased |= cp >= 'A' && cp <= 'Z'; break;
        }
        any = 1;
        all &= ok;
        i += (size_t)k;
    }
    *out = jv_bool(id == M_ISLOWER || id == M_ISUPPER ? all && cased : any && all);
    return DT_STATUS_OK;
}

#define NOARGS DT_CHECK(jj_bind(r, mname, NULL, 0, args, nargs, kwn, kwl, kwv, nkw, line, NULL, NULL))
#define ARGS(...) static const char *const P[] = {__VA_ARGS__}; jv a[sizeof P / sizeof P[0]]; \
    int h[sizeof P / sizeof P[0]]; \
    DT_CHECK(jj_bind(r, mname, P, (int)(sizeof P / sizeof P[0]), args, nargs, kwn, kwl, kwv, nkw, line, a, h))

dt_status_t jj_method_call(jj_render *r, const jj_method *m, const jv *args, size_t nargs, const char *const *kwn,
                           const size_t *kwl, const jv *kwv, size_t nkw, uint32_t line, jv *out) {
    jv s = m->self;
    char mname[32];
    snprintf(mname, sizeof mname, "%.*s", (int)(m->n < 31 ? m->n : 31), m->name);
    switch (m->id) {
    case M_STRIP: case M_LSTRIP: case M_RSTRIP: {
        ARGS("chars");
        return jj_str_strip(r, s, h[0] ? &a[0] : NULL, m->id != M_RSTRIP, m->id != M_LSTRIP, line, out);
    }
    case M_SPLIT: case M_RSPLIT: {
        ARGS("sep", "maxsplit");
        if (h[1]) DT_CHECK(need_int(r, a[1], "maxsplit", line));
        DT_CHECK(str_split(r, s, h[0] ? a[0] : jv_none(), h[1] ? a[1].u.i : -1, m->id == M_RSPLIT, line, out));
        for (size_t i = 0; i < out->u.l->n; i++) out->u.l->v[i].sub = s.sub; /* Markup splits into Markup */
        return DT_STATUS_OK;
    }
    case M_SPLITLINES: {
        ARGS("keepends");
        jj_list *l;
        DT_CHECK(jj_str_splitlines(r, s.u.s.p, s.u.s.n, h[0] && jj_truthy(a[0]), &l));
        for (size_t i = 0; i < l->n; i++) l->v[i].sub = s.sub;
        *out = (jv){.kind = JV_LIST, .sub = JL_LIST, .u.l = l};
        return DT_STATUS_OK;
    }
    case M_STARTSWITH: case M_ENDSWITH: {
        ARGS("prefix");
        if (!h[0]) return jj_fail(r, line, DT_STATUS_INVALID, "%s() takes at least 1 argument (0 given)", mname);
        int res;
        DT_CHECK(affix(r, s, a[0], m->id == M_ENDSWITH, line, &res));
        *out = jv_bool(res);
        return DT_STATUS_OK;
    }
    case M_UPPER: case M_LOWER: case M_TITLE: case M_CAPITALIZE: {
        NOARGS;
        return jj_str_case(r, s, m->id == M_LOWER ? 0 : m->id == M_UPPER ? 1 : m->id == M_CAPITALIZE ? 2 : 4, line, out);
    }
    case M_REPLACE: {
        ARGS("old", "new", "count");
        if (!h[0] || !h[1]) return jj_fail(r, line, DT_STATUS_INVALID, "replace() takes at least 2 arguments");
        if (h[2]) DT_CHECK(need_int(r, a[2], "count", line));
        return jj_str_replace(r, s, a[0], a[1], h[2] ? a[2].u.i : -1, line, out);
    }
    case M_FIND: case M_RFIND: case M_INDEX: case M_RINDEX: case M_COUNT: {
        ARGS("sub");
        if (!h[0]) return jj_fail(r, line, DT_STATUS_INVALID, "%s() takes at least 1 argument (0 given)", mname);
        return str_search(r, s, a[0], m->id, line, out);
    }
    case M_JOIN: {
        ARGS("iterable");
        if (s.sub == JS_MARKUP)
            return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "Markup.join (it escapes what it joins)");
        if (!h[0]) return jj_fail(r, line, DT_STATUS_INVALID, "join() takes exactly one argument (0 given)");
        jv *items;
        size_t n;
        DT_CHECK(jj_iter(r, a[0], line, &items, &n));
        jj_buf b;
        jj_buf_init(&b);
        dt_status_t st = DT_STATUS_OK;
        for (size_t i = 0; i < n && st == DT_STATUS_OK; i++) {
            if (items[i].kind != JV_STR) {
                st = jj_fail(r, line, DT_STATUS_INVALID, "sequence item %zu: expected str instance, %s found", i,
                             jj_type_name(items[i]));
                break;
            }
            if (i) st = jj_buf_put(r, &b, s.u.s.p, s.u.s.n);
            if (st == DT_STATUS_OK) st = jj_buf_put(r, &b, items[i].u.s.p, items[i].u.s.n);
        }
        if (st == DT_STATUS_OK) st = jj_buf_take(r, &b, out);
        free(b.p);
        return st;
    }
    case M_FORMAT: {
        if (s.sub == JS_MARKUP)
            return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "Markup.format (it escapes its arguments)");
        jj_dict *kw = jj_dict_new(r, nkw);
        if (!kw) return jj_oom(r);
        for (size_t k = 0; k < nkw; k++) DT_CHECK(jj_dict_set(r, kw, jv_str(kwn[k], kwl[k]), kwv[k]));
        return str_format(r, s, args, nargs, kw, line, out);
    }
    case M_ISDIGIT: case M_ISALPHA: case M_ISALNUM: case M_ISSPACE: case M_ISLOWER: case M_ISUPPER: {
        NOARGS;
        return str_is(r, s, m->id, line, out);
    }
    case M_CENTER: case M_LJUST: case M_RJUST: {
        ARGS("width", "fillchar");
        if (!h[0]) return jj_fail(r, line, DT_STATUS_INVALID, "%s() takes at least 1 argument (0 given)", mname);
        return str_pad(r, s, a[0], h[1] ? a[1] : jv_str(" ", 1), m->id == M_CENTER ? 0 : m->id == M_LJUST ? 1 : 2,
                       line, out);
    }
    case M_ZFILL: {
        ARGS("width");
        if (!h[0]) return jj_fail(r, line, DT_STATUS_INVALID, "zfill() takes exactly one argument (0 given)");
        DT_CHECK(need_int(r, a[0], "width", line));
        int64_t len = (int64_t)jj_utf8_count(s.u.s.p, s.u.s.n);
        if (a[0].u.i <= len) return *out = s, DT_STATUS_OK;
        size_t pad = (size_t)(a[0].u.i - len), sign = s.u.s.n && (s.u.s.p[0] == '+' || s.u.s.p[0] == '-');
        char *p = jj_alloc(&r->arena, s.u.s.n + pad + 1);
        if (!p) return jj_oom(r);
        memcpy(p, s.u.s.p, sign);
        memset(p + sign, '0', pad);
        memcpy(p + sign + pad, s.u.s.p + sign, s.u.s.n - sign);
        *out = jv_str(p, s.u.s.n + pad);
        return DT_STATUS_OK;
    }
    case M_REMOVEPREFIX: case M_REMOVESUFFIX: {
        ARGS("affix");
        if (!h[0]) return jj_fail(r, line, DT_STATUS_INVALID, "%s() takes exactly one argument (0 given)", mname);
        DT_CHECK(need_str(r, a[0], mname, line));
        int res;
        DT_CHECK(affix(r, s, a[0], m->id == M_REMOVESUFFIX, line, &res));
        *out = s;
        if (res) {
            out->u.s.n -= a[0].u.s.n;
            if (m->id == M_REMOVEPREFIX) out->u.s.p += a[0].u.s.n;
        }
        return DT_STATUS_OK;
    }
    case M_GET: {
        ARGS("key", "default");
        if (!h[0]) return jj_fail(r, line, DT_STATUS_INVALID, "get expected at least 1 argument, got 0");
        jv *v = jj_dict_get(s.u.d, a[0]);
        *out = v ? *v : h[1] ? a[1] : jv_none();
        return DT_STATUS_OK;
    }
    case M_ITEMS: case M_KEYS: case M_VALUES: {
        NOARGS;
        return dict_view(r, s.u.d, m->id == M_ITEMS ? JL_ITEMS : m->id == M_KEYS ? JL_KEYS : JL_VALUES, out);
    }
    case M_COPY: {
        NOARGS;
        jj_dict *d = jj_dict_new(r, s.u.d->n);
        if (!d) return jj_oom(r);
        for (size_t i = 0; i < s.u.d->n; i++) DT_CHECK(jj_dict_set(r, d, s.u.d->k[i], s.u.d->v[i]));
        *out = (jv){.kind = JV_DICT, .u.d = d};
        return DT_STATUS_OK;
    }
    case M_LINDEX: case M_LCOUNT: {
        ARGS("value");
        if (!h[0]) return jj_fail(r, line, DT_STATUS_INVALID, "%s() takes exactly one argument (0 given)", mname);
        int64_t c = 0;
        for (size_t i = 0; i < s.u.l->n; i++) {
            if (!jj_eq(s.u.l->v[i], a[0])) continue;
            if (m->id == M_LINDEX) return *out = jv_int((int64_t)i), DT_STATUS_OK;
            c++;
        }
        if (m->id == M_LINDEX) return jj_fail(r, line, DT_STATUS_INVALID, "value is not in list");
        *out = jv_int(c);
        return DT_STATUS_OK;
    }
    case M_CYCLE:
        if (!nargs) return jj_fail(r, line, DT_STATUS_INVALID, "no items for cycling given");
        *out = args[s.u.loop->i % nargs];
        return DT_STATUS_OK;
    default:
        return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "the method %s() of %s is not supported", mname,
                       jj_type_name(s));
    }
}

/* ---- globals ---- */

static const char *const GLOBALS[JJ_FN_COUNT_] = {
    [JJ_FN_RANGE] = "range", [JJ_FN_NAMESPACE] = "namespace", [JJ_FN_DICT] = "dict",
    [JJ_FN_RAISE] = "raise_exception", [JJ_FN_STRFTIME] = "strftime_now", [JJ_FN_LIPSUM] = "lipsum",
    [JJ_FN_CYCLER] = "cycler", [JJ_FN_JOINER] = "joiner",
};

int jj_global_lookup(const char *name, size_t n, jv *out) {
    for (int i = 0; i < JJ_FN_COUNT_; i++)
        if (strlen(GLOBALS[i]) == n && memcmp(GLOBALS[i], name, n) == 0) {
            *out = (jv){.kind = JV_FUNC, .u.i = i};
            return 1;
        }
    return 0;
}

/* dict(*args, **kwargs) for dict() and namespace(). */
static dt_status_t make_dict(jj_render *r, const char *fname, const jv *args, size_t nargs, const char *const *kwn,
                             const size_t *kwl, const jv *kwv, size_t nkw, uint32_t line, jj_dict **out) {
    *out = NULL;
    jj_dict *d = jj_dict_new(r, nkw);
    if (!d) return jj_oom(r);
    if (nargs > 1) return jj_fail(r, line, DT_STATUS_INVALID, "%s expected at most 1 argument, got %zu", fname, nargs);
    if (nargs == 1) {
        jv a = args[0];
        if (a.kind == JV_DICT || a.kind == JV_NS) {
            for (size_t i = 0; i < a.u.d->n; i++) DT_CHECK(jj_dict_set(r, d, a.u.d->k[i], a.u.d->v[i]));
        } else {
            jv *items;
            size_t n;
            DT_CHECK(jj_iter(r, a, line, &items, &n));
            for (size_t i = 0; i < n; i++) {
                jv *pair;
                size_t pn;
                DT_CHECK(jj_iter(r, items[i], line, &pair, &pn));
                if (pn != 2)
                    return jj_fail(r, line, DT_STATUS_INVALID, "dictionary update sequence element #%zu has length "
                                   "%zu; 2 is required", i, pn);
                DT_CHECK(jj_dict_set(r, d, pair[0], pair[1]));
            }
        }
    }
    for (size_t k = 0; k < nkw; k++) DT_CHECK(jj_dict_set(r, d, jv_str(kwn[k], kwl[k]), kwv[k]));
    *out = d;
    return DT_STATUS_OK;
}

dt_status_t jj_global_call(jj_render *r, int id, const jv *args, size_t nargs, const char *const *kwn,
                           const size_t *kwl, const jv *kwv, size_t nkw, uint32_t line, jv *out) {
    const char *mname = GLOBALS[id];
    switch (id) {
    case JJ_FN_RANGE: {
        if (nkw) return jj_fail(r, line, DT_STATUS_INVALID, "range() takes no keyword arguments");
        if (nargs < 1 || nargs > 3)
            return jj_fail(r, line, DT_STATUS_INVALID, "range expected 1 to 3 arguments, got %zu", nargs);
        for (size_t i = 0; i < nargs; i++) DT_CHECK(need_int(r, args[i], "range", line));
        int64_t start = nargs > 1 ? args[0].u.i : 0, stop = nargs > 1 ? args[1].u.i : args[0].u.i;
        int64_t step = nargs > 2 ? args[2].u.i : 1;
        if (!step) return jj_fail(r, line, DT_STATUS_INVALID, "range() arg 3 must not be zero");
        double count = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                                : ceil(((double)start - (double)stop) / -(double)step);
        if (count > MAX_RANGE)
            return jj_fail(r, line, DT_STATUS_INVALID, "Range too big. The sandbox blocks ranges larger than "
                           "MAX_RANGE (%d).", MAX_RANGE);
        jj_list *l = jj_list_new(r, count > 0 ? (size_t)count : 0);
        if (!l) return jj_oom(r);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) DT_CHECK(jj_list_push(r, l, jv_int(i)));
        l->start = start;
        l->stop = stop;
        l->step = step;
        *out = (jv){.kind = JV_LIST, .sub = JL_RANGE, .u.l = l};
        return DT_STATUS_OK;
    }
    case JJ_FN_NAMESPACE: case JJ_FN_DICT: {
        jj_dict *d;
        DT_CHECK(make_dict(r, mname, args, nargs, kwn, kwl, kwv, nkw, line, &d));
        if (id == JJ_FN_NAMESPACE)
            for (size_t i = 0; i < d->n; i++)
                if (d->k[i].kind == JV_STR && d->k[i].u.s.n && d->k[i].u.s.p[0] == '_')
                    return jj_fail(r, line, DT_STATUS_INVALID, "Chat templates cannot store underscore-prefixed "
                                   "attributes on a namespace, but got '%.*s'.", (int)d->k[i].u.s.n, d->k[i].u.s.p);
        *out = (jv){.kind = id == JJ_FN_NAMESPACE ? JV_NS : JV_DICT, .u.d = d};
        return DT_STATUS_OK;
    }
    case JJ_FN_RAISE: {
        static const char *const P[] = {"message"};
        jv a[1];
        int h[1];
        DT_CHECK(jj_bind(r, mname, P, 1, args, nargs, kwn, kwl, kwv, nkw, line, a, h));
        if (!h[0]) return jj_fail(r, line, DT_STATUS_INVALID, "raise_exception() missing 1 required positional "
                                  "argument: 'message'");
        jv msg;
        DT_CHECK(jj_to_str(r, a[0], line, &msg));
        return jj_fail(r, line, DT_STATUS_INVALID, "%.*s", (int)(msg.u.s.n > 800 ? 800 : msg.u.s.n), msg.u.s.p);
    }
    case JJ_FN_STRFTIME: {
        static const char *const P[] = {"format"};
        jv a[1];
        int h[1];
        DT_CHECK(jj_bind(r, mname, P, 1, args, nargs, kwn, kwl, kwv, nkw, line, a, h));
        if (!h[0] || a[0].kind != JV_STR)
            return jj_fail(r, line, DT_STATUS_INVALID, "strftime_now() takes a format string");
        char fmt[256], buf[512];
        if (a[0].u.s.n >= sizeof fmt) return jj_fail(r, line, DT_STATUS_INVALID, "strftime_now(): format too long");
        memcpy(fmt, a[0].u.s.p, a[0].u.s.n);
        fmt[a[0].u.s.n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        return jj_strdup(r, buf, n, out);
    }
    default:
        return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "the global %s() is not supported", mname);
    }
}
