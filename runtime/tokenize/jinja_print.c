/*
 * jinja_print.c - values as text, as Python writes them: str() (what {{ x }}
 * prints), repr() (what a list or dict shows of its items: 'quoted' strings,
 * True/False/None, shortest round-trip floats), json.dumps() the way
 * transformers' tojson filter calls it, and markupsafe's HTML escape.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xrealloc */
#include "runtime/tokenize/jinja_internal.h"
#include "runtime/tokenize/tok_unicode.h" /* defines: dt_uni_next, dt_uni_class */

/* ---- buffers ---- */

void jj_buf_init(jj_buf *b) { memset(b, 0, sizeof *b); }

dt_status_t jj_buf_put(jj_render *r, jj_buf *b, const char *p, size_t n) {
    if (!n) return DT_STATUS_OK;
    if (b->n + n > r->lim.max_output)
        return dt_error(DT_STATUS_LIMIT, "%s: the template wrote more than %zu MiB of text", r->t->name,
                        r->lim.max_output >> 20);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        b->p = dt_xrealloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return DT_STATUS_OK;
}

static dt_status_t put_s(jj_render *r, jj_buf *b, const char *s) { return jj_buf_put(r, b, s, strlen(s)); }

dt_status_t jj_buf_take(jj_render *r, jj_buf *b, jv *out) { return jj_strdup(r, b->p ? b->p : "", b->n, out); }

/* ---- numbers ---- */

void jj_float_repr(double f, char *buf, size_t len) {
    if (isnan(f)) {
        snprintf(buf, len, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, len, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0) {
        snprintf(buf, len, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]D[.DDD]e[+-]XX -> the digits and the exponent */
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *p = tmp + neg;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int e = atoi(p + 1), decpt = e + 1;
    char *o = buf;
    if (neg) *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            o += sprintf(o, "0.");
            for (int i = 0; i < -decpt; i++) *o++ = '0';
            o += sprintf(o, "%s", digits);
        } else if (decpt >= nd) {
            o += sprintf(o, "%s", digits);
            for (int i = nd; i < decpt; i++) *o++ = '0';
            o += sprintf(o, ".0");
        } else {
            o += sprintf(o, "%.*s.%s", decpt, digits, digits + decpt);
        }
    } else {
        *o++ = digits[0];
        if (nd > 1) o += sprintf(o, ".%s", digits + 1);
        o += sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    *o = 0;
    (void)len;
}

/* ---- repr ---- */

/* Whether Python's str.isprintable() holds for a non-ASCII code point. */
static int py_printable(int32_t cp) { return !jj_uni_in(jj_uni_unprintable, jj_uni_unprintable_n, (uint32_t)cp); }

static dt_status_t repr_str(jj_render *r, jj_buf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    DT_CHECK(jj_buf_put(r, b, &q, 1));
    size_t run = 0; /* bytes copied as they are, flushed in one put */
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = dt_uni_next((const unsigned char *)s + i, n - i, &cp);
        char esc[16] = {0};
        if (cp == q || cp == '\\')
            snprintf(esc, sizeof esc, "\\%c", (char)cp);
        else if (cp == '\t')
            snprintf(esc, sizeof esc, "\\t");
        else if (cp == '\n')
            snprintf(esc, sizeof esc, "\\n");
        else if (cp == '\r')
            snprintf(esc, sizeof esc, "\\r");
        else if ((cp >= 0 && cp < 0x20) || cp == 0x7F)
            snprintf(esc, sizeof esc, "\\x%02x", (unsigned)cp);
        else if (cp >= 0x80 && !py_printable(cp))
            snprintf(esc, sizeof esc, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)cp);
        if (esc[0]) {
            DT_CHECK(jj_buf_put(r, b, s + i - run, run));
            run = 0;
            DT_CHECK(put_s(r, b, esc));
        } else {
            run += (size_t)k;
        }
        i += (size_t)k;
    }
    DT_CHECK(jj_buf_put(r, b, s + n - run, run));
    return jj_buf_put(r, b, &q, 1);
}

static dt_status_t repr_seq(jj_render *r, jj_buf *b, const jv *v, size_t n, const char *open, const char *close,
                            int tuple, uint32_t line) {
    DT_CHECK(put_s(r, b, open));
    for (size_t i = 0; i < n; i++) {
        if (i) DT_CHECK(put_s(r, b, ", "));
        DT_CHECK(jj_repr_into(r, b, v[i], line));
    }
    if (tuple && n == 1) DT_CHECK(put_s(r, b, ","));
    return put_s(r, b, close);
}

static dt_status_t repr_dict(jj_render *r, jj_buf *b, const jj_dict *d, uint32_t line) {
    DT_CHECK(put_s(r, b, "{"));
    for (size_t i = 0; i < d->n; i++) {
        if (i) DT_CHECK(put_s(r, b, ", "));
        DT_CHECK(jj_repr_into(r, b, d->k[i], line));
        DT_CHECK(put_s(r, b, ": "));
        DT_CHECK(jj_repr_into(r, b, d->v[i], line));
    }
    return put_s(r, b, "}");
}

static dt_status_t cannot_print(jj_render *r, jv v, uint32_t line) {
    return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "printing a %s object (Python shows its memory address) is "
                   "not supported", jj_type_name(v));
}

static dt_status_t repr_value(jj_render *r, jj_buf *b, jv v, uint32_t line);

/* Python's Py_ReprEnter: a container met again while printing itself is "{...}". */
dt_status_t jj_repr_into(jj_render *r, jj_buf *b, jv v, uint32_t line) {
    const void *box = v.kind == JV_LIST ? (const void *)v.u.l : v.kind == JV_DICT || v.kind == JV_NS ? (const void *)v.u.d
                                                                                                      : NULL;
    if (!box) return repr_value(r, b, v, line);
    for (int i = 0; i < r->repr_depth; i++)
        if (r->repr_stack[i] == box)
            return put_s(r, b, v.kind == JV_NS ? "<Namespace {...}>" : v.kind == JV_DICT ? "{...}"
                               : v.sub == JL_TUPLE ? "(...)" : "[...]");
    if (r->repr_depth == (int)(sizeof r->repr_stack / sizeof r->repr_stack[0]))
        return jj_fail(r, line, DT_STATUS_LIMIT, "a value nested too deeply to print");
    r->repr_stack[r->repr_depth++] = box;
    dt_status_t st = repr_value(r, b, v, line);
    r->repr_depth--;
    return st;
}

static dt_status_t repr_value(jj_render *r, jj_buf *b, jv v, uint32_t line) {
    char num[96];
    switch (v.kind) {
    case JV_UNDEF: return put_s(r, b, "Undefined");
    case JV_NONE: return put_s(r, b, "None");
    case JV_BOOL: return put_s(r, b, v.u.i ? "True" : "False");
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v.u.i); return put_s(r, b, num);
    case JV_FLOAT: jj_float_repr(v.u.f, num, sizeof num); return put_s(r, b, num);
    case JV_STR:
        if (v.sub == JS_MARKUP) {
            DT_CHECK(put_s(r, b, "Markup("));
            DT_CHECK(repr_str(r, b, v.u.s.p, v.u.s.n));
            return put_s(r, b, ")");
        }
        return repr_str(r, b, v.u.s.p, v.u.s.n);
    case JV_LIST:
        switch (v.sub) {
        case JL_LIST: return repr_seq(r, b, v.u.l->v, v.u.l->n, "[", "]", 0, line);
        case JL_TUPLE: return repr_seq(r, b, v.u.l->v, v.u.l->n, "(", ")", 1, line);
        case JL_ITEMS: return repr_seq(r, b, v.u.l->v, v.u.l->n, "dict_items([", "])", 0, line);
        case JL_KEYS: return repr_seq(r, b, v.u.l->v, v.u.l->n, "dict_keys([", "])", 0, line);
        case JL_VALUES: return repr_seq(r, b, v.u.l->v, v.u.l->n, "dict_values([", "])", 0, line);
        case JL_RANGE:
            if (v.u.l->step == 1)
                snprintf(num, sizeof num, "range(%lld, %lld)", (long long)v.u.l->start, (long long)v.u.l->stop);
            else
                snprintf(num, sizeof num, "range(%lld, %lld, %lld)", (long long)v.u.l->start, (long long)v.u.l->stop,
                         (long long)v.u.l->step);
            return put_s(r, b, num);
        default: return cannot_print(r, v, line);
        }
    case JV_DICT: return repr_dict(r, b, v.u.d, line);
    case JV_NS: /* jinja2: f"<Namespace {self.__attrs!r}>" */
        DT_CHECK(put_s(r, b, "<Namespace "));
        DT_CHECK(repr_dict(r, b, v.u.d, line));
        return put_s(r, b, ">");
    case JV_LOOP:
        snprintf(num, sizeof num, "<LoopContext %zu/%zu>", v.u.loop->i + 1, v.u.loop->n);
        return put_s(r, b, num);
    case JV_MACRO: /* jinja2: <Macro 'name'>, a call block's <Macro anonymous> */
        if (v.u.m->def->type != JN_MACRO) return put_s(r, b, "<Macro anonymous>");
        DT_CHECK(put_s(r, b, "<Macro "));
        DT_CHECK(repr_str(r, b, v.u.m->def->s, v.u.m->def->sn));
        return put_s(r, b, ">");
    default: return cannot_print(r, v, line);
    }
}

dt_status_t jj_str_into(jj_render *r, jj_buf *b, jv v, uint32_t line) {
    if (v.kind == JV_STR) return jj_buf_put(r, b, v.u.s.p, v.u.s.n);
    if (v.kind == JV_UNDEF) return DT_STATUS_OK;
    return jj_repr_into(r, b, v, line);
}

dt_status_t jj_to_str(jj_render *r, jv v, uint32_t line, jv *out) {
    if (v.kind == JV_STR) {
        *out = v;
        return DT_STATUS_OK;
    }
    if (v.kind == JV_UNDEF) {
        *out = jv_str("", 0);
        return DT_STATUS_OK;
    }
    jj_buf b;
    jj_buf_init(&b);
    dt_status_t st = jj_str_into(r, &b, v, line);
    if (st == DT_STATUS_OK) st = jj_buf_take(r, &b, out);
    free(b.p);
    return st;
}

/* ---- json.dumps ---- */

static dt_status_t json_str(jj_render *r, jj_buf *b, const char *s, size_t n, int ensure_ascii) {
    DT_CHECK(put_s(r, b, "\""));
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = dt_uni_next((const unsigned char *)s + i, n - i, &cp);
        char esc[16] = {0};
        switch (cp) {
        case '"': strcpy(esc, "\\\""); break;
        case '\\': strcpy(esc, "\\\\"); break;
        case '\n': strcpy(esc, "\\n"); break;
        case '\r': strcpy(esc, "\\r"); break;
        case '\t': strcpy(esc, "\\t"); break;
        case '\b': strcpy(esc, "\\b"); break;
        case '\f': strcpy(esc, "\\f"); break;
        default:
            if (cp >= 0 && cp < 0x20)
                snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
            else if (ensure_ascii && cp >= 0x7F) {
                if (cp >= 0x10000) {
                    uint32_t v = (uint32_t)cp - 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
                } else if (cp >= 0) {
                    snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
                }
            }
        }
        if (esc[0]) {
            DT_CHECK(jj_buf_put(r, b, s + i - run, run));
            run = 0;
            DT_CHECK(put_s(r, b, esc));
        } else {
            run += (size_t)k;
        }
        i += (size_t)k;
    }
    DT_CHECK(jj_buf_put(r, b, s + n - run, run));
    return put_s(r, b, "\"");
}

static dt_status_t json_newline(jj_render *r, jj_buf *b, const char *indent, size_t indent_n, int level) {
    DT_CHECK(put_s(r, b, "\n"));
    for (int i = 0; i < level; i++) DT_CHECK(jj_buf_put(r, b, indent, indent_n));
    return DT_STATUS_OK;
}

static dt_status_t json_key(jj_render *r, jj_buf *b, jv k, int ensure_ascii, uint32_t line) {
    char num[64];
    switch (k.kind) {
    case JV_STR: return json_str(r, b, k.u.s.p, k.u.s.n, ensure_ascii);
    case JV_NONE: return put_s(r, b, "\"null\"");
    case JV_BOOL: return put_s(r, b, k.u.i ? "\"true\"" : "\"false\"");
    case JV_INT: snprintf(num, sizeof num, "\"%lld\"", (long long)k.u.i); return put_s(r, b, num);
    case JV_FLOAT:
        if (isnan(k.u.f)) return put_s(r, b, "\"NaN\"");
        if (isinf(k.u.f)) return put_s(r, b, k.u.f > 0 ? "\"Infinity\"" : "\"-Infinity\"");
        num[0] = '"';
        jj_float_repr(k.u.f, num + 1, sizeof num - 2);
        strcat(num, "\"");
        return put_s(r, b, num);
    default:
        return jj_fail(r, line, DT_STATUS_INVALID, "keys must be str, int, float, bool or None, not %s",
                       jj_type_name(k));
    }
}

dt_status_t jj_json_into(jj_render *r, jj_buf *b, jv v, int ensure_ascii, const char *indent, size_t indent_n,
                         const char *item_sep, const char *key_sep, int sort_keys, int level, uint32_t line) {
    char num[64];
    if (level > 1000) return jj_fail(r, line, DT_STATUS_LIMIT, "tojson: value nested more than 1000 deep");
    switch (v.kind) {
    case JV_NONE: return put_s(r, b, "null");
    case JV_BOOL: return put_s(r, b, v.u.i ? "true" : "false");
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v.u.i); return put_s(r, b, num);
    case JV_FLOAT:
        if (isnan(v.u.f)) return put_s(r, b, "NaN");
        if (isinf(v.u.f)) return put_s(r, b, v.u.f > 0 ? "Infinity" : "-Infinity");
        jj_float_repr(v.u.f, num, sizeof num);
        return put_s(r, b, num);
    case JV_STR: return json_str(r, b, v.u.s.p, v.u.s.n, ensure_ascii);
    case JV_LIST:
        if (v.sub == JL_LIST || v.sub == JL_TUPLE) {
            if (!v.u.l->n) return put_s(r, b, "[]");
            DT_CHECK(put_s(r, b, "["));
            for (size_t i = 0; i < v.u.l->n; i++) {
                if (i) DT_CHECK(put_s(r, b, item_sep));
                if (indent) DT_CHECK(json_newline(r, b, indent, indent_n, level + 1));
                DT_CHECK(jj_json_into(r, b, v.u.l->v[i], ensure_ascii, indent, indent_n, item_sep, key_sep,
                                      sort_keys, level + 1, line));
            }
            if (indent) DT_CHECK(json_newline(r, b, indent, indent_n, level));
            return put_s(r, b, "]");
        }
        break;
    case JV_DICT: {
        const jj_dict *d = v.u.d;
        if (!d->n) return put_s(r, b, "{}");
        size_t *order = jj_alloc(&r->arena, d->n * sizeof *order);
        if (!order) return jj_oom(r);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (sort_keys) { /* insertion sort: stable, small dicts */
            for (size_t i = 1; i < d->n; i++) {
                for (size_t j = i; j > 0; j--) {
                    int c;
                    DT_CHECK(jj_cmp(r, d->k[order[j - 1]], d->k[order[j]], line, &c));
                    if (c <= 0) break;
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
            }
        }
        DT_CHECK(put_s(r, b, "{"));
        for (size_t i = 0; i < d->n; i++) {
            if (i) DT_CHECK(put_s(r, b, item_sep));
            if (indent) DT_CHECK(json_newline(r, b, indent, indent_n, level + 1));
            DT_CHECK(json_key(r, b, d->k[order[i]], ensure_ascii, line));
            DT_CHECK(put_s(r, b, key_sep));
            DT_CHECK(jj_json_into(r, b, d->v[order[i]], ensure_ascii, indent, indent_n, item_sep, key_sep,
                                  sort_keys, level + 1, line));
        }
        if (indent) DT_CHECK(json_newline(r, b, indent, indent_n, level));
        return put_s(r, b, "}");
    }
    default: break;
    }
    if (v.kind == JV_UNDEF)
        return jj_fail(r, line, DT_STATUS_INVALID, "Object of type Undefined is not JSON serializable");
    return jj_fail(r, line, DT_STATUS_INVALID, "Object of type %s is not JSON serializable", jj_type_name(v));
}

/* ---- HTML escape ---- */

dt_status_t jj_escape(jj_render *r, jv v, uint32_t line, jv *out) {
    if (v.kind == JV_STR && v.sub == JS_MARKUP) {
        *out = v;
        return DT_STATUS_OK;
    }
    jv s;
    DT_CHECK(jj_to_str(r, v, line, &s));
    jj_buf b;
    jj_buf_init(&b);
    dt_status_t st = DT_STATUS_OK;
    size_t run = 0;
    for (size_t i = 0; i < s.u.s.n && st == DT_STATUS_OK; i++) {
        const char *e = NULL;
        switch (s.u.s.p[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '\'': e = "&#39;"; break;
        case '"': e = "&#34;"; break;
        default: run++; continue;
        }
        st = jj_buf_put(r, &b, s.u.s.p + i - run, run);
        run = 0;
        if (st == DT_STATUS_OK) st = put_s(r, &b, e);
    }
    if (st == DT_STATUS_OK) st = jj_buf_put(r, &b, s.u.s.p + s.u.s.n - run, run);
    if (st == DT_STATUS_OK) st = jj_buf_take(r, &b, out);
    free(b.p);
    out->sub = JS_MARKUP;
    return st;
}
