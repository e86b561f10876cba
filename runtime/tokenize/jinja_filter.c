/*
 * jinja_filter.c - jinja2's filters as the renderer runs them, with
 * their Python signatures (positional and keyword arguments), and transformers'
 * tojson (json.dumps with ensure_ascii=False, indent, separators, sort_keys).
 * Filters that return generators in jinja2 (map, select, reject, selectattr,
 * rejectattr, unique, items, reverse of a list) return one here too: true
 * whatever it holds, no len(), empty once iterated.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/tokenize/jinja_internal.h"
#include "runtime/tokenize/tok_unicode.h" /* defines: dt_uni_next, dt_uni_class */

enum {
    F_ABS, F_ATTR, F_CAPITALIZE, F_CENTER, F_DEFAULT, F_DICTSORT, F_ESCAPE, F_FIRST, F_FLOAT, F_FORCEESCAPE,
    F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT,
    F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE,
    F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT,
};

static const struct {
    const char *name;
    int id; /* -2: jinja2 has it, not implemented */
} FILTERS[] = {
    {"abs", F_ABS}, {"attr", F_ATTR}, {"batch", -2}, {"capitalize", F_CAPITALIZE}, {"center", F_CENTER},
    {"count", F_LENGTH}, {"d", F_DEFAULT}, {"default", F_DEFAULT}, {"dictsort", F_DICTSORT}, {"e", F_ESCAPE},
    {"escape", F_ESCAPE}, {"filesizeformat", -2}, {"first", F_FIRST}, {"float", F_FLOAT},
    {"forceescape", F_FORCEESCAPE}, {"format", F_FORMAT}, {"groupby", -2}, {"indent", F_INDENT}, {"int", F_INT},
    {"items", F_ITEMS}, {"join", F_JOIN}, {"last", F_LAST}, {"length", F_LENGTH}, {"list", F_LIST},
    {"lower", F_LOWER}, {"map", F_MAP}, {"max", F_MAX}, {"min", F_MIN}, {"pprint", -2}, {"random", -2},
    {"reject", F_REJECT}, {"rejectattr", F_REJECTATTR}, {"replace", F_REPLACE}, {"reverse", F_REVERSE},
    {"round", F_ROUND}, {"safe", F_SAFE}, {"select", F_SELECT}, {"selectattr", F_SELECTATTR}, {"slice", -2},
    {"sort", F_SORT}, {"string", F_STRING}, {"striptags", -2}, {"sum", F_SUM}, {"title", F_TITLE},
    {"tojson", F_TOJSON}, {"trim", F_TRIM}, {"truncate", -2}, {"unique", F_UNIQUE}, {"upper", F_UPPER},
    {"urlencode", -2}, {"urlize", -2}, {"wordcount", F_WORDCOUNT}, {"wordwrap", -2}, {"xmlattr", -2},
};

int jj_filter_id(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
        if (strlen(FILTERS[i].name) == n && memcmp(FILTERS[i].name, name, n) == 0) return FILTERS[i].id;
    return -1;
}

static int is_num(jv v) { return v.kind == JV_INT || v.kind == JV_BOOL || v.kind == JV_FLOAT; }

/* ---- attribute getters (make_attrgetter) ---- */

#define MAX_PARTS 8
typedef struct getter {
    jv part[MAX_PARTS][MAX_PARTS]; /* comma-separated attributes, each a dotted path */
    int nparts[MAX_PARTS];
    int nattr;                     /* 0: the item itself */
    jv dflt;                       /* JV_UNDEF: none */
    int ignore_case;
} getter;

static dt_status_t getter_init(jj_render *r, jv attribute, int multi, jv dflt, int ignore_case, uint32_t line,
                               getter *g) {
    memset(g, 0, sizeof *g);
    g->dflt = dflt.kind == JV_NONE ? (jv){.kind = JV_UNDEF} : dflt;
    g->ignore_case = ignore_case;
    if (attribute.kind == JV_NONE || attribute.kind == JV_UNDEF) return DT_STATUS_OK;
    if (attribute.kind == JV_INT) {
        g->part[0][0] = attribute;
        g->nparts[0] = 1;
        g->nattr = 1;
        return DT_STATUS_OK;
    }
    if (attribute.kind != JV_STR)
        return jj_fail(r, line, DT_STATUS_INVALID, "attribute must be a string or an integer, not %s",
                       jj_type_name(attribute));
    const char *p = attribute.u.s.p, *end = p + attribute.u.s.n;
    while (p <= end) {
        const char *comma = multi ? memchr(p, ',', (size_t)(end - p)) : NULL;
        const char *aend = comma ? comma : end;
        if (g->nattr == MAX_PARTS) return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "more than %d attributes", MAX_PARTS);
        int k = g->nattr++;
        for (const char *q = p; q <= aend;) {
            const char *dot = memchr(q, '.', (size_t)(aend - q));
            const char *qend = dot ? dot : aend;
            if (g->nparts[k] == MAX_PARTS)
                return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "attribute paths deeper than %d", MAX_PARTS);
            int digits = qend > q;
            for (const char *c = q; c < qend; c++) digits &= *c >= '0' && *c <= '9';
            g->part[k][g->nparts[k]++] = digits ? jv_int(strtoll(q, NULL, 10)) : jv_str(q, (size_t)(qend - q));
            if (!dot) break;
            q = dot + 1;
        }
        if (!comma) break;
        p = comma + 1;
    }
    return DT_STATUS_OK;
}

static dt_status_t getter_one(jj_render *r, const getter *g, int k, jv item, uint32_t line, jv *out) {
    for (int i = 0; i < g->nparts[k]; i++) {
        DT_CHECK(jj_getitem(r, item, g->part[k][i], line, &item));
        if (item.kind == JV_UNDEF && g->dflt.kind != JV_UNDEF) item = g->dflt;
    }
    if (g->ignore_case && item.kind == JV_STR) DT_CHECK(jj_str_case(r, item, 0, line, &item));
    *out = item;
    return DT_STATUS_OK;
}

static dt_status_t getter_apply(jj_render *r, const getter *g, jv item, uint32_t line, jv *out) {
    if (g->nattr <= 1) {
        if (g->nattr == 0) {
            if (g->ignore_case && item.kind == JV_STR) return jj_str_case(r, item, 0, line, out);
            *out = item;
            return DT_STATUS_OK;
        }
        return getter_one(r, g, 0, item, line, out);
    }
    jj_list *l = jj_list_new(r, (size_t)g->nattr);
    if (!l) return jj_oom(r);
    for (int k = 0; k < g->nattr; k++) {
        jv v;
        DT_CHECK(getter_one(r, g, k, item, line, &v));
        DT_CHECK(jj_list_push(r, l, v));
    }
    *out = (jv){.kind = JV_LIST, .sub = JL_LIST, .u.l = l};
    return DT_STATUS_OK;
}

/* ---- sorting (stable, like sorted()) ---- */

static dt_status_t msort(jj_render *r, const jv *keys, size_t *idx, size_t *tmp, size_t n, int rev, uint32_t line) {
    if (n < 2) return DT_STATUS_OK;
    size_t h = n / 2;
    DT_CHECK(msort(r, keys, idx, tmp, h, rev, line));
    DT_CHECK(msort(r, keys, idx + h, tmp, n - h, rev, line));
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c;
        DT_CHECK(jj_cmp(r, keys[idx[j]], keys[idx[i]], line, &c));
        tmp[k++] = (rev ? c > 0 : c < 0) ? idx[j++] : idx[i++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
    return DT_STATUS_OK;
}

/* items sorted by the getter's keys into *out (a list). */
static dt_status_t sort_items(jj_render *r, const jv *items, size_t n, const getter *g, int rev, uint32_t line,
                              jv *out) {
    jv *keys = jj_alloc(&r->arena, (n + 1) * sizeof *keys);
    size_t *idx = jj_alloc(&r->arena, (n + 1) * sizeof *idx), *tmp = jj_alloc(&r->arena, (n + 1) * sizeof *tmp);
    jj_list *l = jj_list_new(r, n);
    if (!keys || !idx || !tmp || !l) return jj_oom(r);
    for (size_t i = 0; i < n; i++) {
        DT_CHECK(getter_apply(r, g, items[i], line, &keys[i]));
        idx[i] = i;
    }
    DT_CHECK(msort(r, keys, idx, tmp, n, rev, line));
    for (size_t i = 0; i < n; i++) DT_CHECK(jj_list_push(r, l, items[idx[i]]));
    *out = (jv){.kind = JV_LIST, .sub = JL_LIST, .u.l = l};
    return DT_STATUS_OK;
}

/* ---- number parsing (int() and float() of a string) ---- */

static int py_float(jv s, double *out) {
    char buf[128];
    size_t a = 0, b = s.u.s.n, k = 0;
    while (a < b && (s.u.s.p[a] == ' ' || (s.u.s.p[a] >= '\t' && s.u.s.p[a] <= '\r'))) a++;
    while (b > a && (s.u.s.p[b - 1] == ' ' || (s.u.s.p[b - 1] >= '\t' && s.u.s.p[b - 1] <= '\r'))) b--;
    if (a == b || b - a >= sizeof buf) return 0;
    for (size_t i = a; i < b; i++) {
        char c = s.u.s.p[i];
        if (c == '_') { /* only between digits */
            if (i == a || i + 1 == b || !(s.u.s.p[i - 1] >= '0' && s.u.s.p[i - 1] <= '9') ||
                !(s.u.s.p[i + 1] >= '0' && s.u.s.p[i + 1] <= '9'))
                return 0;
            continue;
        }
        if (!strchr("0123456789+-.eEinfatyINFATY", c)) return 0;
        buf[k++] = c;
    }
    buf[k] = 0;
    char *end;
    *out = strtod(buf, &end);
    if (*end) return 0;
    const char *w = buf + (buf[0] == '+' || buf[0] == '-');
    if ((w[0] | 0x20) == 'i' || (w[0] | 0x20) == 'n') /* inf, infinity, nan only, any case */
        return strcasecmp(w, "inf") == 0 || strcasecmp(w, "infinity") == 0 || strcasecmp(w, "nan") == 0;
    return !strpbrk(buf, "xXpP");
}

static int py_int(jv s, int base, int64_t *out) {
    size_t a = 0, b = s.u.s.n;
    const char *p = s.u.s.p;
    while (a < b && (p[a] == ' ' || (p[a] >= '\t' && p[a] <= '\r'))) a++;
    while (b > a && (p[b - 1] == ' ' || (p[b - 1] >= '\t' && p[b - 1] <= '\r'))) b--;
    int neg = 0;
    if (a < b && (p[a] == '+' || p[a] == '-')) neg = p[a++] == '-';
    if (a + 1 < b && p[a] == '0' && ((base == 16 && (p[a + 1] | 0x20) == 'x') || (base == 8 && (p[a + 1] | 0x20) == 'o') ||
                                     (base == 2 && (p[a + 1] | 0x20) == 'b'))) {
        a += 2;
        if (a < b && p[a] == '_') a++;
    }
    if (a == b) return 0;
    int64_t v = 0;
    for (size_t i = a; i < b; i++) {
        char c = p[i];
        if (c == '_' && i > a && i + 1 < b && p[i - 1] != '_') continue;
        int d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10 : 99;
        if (d >= base) return 0;
        if (__builtin_mul_overflow(v, (int64_t)base, &v) || __builtin_add_overflow(v, (int64_t)d, &v)) return 0;
    }
    *out = neg ? -v : v;
    return 1;
}

/* ---- filters ---- */

#define BIND(...)                                                                                           \
    static const char *const P[] = {__VA_ARGS__};                                                           \
    jv a[sizeof P / sizeof P[0]];                                                                           \
    int h[sizeof P / sizeof P[0]];                                                                          \
    DT_CHECK(jj_bind(r, fname, P, (int)(sizeof P / sizeof P[0]), args, nargs, kwn, kwl, kwv, nkw, line, a, h))
#define NOBIND DT_CHECK(jj_bind(r, fname, NULL, 0, args, nargs, kwn, kwl, kwv, nkw, line, NULL, NULL))

static jv gen_of(jj_list *l) { return (jv){.kind = JV_LIST, .sub = JL_GEN, .u.l = l}; }

static dt_status_t undefined_input(jj_render *r, jv in, uint32_t line) {
    return in.kind == JV_UNDEF ? jj_undef_fail(r, in, line) : DT_STATUS_OK;
}

/* select / reject / selectattr / rejectattr */
static dt_status_t select_like(jj_render *r, jv in, const jv *args, size_t nargs, int attr, int keep, uint32_t line,
                               jv *out) {
    getter g;
    if (!jj_truthy(in)) { /* jinja2: `if value:` before anything else */
        jj_list *l = jj_list_new(r, 0);
        if (!l) return jj_oom(r);
        *out = gen_of(l);
        return DT_STATUS_OK;
    }
    size_t off = 0;
    if (attr) {
        if (!nargs) return jj_fail(r, line, DT_STATUS_INVALID, "Missing parameter for attribute name");
        DT_CHECK(getter_init(r, args[0], 0, jv_none(), 0, line, &g));
        off = 1;
    } else {
        DT_CHECK(getter_init(r, jv_none(), 0, jv_none(), 0, line, &g));
    }
    jv *items;
    size_t n;
    jj_list *l = jj_list_new(r, 0);
    if (!l) return jj_oom(r);
    DT_CHECK(jj_iter(r, in, line, &items, &n));
    for (size_t i = 0; i < n; i++) {
        jv v;
        int ok;
        DT_CHECK(getter_apply(r, &g, items[i], line, &v));
        if (nargs > off)
            DT_CHECK(jj_test_named(r, args[off], v, args + off + 1, nargs - off - 1, line, &ok));
        else
            ok = jj_truthy(v);
        if (ok == keep) DT_CHECK(jj_list_push(r, l, items[i]));
    }
    *out = gen_of(l);
    return DT_STATUS_OK;
}

static dt_status_t sum_values(jj_render *r, const jv *v, size_t n, jv start, uint32_t line, jv *out) {
    jv acc = start;
    for (size_t i = 0; i < n; i++) {
        jv x = v[i];
        if (!is_num(acc) || !is_num(x)) {
            if (x.kind == JV_UNDEF) return jj_undef_fail(r, x, line);
            return jj_fail(r, line, DT_STATUS_INVALID, "unsupported operand type(s) for +: '%s' and '%s'",
                           jj_type_name(acc), jj_type_name(x));
        }
        if (acc.kind != JV_FLOAT && x.kind != JV_FLOAT) {
            int64_t z;
            if (__builtin_add_overflow(acc.u.i, x.u.i, &z))
                return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "integer overflow in sum");
            acc = jv_int(z);
        } else {
            acc = jv_float((acc.kind == JV_FLOAT ? acc.u.f : (double)acc.u.i) + (x.kind == JV_FLOAT ? x.u.f : (double)x.u.i));
        }
    }
    *out = acc;
    return DT_STATUS_OK;
}

static dt_status_t do_round(jj_render *r, jv v, jv prec, jv method, uint32_t line, jv *out) {
    if (v.kind == JV_UNDEF) return jj_undef_fail(r, v, line);
    if (!is_num(v)) return jj_fail(r, line, DT_STATUS_INVALID, "type %s doesn't define __round__ method", jj_type_name(v));
    if (prec.kind != JV_INT && prec.kind != JV_BOOL)
        return jj_fail(r, line, DT_STATUS_INVALID, "'%s' object cannot be interpreted as an integer", jj_type_name(prec));
    int64_t p = prec.u.i;
    int common = method.kind == JV_STR && method.u.s.n == 6 && memcmp(method.u.s.p, "common", 6) == 0;
    int ceil_ = method.kind == JV_STR && method.u.s.n == 4 && memcmp(method.u.s.p, "ceil", 4) == 0;
    int floor_ = method.kind == JV_STR && method.u.s.n == 5 && memcmp(method.u.s.p, "floor", 5) == 0;
    if (!common && !ceil_ && !floor_) return jj_fail(r, line, DT_STATUS_INVALID, "method must be common, ceil or floor");
    double x = v.kind == JV_FLOAT ? v.u.f : (double)v.u.i, scale = pow(10.0, (double)p);
    if (!common) {
        *out = jv_float((ceil_ ? ceil(x * scale) : floor(x * scale)) / scale);
        return DT_STATUS_OK;
    }
    if (v.kind != JV_FLOAT) {
        if (p >= 0) return *out = jv_int(v.u.i), DT_STATUS_OK;
        return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "round() of an integer to negative digits");
    }
    if (!isfinite(x) || p > 300) return *out = v, DT_STATUS_OK;
    if (p <= 0) {
        *out = jv_float(nearbyint(x / pow(10.0, (double)-p)) * pow(10.0, (double)-p));
        return DT_STATUS_OK;
    }
    char buf[400];
    snprintf(buf, sizeof buf, "%.*f", (int)p, x);
    *out = jv_float(strtod(buf, NULL));
    return DT_STATUS_OK;
}

static dt_status_t do_indent(jj_render *r, jv s, jv width, jv first, jv blank, uint32_t line, jv *out) {
    if (s.kind == JV_UNDEF) return jj_undef_fail(r, s, line);
    if (s.kind != JV_STR)
        return jj_fail(r, line, DT_STATUS_INVALID, "unsupported operand type(s) for +=: '%s' and 'str'", jj_type_name(s));
    jv ind;
    if (width.kind == JV_STR) {
        ind = width;
    } else if (width.kind == JV_INT || width.kind == JV_BOOL) {
        int64_t w = width.u.i < 0 ? 0 : width.u.i > 4096 ? 4096 : width.u.i;
        char *sp = jj_alloc(&r->arena, (size_t)w + 1);
        if (!sp) return jj_oom(r);
        memset(sp, ' ', (size_t)w);
        ind = jv_str(sp, (size_t)w);
    } else {
        return jj_fail(r, line, DT_STATUS_INVALID, "can't multiply sequence by non-int of type '%s'", jj_type_name(width));
    }
    char *withnl = jj_alloc(&r->arena, s.u.s.n + 2);
    if (!withnl) return jj_oom(r);
    memcpy(withnl, s.u.s.p, s.u.s.n);
    withnl[s.u.s.n] = '\n';
    jj_list *lines;
    DT_CHECK(jj_str_splitlines(r, withnl, s.u.s.n + 1, 0, &lines));
    jj_buf b;
    jj_buf_init(&b);
    dt_status_t st = DT_STATUS_OK;
    if (jj_truthy(first)) st = jj_buf_put(r, &b, ind.u.s.p, ind.u.s.n);
    for (size_t i = 0; i < lines->n && st == DT_STATUS_OK; i++) {
        jv ln = lines->v[i];
        if (i) st = jj_buf_put(r, &b, "\n", 1);
        if (st == DT_STATUS_OK && i && (ln.u.s.n || jj_truthy(blank))) st = jj_buf_put(r, &b, ind.u.s.p, ind.u.s.n);
        if (st == DT_STATUS_OK) st = jj_buf_put(r, &b, ln.u.s.p, ln.u.s.n);
    }
    if (st == DT_STATUS_OK) st = jj_buf_take(r, &b, out);
    free(b.p);
    out->sub = s.sub;
    return st;
}

static dt_status_t do_tojson(jj_render *r, jv x, const jv *a, const int *h, uint32_t line, jv *out) {
    /* transformers: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    int ensure_ascii = h[0] && jj_truthy(a[0]), sort_keys = h[3] && jj_truthy(a[3]);
    const char *indent = NULL;
    size_t indent_n = 0;
    if (h[1] && a[1].kind != JV_NONE) {
        if (a[1].kind == JV_STR) {
            indent = a[1].u.s.p;
            indent_n = a[1].u.s.n;
        } else if (a[1].kind == JV_INT || a[1].kind == JV_BOOL) {
            indent_n = a[1].u.i < 0 ? 0 : a[1].u.i > 256 ? 256 : (size_t)a[1].u.i;
            char *sp = jj_alloc(&r->arena, indent_n + 1);
            if (!sp) return jj_oom(r);
            memset(sp, ' ', indent_n);
            indent = sp;
        } else {
            return jj_fail(r, line, DT_STATUS_INVALID, "tojson: indent must be an int or a string, not %s",
                           jj_type_name(a[1]));
        }
    }
    char item_sep[64], key_sep[64];
    snprintf(item_sep, sizeof item_sep, "%s", indent ? "," : ", ");
    snprintf(key_sep, sizeof key_sep, ": ");
    if (h[2] && a[2].kind != JV_NONE) {
        jv *sep;
        size_t n;
        DT_CHECK(jj_iter(r, a[2], line, &sep, &n));
        if (n != 2 || sep[0].kind != JV_STR || sep[1].kind != JV_STR || sep[0].u.s.n >= 64 || sep[1].u.s.n >= 64)
            return jj_fail(r, line, DT_STATUS_INVALID, "tojson: separators must be two strings");
        snprintf(item_sep, sizeof item_sep, "%.*s", (int)sep[0].u.s.n, sep[0].u.s.p);
        snprintf(key_sep, sizeof key_sep, "%.*s", (int)sep[1].u.s.n, sep[1].u.s.p);
    }
    jj_buf b;
    jj_buf_init(&b);
    dt_status_t st = jj_json_into(r, &b, x, ensure_ascii, indent, indent_n, item_sep, key_sep, sort_keys, 0, line);
    if (st == DT_STATUS_OK) st = jj_buf_take(r, &b, out);
    free(b.p);
    return st;
}

static dt_status_t min_max(jj_render *r, jv in, jv cs, jv attr, int want_max, uint32_t line, jv *out) {
    getter g;
    DT_CHECK(getter_init(r, attr, 0, jv_none(), !jj_truthy(cs), line, &g));
    jv *items;
    size_t n;
    DT_CHECK(jj_iter(r, in, line, &items, &n));
    if (!n) {
        *out = (jv){.kind = JV_UNDEF, .sub = JU_MSG, .u.s = {"No aggregated item, sequence was empty.", 39}};
        return DT_STATUS_OK;
    }
    jv best = items[0], bkey;
    DT_CHECK(getter_apply(r, &g, best, line, &bkey));
    for (size_t i = 1; i < n; i++) {
        jv k;
        int c;
        DT_CHECK(getter_apply(r, &g, items[i], line, &k));
        DT_CHECK(jj_cmp(r, k, bkey, line, &c));
        if (want_max ? c > 0 : c < 0) best = items[i], bkey = k;
    }
    *out = best;
    return DT_STATUS_OK;
}

dt_status_t jj_filter(jj_render *r, int id, jv in, const jv *args, size_t nargs, const char *const *kwn,
                      const size_t *kwl, const jv *kwv, size_t nkw, uint32_t line, jv *out) {
    const char *fname = "filter";
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
        if (FILTERS[i].id == id) {
            fname = FILTERS[i].name;
            break;
        }
    jv *items;
    size_t n;
    switch (id) {
    case F_ABS:
        NOBIND;
        DT_CHECK(undefined_input(r, in, line));
        if (in.kind == JV_FLOAT) *out = jv_float(fabs(in.u.f));
        else if (in.kind == JV_INT || in.kind == JV_BOOL) *out = jv_int(in.u.i < 0 ? -in.u.i : in.u.i);
        else return jj_fail(r, line, DT_STATUS_INVALID, "bad operand type for abs(): '%s'", jj_type_name(in));
        return DT_STATUS_OK;
    case F_ATTR: {
        BIND("name");
        if (!h[0] || a[0].kind != JV_STR) return jj_fail(r, line, DT_STATUS_INVALID, "attr() takes an attribute name");
        if (in.kind == JV_DICT) { /* attributes only: a dict's keys are not */
            int m = jj_method_lookup(r, in, a[0].u.s.p, a[0].u.s.n, out);
            if (m < 0) return jj_oom(r);
            if (!m) *out = (jv){.kind = JV_UNDEF, .sub = JU_ATTR, .aux = JV_DICT, .u.s = {a[0].u.s.p, a[0].u.s.n}};
            return DT_STATUS_OK;
        }
        return jj_getattr(r, in, a[0].u.s.p, a[0].u.s.n, line, out);
    }
    case F_CAPITALIZE: case F_LOWER: case F_UPPER: case F_TITLE:
        NOBIND;
        DT_CHECK(jj_to_str(r, in, line, &in));
        return jj_str_case(r, in, id == F_LOWER ? 0 : id == F_UPPER ? 1 : id == F_CAPITALIZE ? 2 : 3, line, out);
    case F_CENTER: {
        BIND("width");
        DT_CHECK(jj_to_str(r, in, line, &in));
        jv m;
        if (jj_method_lookup(r, in, "center", 6, &m) < 0) return jj_oom(r);
        jv w = h[0] ? a[0] : jv_int(80);
        return jj_method_call(r, m.u.meth, &w, 1, NULL, NULL, NULL, 0, line, out);
    }
    case F_DEFAULT: {
        BIND("default_value", "boolean");
        int use = in.kind == JV_UNDEF || (h[1] && jj_truthy(a[1]) && !jj_truthy(in));
        *out = use ? (h[0] ? a[0] : jv_str("", 0)) : in;
        return DT_STATUS_OK;
    }
    case F_DICTSORT: {
        BIND("case_sensitive", "by", "reverse");
        if (in.kind != JV_DICT) return jj_fail(r, line, DT_STATUS_INVALID, "dictsort: '%s' object has no attribute "
                                               "'items'", jj_type_name(in));
        int pos = 0;
        if (h[1]) {
            if (a[1].kind == JV_STR && a[1].u.s.n == 5 && memcmp(a[1].u.s.p, "value", 5) == 0) pos = 1;
            else if (!(a[1].kind == JV_STR && a[1].u.s.n == 3 && memcmp(a[1].u.s.p, "key", 3) == 0))
                return jj_fail(r, line, DT_STATUS_INVALID, "You can only sort by either \"key\" or \"value\"");
        }
        jv m, view;
        if (jj_method_lookup(r, in, "items", 5, &m) < 0) return jj_oom(r);
        DT_CHECK(jj_method_call(r, m.u.meth, NULL, 0, NULL, NULL, NULL, 0, line, &view));
        getter g;
        DT_CHECK(getter_init(r, jv_int(pos), 0, jv_none(), !(h[0] && jj_truthy(a[0])), line, &g));
        return sort_items(r, view.u.l->v, view.u.l->n, &g, h[2] && jj_truthy(a[2]), line, out);
    }
    case F_ESCAPE: case F_FORCEESCAPE:
        NOBIND;
        if (id == F_FORCEESCAPE && in.kind == JV_STR) in.sub = JS_PLAIN;
        return jj_escape(r, in, line, out);
    case F_FIRST: case F_LAST:
        NOBIND;
        if (id == F_LAST && in.kind == JV_LIST && in.sub == JL_GEN)
            return jj_fail(r, line, DT_STATUS_INVALID, "'generator' object is not reversible");
        DT_CHECK(jj_iter(r, in, line, &items, &n));
        if (!n) {
            *out = (jv){.kind = JV_UNDEF, .sub = JU_MSG};
            out->u.s.p = id == F_FIRST ? "No first item, sequence was empty." : "No last item, sequence was empty.";
            out->u.s.n = strlen(out->u.s.p);
        } else {
            *out = items[id == F_FIRST ? 0 : n - 1];
            if (id == F_LAST && in.kind == JV_STR) out->sub = in.sub; /* reversed() reads Markup.__getitem__ */
        }
        return DT_STATUS_OK;
    case F_FLOAT: {
        BIND("default");
        DT_CHECK(undefined_input(r, in, line));
        double f;
        if (in.kind == JV_FLOAT) *out = in;
        else if (in.kind == JV_INT || in.kind == JV_BOOL) *out = jv_float((double)in.u.i);
        else if (in.kind == JV_STR && py_float(in, &f)) *out = jv_float(f);
        else *out = h[0] ? a[0] : jv_float(0.0);
        return DT_STATUS_OK;
    }
    case F_FORMAT: {
        jv s;
        if (nargs && nkw) return jj_fail(r, line, DT_STATUS_INVALID, "can't handle positional and keyword arguments "
                                         "at the same time");
        DT_CHECK(jj_to_str(r, in, line, &s));
        jv fa;
        if (nkw) {
            jj_dict *d = jj_dict_new(r, nkw);
            if (!d) return jj_oom(r);
            for (size_t k = 0; k < nkw; k++) DT_CHECK(jj_dict_set(r, d, jv_str(kwn[k], kwl[k]), kwv[k]));
            fa = (jv){.kind = JV_DICT, .u.d = d};
        } else {
            jj_list *l = jj_list_new(r, nargs);
            if (!l) return jj_oom(r);
            for (size_t i = 0; i < nargs; i++) DT_CHECK(jj_list_push(r, l, args[i]));
            fa = (jv){.kind = JV_LIST, .sub = JL_TUPLE, .u.l = l};
        }
        return jj_str_percent(r, s, fa, line, out);
    }
    case F_INDENT: {
        BIND("width", "first", "blank");
        return do_indent(r, in, h[0] ? a[0] : jv_int(4), h[1] ? a[1] : jv_bool(0), h[2] ? a[2] : jv_bool(0), line, out);
    }
    case F_INT: {
        BIND("default", "base");
        DT_CHECK(undefined_input(r, in, line));
        int base = h[1] ? (int)a[1].u.i : 10;
        int64_t i;
        double f;
        if (in.kind == JV_INT || in.kind == JV_BOOL) *out = jv_int(in.u.i);
        else if (in.kind == JV_FLOAT && isfinite(in.u.f) && fabs(in.u.f) < 9.2e18) *out = jv_int((int64_t)in.u.f);
        else if (in.kind == JV_STR && base >= 2 && base <= 36 && py_int(in, base, &i)) *out = jv_int(i);
        else if (in.kind == JV_STR && py_float(in, &f) && isfinite(f) && fabs(f) < 9.2e18) *out = jv_int((int64_t)f);
        else *out = h[0] ? a[0] : jv_int(0);
        return DT_STATUS_OK;
    }
    case F_ITEMS: {
        NOBIND;
        jj_list *l = jj_list_new(r, 0);
        if (!l) return jj_oom(r);
        if (in.kind != JV_UNDEF) {
            if (in.kind != JV_DICT) return jj_fail(r, line, DT_STATUS_INVALID, "Can only get item pairs from a mapping.");
            jv m, view;
            if (jj_method_lookup(r, in, "items", 5, &m) < 0) return jj_oom(r);
            DT_CHECK(jj_method_call(r, m.u.meth, NULL, 0, NULL, NULL, NULL, 0, line, &view));
            l = view.u.l;
        }
        *out = gen_of(l);
        return DT_STATUS_OK;
    }
    case F_JOIN: {
        BIND("d", "attribute");
        getter g;
        DT_CHECK(getter_init(r, h[1] ? a[1] : jv_none(), 0, jv_none(), 0, line, &g));
        jv sep = jv_str("", 0);
        if (h[0]) DT_CHECK(jj_to_str(r, a[0], line, &sep));
        DT_CHECK(jj_iter(r, in, line, &items, &n));
        jj_buf b;
        jj_buf_init(&b);
        dt_status_t st = DT_STATUS_OK;
        for (size_t i = 0; i < n && st == DT_STATUS_OK; i++) {
            jv v;
            if (i) st = jj_buf_put(r, &b, sep.u.s.p, sep.u.s.n);
            if (st == DT_STATUS_OK) st = getter_apply(r, &g, items[i], line, &v);
            if (st == DT_STATUS_OK) st = jj_str_into(r, &b, v, line);
        }
        if (st == DT_STATUS_OK) st = jj_buf_take(r, &b, out);
        free(b.p);
        return st;
    }
    case F_LENGTH: {
        NOBIND;
        int64_t len;
        DT_CHECK(jj_len(r, in, line, &len));
        *out = jv_int(len);
        return DT_STATUS_OK;
    }
    case F_LIST: {
        NOBIND;
        DT_CHECK(jj_iter(r, in, line, &items, &n));
        jj_list *l = jj_list_new(r, n);
        if (!l) return jj_oom(r);
        for (size_t i = 0; i < n; i++) DT_CHECK(jj_list_push(r, l, items[i]));
        *out = (jv){.kind = JV_LIST, .sub = JL_LIST, .u.l = l};
        return DT_STATUS_OK;
    }
    case F_MAP: {
        getter g;
        if (!jj_truthy(in)) { /* jinja2: `if value:` before anything else */
            jj_list *l = jj_list_new(r, 0);
            if (!l) return jj_oom(r);
            *out = gen_of(l);
            return DT_STATUS_OK;
        }
        int by_attr = 0;
        jv attr = jv_none(), dflt = jv_none();
        if (!nargs) {
            for (size_t k = 0; k < nkw; k++) {
                if (kwl[k] == 9 && memcmp(kwn[k], "attribute", 9) == 0) attr = kwv[k], by_attr = 1;
                else if (kwl[k] == 7 && memcmp(kwn[k], "default", 7) == 0) dflt = kwv[k];
                else return jj_fail(r, line, DT_STATUS_INVALID, "Unexpected keyword argument '%.*s'", (int)kwl[k], kwn[k]);
            }
            if (!by_attr) return jj_fail(r, line, DT_STATUS_INVALID, "map requires a filter argument");
            DT_CHECK(getter_init(r, attr, 0, dflt, 0, line, &g));
        }
        int fid = -1;
        if (!by_attr) {
            if (args[0].kind != JV_STR) return jj_fail(r, line, DT_STATUS_INVALID, "map: the filter name must be a string");
            fid = jj_filter_id(args[0].u.s.p, args[0].u.s.n);
            if (fid == -2)
                return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "the filter '%.*s' is not supported",
                               (int)args[0].u.s.n, args[0].u.s.p);
            if (fid < 0)
                return jj_fail(r, line, DT_STATUS_INVALID, "No filter named '%.*s'.", (int)args[0].u.s.n, args[0].u.s.p);
        }
        DT_CHECK(jj_iter(r, in, line, &items, &n));
        jj_list *l = jj_list_new(r, n);
        if (!l) return jj_oom(r);
        for (size_t i = 0; i < n; i++) {
            jv v;
            if (by_attr)
                DT_CHECK(getter_apply(r, &g, items[i], line, &v));
            else
                DT_CHECK(jj_filter(r, fid, items[i], args + 1, nargs - 1, kwn, kwl, kwv, nkw, line, &v));
            DT_CHECK(jj_list_push(r, l, v));
        }
        *out = gen_of(l);
        return DT_STATUS_OK;
    }
    case F_MAX: case F_MIN: {
        BIND("case_sensitive", "attribute");
        return min_max(r, in, h[0] ? a[0] : jv_bool(0), h[1] ? a[1] : jv_none(), id == F_MAX, line, out);
    }
    case F_REJECT: case F_SELECT:
        if (nkw) return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "keyword arguments to %s", fname);
        return select_like(r, in, args, nargs, 0, id == F_SELECT, line, out);
    case F_REJECTATTR: case F_SELECTATTR:
        if (nkw) return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "keyword arguments to %s", fname);
        return select_like(r, in, args, nargs, 1, id == F_SELECTATTR, line, out);
    case F_REPLACE: {
        BIND("old", "new", "count");
        if (!h[0] || !h[1]) return jj_fail(r, line, DT_STATUS_INVALID, "replace() missing required arguments");
        jv s, o, nw;
        DT_CHECK(jj_to_str(r, in, line, &s));
        DT_CHECK(jj_to_str(r, a[0], line, &o));
        DT_CHECK(jj_to_str(r, a[1], line, &nw));
        int64_t count = -1;
        if (h[2] && a[2].kind != JV_NONE) {
            if (a[2].kind != JV_INT && a[2].kind != JV_BOOL)
                return jj_fail(r, line, DT_STATUS_INVALID, "'%s' object cannot be interpreted as an integer",
                               jj_type_name(a[2]));
            count = a[2].u.i;
        }
        s.sub = JS_PLAIN;
        return jj_str_replace(r, s, o, nw, count, line, out);
    }
    case F_REVERSE: {
        NOBIND;
        if (in.kind == JV_STR) {
            char *p = jj_alloc(&r->arena, in.u.s.n + 1);
            if (!p) return jj_oom(r);
            for (size_t i = 0; i < in.u.s.n;) {
                size_t j = i + jj_utf8_next(in.u.s.p + i, in.u.s.n - i);
                memcpy(p + in.u.s.n - j, in.u.s.p + i, j - i);
                i = j;
            }
            *out = jv_str(p, in.u.s.n);
            return DT_STATUS_OK;
        }
        int reversible = in.kind != JV_LIST || in.sub != JL_GEN;
        DT_CHECK(jj_iter(r, in, line, &items, &n));
        jj_list *l = jj_list_new(r, n);
        if (!l) return jj_oom(r);
        for (size_t i = n; i-- > 0;) DT_CHECK(jj_list_push(r, l, items[i]));
        *out = (jv){.kind = JV_LIST, .sub = reversible ? JL_GEN : JL_LIST, .u.l = l};
        return DT_STATUS_OK;
    }
    case F_ROUND: {
        BIND("precision", "method");
        return do_round(r, in, h[0] ? a[0] : jv_int(0), h[1] ? a[1] : jv_str("common", 6), line, out);
    }
    case F_SAFE: case F_STRING:
        NOBIND;
        if (id == F_STRING && in.kind == JV_STR) return *out = in, DT_STATUS_OK;
        DT_CHECK(jj_to_str(r, in, line, out));
        if (id == F_SAFE) out->sub = JS_MARKUP;
        return DT_STATUS_OK;
    case F_SORT: {
        BIND("reverse", "case_sensitive", "attribute");
        getter g;
        DT_CHECK(getter_init(r, h[2] ? a[2] : jv_none(), 1, jv_none(), !(h[1] && jj_truthy(a[1])), line, &g));
        DT_CHECK(jj_iter(r, in, line, &items, &n));
        return sort_items(r, items, n, &g, h[0] && jj_truthy(a[0]), line, out);
    }
    case F_SUM: {
        BIND("attribute", "start");
        getter g;
        DT_CHECK(getter_init(r, h[0] ? a[0] : jv_none(), 0, jv_none(), 0, line, &g));
        DT_CHECK(jj_iter(r, in, line, &items, &n));
        jv *vals = jj_alloc(&r->arena, (n + 1) * sizeof *vals);
        if (!vals) return jj_oom(r);
        for (size_t i = 0; i < n; i++) DT_CHECK(getter_apply(r, &g, items[i], line, &vals[i]));
        return sum_values(r, vals, n, h[1] ? a[1] : jv_int(0), line, out);
    }
    case F_TOJSON: {
        BIND("ensure_ascii", "indent", "separators", "sort_keys");
        return do_tojson(r, in, a, h, line, out);
    }
    case F_TRIM: {
        BIND("chars");
        DT_CHECK(jj_to_str(r, in, line, &in));
        return jj_str_strip(r, in, h[0] ? &a[0] : NULL, 1, 1, line, out);
    }
    case F_UNIQUE: {
        BIND("case_sensitive", "attribute");
        getter g;
        DT_CHECK(getter_init(r, h[1] ? a[1] : jv_none(), 0, jv_none(), !(h[0] && jj_truthy(a[0])), line, &g));
        DT_CHECK(jj_iter(r, in, line, &items, &n));
        jj_list *l = jj_list_new(r, n), *seen = jj_list_new(r, n);
        if (!l || !seen) return jj_oom(r);
        for (size_t i = 0; i < n; i++) {
            jv k;
            DT_CHECK(getter_apply(r, &g, items[i], line, &k));
            if (k.kind == JV_DICT || k.kind == JV_NS || (k.kind == JV_LIST && k.sub != JL_TUPLE && k.sub != JL_RANGE))
                return jj_fail(r, line, DT_STATUS_INVALID, "unhashable type: '%s'", jj_type_name(k));
            int dup = 0;
            for (size_t j = 0; j < seen->n && !dup; j++) dup = jj_eq(seen->v[j], k);
            if (dup) continue;
            DT_CHECK(jj_list_push(r, seen, k));
            DT_CHECK(jj_list_push(r, l, items[i]));
        }
        *out = gen_of(l);
        return DT_STATUS_OK;
    }
    case F_WORDCOUNT: {
        NOBIND;
        jv s;
        DT_CHECK(jj_to_str(r, in, line, &s));
        int64_t words = 0;
        int inword = 0;
        for (size_t i = 0; i < s.u.s.n;) {
            int32_t cp;
            int k = dt_uni_next((const unsigned char *)s.u.s.p + i, s.u.s.n - i, &cp);
            int w = cp == '_' || (cp >= 0 && (dt_uni_class(cp) & (DT_UNI_LETTER | DT_UNI_NUMBER)));
            words += w && !inword;
            inword = w;
            i += (size_t)k;
        }
        *out = jv_int(words);
        return DT_STATUS_OK;
    }
    default:
        return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "filter %d", id);
    }
}
