/*
 * jinja_test.c - jinja2's tests (`x is defined`, `is string`, `is divisibleby 3`,
 * `select("equalto", y)`, ...) with Python's semantics: `number` holds for bools,
 * `sequence` for dicts and undefined, `sameas` is identity (refused for numbers and
 * strings, where Python's answer depends on its object cache).
 */
#include <math.h>
#include <string.h>

#include "runtime/tokenize/jinja_internal.h"

enum {
    T_ODD, T_EVEN, T_DIVISIBLEBY, T_DEFINED, T_UNDEFINED, T_FILTER, T_TEST, T_NONE, T_BOOLEAN, T_FALSE, T_TRUE,
    T_INTEGER, T_FLOAT, T_LOWER, T_UPPER, T_STRING, T_MAPPING, T_NUMBER, T_SEQUENCE, T_ITERABLE, T_CALLABLE,
    T_SAMEAS, T_ESCAPED, T_IN, T_EQ, T_NE, T_GT, T_GE, T_LT, T_LE,
};

static const struct {
    const char *name;
    int id;
} TESTS[] = {
    {"odd", T_ODD}, {"even", T_EVEN}, {"divisibleby", T_DIVISIBLEBY}, {"defined", T_DEFINED},
    {"undefined", T_UNDEFINED}, {"filter", T_FILTER}, {"test", T_TEST}, {"none", T_NONE},
    {"boolean", T_BOOLEAN}, {"false", T_FALSE}, {"true", T_TRUE}, {"integer", T_INTEGER}, {"float", T_FLOAT},
    {"lower", T_LOWER}, {"upper", T_UPPER}, {"string", T_STRING}, {"mapping", T_MAPPING}, {"number", T_NUMBER},
    {"sequence", T_SEQUENCE}, {"iterable", T_ITERABLE}, {"callable", T_CALLABLE}, {"sameas", T_SAMEAS},
    {"escaped", T_ESCAPED}, {"in", T_IN}, {"==", T_EQ}, {"eq", T_EQ}, {"equalto", T_EQ}, {"!=", T_NE},
    {"ne", T_NE}, {">", T_GT}, {"gt", T_GT}, {"greaterthan", T_GT}, {"ge", T_GE}, {">=", T_GE}, {"<", T_LT},
    {"lt", T_LT}, {"lessthan", T_LT}, {"<=", T_LE}, {"le", T_LE},
};

int jj_test_id(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof TESTS / sizeof TESTS[0]; i++)
        if (strlen(TESTS[i].name) == n && memcmp(TESTS[i].name, name, n) == 0) return TESTS[i].id;
    return -1;
}

/* ---- tests ---- */

static int is_num(jv v) { return v.kind == JV_INT || v.kind == JV_BOOL || v.kind == JV_FLOAT; }

static dt_status_t modulo_is(jj_render *r, jv v, jv m, int64_t want, uint32_t line, int *out) {
    if (v.kind == JV_UNDEF) return jj_undef_fail(r, v, line);
    if (!is_num(v) || !is_num(m))
        return jj_fail(r, line, DT_STATUS_INVALID, "unsupported operand type(s) for %%: '%s' and '%s'",
                       jj_type_name(v), jj_type_name(m));
    if (v.kind == JV_FLOAT || m.kind == JV_FLOAT) {
        double q = m.kind == JV_FLOAT ? m.u.f : (double)m.u.i, x = v.kind == JV_FLOAT ? v.u.f : (double)v.u.i;
        if (q == 0) return jj_fail(r, line, DT_STATUS_INVALID, "float modulo");
        double md = fmod(x, q);
        if (md != 0 && ((md < 0) != (q < 0))) md += q;
        *out = md == (double)want;
        return DT_STATUS_OK;
    }
    if (m.u.i == 0) return jj_fail(r, line, DT_STATUS_INVALID, "integer division or modulo by zero");
    int64_t md = v.u.i % m.u.i;
    if (md != 0 && ((md < 0) != (m.u.i < 0))) md += m.u.i;
    *out = md == want;
    return DT_STATUS_OK;
}

dt_status_t jj_test(jj_render *r, int id, jv v, const jv *args, size_t nargs, uint32_t line, int *out) {
    static const int nargs_of[] = {[T_DIVISIBLEBY] = 1, [T_SAMEAS] = 1, [T_IN] = 1, [T_EQ] = 1, [T_NE] = 1,
                                   [T_GT] = 1, [T_GE] = 1, [T_LT] = 1, [T_LE] = 1};
    if (nargs != (size_t)nargs_of[id])
        return jj_fail(r, line, DT_STATUS_INVALID, "the test takes %d argument(s), %zu given", nargs_of[id] + 1,
                       nargs + 1);
    switch (id) {
    case T_ODD: return modulo_is(r, v, jv_int(2), 1, line, out);
    case T_EVEN: return modulo_is(r, v, jv_int(2), 0, line, out);
    case T_DIVISIBLEBY: return modulo_is(r, v, args[0], 0, line, out);
    case T_DEFINED: *out = v.kind != JV_UNDEF; return DT_STATUS_OK;
    case T_UNDEFINED: *out = v.kind == JV_UNDEF; return DT_STATUS_OK;
    case T_FILTER: *out = v.kind == JV_STR && jj_filter_id(v.u.s.p, v.u.s.n) != -1; return DT_STATUS_OK;
    case T_TEST: *out = v.kind == JV_STR && jj_test_id(v.u.s.p, v.u.s.n) != -1; return DT_STATUS_OK;
    case T_NONE: *out = v.kind == JV_NONE; return DT_STATUS_OK;
    case T_BOOLEAN: *out = v.kind == JV_BOOL; return DT_STATUS_OK;
    case T_FALSE: *out = v.kind == JV_BOOL && !v.u.i; return DT_STATUS_OK;
    case T_TRUE: *out = v.kind == JV_BOOL && v.u.i; return DT_STATUS_OK;
    case T_INTEGER: *out = v.kind == JV_INT; return DT_STATUS_OK;
    case T_FLOAT: *out = v.kind == JV_FLOAT; return DT_STATUS_OK;
    case T_LOWER: case T_UPPER: {
        jv s, m;
        DT_CHECK(jj_to_str(r, v, line, &s));
        if (jj_method_lookup(r, s, id == T_LOWER ? "islower" : "isupper", 7, &m) < 0) return jj_oom(r);
        DT_CHECK(jj_method_call(r, m.u.meth, NULL, 0, NULL, NULL, NULL, 0, line, &m));
        *out = (int)m.u.i;
        return DT_STATUS_OK;
    }
    case T_STRING: *out = v.kind == JV_STR; return DT_STATUS_OK;
    case T_MAPPING: *out = v.kind == JV_DICT; return DT_STATUS_OK;
    case T_NUMBER: *out = is_num(v); return DT_STATUS_OK;
    case T_SEQUENCE:
        *out = v.kind == JV_STR || v.kind == JV_DICT || v.kind == JV_UNDEF ||
               (v.kind == JV_LIST && (v.sub == JL_LIST || v.sub == JL_TUPLE || v.sub == JL_RANGE));
        return DT_STATUS_OK;
    case T_ITERABLE:
        *out = v.kind == JV_STR || v.kind == JV_DICT || v.kind == JV_UNDEF || v.kind == JV_LIST || v.kind == JV_LOOP;
        return DT_STATUS_OK;
    case T_CALLABLE:
        *out = v.kind == JV_MACRO || v.kind == JV_FUNC || v.kind == JV_METHOD || v.kind == JV_UNDEF;
        return DT_STATUS_OK;
    case T_SAMEAS: {
        jv o = args[0];
        int singleton = v.kind == JV_NONE || v.kind == JV_BOOL || o.kind == JV_NONE || o.kind == JV_BOOL;
        if (singleton || v.kind != o.kind) {
            *out = v.kind == o.kind && (v.kind == JV_NONE || v.u.i == o.u.i);
            return DT_STATUS_OK;
        }
        if (v.kind == JV_LIST || v.kind == JV_DICT || v.kind == JV_NS) {
            *out = v.kind == JV_LIST ? v.u.l == o.u.l : v.u.d == o.u.d;
            return DT_STATUS_OK;
        }
        return jj_fail(r, line, DT_STATUS_UNSUPPORTED, "'sameas' on %s values (Python object identity)",
                       jj_type_name(v));
    }
    case T_ESCAPED: *out = v.kind == JV_STR && v.sub == JS_MARKUP; return DT_STATUS_OK;
    case T_IN: {
        jv seq = args[0], *items;
        size_t n;
        if (seq.kind == JV_STR) {
            if (v.kind != JV_STR)
                return jj_fail(r, line, DT_STATUS_INVALID, "'in <string>' requires string as left operand, not %s",
                               jj_type_name(v));
            *out = 0;
            for (size_t i = 0; i + v.u.s.n <= seq.u.s.n && !*out; i++)
                *out = memcmp(seq.u.s.p + i, v.u.s.p, v.u.s.n) == 0;
            return DT_STATUS_OK;
        }
        if (seq.kind == JV_DICT) {
            *out = jj_dict_get(seq.u.d, v) != NULL;
            return DT_STATUS_OK;
        }
        DT_CHECK(jj_iter(r, seq, line, &items, &n));
        *out = 0;
        for (size_t i = 0; i < n && !*out; i++) *out = jj_eq(items[i], v);
        return DT_STATUS_OK;
    }
    case T_EQ: *out = jj_eq(v, args[0]); return DT_STATUS_OK;
    case T_NE: *out = !jj_eq(v, args[0]); return DT_STATUS_OK;
    default: {
        int c;
        DT_CHECK(jj_cmp(r, v, args[0], line, &c));
        *out = id == T_GT ? c > 0 : id == T_GE ? c >= 0 : id == T_LT ? c < 0 : c <= 0;
        return DT_STATUS_OK;
    }
    }
}

dt_status_t jj_test_named(jj_render *r, jv name, jv in, const jv *args, size_t nargs, uint32_t line, int *out) {
    if (name.kind != JV_STR) return jj_fail(r, line, DT_STATUS_INVALID, "a test name must be a string");
    int id = jj_test_id(name.u.s.p, name.u.s.n);
    if (id < 0) return jj_fail(r, line, DT_STATUS_INVALID, "No test named '%.*s'.", (int)name.u.s.n, name.u.s.p);
    return jj_test(r, id, in, args, nargs, line, out);
}
