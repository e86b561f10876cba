/*
 * jinja_str.c - Python's str operations as templates call them: strip with or
 * without characters, replace, split and rsplit (whitespace runs or a separator,
 * maxsplit), splitlines, case mapping (exact for ASCII; other cased letters are
 * refused rather than guessed), padding, str.format and printf-style `%`.
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
    DT_CHECK(jj_need_str(r, s, "strip's string", line));
    if (chars && chars->kind == JV_NONE) chars = NULL;
    if (chars) DT_CHECK(jj_need_str(r, *chars, "strip arg", line));
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
int jj_case_unknown(int32_t cp) {
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
    DT_CHECK(jj_need_str(r, s, names[how], line));
    char *o = jj_alloc(&r->arena, s.u.s.n + 1);
    if (!o) return jj_oom(r);
    int start = 1, prev_cased = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        int32_t cp;
        int k = dt_uni_next((const unsigned char *)s.u.s.p + i, s.u.s.n - i, &cp);
        if (jj_case_unknown(cp))
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
