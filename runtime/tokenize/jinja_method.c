/*
 * jinja_method.c - what a template can call besides filters: the methods of
 * strings (Python's str methods templates use; their work is in jinja_str.c),
 * dicts, lists and loop.cycle; the globals jinja2 and transformers define (range,
 * namespace, dict, raise_exception, strftime_now); and the argument binding they
 * share with the filters.
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
    DT_CHECK(jj_need_str(r, sub, "substring", line));
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
        int64_t k = 0; /* the last match starting at a character */
        for (size_t j = 0;; j += jj_utf8_next(s.u.s.p + j, s.u.s.n - j), k++) {
            if (j + sub.u.s.n <= s.u.s.n && memcmp(s.u.s.p + j, sub.u.s.p, sub.u.s.n) == 0) at = k;
            if (j >= s.u.s.n) break;
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
            (id == M_ISDIGIT ? (cls & DT_UNI_NUMBER) != 0 : jj_case_unknown(cp)))
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
        if (h[1]) DT_CHECK(jj_need_int(r, a[1], "maxsplit", line));
        DT_CHECK(jj_str_split(r, s, h[0] ? a[0] : jv_none(), h[1] ? a[1].u.i : -1, m->id == M_RSPLIT, line, out));
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
        if (h[2]) DT_CHECK(jj_need_int(r, a[2], "count", line));
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
        return jj_str_format(r, s, args, nargs, kw, line, out);
    }
    case M_ISDIGIT: case M_ISALPHA: case M_ISALNUM: case M_ISSPACE: case M_ISLOWER: case M_ISUPPER: {
        NOARGS;
        return str_is(r, s, m->id, line, out);
    }
    case M_CENTER: case M_LJUST: case M_RJUST: {
        ARGS("width", "fillchar");
        if (!h[0]) return jj_fail(r, line, DT_STATUS_INVALID, "%s() takes at least 1 argument (0 given)", mname);
        return jj_str_pad(r, s, a[0], h[1] ? a[1] : jv_str(" ", 1), m->id == M_CENTER ? 0 : m->id == M_LJUST ? 1 : 2,
                       line, out);
    }
    case M_ZFILL: {
        ARGS("width");
        if (!h[0]) return jj_fail(r, line, DT_STATUS_INVALID, "zfill() takes exactly one argument (0 given)");
        DT_CHECK(jj_need_int(r, a[0], "width", line));
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
        DT_CHECK(jj_need_str(r, a[0], mname, line));
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
        for (size_t i = 0; i < nargs; i++) DT_CHECK(jj_need_int(r, args[i], "range", line));
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
