/*
 * jinja_parse.c - a template's expressions from tokens into the syntax tree,
 * following jinja2's parser.py rule for rule (precedence, tuples without
 * parentheses, tests with one bare argument, adjacent strings joined, filters
 * and tests resolved by name). A filter or test that jinja2 has and the renderer
 * does not is DT_STATUS_UNSUPPORTED here, at parse time, naming it and its line.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xcalloc, dt_xstrdup */
#include "runtime/tokenize/jinja_parser.h"

const char *jp_describe(const jj_tok *t, char *buf, size_t len) {
    switch (t->type) {
    case JT_EOF: return "end of template";
    case JT_BLOCK_END: return "end of statement block";
    case JT_VAR_END: return "end of print statement";
    case JT_BLOCK_BEGIN: return "begin of statement block";
    case JT_VAR_BEGIN: return "begin of print statement";
    case JT_DATA: return "template data";
    case JT_STRING: return "string";
    default: snprintf(buf, len, "%.*s", (int)(t->n > 40 ? 40 : t->n), t->p); return buf;
    }
}

dt_status_t jp_fail(jj_parser *P, dt_status_t st, uint32_t line, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt_error(st, "%s:%u: %s", P->t->name, line, msg);
}

dt_status_t jp_unexpected(jj_parser *P, const char *want) {
    char buf[64];
    return jp_fail(P, DT_STATUS_FORMAT, cur(P)->line, "expected %s, got '%s'", want, jp_describe(cur(P), buf, sizeof buf));
}

dt_status_t jp_expect_op(jj_parser *P, int op, const char *what) {
    if (!is_op(cur(P), op)) return jp_unexpected(P, what);
    next(P);
    return DT_STATUS_OK;
}

dt_status_t jp_expect_type(jj_parser *P, int type, const char *what) {
    if (cur(P)->type != type) return jp_unexpected(P, what);
    next(P);
    return DT_STATUS_OK;
}

dt_status_t jp_node(jj_parser *P, int type, uint32_t line, jj_node **out) {
    *out = NULL;
    jj_node *x = jj_alloc(&P->t->pool, sizeof *x);
    if (!x) return dt_error(DT_STATUS_NOMEM, "%s: template too large", P->t->name);
    x->type = (uint8_t)type;
    x->line = line;
    x->id = -1;
    *out = x;
    return DT_STATUS_OK;
}

/* Appends to a list whose capacity doubles at powers of two. */
dt_status_t jp_push(jj_parser *P, jj_nlist *l, jj_node *x) {
    if ((l->n & (l->n - 1)) == 0) { /* 0, 1, 2, 4, ...: full */
        size_t cap = l->n ? 2 * (size_t)l->n : 1;
        jj_node **v = jj_alloc(&P->t->pool, cap * sizeof *v);
        if (!v) return dt_error(DT_STATUS_NOMEM, "%s: template too large", P->t->name);
        if (l->n) memcpy(v, l->v, l->n * sizeof *v);
        l->v = v;
    }
    l->v[l->n++] = x;
    return DT_STATUS_OK;
}

dt_status_t jp_deeper(jj_parser *P) {
    if (++P->depth > JP_MAX_NEST)
        return jp_fail(P, DT_STATUS_LIMIT, cur(P)->line, "expressions or blocks nested more than %d deep", JP_MAX_NEST);
    return DT_STATUS_OK;
}

static dt_status_t parse_unary(jj_parser *P, int with_filter, jj_node **out);
static dt_status_t parse_primary(jj_parser *P, int with_namespace, jj_node **out);
static dt_status_t parse_postfix(jj_parser *P, jj_node **x);

/* ---- expressions ---- */

static dt_status_t parse_condexpr(jj_parser *P, jj_node **out) {
    uint32_t line = cur(P)->line;
    jj_node *e1;
    DT_CHECK(jp_expression(P, 0, &e1));
    while (is_name(cur(P), "if")) {
        next(P);
        jj_node *c, *e2, *e3 = NULL;
        P->soft++;
        DT_CHECK(jp_expression(P, 0, &e2));
        if (is_name(cur(P), "else")) {
            next(P);
            DT_CHECK(parse_condexpr(P, &e3));
        }
        P->soft--;
        DT_CHECK(jp_node(P, JN_COND, line, &c));
        c->a = e2;
        c->b = e1;
        c->c = e3;
        e1 = c;
        line = cur(P)->line;
    }
    *out = e1;
    return DT_STATUS_OK;
}

static dt_status_t parse_not(jj_parser *P, jj_node **out);
static dt_status_t parse_compare(jj_parser *P, jj_node **out);
static dt_status_t parse_math1(jj_parser *P, jj_node **out);

static dt_status_t parse_binlevel(jj_parser *P, int level, jj_node **out);

/* or (0), and (1): left-associative chains. */
static dt_status_t parse_boolop(jj_parser *P, int level, jj_node **out) {
    const char *kw = level == 0 ? "or" : "and";
    uint32_t line = cur(P)->line;
    jj_node *left;
    DT_CHECK(level == 0 ? parse_boolop(P, 1, &left) : parse_not(P, &left));
    while (is_name(cur(P), kw)) {
        next(P);
        jj_node *right, *x;
        DT_CHECK(level == 0 ? parse_boolop(P, 1, &right) : parse_not(P, &right));
        DT_CHECK(jp_node(P, level == 0 ? JN_OR : JN_AND, line, &x));
        x->a = left;
        x->b = right;
        left = x;
        line = cur(P)->line;
    }
    *out = left;
    return DT_STATUS_OK;
}

static dt_status_t parse_not(jj_parser *P, jj_node **out) {
    if (is_name(cur(P), "not")) {
        uint32_t line = next(P)->line;
        jj_node *x;
        DT_CHECK(jp_deeper(P));
        DT_CHECK(jp_node(P, JN_NOT, line, &x));
        DT_CHECK(parse_not(P, &x->a));
        P->depth--;
        *out = x;
        return DT_STATUS_OK;
    }
    return parse_compare(P, out);
}

static dt_status_t parse_compare(jj_parser *P, jj_node **out) {
    uint32_t line = cur(P)->line;
    jj_node *first, *cmp = NULL;
    DT_CHECK(parse_math1(P, &first));
    size_t cap = 0;
    for (;;) {
        jj_tok *t = cur(P);
        int op = JO_NONE;
        if (t->type == JT_OP && (t->op == JO_EQ || t->op == JO_NE || t->op == JO_LT || t->op == JO_LTEQ ||
                                 t->op == JO_GT || t->op == JO_GTEQ)) {
            op = t->op;
            next(P);
        } else if (is_name(t, "in")) {
            op = JO_IN;
            next(P);
        } else if (is_name(t, "not") && is_name(look(P), "in")) {
            op = JO_NOTIN;
            next(P);
            next(P);
        } else {
            break;
        }
        if (!cmp) {
            DT_CHECK(jp_node(P, JN_CMP, line, &cmp));
            cmp->a = first;
        }
        jj_node *operand;
        DT_CHECK(parse_math1(P, &operand));
        if (cmp->l1.n == cap) {
            cap = cap ? 2 * cap : 2;
            uint8_t *ops = jj_alloc(&P->t->pool, cap);
            if (!ops) return dt_error(DT_STATUS_NOMEM, "%s: template too large", P->t->name);
            if (cmp->l1.n) memcpy(ops, cmp->ops, cmp->l1.n);
            cmp->ops = ops;
        }
        cmp->ops[cmp->l1.n] = (uint8_t)op;
        DT_CHECK(jp_push(P, &cmp->l1, operand));
    }
    *out = cmp ? cmp : first;
    return DT_STATUS_OK;
}

/* math1 (+ -), concat (~), math2 (* / // %), pow (**): levels 0..3. */
static dt_status_t parse_binlevel(jj_parser *P, int level, jj_node **out) {
    static const int ops[4][4] = {{JO_ADD, JO_SUB}, {JO_TILDE}, {JO_MUL, JO_DIV, JO_FLOORDIV, JO_MOD}, {JO_POW}};
    uint32_t line = cur(P)->line;
    jj_node *left;
    DT_CHECK(level == 3 ? parse_unary(P, 1, &left) : parse_binlevel(P, level + 1, &left));
    jj_node *concat = NULL;
    for (;;) {
        jj_tok *t = cur(P);
        int op = JO_NONE;
        for (int k = 0; k < 4 && ops[level][k]; k++)
            if (t->type == JT_OP && t->op == ops[level][k]) op = t->op;
        if (op == JO_NONE) break;
        next(P);
        jj_node *right, *x;
        DT_CHECK(level == 3 ? parse_unary(P, 1, &right) : parse_binlevel(P, level + 1, &right));
        if (level == 1) {
            if (!concat) {
                DT_CHECK(jp_node(P, JN_CONCAT, line, &concat));
                DT_CHECK(jp_push(P, &concat->l1, left));
            }
            DT_CHECK(jp_push(P, &concat->l1, right));
            continue;
        }
        DT_CHECK(jp_node(P, JN_BINOP, line, &x));
        x->op = (uint8_t)op;
        x->a = left;
        x->b = right;
        left = x;
        line = cur(P)->line;
    }
    *out = concat ? concat : left;
    return DT_STATUS_OK;
}

static dt_status_t parse_math1(jj_parser *P, jj_node **out) { return parse_binlevel(P, 0, out); }

static dt_status_t parse_call_args(jj_parser *P, jj_node *x) {
    uint32_t line = cur(P)->line;
    DT_CHECK(jp_expect_op(P, JO_LPAREN, "'('"));
    int need_comma = 0;
    while (!is_op(cur(P), JO_RPAREN)) {
        if (need_comma) {
            DT_CHECK(jp_expect_op(P, JO_COMMA, "','"));
            if (is_op(cur(P), JO_RPAREN)) break;
        }
        if (is_op(cur(P), JO_MUL) || is_op(cur(P), JO_POW))
            return jp_fail(P, DT_STATUS_UNSUPPORTED, cur(P)->line, "*args and **kwargs in a call are not supported");
        jj_node *v;
        if (cur(P)->type == JT_NAME && is_op(look(P), JO_ASSIGN)) {
            jj_tok *name = next(P);
            next(P);
            jj_node *kw;
            DT_CHECK(jp_expression(P, 1, &v));
            DT_CHECK(jp_node(P, JN_KWARG, name->line, &kw));
            kw->s = name->p;
            kw->sn = name->n;
            kw->a = v;
            DT_CHECK(jp_push(P, &x->l2, kw));
        } else {
            if (x->l2.n) return jp_fail(P, DT_STATUS_FORMAT, line, "invalid syntax for function call expression");
            DT_CHECK(jp_expression(P, 1, &v));
            DT_CHECK(jp_push(P, &x->l1, v));
        }
        need_comma = 1;
    }
    return jp_expect_op(P, JO_RPAREN, "')'");
}

/* A filter or test name (dotted names allowed) resolved to its id. */
static dt_status_t resolve(jj_parser *P, jj_node *x, int is_filter) {
    int id = is_filter ? jj_filter_id(x->s, x->sn) : jj_test_id(x->s, x->sn);
    const char *what = is_filter ? "filter" : "test";
    if (id == -2)
        return jp_fail(P, DT_STATUS_UNSUPPORTED, x->line, "the %s '%.*s' is not supported", what, (int)x->sn, x->s);
    if (id == -1 && !P->soft)
        return jp_fail(P, DT_STATUS_FORMAT, x->line, "No %s named '%.*s'.", what, (int)x->sn, x->s);
    x->id = id;
    return DT_STATUS_OK;
}

static dt_status_t dotted_name(jj_parser *P, jj_node *x) {
    if (cur(P)->type != JT_NAME) return jp_unexpected(P, "a name");
    jj_tok *t = next(P);
    x->s = t->p;
    x->sn = t->n;
    while (is_op(cur(P), JO_DOT)) { /* the tokens sit side by side in the source */
        next(P);
        if (cur(P)->type != JT_NAME) return jp_unexpected(P, "a name");
        jj_tok *u = next(P);
        x->sn = (size_t)(u->p + u->n - x->s);
    }
    return DT_STATUS_OK;
}

dt_status_t jp_filter(jj_parser *P, jj_node *in, int start_inline, jj_node **out) {
    while (is_op(cur(P), JO_PIPE) || start_inline) {
        if (!start_inline) next(P);
        jj_node *f;
        DT_CHECK(jp_node(P, JN_FILTER, cur(P)->line, &f));
        DT_CHECK(dotted_name(P, f));
        DT_CHECK(resolve(P, f, 1));
        if (is_op(cur(P), JO_LPAREN)) DT_CHECK(parse_call_args(P, f));
        f->a = in;
        in = f;
        start_inline = 0;
    }
    *out = in;
    return DT_STATUS_OK;
}

static dt_status_t parse_test(jj_parser *P, jj_node *in, jj_node **out) {
    uint32_t line = next(P)->line; /* "is" */
    int negated = 0;
    if (is_name(cur(P), "not")) {
        next(P);
        negated = 1;
    }
    jj_node *x;
    DT_CHECK(jp_node(P, JN_TEST, line, &x));
    DT_CHECK(dotted_name(P, x));
    DT_CHECK(resolve(P, x, 0));
    jj_tok *t = cur(P);
    if (is_op(t, JO_LPAREN)) {
        DT_CHECK(parse_call_args(P, x));
    } else if ((t->type == JT_NAME || t->type == JT_STRING || t->type == JT_INT || t->type == JT_FLOAT ||
                is_op(t, JO_LPAREN) || is_op(t, JO_LBRACKET) || is_op(t, JO_LBRACE)) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
        if (is_name(t, "is")) return jp_fail(P, DT_STATUS_FORMAT, t->line, "You cannot chain multiple tests with is");
        jj_node *arg;
        DT_CHECK(parse_primary(P, 0, &arg));
        DT_CHECK(parse_postfix(P, &arg));
        DT_CHECK(jp_push(P, &x->l1, arg));
    }
    x->a = in;
    if (negated) {
        jj_node *n;
        DT_CHECK(jp_node(P, JN_NOT, line, &n));
        n->a = x;
        x = n;
    }
    *out = x;
    return DT_STATUS_OK;
}

static dt_status_t parse_subscribed(jj_parser *P, jj_node **out) {
    uint32_t line = cur(P)->line;
    jj_node *args[3] = {0};
    if (is_op(cur(P), JO_COLON)) {
        next(P);
    } else {
        DT_CHECK(jp_expression(P, 1, &args[0]));
        if (!is_op(cur(P), JO_COLON)) {
            *out = args[0];
            return DT_STATUS_OK;
        }
        next(P);
    }
    if (!is_op(cur(P), JO_COLON) && !is_op(cur(P), JO_RBRACKET) && !is_op(cur(P), JO_COMMA))
        DT_CHECK(jp_expression(P, 1, &args[1]));
    if (is_op(cur(P), JO_COLON)) {
        next(P);
        if (!is_op(cur(P), JO_RBRACKET) && !is_op(cur(P), JO_COMMA)) DT_CHECK(jp_expression(P, 1, &args[2]));
    }
    jj_node *s;
    DT_CHECK(jp_node(P, JN_SLICE, line, &s));
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    *out = s;
    return DT_STATUS_OK;
}

static dt_status_t parse_postfix(jj_parser *P, jj_node **x) {
    for (;;) {
        jj_tok *t = cur(P);
        if (is_op(t, JO_DOT)) {
            next(P);
            jj_tok *a = next(P);
            jj_node *g;
            if (a->type == JT_NAME) {
                DT_CHECK(jp_node(P, JN_GETATTR, t->line, &g));
                g->s = a->p;
                g->sn = a->n;
            } else if (a->type == JT_INT) {
                jj_node *k;
                DT_CHECK(jp_node(P, JN_GETITEM, t->line, &g));
                DT_CHECK(jp_node(P, JN_CONST, a->line, &k));
                k->val = jv_int(a->i);
                g->b = k;
            } else {
                return jp_fail(P, DT_STATUS_FORMAT, a->line, "expected name or number");
            }
            g->a = *x;
            *x = g;
        } else if (is_op(t, JO_LBRACKET)) {
            next(P);
            jj_node *g, *idx = NULL, *tup = NULL;
            DT_CHECK(jp_node(P, JN_GETITEM, t->line, &g));
            int nargs = 0;
            while (!is_op(cur(P), JO_RBRACKET)) {
                if (nargs) DT_CHECK(jp_expect_op(P, JO_COMMA, "','"));
                jj_node *e;
                DT_CHECK(parse_subscribed(P, &e));
                if (nargs == 1) {
                    DT_CHECK(jp_node(P, JN_TUPLE, t->line, &tup));
                    DT_CHECK(jp_push(P, &tup->l1, idx));
                }
                if (tup) DT_CHECK(jp_push(P, &tup->l1, e));
                idx = e;
                nargs++;
            }
            DT_CHECK(jp_expect_op(P, JO_RBRACKET, "']'"));
            if (!nargs) return jp_fail(P, DT_STATUS_FORMAT, t->line, "expected subscript expression");
            g->a = *x;
            g->b = tup ? tup : idx;
            *x = g;
        } else if (is_op(t, JO_LPAREN)) {
            jj_node *c;
            DT_CHECK(jp_node(P, JN_CALL, t->line, &c));
            DT_CHECK(parse_call_args(P, c));
            c->a = *x;
            *x = c;
        } else {
            return DT_STATUS_OK;
        }
    }
}

static dt_status_t parse_filter_expr(jj_parser *P, jj_node **x) {
    for (;;) {
        if (is_op(cur(P), JO_PIPE)) {
            DT_CHECK(jp_filter(P, *x, 0, x));
        } else if (is_name(cur(P), "is")) {
            DT_CHECK(parse_test(P, *x, x));
        } else if (is_op(cur(P), JO_LPAREN)) {
            jj_node *c;
            DT_CHECK(jp_node(P, JN_CALL, cur(P)->line, &c));
            DT_CHECK(parse_call_args(P, c));
            c->a = *x;
            *x = c;
        } else {
            return DT_STATUS_OK;
        }
    }
}

static dt_status_t parse_unary(jj_parser *P, int with_filter, jj_node **out) {
    jj_tok *t = cur(P);
    jj_node *x;
    DT_CHECK(jp_deeper(P));
    if (is_op(t, JO_SUB) || is_op(t, JO_ADD)) {
        next(P);
        DT_CHECK(jp_node(P, t->op == JO_SUB ? JN_NEG : JN_POS, t->line, &x));
        DT_CHECK(parse_unary(P, 0, &x->a));
    } else {
        DT_CHECK(parse_primary(P, 0, &x));
    }
    DT_CHECK(parse_postfix(P, &x));
    if (with_filter) DT_CHECK(parse_filter_expr(P, &x));
    P->depth--;
    *out = x;
    return DT_STATUS_OK;
}

static dt_status_t parse_primary(jj_parser *P, int with_namespace, jj_node **out) {
    jj_tok *t = cur(P);
    jj_node *x;
    char buf[64];
    switch (t->type) {
    case JT_NAME:
        next(P);
        DT_CHECK(jp_node(P, JN_CONST, t->line, &x));
        if (is_name(t, "true") || is_name(t, "True")) {
            x->val = jv_bool(1);
        } else if (is_name(t, "false") || is_name(t, "False")) {
            x->val = jv_bool(0);
        } else if (is_name(t, "none") || is_name(t, "None")) {
            x->val = jv_none();
        } else if (with_namespace && is_op(cur(P), JO_DOT)) {
            next(P);
            if (cur(P)->type != JT_NAME) return jp_unexpected(P, "a name");
            jj_tok *a = next(P);
            x->type = JN_NSREF;
            x->s = t->p;
            x->sn = t->n;
            x->s2 = a->p;
            x->s2n = a->n;
        } else {
            x->type = JN_NAME;
            x->s = t->p;
            x->sn = t->n;
            if (P->macro_flags) {
                if (is_name(t, "varargs")) *P->macro_flags |= JJ_USES_VARARGS;
                if (is_name(t, "kwargs")) *P->macro_flags |= JJ_USES_KWARGS;
                if (is_name(t, "caller")) *P->macro_flags |= JJ_USES_CALLER;
            }
        }
        break;
    case JT_STRING: {
        next(P);
        DT_CHECK(jp_node(P, JN_CONST, t->line, &x));
        if (cur(P)->type != JT_STRING) { /* adjacent literals join: "a" "b" */
            x->val = jv_str(t->p, t->n);
            break;
        }
        size_t total = t->n;
        for (size_t k = P->i; P->tk[k].type == JT_STRING; k++) total += P->tk[k].n;
        char *s = jj_alloc(&P->t->pool, total + 1), *o = s;
        if (!s) return dt_error(DT_STATUS_NOMEM, "%s: template too large", P->t->name);
        memcpy(o, t->p, t->n);
        o += t->n;
        while (cur(P)->type == JT_STRING) {
            memcpy(o, cur(P)->p, cur(P)->n);
            o += cur(P)->n;
            next(P);
        }
        x->val = jv_str(s, total);
        break;
    }
    case JT_INT: case JT_FLOAT:
        next(P);
        DT_CHECK(jp_node(P, JN_CONST, t->line, &x));
        x->val = t->type == JT_INT ? jv_int(t->i) : jv_float(t->f);
        break;
    case JT_OP:
        if (t->op == JO_LPAREN) {
            next(P);
            DT_CHECK(jp_tuple(P, 0, 1, NULL, 1, 0, &x));
            DT_CHECK(jp_expect_op(P, JO_RPAREN, "')'"));
            break;
        }
        if (t->op == JO_LBRACKET || t->op == JO_LBRACE) {
            int dict = t->op == JO_LBRACE, close = dict ? JO_RBRACE : JO_RBRACKET;
            next(P);
            DT_CHECK(jp_node(P, dict ? JN_DICT : JN_LIST, t->line, &x));
            while (!is_op(cur(P), close)) {
                if (x->l1.n) DT_CHECK(jp_expect_op(P, JO_COMMA, "','"));
                if (is_op(cur(P), close)) break;
                jj_node *e;
                DT_CHECK(jp_expression(P, 1, &e));
                DT_CHECK(jp_push(P, &x->l1, e));
                if (dict) {
                    DT_CHECK(jp_expect_op(P, JO_COLON, "':'"));
                    DT_CHECK(jp_expression(P, 1, &e));
                    DT_CHECK(jp_push(P, &x->l2, e));
                }
            }
            DT_CHECK(jp_expect_op(P, close, dict ? "'}'" : "']'"));
            break;
        }
        /* fall through */
    default:
        return jp_fail(P, DT_STATUS_FORMAT, t->line, "jp_unexpected '%s'", jp_describe(t, buf, sizeof buf));
    }
    *out = x;
    return DT_STATUS_OK;
}

static int tuple_end(jj_parser *P, const char *extra_end) {
    jj_tok *t = cur(P);
    return t->type == JT_VAR_END || t->type == JT_BLOCK_END || is_op(t, JO_RPAREN) ||
           (extra_end && is_name(t, extra_end));
}

dt_status_t jp_tuple(jj_parser *P, int simplified, int with_condexpr, const char *extra_end,
                               int explicit_parens, int with_namespace, jj_node **out) {
    uint32_t line = cur(P)->line;
    jj_nlist args = {0};
    int is_tuple = 0;
    for (;;) {
        if (args.n) DT_CHECK(jp_expect_op(P, JO_COMMA, "','"));
        if (tuple_end(P, extra_end)) break;
        jj_node *e;
        if (simplified)
            DT_CHECK(parse_primary(P, with_namespace, &e));
        else
            DT_CHECK(jp_expression(P, with_condexpr, &e));
        DT_CHECK(jp_push(P, &args, e));
        if (!is_op(cur(P), JO_COMMA)) break;
        is_tuple = 1;
    }
    if (!is_tuple) {
        if (args.n) {
            *out = args.v[0];
            return DT_STATUS_OK;
        }
        if (!explicit_parens) return jp_unexpected(P, "an expression");
    }
    DT_CHECK(jp_node(P, JN_TUPLE, line, out));
    (*out)->l1 = args;
    return DT_STATUS_OK;
}

dt_status_t jp_expression(jj_parser *P, int with_condexpr, jj_node **out) {
    DT_CHECK(jp_deeper(P));
    dt_status_t st = with_condexpr ? parse_condexpr(P, out) : parse_boolop(P, 0, out);
    P->depth--;
    return st;
}
