/*
 * jinja_value.c - the values a template computes with, as Python's: the arena
 * they live in (freed at once when the render ends), lists and dicts (ordered),
 * JSON input as values, truth, ==, <, len(), iteration, and the sandbox's
 * getattr / getitem / slicing with its undefined results.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xmalloc, dt_xrealloc */
#include "runtime/tokenize/jinja_internal.h"
#include "runtime/tokenize/tok_unicode.h" /* defines: dt_uni_next, dt_uni_class */

/* ---- arena ---- */

#define CHUNK (64 * 1024)

struct jj_chunk {
    jj_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *jj_alloc(jj_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!n) n = 16;
    jj_chunk *c = a->head;
    if (c && c->cap - c->used >= n) {
        void *p = c->data + c->used;
        c->used += n;
        memset(p, 0, n);
        return p;
    }
    size_t cap = n > CHUNK / 4 ? n : CHUNK;
    if (a->limit && a->total + cap + sizeof *c > a->limit) return NULL;
    jj_chunk *k = malloc(sizeof *k + cap);
    if (!k) return NULL;
    a->total += cap + sizeof *k;
    k->cap = cap;
    k->used = n;
    if (cap == n && c) { /* a big one: keep the current chunk for small ones */
        k->next = c->next;
        c->next = k;
    } else {
        k->next = c;
        a->head = k;
    }
    memset(k->data, 0, n);
    return k->data;
}

void jj_arena_free(jj_arena *a) {
    for (jj_chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- constructors and errors ---- */

jv jv_undef_name(const char *name, size_t n) {
    jv v = {.kind = JV_UNDEF, .sub = JU_NAME};
    v.u.s.p = name;
    v.u.s.n = n;
    return v;
}
jv jv_str(const char *p, size_t n) {
    jv v = {.kind = JV_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
jv jv_int(int64_t i) { return (jv){.kind = JV_INT, .u.i = i}; }
jv jv_bool(int b) { return (jv){.kind = JV_BOOL, .u.i = b != 0}; }
jv jv_float(double f) { return (jv){.kind = JV_FLOAT, .u.f = f}; }
jv jv_none(void) { return (jv){.kind = JV_NONE}; }

dt_status_t jj_fail(jj_render *r, uint32_t line, dt_status_t st, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt_error(st, "%s:%u: %s", r->t->name, line, msg);
}

dt_status_t jj_oom(jj_render *r) {
    return dt_error(DT_STATUS_LIMIT, "%s: the template built more than %zu MiB of values while rendering",
                    r->t->name, r->lim.max_memory >> 20);
}

dt_status_t jj_strdup(jj_render *r, const char *p, size_t n, jv *out) {
    char *s = jj_alloc(&r->arena, n + 1);
    if (!s) return jj_oom(r);
    if (n) memcpy(s, p, n);
    *out = jv_str(s, n);
    return DT_STATUS_OK;
}

/* ---- lists and dicts ---- */

jj_list *jj_list_new(jj_render *r, size_t cap) {
    jj_list *l = jj_alloc(&r->arena, sizeof *l);
    if (!l) return NULL;
    l->cap = cap ? cap : 4;
    l->v = jj_alloc(&r->arena, l->cap * sizeof *l->v);
    return l->v ? l : NULL;
}

dt_status_t jj_list_push(jj_render *r, jj_list *l, jv v) {
    if (l->n == l->cap) {
        jv *nv = jj_alloc(&r->arena, 2 * l->cap * sizeof *nv);
        if (!nv) return jj_oom(r);
        memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = v;
    return DT_STATUS_OK;
}

jj_dict *jj_dict_new(jj_render *r, size_t cap) {
    jj_dict *d = jj_alloc(&r->arena, sizeof *d);
    if (!d) return NULL;
    d->cap = cap ? cap : 4;
    d->k = jj_alloc(&r->arena, d->cap * sizeof *d->k);
    d->v = jj_alloc(&r->arena, d->cap * sizeof *d->v);
    return d->k && d->v ? d : NULL;
}

jv *jj_dict_getn(const jj_dict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].kind == JV_STR && d->k[i].u.s.n == n && memcmp(d->k[i].u.s.p, key, n) == 0) return &d->v[i];
    return NULL;
}

jv *jj_dict_get(const jj_dict *d, jv k) {
    if (k.kind == JV_STR) return jj_dict_getn(d, k.u.s.p, k.u.s.n);
    for (size_t i = 0; i < d->n; i++)
        if (jj_eq(d->k[i], k)) return &d->v[i];
    return NULL;
}

dt_status_t jj_dict_set(jj_render *r, jj_dict *d, jv k, jv v) {
    jv *have = jj_dict_get(d, k);
    if (have) {
        *have = v;
        return DT_STATUS_OK;
    }
    if (d->n == d->cap) {
        jv *nk = jj_alloc(&r->arena, 2 * d->cap * sizeof *nk), *nv = jj_alloc(&r->arena, 2 * d->cap * sizeof *nv);
        if (!nk || !nv) return jj_oom(r);
        memcpy(nk, d->k, d->n * sizeof *nk);
        memcpy(nv, d->v, d->n * sizeof *nv);
        d->k = nk;
        d->v = nv;
        d->cap *= 2;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return DT_STATUS_OK;
}

dt_status_t jj_from_json(jj_render *r, const cJSON *j, jv *out) {
    if (!j || cJSON_IsNull(j)) {
        *out = jv_none();
    } else if (cJSON_IsBool(j)) {
        *out = jv_bool(cJSON_IsTrue(j));
    } else if (cJSON_IsNumber(j)) {
        /* JSON does not say int or float once cJSON has read it: a whole number is an
         * int up to 2^53 (where doubles stop holding every integer: beyond, the text
         * was a float, or an int cJSON could not keep exactly anyway). */
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) <= 9007199254740992.0)
            *out = jv_int((int64_t)d);
        else
            *out = jv_float(d);
    } else if (cJSON_IsString(j)) {
        *out = jv_str(j->valuestring, strlen(j->valuestring));
    } else if (cJSON_IsArray(j)) {
        jj_list *l = jj_list_new(r, (size_t)cJSON_GetArraySize(j));
        if (!l) return jj_oom(r);
        for (const cJSON *e = j->child; e; e = e->next) {
            jv v;
            DT_CHECK(jj_from_json(r, e, &v));
            DT_CHECK(jj_list_push(r, l, v));
        }
        *out = (jv){.kind = JV_LIST, .sub = JL_LIST, .u.l = l};
    } else if (cJSON_IsObject(j)) {
        jj_dict *d = jj_dict_new(r, (size_t)cJSON_GetArraySize(j));
        if (!d) return jj_oom(r);
        for (const cJSON *e = j->child; e; e = e->next) {
            jv v;
            DT_CHECK(jj_from_json(r, e, &v));
            DT_CHECK(jj_dict_set(r, d, jv_str(e->string, strlen(e->string)), v));
        }
        *out = (jv){.kind = JV_DICT, .u.d = d};
    } else {
        *out = jv_none(); /* cJSON_Raw and the like: not produced by cJSON_Parse */
    }
    return DT_STATUS_OK;
}

/* ---- unicode ---- */

int jj_py_isspace(int32_t cp) {
    return (cp >= 0x1c && cp <= 0x1f) || (cp >= 0 && (dt_uni_class(cp) & DT_UNI_SPACE));
}

/* Characters are what dt_uni_next steps over (an invalid byte is one): every
 * count, offset and split of a string agrees, whatever bytes it holds. */
size_t jj_utf8_next(const char *p, size_t n) {
    int32_t cp;
    return n ? (size_t)dt_uni_next((const unsigned char *)p, n, &cp) : 0;
}

size_t jj_utf8_prev(const char *p, size_t a, size_t i) {
    for (size_t st = i - 1;; st--) { /* a lead byte whose character ends at i, else one byte */
        if (((unsigned char)p[st] & 0xC0) != 0x80) return jj_utf8_next(p + st, i - st) == i - st ? st : i - 1;
        if (st == a || i - st == 4) return i - 1;
    }
}

size_t jj_utf8_count(const char *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i += jj_utf8_next(p + i, n - i)) c++;
    return c;
}

size_t jj_utf8_offset(const char *p, size_t n, size_t i) {
    size_t b = 0;
    for (size_t k = 0; k < i && b < n; k++) b += jj_utf8_next(p + b, n - b);
    return b;
}

/* ---- truth, equality, order ---- */

int jj_truthy(jv v) {
    switch (v.kind) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.sub == JL_GEN || v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static int is_num(jv v) { return v.kind == JV_BOOL || v.kind == JV_INT || v.kind == JV_FLOAT; }
static double num_f(jv v) { return v.kind == JV_FLOAT ? v.u.f : (double)v.u.i; }

int jj_eq(jv a, jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) return a.u.i == b.u.i;
        return num_f(a) == num_f(b);
    }
    if (a.kind != b.kind) return 0;
    switch (a.kind) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case JV_LIST: {
        if (a.u.l == b.u.l) return 1;
        int seq_a = a.sub == JL_LIST || a.sub == JL_TUPLE || a.sub == JL_RANGE;
        if (a.sub != b.sub || !seq_a || a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jj_eq(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    }
    case JV_DICT: {
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv *o = jj_dict_get(b.u.d, a.u.d->k[i]);
            if (!o || !jj_eq(a.u.d->v[i], *o)) return 0;
        }
        return 1;
    }
    case JV_NS: return a.u.d == b.u.d;
    case JV_LOOP: return a.u.loop == b.u.loop;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_FUNC: return a.u.i == b.u.i;
    default: return 0;
    }
}

const char *jj_type_name(jv v) {
    switch (v.kind) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return v.sub == JS_MARKUP ? "Markup" : "str";
    case JV_LIST:
        switch (v.sub) {
        case JL_TUPLE: return "tuple";
        case JL_GEN: return "generator";
        case JL_ITEMS: return "dict_items";
        case JL_KEYS: return "dict_keys";
        case JL_VALUES: return "dict_values";
        case JL_RANGE: return "range";
        default: return "list";
        }
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_LOOP: return "LoopContext";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    default: return "builtin_function_or_method";
    }
}

dt_status_t jj_cmp(jj_render *r, jv a, jv b, uint32_t line, int *cmp) {
    if (is_num(a) && is_num(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT)
            *cmp = (a.u.i > b.u.i) - (a.u.i < b.u.i);
        else
            *cmp = (num_f(a) > num_f(b)) - (num_f(a) < num_f(b));
        return DT_STATUS_OK;
    }
    if (a.kind == JV_STR && b.kind == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, n);
        *cmp = c ? (c > 0) - (c < 0) : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
        return DT_STATUS_OK;
    }
    if (a.kind == JV_LIST && b.kind == JV_LIST && a.sub == b.sub && (a.sub == JL_LIST || a.sub == JL_TUPLE)) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (jj_eq(a.u.l->v[i], b.u.l->v[i])) continue;
            return jj_cmp(r, a.u.l->v[i], b.u.l->v[i], line, cmp);
        }
        *cmp = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return DT_STATUS_OK;
    }
    if (a.kind == JV_UNDEF) return jj_undef_fail(r, a, line);
    if (b.kind == JV_UNDEF) return jj_undef_fail(r, b, line);
    return jj_fail(r, line, DT_STATUS_INVALID, "'<' not supported between instances of '%s' and '%s'",
                   jj_type_name(a), jj_type_name(b));
}

dt_status_t jj_len(jj_render *r, jv v, uint32_t line, int64_t *n) {
    switch (v.kind) {
    case JV_UNDEF: *n = 0; return DT_STATUS_OK;
    case JV_STR: *n = (int64_t)jj_utf8_count(v.u.s.p, v.u.s.n); return DT_STATUS_OK;
    case JV_DICT: *n = (int64_t)v.u.d->n; return DT_STATUS_OK;
    case JV_LIST:
        if (v.sub != JL_GEN) {
            *n = (int64_t)v.u.l->n;
            return DT_STATUS_OK;
        }
        break;
    default: break;
    }
    return jj_fail(r, line, DT_STATUS_INVALID, "object of type '%s' has no len()", jj_type_name(v));
}

dt_status_t jj_iter(jj_render *r, jv v, uint32_t line, jv **items, size_t *n) {
    *items = NULL;
    *n = 0;
    switch (v.kind) {
    case JV_UNDEF: return DT_STATUS_OK;
    case JV_LIST:
        if (v.sub == JL_GEN) {
            if (v.u.l->consumed) return DT_STATUS_OK;
            v.u.l->consumed = 1;
        }
        *items = v.u.l->v;
        *n = v.u.l->n;
        return DT_STATUS_OK;
    case JV_DICT:
        *items = v.u.d->k;
        *n = v.u.d->n;
        return DT_STATUS_OK;
    case JV_STR: {
        size_t cnt = jj_utf8_count(v.u.s.p, v.u.s.n);
        jv *out = jj_alloc(&r->arena, (cnt ? cnt : 1) * sizeof *out);
        if (!out) return jj_oom(r);
        size_t k = 0;
        for (size_t i = 0; i < v.u.s.n;) {
            size_t j = i + jj_utf8_next(v.u.s.p + i, v.u.s.n - i);
            out[k++] = jv_str(v.u.s.p + i, j - i);
            i = j;
        }
        *items = out;
        *n = k;
        return DT_STATUS_OK;
    }
    default:
        return jj_fail(r, line, DT_STATUS_INVALID, "'%s' object is not iterable", jj_type_name(v));
    }
}

/* ---- undefined ---- */

static jv undef_of(jv obj, int why, const char *name, size_t n) {
    jv u = {.kind = JV_UNDEF, .sub = (uint8_t)why, .aux = obj.kind};
    if (obj.kind == JV_LIST) u.aux = (uint8_t)(JV_METHOD + 1 + obj.sub); /* keeps list vs tuple for messages */
    u.u.s.p = name;
    u.u.s.n = n;
    return u;
}

static const char *undef_obj_name(uint8_t aux) {
    if (aux > JV_METHOD) {
        jv l = {.kind = JV_LIST, .sub = (uint8_t)(aux - JV_METHOD - 1)};
        return jj_type_name(l);
    }
    jv o = {.kind = aux};
    return jj_type_name(o);
}

dt_status_t jj_undef_fail(jj_render *r, jv v, uint32_t line) {
    int n = (int)(v.u.s.n > 200 ? 200 : v.u.s.n);
    const char *obj = undef_obj_name(v.aux);
    switch (v.sub) {
    case JU_NAME: return jj_fail(r, line, DT_STATUS_INVALID, "'%.*s' is undefined", n, v.u.s.p);
    case JU_ATTR:
        if (v.aux == JV_NONE)
            return jj_fail(r, line, DT_STATUS_INVALID, "'None' has no attribute '%.*s'", n, v.u.s.p);
        return jj_fail(r, line, DT_STATUS_INVALID, "'%s object' has no attribute '%.*s'", obj, n, v.u.s.p);
    case JU_ITEM: return jj_fail(r, line, DT_STATUS_INVALID, "%s object has no element %.*s", obj, n, v.u.s.p);
    case JU_UNSAFE:
        return jj_fail(r, line, DT_STATUS_INVALID, "access to attribute '%.*s' of '%s' object is unsafe.", n,
                       v.u.s.p, obj);
    default: return jj_fail(r, line, DT_STATUS_INVALID, "%.*s", n, v.u.s.p);
    }
}

/* ---- attribute and item access (the sandbox's getattr / getitem) ---- */

static dt_status_t loop_attr(jj_render *r, jj_loop *l, const char *name, size_t n, jv *out, int *found) {
    int64_t i = (int64_t)l->i, len = (int64_t)l->n;
    *found = 1;
#define IS(s) (n == sizeof(s) - 1 && memcmp(name, s, n) == 0)
    if (IS("index")) *out = jv_int(i + 1);
    else if (IS("index0")) *out = jv_int(i);
    else if (IS("revindex")) *out = jv_int(len - i);
    else if (IS("revindex0")) *out = jv_int(len - i - 1);
    else if (IS("first")) *out = jv_bool(i == 0);
    else if (IS("last")) *out = jv_bool(i == len - 1);
    else if (IS("length")) *out = jv_int(len);
    else if (IS("depth")) *out = jv_int(1);
    else if (IS("depth0")) *out = jv_int(0);
    else if (IS("previtem")) *out = i > 0 ? l->items[i - 1] : (jv){.kind = JV_UNDEF, .sub = JU_MSG,
                                   .u.s = {"there is no previous item", 25}};
    else if (IS("nextitem")) *out = i + 1 < len ? l->items[i + 1] : (jv){.kind = JV_UNDEF, .sub = JU_MSG,
                                    .u.s = {"there is no next item", 21}};
    else *found = 0;
#undef IS
    (void)r;
    return DT_STATUS_OK;
}

static int is_unsafe(jv obj, const char *name, size_t n) {
    static const char *const dict_mut[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
    static const char *const list_mut[] = {"append", "clear", "pop", "reverse", "insert", "sort", "extend",
                                           "remove", NULL};
    const char *const *set = obj.kind == JV_DICT ? dict_mut : (obj.kind == JV_LIST && obj.sub == JL_LIST) ? list_mut
                                                                                                          : NULL;
    for (; set && *set; set++)
        if (strlen(*set) == n && memcmp(*set, name, n) == 0) return 1;
    return n >= 4 && name[0] == '_' && name[1] == '_' && name[n - 1] == '_' && name[n - 2] == '_'; /* dunders */
}

dt_status_t jj_getattr(jj_render *r, jv obj, const char *name, size_t n, uint32_t line, jv *out) {
    if (obj.kind == JV_UNDEF) return jj_undef_fail(r, obj, line);
    if (is_unsafe(obj, name, n)) {
        *out = undef_of(obj, JU_UNSAFE, name, n);
        return DT_STATUS_OK;
    }
    int m = jj_method_lookup(r, obj, name, n, out);
    if (m < 0) return jj_oom(r);
    if (m) return DT_STATUS_OK;
    if (obj.kind == JV_DICT || obj.kind == JV_NS) {
        jv *v = jj_dict_getn(obj.u.d, name, n);
        if (v) {
            *out = *v;
            return DT_STATUS_OK;
        }
    } else if (obj.kind == JV_LOOP) {
        int found;
        DT_CHECK(loop_attr(r, obj.u.loop, name, n, out, &found));
        if (found) return DT_STATUS_OK;
    }
    *out = undef_of(obj, JU_ATTR, name, n);
    return DT_STATUS_OK;
}

/* A Python index (bool and int) as int64 into *i; 0 when key is not one. */
static int as_index(jv key, int64_t *i) {
    if (key.kind != JV_INT && key.kind != JV_BOOL) return 0;
    *i = key.u.i;
    return 1;
}

dt_status_t jj_getitem(jj_render *r, jv obj, jv key, uint32_t line, jv *out) {
    if (obj.kind == JV_UNDEF) return jj_undef_fail(r, obj, line);
    int64_t i;
    if (obj.kind == JV_DICT) {
        jv *v = jj_dict_get(obj.u.d, key);
        if (v) {
            *out = *v;
            return DT_STATUS_OK;
        }
    } else if (obj.kind == JV_LIST && obj.sub != JL_GEN && obj.sub != JL_ITEMS && obj.sub != JL_KEYS &&
               obj.sub != JL_VALUES && as_index(key, &i)) {
        int64_t n = (int64_t)obj.u.l->n;
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
            *out = obj.u.l->v[i];
            return DT_STATUS_OK;
        }
    } else if (obj.kind == JV_STR && as_index(key, &i)) {
        int64_t n = (int64_t)jj_utf8_count(obj.u.s.p, obj.u.s.n);
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
            size_t a = jj_utf8_offset(obj.u.s.p, obj.u.s.n, (size_t)i);
            size_t b = jj_utf8_offset(obj.u.s.p, obj.u.s.n, (size_t)i + 1);
            *out = jv_str(obj.u.s.p + a, b - a);
            out->sub = obj.sub;
            return DT_STATUS_OK;
        }
    }
    if (key.kind == JV_STR) {
        jv v;
        DT_CHECK(jj_getattr(r, obj, key.u.s.p, key.u.s.n, line, &v));
        *out = v;
        return DT_STATUS_OK;
    }
    jj_buf b;
    jj_buf_init(&b);
    dt_status_t st = jj_repr_into(r, &b, key, line);
    jv name = jv_str("?", 1);
    if (st == DT_STATUS_OK) st = jj_buf_take(r, &b, &name);
    free(b.p);
    DT_CHECK(st);
    *out = undef_of(obj, JU_ITEM, name.u.s.p, name.u.s.n);
    return DT_STATUS_OK;
}
