/*
 * jinja_parse.c - tokens into the syntax tree, following jinja2's parser.py rule
 * for rule (precedence, tuples without parentheses, tests with one bare argument,
 * the `if` of a for loop, namespace attribute targets), and dt_jinja_parse /
 * dt_jinja_free. A tag, filter or test that jinja2 has and the renderer does not
 * is DT_STATUS_UNSUPPORTED here, at parse time, naming it and its line.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xcalloc, dt_xstrdup */
#include "runtime/tokenize/jinja_internal.h"

#define MAX_NEST 200 /* nested expressions and blocks: bounded C stack */

typedef struct parser {
    dt_jinja_t *t;
    jj_tok *tk;
    size_t n, i;
    int depth;
    int soft;       /* inside an if / conditional expression: unknown filters fail when run */
    int loops;      /* enclosing for loops (break / continue) */
    uint8_t *macro_flags; /* the macro being parsed: what its body reads */
} parser;

static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_FOR_ELSE[] = {"endfor", NULL};
static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_IF_ELSE[] = {"endif", NULL};

static jj_tok *cur(parser *P) { return &P->tk[P->i]; }
static jj_tok *look(parser *P) { return &P->tk[P->i + 1 < P->n ? P->i + 1 : P->i]; }
static jj_tok *next(parser *P) {
    jj_tok *t = cur(P);
    if (P->i + 1 < P->n) P->i++;
    return t;
}
static int is_name(const jj_tok *t, const char *s) {
    return t->type == JT_NAME && t->n == strlen(s) && memcmp(t->p, s, t->n) == 0;
}
static int is_op(const jj_tok *t, int op) { return t->type == JT_OP && t->op == op; }

static const char *describe(const jj_tok *t, char *buf, size_t len) {
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

static dt_status_t fail(parser *P, dt_status_t st, uint32_t line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static dt_status_t fail(parser *P, dt_status_t st, uint32_t line, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt_error(st, "%s:%u: %s", P->t->name, line, msg);
}

static dt_status_t unexpected(parser *P, const char *want) {
    char buf[64];
    return fail(P, DT_STATUS_FORMAT, cur(P)->line, "expected %s, got '%s'", want, describe(cur(P), buf, sizeof buf));
}

static dt_status_t expect_op(parser *P, int op, const char *what) {
    if (!is_op(cur(P), op)) return unexpected(P, what);
    next(P);
    return DT_STATUS_OK;
}

static dt_status_t expect_type(parser *P, int type, const char *what) {
    if (cur(P)->type != type) return unexpected(P, what);
    next(P);
    return DT_STATUS_OK;
}

static dt_status_t node(parser *P, int type, uint32_t line, jj_node **out) {
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
static dt_status_t push(parser *P, jj_nlist *l, jj_node *x) {
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

static dt_status_t deeper(parser *P) {
    if (++P->depth > MAX_NEST)
        return fail(P, DT_STATUS_LIMIT, cur(P)->line, "expressions or blocks nested more than %d deep", MAX_NEST);
    return DT_STATUS_OK;
}

static dt_status_t parse_expression(parser *P, int with_condexpr, jj_node **out);
static dt_status_t parse_tuple(parser *P, int simplified, int with_condexpr, const char *extra_end,
                               int explicit_parens, int with_namespace, jj_node **out);
static dt_status_t parse_unary(parser *P, int with_filter, jj_node **out);
static dt_status_t parse_primary(parser *P, int with_namespace, jj_node **out);
static dt_status_t parse_postfix(parser *P, jj_node **x);
static dt_status_t parse_filter(parser *P, jj_node *in, int start_inline, jj_node **out);
static dt_status_t subparse(parser *P, const char *const *ends, jj_nlist *body);

/* ---- expressions ---- */

static dt_status_t parse_condexpr(parser *P, jj_node **out) {
    uint32_t line = cur(P)->line;
    jj_node *e1;
    DT_CHECK(parse_expression(P, 0, &e1));
    while (is_name(cur(P), "if")) {
        next(P);
        jj_node *c, *e2, *e3 = NULL;
        P->soft++;
        DT_CHECK(parse_expression(P, 0, &e2));
        if (is_name(cur(P), "else")) {
            next(P);
            DT_CHECK(parse_condexpr(P, &e3));
        }
        P->soft--;
        DT_CHECK(node(P, JN_COND, line, &c));
        c->a = e2;
        c->b = e1;
        c->c = e3;
        e1 = c;
        line = cur(P)->line;
    }
    *out = e1;
    return DT_STATUS_OK;
}

static dt_status_t parse_not(parser *P, jj_node **out);
static dt_status_t parse_compare(parser *P, jj_node **out);
static dt_status_t parse_math1(parser *P, jj_node **out);

static dt_status_t parse_binlevel(parser *P, int level, jj_node **out);

/* or (0), and (1): left-associative chains. */
static dt_status_t parse_boolop(parser *P, int level, jj_node **out) {
    const char *kw = level == 0 ? "or" : "and";
    uint32_t line = cur(P)->line;
    jj_node *left;
    DT_CHECK(level == 0 ? parse_boolop(P, 1, &left) : parse_not(P, &left));
    while (is_name(cur(P), kw)) {
        next(P);
        jj_node *right, *x;
        DT_CHECK(level == 0 ? parse_boolop(P, 1, &right) : parse_not(P, &right));
        DT_CHECK(node(P, level == 0 ? JN_OR : JN_AND, line, &x));
        x->a = left;
        x->b = right;
        left = x;
        line = cur(P)->line;
    }
    *out = left;
    return DT_STATUS_OK;
}

static dt_status_t parse_not(parser *P, jj_node **out) {
    if (is_name(cur(P), "not")) {
        uint32_t line = next(P)->line;
        jj_node *x;
        DT_CHECK(deeper(P));
        DT_CHECK(node(P, JN_NOT, line, &x));
        DT_CHECK(parse_not(P, &x->a));
        P->depth--;
        *out = x;
        return DT_STATUS_OK;
    }
    return parse_compare(P, out);
}

static dt_status_t parse_compare(parser *P, jj_node **out) {
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
            DT_CHECK(node(P, JN_CMP, line, &cmp));
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
        DT_CHECK(push(P, &cmp->l1, operand));
    }
    *out = cmp ? cmp : first;
    return DT_STATUS_OK;
}

/* math1 (+ -), concat (~), math2 (* / // %), pow (**): levels 0..3. */
static dt_status_t parse_binlevel(parser *P, int level, jj_node **out) {
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
                DT_CHECK(node(P, JN_CONCAT, line, &concat));
                DT_CHECK(push(P, &concat->l1, left));
            }
            DT_CHECK(push(P, &concat->l1, right));
            continue;
        }
        DT_CHECK(node(P, JN_BINOP, line, &x));
        x->op = (uint8_t)op;
        x->a = left;
        x->b = right;
        left = x;
        line = cur(P)->line;
    }
    *out = concat ? concat : left;
    return DT_STATUS_OK;
}

static dt_status_t parse_math1(parser *P, jj_node **out) { return parse_binlevel(P, 0, out); }

static dt_status_t parse_call_args(parser *P, jj_node *x) {
    uint32_t line = cur(P)->line;
    DT_CHECK(expect_op(P, JO_LPAREN, "'('"));
    int need_comma = 0;
    while (!is_op(cur(P), JO_RPAREN)) {
        if (need_comma) {
            DT_CHECK(expect_op(P, JO_COMMA, "','"));
            if (is_op(cur(P), JO_RPAREN)) break;
        }
        if (is_op(cur(P), JO_MUL) || is_op(cur(P), JO_POW))
            return fail(P, DT_STATUS_UNSUPPORTED, cur(P)->line, "*args and **kwargs in a call are not supported");
        jj_node *v;
        if (cur(P)->type == JT_NAME && is_op(look(P), JO_ASSIGN)) {
            jj_tok *name = next(P);
            next(P);
            jj_node *kw;
            DT_CHECK(parse_expression(P, 1, &v));
            DT_CHECK(node(P, JN_KWARG, name->line, &kw));
            kw->s = name->p;
            kw->sn = name->n;
            kw->a = v;
            DT_CHECK(push(P, &x->l2, kw));
        } else {
            if (x->l2.n) return fail(P, DT_STATUS_FORMAT, line, "invalid syntax for function call expression");
            DT_CHECK(parse_expression(P, 1, &v));
            DT_CHECK(push(P, &x->l1, v));
        }
        need_comma = 1;
    }
    return expect_op(P, JO_RPAREN, "')'");
}

/* A filter or test name (dotted names allowed) resolved to its id. */
static dt_status_t resolve(parser *P, jj_node *x, int is_filter) {
    int id = is_filter ? jj_filter_id(x->s, x->sn) : jj_test_id(x->s, x->sn);
    const char *what = is_filter ? "filter" : "test";
    if (id == -2)
        return fail(P, DT_STATUS_UNSUPPORTED, x->line, "the %s '%.*s' is not supported", what, (int)x->sn, x->s);
    if (id == -1 && !P->soft)
        return fail(P, DT_STATUS_FORMAT, x->line, "No %s named '%.*s'.", what, (int)x->sn, x->s);
    x->id = id;
    return DT_STATUS_OK;
}

static dt_status_t dotted_name(parser *P, jj_node *x) {
    if (cur(P)->type != JT_NAME) return unexpected(P, "a name");
    jj_tok *t = next(P);
    x->s = t->p;
    x->sn = t->n;
    while (is_op(cur(P), JO_DOT)) { /* the tokens sit side by side in the source */
        next(P);
        if (cur(P)->type != JT_NAME) return unexpected(P, "a name");
        jj_tok *u = next(P);
        x->sn = (size_t)(u->p + u->n - x->s);
    }
    return DT_STATUS_OK;
}

static dt_status_t parse_filter(parser *P, jj_node *in, int start_inline, jj_node **out) {
    while (is_op(cur(P), JO_PIPE) || start_inline) {
        if (!start_inline) next(P);
        jj_node *f;
        DT_CHECK(node(P, JN_FILTER, cur(P)->line, &f));
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

static dt_status_t parse_test(parser *P, jj_node *in, jj_node **out) {
    uint32_t line = next(P)->line; /* "is" */
    int negated = 0;
    if (is_name(cur(P), "not")) {
        next(P);
        negated = 1;
    }
    jj_node *x;
    DT_CHECK(node(P, JN_TEST, line, &x));
    DT_CHECK(dotted_name(P, x));
    DT_CHECK(resolve(P, x, 0));
    jj_tok *t = cur(P);
    if (is_op(t, JO_LPAREN)) {
        DT_CHECK(parse_call_args(P, x));
    } else if ((t->type == JT_NAME || t->type == JT_STRING || t->type == JT_INT || t->type == JT_FLOAT ||
                is_op(t, JO_LPAREN) || is_op(t, JO_LBRACKET) || is_op(t, JO_LBRACE)) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
        if (is_name(t, "is")) return fail(P, DT_STATUS_FORMAT, t->line, "You cannot chain multiple tests with is");
        jj_node *arg;
        DT_CHECK(parse_primary(P, 0, &arg));
        DT_CHECK(parse_postfix(P, &arg));
        DT_CHECK(push(P, &x->l1, arg));
    }
    x->a = in;
    if (negated) {
        jj_node *n;
        DT_CHECK(node(P, JN_NOT, line, &n));
        n->a = x;
        x = n;
    }
    *out = x;
    return DT_STATUS_OK;
}

static dt_status_t parse_subscribed(parser *P, jj_node **out) {
    uint32_t line = cur(P)->line;
    jj_node *args[3] = {0};
    if (is_op(cur(P), JO_COLON)) {
        next(P);
    } else {
        DT_CHECK(parse_expression(P, 1, &args[0]));
        if (!is_op(cur(P), JO_COLON)) {
            *out = args[0];
            return DT_STATUS_OK;
        }
        next(P);
    }
    if (!is_op(cur(P), JO_COLON) && !is_op(cur(P), JO_RBRACKET) && !is_op(cur(P), JO_COMMA))
        DT_CHECK(parse_expression(P, 1, &args[1]));
    if (is_op(cur(P), JO_COLON)) {
        next(P);
        if (!is_op(cur(P), JO_RBRACKET) && !is_op(cur(P), JO_COMMA)) DT_CHECK(parse_expression(P, 1, &args[2]));
    }
    jj_node *s;
    DT_CHECK(node(P, JN_SLICE, line, &s));
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    *out = s;
    return DT_STATUS_OK;
}

static dt_status_t parse_postfix(parser *P, jj_node **x) {
    for (;;) {
        jj_tok *t = cur(P);
        if (is_op(t, JO_DOT)) {
            next(P);
            jj_tok *a = next(P);
            jj_node *g;
            if (a->type == JT_NAME) {
                DT_CHECK(node(P, JN_GETATTR, t->line, &g));
                g->s = a->p;
                g->sn = a->n;
            } else if (a->type == JT_INT) {
                jj_node *k;
                DT_CHECK(node(P, JN_GETITEM, t->line, &g));
                DT_CHECK(node(P, JN_CONST, a->line, &k));
                k->val = jv_int(a->i);
                g->b = k;
            } else {
                return fail(P, DT_STATUS_FORMAT, a->line, "expected name or number");
            }
            g->a = *x;
            *x = g;
        } else if (is_op(t, JO_LBRACKET)) {
            next(P);
            jj_node *g, *idx = NULL, *tup = NULL;
            DT_CHECK(node(P, JN_GETITEM, t->line, &g));
            int nargs = 0;
            while (!is_op(cur(P), JO_RBRACKET)) {
                if (nargs) DT_CHECK(expect_op(P, JO_COMMA, "','"));
                jj_node *e;
                DT_CHECK(parse_subscribed(P, &e));
                if (nargs == 1) {
                    DT_CHECK(node(P, JN_TUPLE, t->line, &tup));
                    DT_CHECK(push(P, &tup->l1, idx));
                }
                if (tup) DT_CHECK(push(P, &tup->l1, e));
                idx = e;
                nargs++;
            }
            DT_CHECK(expect_op(P, JO_RBRACKET, "']'"));
            if (!nargs) return fail(P, DT_STATUS_FORMAT, t->line, "expected subscript expression");
            g->a = *x;
            g->b = tup ? tup : idx;
            *x = g;
        } else if (is_op(t, JO_LPAREN)) {
            jj_node *c;
            DT_CHECK(node(P, JN_CALL, t->line, &c));
            DT_CHECK(parse_call_args(P, c));
            c->a = *x;
            *x = c;
        } else {
            return DT_STATUS_OK;
        }
    }
}

static dt_status_t parse_filter_expr(parser *P, jj_node **x) {
    for (;;) {
        if (is_op(cur(P), JO_PIPE)) {
            DT_CHECK(parse_filter(P, *x, 0, x));
        } else if (is_name(cur(P), "is")) {
            DT_CHECK(parse_test(P, *x, x));
        } else if (is_op(cur(P), JO_LPAREN)) {
            jj_node *c;
            DT_CHECK(node(P, JN_CALL, cur(P)->line, &c));
            DT_CHECK(parse_call_args(P, c));
            c->a = *x;
            *x = c;
        } else {
            return DT_STATUS_OK;
        }
    }
}

static dt_status_t parse_unary(parser *P, int with_filter, jj_node **out) {
    jj_tok *t = cur(P);
    jj_node *x;
    DT_CHECK(deeper(P));
    if (is_op(t, JO_SUB) || is_op(t, JO_ADD)) {
        next(P);
        DT_CHECK(node(P, t->op == JO_SUB ? JN_NEG : JN_POS, t->line, &x));
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

static dt_status_t parse_primary(parser *P, int with_namespace, jj_node **out) {
    jj_tok *t = cur(P);
    jj_node *x;
    char buf[64];
    switch (t->type) {
    case JT_NAME:
        next(P);
        DT_CHECK(node(P, JN_CONST, t->line, &x));
        if (is_name(t, "true") || is_name(t, "True")) {
            x->val = jv_bool(1);
        } else if (is_name(t, "false") || is_name(t, "False")) {
            x->val = jv_bool(0);
        } else if (is_name(t, "none") || is_name(t, "None")) {
            x->val = jv_none();
        } else if (with_namespace && is_op(cur(P), JO_DOT)) {
            next(P);
            if (cur(P)->type != JT_NAME) return unexpected(P, "a name");
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
        DT_CHECK(node(P, JN_CONST, t->line, &x));
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
        DT_CHECK(node(P, JN_CONST, t->line, &x));
        x->val = t->type == JT_INT ? jv_int(t->i) : jv_float(t->f);
        break;
    case JT_OP:
        if (t->op == JO_LPAREN) {
            next(P);
            DT_CHECK(parse_tuple(P, 0, 1, NULL, 1, 0, &x));
            DT_CHECK(expect_op(P, JO_RPAREN, "')'"));
            break;
        }
        if (t->op == JO_LBRACKET || t->op == JO_LBRACE) {
            int dict = t->op == JO_LBRACE, close = dict ? JO_RBRACE : JO_RBRACKET;
            next(P);
            DT_CHECK(node(P, dict ? JN_DICT : JN_LIST, t->line, &x));
            while (!is_op(cur(P), close)) {
                if (x->l1.n) DT_CHECK(expect_op(P, JO_COMMA, "','"));
                if (is_op(cur(P), close)) break;
                jj_node *e;
                DT_CHECK(parse_expression(P, 1, &e));
                DT_CHECK(push(P, &x->l1, e));
                if (dict) {
                    DT_CHECK(expect_op(P, JO_COLON, "':'"));
                    DT_CHECK(parse_expression(P, 1, &e));
                    DT_CHECK(push(P, &x->l2, e));
                }
            }
            DT_CHECK(expect_op(P, close, dict ? "'}'" : "']'"));
            break;
        }
        /* fall through */
    default:
        return fail(P, DT_STATUS_FORMAT, t->line, "unexpected '%s'", describe(t, buf, sizeof buf));
    }
    *out = x;
    return DT_STATUS_OK;
}

static int tuple_end(parser *P, const char *extra_end) {
    jj_tok *t = cur(P);
    return t->type == JT_VAR_END || t->type == JT_BLOCK_END || is_op(t, JO_RPAREN) ||
           (extra_end && is_name(t, extra_end));
}

static dt_status_t parse_tuple(parser *P, int simplified, int with_condexpr, const char *extra_end,
                               int explicit_parens, int with_namespace, jj_node **out) {
    uint32_t line = cur(P)->line;
    jj_nlist args = {0};
    int is_tuple = 0;
    for (;;) {
        if (args.n) DT_CHECK(expect_op(P, JO_COMMA, "','"));
        if (tuple_end(P, extra_end)) break;
        jj_node *e;
        if (simplified)
            DT_CHECK(parse_primary(P, with_namespace, &e));
        else
            DT_CHECK(parse_expression(P, with_condexpr, &e));
        DT_CHECK(push(P, &args, e));
        if (!is_op(cur(P), JO_COMMA)) break;
        is_tuple = 1;
    }
    if (!is_tuple) {
        if (args.n) {
            *out = args.v[0];
            return DT_STATUS_OK;
        }
        if (!explicit_parens) return unexpected(P, "an expression");
    }
    DT_CHECK(node(P, JN_TUPLE, line, out));
    (*out)->l1 = args;
    return DT_STATUS_OK;
}

static dt_status_t parse_expression(parser *P, int with_condexpr, jj_node **out) {
    DT_CHECK(deeper(P));
    dt_status_t st = with_condexpr ? parse_condexpr(P, out) : parse_boolop(P, 0, out);
    P->depth--;
    return st;
}

/* ---- statements ---- */

static int can_assign(const jj_node *x, int ns_ok) {
    if (x->type == JN_NAME) return 1;
    if (x->type == JN_NSREF) return ns_ok;
    if (x->type != JN_TUPLE) return 0;
    for (uint32_t i = 0; i < x->l1.n; i++)
        if (!can_assign(x->l1.v[i], 0)) return 0;
    return 1;
}

static dt_status_t parse_target(parser *P, const char *extra_end, int with_namespace, jj_node **out) {
    uint32_t line = cur(P)->line;
    DT_CHECK(parse_tuple(P, 1, 1, extra_end, 0, with_namespace, out));
    if (!can_assign(*out, with_namespace))
        return fail(P, DT_STATUS_FORMAT, line, "can't assign to this target (a name, a tuple of names or "
                    "namespace.attribute)");
    return DT_STATUS_OK;
}

/* The body after a tag up to one of ends (left as the current token). */
static dt_status_t parse_statements(parser *P, const char *const *ends, int drop_needle, const char *tag,
                                    uint32_t line, jj_nlist *body) {
    if (is_op(cur(P), JO_COLON)) next(P);
    DT_CHECK(expect_type(P, JT_BLOCK_END, "end of statement block"));
    DT_CHECK(deeper(P));
    DT_CHECK(subparse(P, ends, body));
    P->depth--;
    if (cur(P)->type == JT_EOF) {
        char want[128] = "";
        for (const char *const *e = ends; *e; e++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s'%s'", e == ends ? "" : " or ", *e);
        return fail(P, DT_STATUS_FORMAT, cur(P)->line, "unexpected end of template: the '%s' of line %u is not "
                    "closed (expected %s)", tag, line, want);
    }
    if (drop_needle) next(P);
    return DT_STATUS_OK;
}

static dt_status_t parse_signature(parser *P, jj_node *x) {
    DT_CHECK(expect_op(P, JO_LPAREN, "'('"));
    while (!is_op(cur(P), JO_RPAREN)) {
        if (x->l1.n) DT_CHECK(expect_op(P, JO_COMMA, "','"));
        if (cur(P)->type != JT_NAME) return unexpected(P, "a parameter name");
        jj_node *p, *dflt = NULL;
        DT_CHECK(node(P, JN_NAME, cur(P)->line, &p));
        p->s = cur(P)->p;
        p->sn = cur(P)->n;
        next(P);
        if (is_op(cur(P), JO_ASSIGN)) {
            next(P);
            DT_CHECK(parse_expression(P, 1, &dflt));
        } else if (x->l3.n && x->l3.v[x->l3.n - 1]) {
            return fail(P, DT_STATUS_FORMAT, p->line, "non-default argument follows default argument");
        }
        DT_CHECK(push(P, &x->l1, p));
        DT_CHECK(push(P, &x->l3, dflt));
    }
    return expect_op(P, JO_RPAREN, "')'");
}

static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_CALL[] = {"endcall", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_WITH[] = {"endwith", NULL};
static const char *const END_GEN[] = {"endgeneration", NULL};

/* A body parsed as a new scope (for, macro, call, with): not soft. loop: 1 a for
 * loop's body (break and continue allowed), 0 a function's body (macro, call,
 * generation: they are not), 2 as around it (a for's else, with). */
static dt_status_t scoped_body(parser *P, const char *const *ends, int drop, const char *tag, uint32_t line,
                               int loop, jj_nlist *body) {
    int soft = P->soft, loops = P->loops;
    P->soft = 0;
    P->loops = loop == 1 ? loops + 1 : loop == 2 ? loops : 0;
    dt_status_t st = parse_statements(P, ends, drop, tag, line, body);
    P->soft = soft;
    P->loops = loops;
    return st;
}

static dt_status_t parse_statement(parser *P, jj_nlist *body) {
    jj_tok *t = cur(P);
    char buf[64];
    if (t->type != JT_NAME) return fail(P, DT_STATUS_FORMAT, t->line, "tag name expected");
    uint32_t line = t->line;
    jj_node *x;
    if (is_name(t, "if")) {
        next(P);
        DT_CHECK(node(P, JN_IF, line, &x));
        DT_CHECK(push(P, body, x));
        P->soft++;
        for (jj_node *cur_if = x;;) {
            DT_CHECK(parse_tuple(P, 0, 0, NULL, 0, 0, &cur_if->a));
            DT_CHECK(parse_statements(P, END_IF, 0, "if", line, &cur_if->l1));
            jj_tok *e = next(P);
            if (is_name(e, "elif")) {
                jj_node *nx;
                DT_CHECK(node(P, JN_IF, cur(P)->line, &nx));
                DT_CHECK(push(P, &cur_if->l2, nx));
                cur_if = nx;
                continue;
            }
            if (is_name(e, "else")) DT_CHECK(parse_statements(P, END_IF_ELSE, 1, "if", line, &cur_if->l2));
            break;
        }
        P->soft--;
        return DT_STATUS_OK;
    }
    if (is_name(t, "for")) {
        next(P);
        DT_CHECK(node(P, JN_FOR, line, &x));
        DT_CHECK(parse_target(P, "in", 0, &x->a));
        if (!is_name(cur(P), "in")) return unexpected(P, "'in'");
        next(P);
        DT_CHECK(parse_tuple(P, 0, 0, "recursive", 0, 0, &x->b));
        if (is_name(cur(P), "if")) {
            next(P);
            DT_CHECK(parse_expression(P, 1, &x->c));
        }
        if (is_name(cur(P), "recursive"))
            return fail(P, DT_STATUS_UNSUPPORTED, cur(P)->line, "recursive for loops are not supported");
        DT_CHECK(scoped_body(P, END_FOR, 0, "for", line, 1, &x->l1));
        if (is_name(next(P), "else")) DT_CHECK(scoped_body(P, END_FOR_ELSE, 1, "for", line, 2, &x->l2));
        return push(P, body, x);
    }
    if (is_name(t, "set")) {
        next(P);
        jj_node *target;
        DT_CHECK(parse_target(P, NULL, 1, &target));
        if (is_op(cur(P), JO_ASSIGN)) {
            next(P);
            DT_CHECK(node(P, JN_SET, line, &x));
            x->a = target;
            DT_CHECK(parse_tuple(P, 0, 1, NULL, 0, 0, &x->b));
            return push(P, body, x);
        }
        DT_CHECK(node(P, JN_SETBLOCK, line, &x));
        x->a = target;
        DT_CHECK(parse_filter(P, NULL, 0, &x->c));
        DT_CHECK(parse_statements(P, END_SET, 1, "set", line, &x->l1));
        return push(P, body, x);
    }
    if (is_name(t, "macro") || is_name(t, "call")) {
        int is_macro = is_name(t, "macro");
        next(P);
        DT_CHECK(node(P, is_macro ? JN_MACRO : JN_CALLBLOCK, line, &x));
        uint8_t *saved = P->macro_flags;
        if (is_macro) {
            if (cur(P)->type != JT_NAME) return unexpected(P, "a macro name");
            x->s = cur(P)->p;
            x->sn = cur(P)->n;
            next(P);
            DT_CHECK(parse_signature(P, x));
        } else {
            if (is_op(cur(P), JO_LPAREN)) DT_CHECK(parse_signature(P, x));
            P->macro_flags = NULL;
            DT_CHECK(parse_expression(P, 1, &x->a));
            if (x->a->type != JN_CALL) return fail(P, DT_STATUS_FORMAT, line, "expected call");
        }
        P->macro_flags = &x->flag;
        dt_status_t st = scoped_body(P, is_macro ? END_MACRO : END_CALL, 1, is_macro ? "macro" : "call", line, 0,
                                     &x->l2);
        P->macro_flags = saved;
        DT_CHECK(st);
        return push(P, body, x);
    }
    if (is_name(t, "filter")) {
        next(P);
        DT_CHECK(node(P, JN_FILTERBLOCK, line, &x));
        DT_CHECK(parse_filter(P, NULL, 1, &x->c));
        DT_CHECK(parse_statements(P, END_FILTER, 1, "filter", line, &x->l1));
        return push(P, body, x);
    }
    if (is_name(t, "with")) {
        next(P);
        DT_CHECK(node(P, JN_WITH, line, &x));
        while (cur(P)->type != JT_BLOCK_END) {
            if (x->l1.n) DT_CHECK(expect_op(P, JO_COMMA, "','"));
            jj_node *target, *value;
            DT_CHECK(parse_target(P, NULL, 0, &target));
            DT_CHECK(expect_op(P, JO_ASSIGN, "'='"));
            DT_CHECK(parse_expression(P, 1, &value));
            DT_CHECK(push(P, &x->l1, target));
            DT_CHECK(push(P, &x->l3, value));
        }
        DT_CHECK(scoped_body(P, END_WITH, 1, "with", line, 2, &x->l2));
        return push(P, body, x);
    }
    if (is_name(t, "print")) {
        next(P);
        while (cur(P)->type != JT_BLOCK_END) {
            DT_CHECK(node(P, JN_PRINT, line, &x));
            DT_CHECK(parse_expression(P, 1, &x->a));
            DT_CHECK(push(P, body, x));
            if (cur(P)->type != JT_BLOCK_END) DT_CHECK(expect_op(P, JO_COMMA, "','"));
        }
        return DT_STATUS_OK;
    }
    if (is_name(t, "generation")) {
        next(P);
        DT_CHECK(node(P, JN_GENERATION, line, &x));
        P->t->has_generation = 1;
        DT_CHECK(scoped_body(P, END_GEN, 1, "generation", line, 0, &x->l1));
        return push(P, body, x);
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        if (!P->loops) return fail(P, DT_STATUS_FORMAT, line, "'%.*s' outside of a for loop", (int)t->n, t->p);
        next(P);
        DT_CHECK(node(P, is_name(t, "break") ? JN_BREAK : JN_CONTINUE, line, &x));
        return push(P, body, x);
    }
    static const char *const unsupported[] = {"block", "extends", "include", "import", "from", "autoescape", NULL};
    for (const char *const *u = unsupported; *u; u++)
        if (is_name(t, *u))
            return fail(P, DT_STATUS_UNSUPPORTED, line, "the tag '%s' is not supported (chat templates are one "
                        "file: no loader, no blocks)", *u);
    return fail(P, DT_STATUS_FORMAT, line, "Encountered unknown tag '%s'.", describe(t, buf, sizeof buf));
}

static int is_end(const jj_tok *t, const char *const *ends) {
    for (; ends && *ends; ends++)
        if (is_name(t, *ends)) return 1;
    return 0;
}

static dt_status_t subparse(parser *P, const char *const *ends, jj_nlist *body) {
    for (;;) {
        jj_tok *t = cur(P);
        jj_node *x;
        switch (t->type) {
        case JT_EOF: return DT_STATUS_OK;
        case JT_DATA:
            DT_CHECK(node(P, JN_TEXT, t->line, &x));
            x->s = t->p;
            x->sn = t->n;
            DT_CHECK(push(P, body, x));
            next(P);
            break;
        case JT_VAR_BEGIN:
            next(P);
            DT_CHECK(node(P, JN_PRINT, t->line, &x));
            DT_CHECK(parse_tuple(P, 0, 1, NULL, 0, 0, &x->a));
            DT_CHECK(push(P, body, x));
            DT_CHECK(expect_type(P, JT_VAR_END, "end of print statement"));
            break;
        case JT_BLOCK_BEGIN:
            next(P);
            if (is_end(cur(P), ends)) return DT_STATUS_OK;
            DT_CHECK(parse_statement(P, body));
            DT_CHECK(expect_type(P, JT_BLOCK_END, "end of statement block"));
            break;
        default: {
            char buf[64];
            return fail(P, DT_STATUS_FORMAT, t->line, "unexpected '%s'", describe(t, buf, sizeof buf));
        }
        }
    }
}

/* ---- the template ---- */

dt_status_t dt_jinja_parse(const char *src, size_t len, const char *name, dt_jinja_t **out) {
    *out = NULL;
    dt_jinja_t *t = dt_xcalloc(1, sizeof *t);
    t->name = dt_xstrdup(name ? name : "<template>");
    jj_tok *toks = NULL;
    size_t ntoks = 0;
    dt_status_t st = jj_lex(t, src, len, &toks, &ntoks);
    if (st == DT_STATUS_OK) {
        parser P = {.t = t, .tk = toks, .n = ntoks};
        st = subparse(&P, NULL, &t->body);
        if (st == DT_STATUS_OK && cur(&P)->type != JT_EOF) {
            char buf[64];
            st = fail(&P, DT_STATUS_FORMAT, cur(&P)->line, "Encountered unknown tag '%s'.",
                      describe(cur(&P), buf, sizeof buf));
        }
        if (st == DT_STATUS_OK) st = jj_scope_analyze(t);
    }
    free(toks);
    if (st != DT_STATUS_OK) {
        dt_jinja_free(t);
        return st;
    }
    *out = t;
    return DT_STATUS_OK;
}

void dt_jinja_free(dt_jinja_t *t) {
    if (!t) return;
    jj_arena_free(&t->pool);
    free(t->src);
    free(t->name);
    free(t);
}

int dt_jinja_has_generation(const dt_jinja_t *t) { return t->has_generation; }
