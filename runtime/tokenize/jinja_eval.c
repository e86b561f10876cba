/*
 * jinja_eval.c - a template's expressions, with Python's operators (int/float
 * arithmetic, str and list concatenation and repetition, chained comparisons,
 * `in`, and/or returning an operand, slices), variable lookup through the scopes,
 * calls of macros, globals and methods with their arguments evaluated.
 */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xrealloc */
#include "runtime/tokenize/jinja_internal.h"



/* ---- scopes ---- */

jj_frame *jj_frame_new(jj_render *r, jj_frame *parent) {
    jj_frame *f = jj_alloc(&r->arena, sizeof *f);
    if (f) f->parent = parent;
    return f;
}

jv *jj_frame_find(jj_frame *f, const char *name, size_t n) {
    for (; f; f = f->parent)
        for (size_t i = 0; i < f->n; i++)
            if (f->vars[i].n == n && memcmp(f->vars[i].name, name, n) == 0) return &f->vars[i].v;
    return NULL;
}

dt_status_t jj_frame_set(jj_render *r, jj_frame *f, const char *name, size_t n, jv v) {
    for (size_t i = 0; i < f->n; i++)
        if (f->vars[i].n == n && memcmp(f->vars[i].name, name, n) == 0) {
            f->vars[i].v = v;
            return DT_STATUS_OK;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 8;
        jj_var *nv = jj_alloc(&r->arena, cap * sizeof *nv);
        if (!nv) return jj_oom(r);
        if (f->n) memcpy(nv, f->vars, f->n * sizeof *nv);
        f->vars = nv;
        f->cap = cap;
    }
    f->vars[f->n++] = (jj_var){name, n, v};
    return DT_STATUS_OK;
}

dt_status_t jj_step(jj_render *r, uint32_t line) {
    if (++r->steps > r->lim.max_steps)
        return jj_fail(r, line, DT_STATUS_LIMIT, "the template ran more than %llu loop iterations and macro calls",
                       (unsigned long long)r->lim.max_steps);
    return DT_STATUS_OK;
}

/* ---- arithmetic ---- */

static int num(jv v) { return v.kind == JV_INT || v.kind == JV_BOOL || v.kind == JV_FLOAT; }
static double fl(jv v) { return v.kind == JV_FLOAT ? v.u.f : (double)v.u.i; }

static dt_status_t overflow(jj_render *r, uint32_t line) {
    return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "integer overflow (Python integers are unbounded, these are "
                   "64-bit)");
}

static dt_status_t repeat(jj_render *r, jv seq, int64_t times, uint32_t line, jv *out) {
    if (times < 0 || (seq.kind == JV_STR ? seq.u.s.n : seq.u.l->n) == 0) times = 0; /* "" * 10**16: no loop */
    if (seq.kind == JV_STR) {
        if (times && seq.u.s.n > r->lim.max_output / (uint64_t)times)
            return jj_fail(r, line, DT_STATUS_LIMIT, "a string repeated %lld times is longer than %zu MiB",
                           (long long)times, r->lim.max_output >> 20);
        size_t total = seq.u.s.n * (size_t)times;
        char *p = jj_alloc(&r->arena, total + 1);
        if (!p) return jj_oom(r);
        for (int64_t i = 0; i < times; i++) memcpy(p + (size_t)i * seq.u.s.n, seq.u.s.p, seq.u.s.n);
        *out = jv_str(p, total);
        out->sub = seq.sub;
        return DT_STATUS_OK;
    }
    if (times && seq.u.l->n > (r->lim.max_memory / sizeof(jv)) / (uint64_t)times) return jj_oom(r);
    jj_list *l = jj_list_new(r, seq.u.l->n * (size_t)times);
    if (!l) return jj_oom(r);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.u.l->n; k++) DT_CHECK(jj_list_push(r, l, seq.u.l->v[k]));
    *out = (jv){.kind = JV_LIST, .sub = seq.sub, .u.l = l};
    return DT_STATUS_OK;
}

static const char *OPNAME[] = {[JO_ADD] = "+", [JO_SUB] = "-", [JO_MUL] = "*", [JO_DIV] = "/",
                               [JO_FLOORDIV] = "//", [JO_MOD] = "%", [JO_POW] = "**"};

static dt_status_t binop(jj_render *r, int op, jv a, jv b, uint32_t line, jv *out) {
    if (op == JO_MOD && a.kind == JV_STR) return jj_str_percent(r, a, b, line, out);
    if (a.kind == JV_UNDEF) return jj_undef_fail(r, a, line);
    if (b.kind == JV_UNDEF) return jj_undef_fail(r, b, line);
    if (num(a) && num(b)) {
        int ints = a.kind != JV_FLOAT && b.kind != JV_FLOAT;
        int64_t x = a.u.i, y = b.u.i, z;
        double p = fl(a), q = fl(b);
        switch (op) {
        case JO_ADD:
            if (!ints) break;
            if (__builtin_add_overflow(x, y, &z)) return overflow(r, line);
            *out = jv_int(z);
            return DT_STATUS_OK;
        case JO_SUB:
            if (!ints) break;
            if (__builtin_sub_overflow(x, y, &z)) return overflow(r, line);
            *out = jv_int(z);
            return DT_STATUS_OK;
        case JO_MUL:
            if (!ints) break;
            if (__builtin_mul_overflow(x, y, &z)) return overflow(r, line);
            *out = jv_int(z);
            return DT_STATUS_OK;
        case JO_DIV:
            if (q == 0) return jj_fail(r, line, DT_STATUS_INVALID, "division by zero");
            *out = jv_float(p / q);
            return DT_STATUS_OK;
        case JO_FLOORDIV: case JO_MOD:
            if (ints) {
                if (y == 0) return jj_fail(r, line, DT_STATUS_INVALID, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) return overflow(r, line);
                int64_t d = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    d--;
                    m += y;
                }
                *out = jv_int(op == JO_MOD ? m : d);
                return DT_STATUS_OK;
            }
            if (q == 0)
                return jj_fail(r, line, DT_STATUS_INVALID, op == JO_MOD ? "float modulo" : "float floor division by zero");
            if (op == JO_MOD) {
                double m = fmod(p, q);
                if (m != 0 && ((m < 0) != (q < 0))) m += q;
                if (m == 0) m = copysign(0.0, q);
                *out = jv_float(m);
            } else {
                double m = fmod(p, q), d = (p - m) / q;
                if (m != 0 && ((m < 0) != (q < 0))) d -= 1.0;
                double fd = floor(d);
                if (d - fd > 0.5) fd += 1.0;
                *out = jv_float(d != 0 ? fd : copysign(0.0, p / q));
            }
            return DT_STATUS_OK;
        case JO_POW:
            if (ints && y >= 0) {
                int64_t acc = 1, base = x;
                for (int64_t e = y; e > 0; e >>= 1) {
                    if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) return overflow(r, line);
                    if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow(r, line);
                }
                *out = jv_int(acc);
                return DT_STATUS_OK;
            }
            if (p == 0 && q < 0)
                return jj_fail(r, line, DT_STATUS_INVALID, "0.0 cannot be raised to a negative power");
            *out = jv_float(pow(p, q));
            return DT_STATUS_OK;
        }
        double res = op == JO_ADD ? p + q : op == JO_SUB ? p - q : p * q;
        *out = jv_float(res);
        return DT_STATUS_OK;
    }
    if (op == JO_ADD && a.kind == JV_STR && b.kind == JV_STR) {
        if (a.sub != b.sub) { /* Markup + str escapes the str */
            if (a.sub == JS_PLAIN) DT_CHECK(jj_escape(r, a, line, &a));
            if (b.sub == JS_PLAIN) DT_CHECK(jj_escape(r, b, line, &b));
        }
        if (a.u.s.n + b.u.s.n > r->lim.max_output)
            return jj_fail(r, line, DT_STATUS_LIMIT, "a string longer than %zu MiB", r->lim.max_output >> 20);
        char *p = jj_alloc(&r->arena, a.u.s.n + b.u.s.n + 1);
        if (!p) return jj_oom(r);
        memcpy(p, a.u.s.p, a.u.s.n);
        memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
        *out = jv_str(p, a.u.s.n + b.u.s.n);
        out->sub = a.sub;
        return DT_STATUS_OK;
    }
    if (op == JO_ADD && a.kind == JV_LIST && b.kind == JV_LIST && a.sub == b.sub &&
        (a.sub == JL_LIST || a.sub == JL_TUPLE)) {
        jj_list *l = jj_list_new(r, a.u.l->n + b.u.l->n);
        if (!l) return jj_oom(r);
        for (size_t i = 0; i < a.u.l->n; i++) DT_CHECK(jj_list_push(r, l, a.u.l->v[i]));
        for (size_t i = 0; i < b.u.l->n; i++) DT_CHECK(jj_list_push(r, l, b.u.l->v[i]));
        *out = (jv){.kind = JV_LIST, .sub = a.sub, .u.l = l};
        return DT_STATUS_OK;
    }
    if (op == JO_MUL) {
        int seq_a = a.kind == JV_STR || (a.kind == JV_LIST && (a.sub == JL_LIST || a.sub == JL_TUPLE));
        int seq_b = b.kind == JV_STR || (b.kind == JV_LIST && (b.sub == JL_LIST || b.sub == JL_TUPLE));
        if (seq_a && (b.kind == JV_INT || b.kind == JV_BOOL)) return repeat(r, a, b.u.i, line, out);
        if (seq_b && (a.kind == JV_INT || a.kind == JV_BOOL)) return repeat(r, b, a.u.i, line, out);
    }
    if (op == JO_ADD && a.kind == JV_STR)
        return jj_fail(r, line, DT_STATUS_INVALID, "can only concatenate str (not \"%s\") to str", jj_type_name(b));
    if (op == JO_ADD && a.kind == JV_LIST && a.sub == JL_LIST)
        return jj_fail(r, line, DT_STATUS_INVALID, "can only concatenate list (not \"%s\") to list", jj_type_name(b));
    return jj_fail(r, line, DT_STATUS_INVALID, "unsupported operand type(s) for %s: '%s' and '%s'", OPNAME[op],
                   jj_type_name(a), jj_type_name(b));
}

/* ---- comparisons ---- */

static dt_status_t contains(jj_render *r, jv seq, jv x, uint32_t line, int *out) {
    if (seq.kind == JV_STR) {
        if (x.kind != JV_STR)
            return jj_fail(r, line, DT_STATUS_INVALID, "'in <string>' requires string as left operand, not %s",
                           jj_type_name(x));
        *out = x.u.s.n == 0 || (x.u.s.n <= seq.u.s.n && memmem(seq.u.s.p, seq.u.s.n, x.u.s.p, x.u.s.n) != NULL);
        return DT_STATUS_OK;
    }
    if (seq.kind == JV_DICT) {
        if (x.kind == JV_DICT || x.kind == JV_NS || (x.kind == JV_LIST && x.sub != JL_TUPLE && x.sub != JL_RANGE))
            return jj_fail(r, line, DT_STATUS_INVALID, "unhashable type: '%s'", jj_type_name(x));
        *out = jj_dict_get(seq.u.d, x) != NULL;
        return DT_STATUS_OK;
    }
    if (seq.kind == JV_LIST && seq.sub == JL_ITEMS) { /* x in d.items(): pairs */
        for (size_t i = 0; i < seq.u.l->n; i++)
            if (jj_eq(seq.u.l->v[i], x)) return *out = 1, DT_STATUS_OK;
        return *out = 0, DT_STATUS_OK;
    }
    if (seq.kind != JV_LIST && seq.kind != JV_UNDEF)
        return jj_fail(r, line, DT_STATUS_INVALID, "argument of type '%s' is not iterable", jj_type_name(seq));
    jv *items;
    size_t n;
    DT_CHECK(jj_iter(r, seq, line, &items, &n));
    *out = 0;
    for (size_t i = 0; i < n && !*out; i++) *out = jj_eq(items[i], x);
    return DT_STATUS_OK;
}

static dt_status_t compare(jj_render *r, int op, jv a, jv b, uint32_t line, int *out) {
    int c;
    switch (op) {
    case JO_EQ: *out = jj_eq(a, b); return DT_STATUS_OK;
    case JO_NE: *out = !jj_eq(a, b); return DT_STATUS_OK;
    case JO_IN: return contains(r, b, a, line, out);
    case JO_NOTIN: DT_CHECK(contains(r, b, a, line, out)); *out = !*out; return DT_STATUS_OK;
    default: break;
    }
    DT_CHECK(jj_cmp(r, a, b, line, &c));
    *out = op == JO_LT ? c < 0 : op == JO_LTEQ ? c <= 0 : op == JO_GT ? c > 0 : c >= 0;
    return DT_STATUS_OK;
}

/* ---- slicing ---- */

static int slice_index(jv v, int64_t *out) {
    if (v.kind == JV_NONE) return 0;
    *out = v.u.i;
    return 1;
}

static dt_status_t getslice(jj_render *r, jv obj, const jj_node *sl, jj_frame *f, jv *out) {
    jv parts[3] = {jv_none(), jv_none(), jv_none()};
    const jj_node *pn[3] = {sl->a, sl->b, sl->c};
    for (int i = 0; i < 3; i++)
        if (pn[i]) DT_CHECK(jj_eval(r, f, pn[i], &parts[i]));
    if (obj.kind == JV_UNDEF) return jj_undef_fail(r, obj, sl->line);
    /* a slice is Python's own obj[a:b:c] (jinja2 compiles it without getitem): errors raise */
    int is_seq = obj.kind == JV_STR ||
                 (obj.kind == JV_LIST && (obj.sub == JL_LIST || obj.sub == JL_TUPLE || obj.sub == JL_RANGE));
    if (!is_seq)
        return jj_fail(r, sl->line, DT_STATUS_INVALID, obj.kind == JV_DICT ? "unhashable type: 'slice'"
                       : "'%s' object is not subscriptable", jj_type_name(obj));
    for (int i = 0; i < 3; i++)
        if (parts[i].kind != JV_NONE && parts[i].kind != JV_INT && parts[i].kind != JV_BOOL)
            return jj_fail(r, sl->line, DT_STATUS_INVALID, "slice indices must be integers or None or have an "
                           "__index__ method");
    int64_t step = 1, start, stop;
    if (slice_index(parts[2], &step) && step == 0)
        return jj_fail(r, sl->line, DT_STATUS_INVALID, "slice step cannot be zero");
    size_t *offs = NULL; /* a string: byte offset of each code point, and the end */
    int64_t len;
    if (obj.kind == JV_STR) {
        len = (int64_t)jj_utf8_count(obj.u.s.p, obj.u.s.n);
        offs = jj_alloc(&r->arena, ((size_t)len + 1) * sizeof *offs);
        if (!offs) return jj_oom(r);
        size_t k = 0;
        for (size_t b = 0; b < obj.u.s.n; b += jj_utf8_next(obj.u.s.p + b, obj.u.s.n - b)) offs[k++] = b;
        offs[k] = obj.u.s.n;
    } else {
        len = (int64_t)obj.u.l->n;
    }
    int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? len : len - 1;
    if (!slice_index(parts[0], &start))
        start = step > 0 ? lower : upper;
    else
        start = start < 0 ? (start + len < lower ? lower : start + len) : (start > upper ? upper : start);
    if (!slice_index(parts[1], &stop))
        stop = step > 0 ? upper : lower;
    else
        stop = stop < 0 ? (stop + len < lower ? lower : stop + len) : (stop > upper ? upper : stop);
    if (obj.kind == JV_STR) {
        if (step == 1) {
            *out = jv_str(obj.u.s.p + offs[start], start < stop ? offs[stop] - offs[start] : 0);
            out->sub = obj.sub;
            return DT_STATUS_OK;
        }
        jj_buf b;
        jj_buf_init(&b);
        dt_status_t st = DT_STATUS_OK;
        for (int64_t i = start; (step > 0 ? i < stop : i > stop) && st == DT_STATUS_OK; i += step)
            st = jj_buf_put(r, &b, obj.u.s.p + offs[i], offs[i + 1] - offs[i]);
        if (st == DT_STATUS_OK) st = jj_buf_take(r, &b, out);
        free(b.p);
        out->sub = obj.sub;
        return st;
    }
    jj_list *l = jj_list_new(r, 0);
    if (!l) return jj_oom(r);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) DT_CHECK(jj_list_push(r, l, obj.u.l->v[i]));
    if (obj.sub == JL_RANGE) { /* range(a, b, c)[i:j:k] is range(a + i*c, a + j*c, c*k) */
        l->start = obj.u.l->start + start * obj.u.l->step;
        l->stop = obj.u.l->start + stop * obj.u.l->step;
        l->step = obj.u.l->step * step;
    }
    *out = (jv){.kind = JV_LIST, .sub = obj.sub, .u.l = l};
    return DT_STATUS_OK;
}

/* ---- calls ---- */


dt_status_t jj_eval_args(jj_render *r, jj_frame *f, const jj_node *x, int extra_kw, jj_callargs *a) {
    memset(a, 0, sizeof *a);
    a->args = jj_alloc(&r->arena, (x->l1.n + 1) * sizeof *a->args);
    a->kwn = jj_alloc(&r->arena, (x->l2.n + 1 + (size_t)extra_kw) * sizeof *a->kwn);
    a->kwl = jj_alloc(&r->arena, (x->l2.n + 1 + (size_t)extra_kw) * sizeof *a->kwl);
    a->kwv = jj_alloc(&r->arena, (x->l2.n + 1 + (size_t)extra_kw) * sizeof *a->kwv);
    if (!a->args || !a->kwn || !a->kwl || !a->kwv) return jj_oom(r);
    for (uint32_t i = 0; i < x->l1.n; i++) DT_CHECK(jj_eval(r, f, x->l1.v[i], &a->args[a->nargs++]));
    for (uint32_t i = 0; i < x->l2.n; i++) {
        const jj_node *kw = x->l2.v[i];
        a->kwn[a->nkw] = kw->s;
        a->kwl[a->nkw] = kw->sn;
        DT_CHECK(jj_eval(r, f, kw->a, &a->kwv[a->nkw++]));
    }
    return DT_STATUS_OK;
}

/* ---- expressions ---- */

static dt_status_t eval_filter(jj_render *r, jj_frame *f, const jj_node *x, jv *out) {
    jv in;
    if (x->a)
        DT_CHECK(jj_eval(r, f, x->a, &in));
    else
        in = r->filter_input;
    if (x->id < 0) return jj_fail(r, x->line, DT_STATUS_FORMAT, "No filter named '%.*s'.", (int)x->sn, x->s);
    jj_callargs a;
    DT_CHECK(jj_eval_args(r, f, x, 0, &a));
    return jj_filter(r, x->id, in, a.args, a.nargs, a.kwn, a.kwl, a.kwv, a.nkw, x->line, out);
}

static dt_status_t eval_node(jj_render *r, jj_frame *f, const jj_node *x, jv *out);

/* Every evaluation and statement passes here: the C stack stays bounded whatever
 * the template nests (macros calling macros through their arguments, say). */
dt_status_t jj_eval(jj_render *r, jj_frame *f, const jj_node *x, jv *out) {
    if (++r->nest > JJ_MAX_NEST) {
        r->nest--;
        return jj_fail(r, x->line, DT_STATUS_LIMIT, "the template nests expressions and calls more than %d deep",
                       JJ_MAX_NEST);
    }
    dt_status_t st = eval_node(r, f, x, out);
    r->nest--;
    return st;
}

static dt_status_t eval_node(jj_render *r, jj_frame *f, const jj_node *x, jv *out) {
    jv a, b;
    switch (x->type) {
    case JN_CONST: *out = x->val; return DT_STATUS_OK;
    case JN_NAME: {
        jv *v = jj_frame_find(f, x->s, x->sn);
        if (v) *out = *v;
        else if (!jj_global_lookup(x->s, x->sn, out)) *out = jv_undef_name(x->s, x->sn);
        return DT_STATUS_OK;
    }
    case JN_LIST: case JN_TUPLE: {
        jj_list *l = jj_list_new(r, x->l1.n);
        if (!l) return jj_oom(r);
        for (uint32_t i = 0; i < x->l1.n; i++) {
            DT_CHECK(jj_eval(r, f, x->l1.v[i], &a));
            DT_CHECK(jj_list_push(r, l, a));
        }
        *out = (jv){.kind = JV_LIST, .sub = x->type == JN_TUPLE ? JL_TUPLE : JL_LIST, .u.l = l};
        return DT_STATUS_OK;
    }
    case JN_DICT: {
        jj_dict *d = jj_dict_new(r, x->l1.n);
        if (!d) return jj_oom(r);
        for (uint32_t i = 0; i < x->l1.n; i++) {
            DT_CHECK(jj_eval(r, f, x->l1.v[i], &a));
            DT_CHECK(jj_eval(r, f, x->l2.v[i], &b));
            if (a.kind == JV_LIST || a.kind == JV_DICT || a.kind == JV_NS)
                return jj_fail(r, x->line, DT_STATUS_INVALID, "unhashable type: '%s'", jj_type_name(a));
            DT_CHECK(jj_dict_set(r, d, a, b));
        }
        *out = (jv){.kind = JV_DICT, .u.d = d};
        return DT_STATUS_OK;
    }
    case JN_GETATTR:
        DT_CHECK(jj_eval(r, f, x->a, &a));
        return jj_getattr(r, a, x->s, x->sn, x->line, out);
    case JN_GETITEM:
        DT_CHECK(jj_eval(r, f, x->a, &a));
        if (x->b->type == JN_SLICE) return getslice(r, a, x->b, f, out);
        DT_CHECK(jj_eval(r, f, x->b, &b));
        return jj_getitem(r, a, b, x->line, out);
    case JN_CALL: {
        jj_callargs c;
        DT_CHECK(jj_eval(r, f, x->a, &a));
        DT_CHECK(jj_eval_args(r, f, x, 0, &c));
        return jj_call(r, a, c.args, c.nargs, c.kwn, c.kwl, c.kwv, c.nkw, x->line, out);
    }
    case JN_FILTER: return eval_filter(r, f, x, out);
    case JN_TEST: {
        DT_CHECK(jj_eval(r, f, x->a, &a));
        if (x->id < 0) return jj_fail(r, x->line, DT_STATUS_FORMAT, "No test named '%.*s'.", (int)x->sn, x->s);
        jj_callargs c;
        DT_CHECK(jj_eval_args(r, f, x, 0, &c));
        int res;
        DT_CHECK(jj_test(r, x->id, a, c.args, c.nargs, x->line, &res));
        *out = jv_bool(res);
        return DT_STATUS_OK;
    }
    case JN_BINOP:
        DT_CHECK(jj_eval(r, f, x->a, &a));
        DT_CHECK(jj_eval(r, f, x->b, &b));
        return binop(r, x->op, a, b, x->line, out);
    case JN_CONCAT: {
        jj_buf buf;
        jj_buf_init(&buf);
        dt_status_t st = DT_STATUS_OK;
        for (uint32_t i = 0; i < x->l1.n && st == DT_STATUS_OK; i++) {
            st = jj_eval(r, f, x->l1.v[i], &a);
            if (st == DT_STATUS_OK) st = jj_str_into(r, &buf, a, x->line);
        }
        if (st == DT_STATUS_OK) st = jj_buf_take(r, &buf, out);
        free(buf.p);
        return st;
    }
    case JN_CMP: {
        DT_CHECK(jj_eval(r, f, x->a, &a));
        int res = 1;
        for (uint32_t i = 0; i < x->l1.n && res; i++) {
            DT_CHECK(jj_eval(r, f, x->l1.v[i], &b));
            DT_CHECK(compare(r, x->ops[i], a, b, x->line, &res));
            a = b;
        }
        *out = jv_bool(res);
        return DT_STATUS_OK;
    }
    case JN_AND: case JN_OR:
        DT_CHECK(jj_eval(r, f, x->a, &a));
        if (jj_truthy(a) == (x->type == JN_OR)) {
            *out = a;
            return DT_STATUS_OK;
        }
        return jj_eval(r, f, x->b, out);
    case JN_NOT:
        DT_CHECK(jj_eval(r, f, x->a, &a));
        *out = jv_bool(!jj_truthy(a));
        return DT_STATUS_OK;
    case JN_NEG: case JN_POS:
        DT_CHECK(jj_eval(r, f, x->a, &a));
        if (a.kind == JV_UNDEF) return jj_undef_fail(r, a, x->line);
        if (a.kind == JV_FLOAT) {
            *out = jv_float(x->type == JN_NEG ? -a.u.f : a.u.f);
        } else if (a.kind == JV_INT || a.kind == JV_BOOL) {
            if (x->type == JN_NEG && a.u.i == INT64_MIN) return overflow(r, x->line);
            *out = jv_int(x->type == JN_NEG ? -a.u.i : a.u.i);
        } else {
            return jj_fail(r, x->line, DT_STATUS_INVALID, "bad operand type for unary %c: '%s'",
                           x->type == JN_NEG ? '-' : '+', jj_type_name(a));
        }
        return DT_STATUS_OK;
    case JN_COND:
        DT_CHECK(jj_eval(r, f, x->a, &a));
        if (jj_truthy(a)) return jj_eval(r, f, x->b, out);
        if (x->c) return jj_eval(r, f, x->c, out);
        *out = (jv){.kind = JV_UNDEF, .sub = JU_MSG,
                    .u.s = {"the inline if-expression evaluated to false and no else section was defined", 76}};
        return DT_STATUS_OK;
    default:
        return jj_fail(r, x->line, DT_STATUS_UNSUPPORTED, "expression node %d", x->type);
    }
}

