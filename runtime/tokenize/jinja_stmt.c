/*
 * jinja_stmt.c - a template's tags into the syntax tree (if/elif/else, for with
 * else and filter, set and set blocks, macro, call, filter blocks, with, print,
 * break/continue inside loops, transformers' generation block), and
 * dt_jinja_parse / dt_jinja_free. Tags jinja2 has for multi-file templates
 * (extends, block, include, import, from, autoescape) are DT_STATUS_UNSUPPORTED.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xcalloc, dt_xstrdup */
#include "runtime/tokenize/jinja_parser.h"

static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_FOR_ELSE[] = {"endfor", NULL};
static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_IF_ELSE[] = {"endif", NULL};

static dt_status_t subparse(jj_parser *P, const char *const *ends, jj_nlist *body);

/* ---- statements ---- */

static int can_assign(const jj_node *x, int ns_ok) {
    if (x->type == JN_NAME) return 1;
    if (x->type == JN_NSREF) return ns_ok;
    if (x->type != JN_TUPLE) return 0;
    for (uint32_t i = 0; i < x->l1.n; i++)
        if (!can_assign(x->l1.v[i], 0)) return 0;
    return 1;
}

static dt_status_t parse_target(jj_parser *P, const char *extra_end, int with_namespace, jj_node **out) {
    uint32_t line = cur(P)->line;
    DT_CHECK(jp_tuple(P, 1, 1, extra_end, 0, with_namespace, out));
    if (!can_assign(*out, with_namespace))
        return jp_fail(P, DT_STATUS_FORMAT, line, "can't assign to this target (a name, a tuple of names or "
                    "namespace.attribute)");
    return DT_STATUS_OK;
}

/* The body after a tag up to one of ends (left as the current token). */
static dt_status_t parse_statements(jj_parser *P, const char *const *ends, int drop_needle, const char *tag,
                                    uint32_t line, jj_nlist *body) {
    if (is_op(cur(P), JO_COLON)) next(P);
    DT_CHECK(jp_expect_type(P, JT_BLOCK_END, "end of statement block"));
    DT_CHECK(jp_deeper(P));
    DT_CHECK(subparse(P, ends, body));
    P->depth--;
    if (cur(P)->type == JT_EOF) {
        char want[128] = "";
        for (const char *const *e = ends; *e; e++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s'%s'", e == ends ? "" : " or ", *e);
        return jp_fail(P, DT_STATUS_FORMAT, cur(P)->line, "jp_unexpected end of template: the '%s' of line %u is not "
                    "closed (expected %s)", tag, line, want);
    }
    if (drop_needle) next(P);
    return DT_STATUS_OK;
}

static dt_status_t parse_signature(jj_parser *P, jj_node *x) {
    DT_CHECK(jp_expect_op(P, JO_LPAREN, "'('"));
    while (!is_op(cur(P), JO_RPAREN)) {
        if (x->l1.n) DT_CHECK(jp_expect_op(P, JO_COMMA, "','"));
        if (cur(P)->type != JT_NAME) return jp_unexpected(P, "a parameter name");
        jj_node *p, *dflt = NULL;
        DT_CHECK(jp_node(P, JN_NAME, cur(P)->line, &p));
        p->s = cur(P)->p;
        p->sn = cur(P)->n;
        next(P);
        if (is_op(cur(P), JO_ASSIGN)) {
            next(P);
            DT_CHECK(jp_expression(P, 1, &dflt));
        } else if (x->l3.n && x->l3.v[x->l3.n - 1]) {
            return jp_fail(P, DT_STATUS_FORMAT, p->line, "non-default argument follows default argument");
        }
        DT_CHECK(jp_push(P, &x->l1, p));
        DT_CHECK(jp_push(P, &x->l3, dflt));
    }
    return jp_expect_op(P, JO_RPAREN, "')'");
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
static dt_status_t scoped_body(jj_parser *P, const char *const *ends, int drop, const char *tag, uint32_t line,
                               int loop, jj_nlist *body) {
    int soft = P->soft, loops = P->loops;
    P->soft = 0;
    P->loops = loop == 1 ? loops + 1 : loop == 2 ? loops : 0;
    dt_status_t st = parse_statements(P, ends, drop, tag, line, body);
    P->soft = soft;
    P->loops = loops;
    return st;
}

static dt_status_t parse_statement(jj_parser *P, jj_nlist *body) {
    jj_tok *t = cur(P);
    char buf[64];
    if (t->type != JT_NAME) return jp_fail(P, DT_STATUS_FORMAT, t->line, "tag name expected");
    uint32_t line = t->line;
    jj_node *x;
    if (is_name(t, "if")) {
        next(P);
        DT_CHECK(jp_node(P, JN_IF, line, &x));
        DT_CHECK(jp_push(P, body, x));
        P->soft++;
        for (jj_node *cur_if = x;;) {
            DT_CHECK(jp_tuple(P, 0, 0, NULL, 0, 0, &cur_if->a));
            DT_CHECK(parse_statements(P, END_IF, 0, "if", line, &cur_if->l1));
            jj_tok *e = next(P);
            if (is_name(e, "elif")) {
                jj_node *nx;
                DT_CHECK(jp_node(P, JN_IF, cur(P)->line, &nx));
                DT_CHECK(jp_push(P, &cur_if->l2, nx));
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
        DT_CHECK(jp_node(P, JN_FOR, line, &x));
        DT_CHECK(parse_target(P, "in", 0, &x->a));
        if (!is_name(cur(P), "in")) return jp_unexpected(P, "'in'");
        next(P);
        DT_CHECK(jp_tuple(P, 0, 0, "recursive", 0, 0, &x->b));
        if (is_name(cur(P), "if")) {
            next(P);
            DT_CHECK(jp_expression(P, 1, &x->c));
        }
        if (is_name(cur(P), "recursive"))
            return jp_fail(P, DT_STATUS_UNSUPPORTED, cur(P)->line, "recursive for loops are not supported");
        DT_CHECK(scoped_body(P, END_FOR, 0, "for", line, 1, &x->l1));
        if (is_name(next(P), "else")) DT_CHECK(scoped_body(P, END_FOR_ELSE, 1, "for", line, 2, &x->l2));
        return jp_push(P, body, x);
    }
    if (is_name(t, "set")) {
        next(P);
        jj_node *target;
        DT_CHECK(parse_target(P, NULL, 1, &target));
        if (is_op(cur(P), JO_ASSIGN)) {
            next(P);
            DT_CHECK(jp_node(P, JN_SET, line, &x));
            x->a = target;
            DT_CHECK(jp_tuple(P, 0, 1, NULL, 0, 0, &x->b));
            return jp_push(P, body, x);
        }
        DT_CHECK(jp_node(P, JN_SETBLOCK, line, &x));
        x->a = target;
        DT_CHECK(jp_filter(P, NULL, 0, &x->c));
        DT_CHECK(parse_statements(P, END_SET, 1, "set", line, &x->l1));
        return jp_push(P, body, x);
    }
    if (is_name(t, "macro") || is_name(t, "call")) {
        int is_macro = is_name(t, "macro");
        next(P);
        DT_CHECK(jp_node(P, is_macro ? JN_MACRO : JN_CALLBLOCK, line, &x));
        uint8_t *saved = P->macro_flags;
        if (is_macro) {
            if (cur(P)->type != JT_NAME) return jp_unexpected(P, "a macro name");
            x->s = cur(P)->p;
            x->sn = cur(P)->n;
            next(P);
            DT_CHECK(parse_signature(P, x));
        } else {
            if (is_op(cur(P), JO_LPAREN)) DT_CHECK(parse_signature(P, x));
            P->macro_flags = NULL;
            DT_CHECK(jp_expression(P, 1, &x->a));
            if (x->a->type != JN_CALL) return jp_fail(P, DT_STATUS_FORMAT, line, "expected call");
        }
        P->macro_flags = &x->flag;
        dt_status_t st = scoped_body(P, is_macro ? END_MACRO : END_CALL, 1, is_macro ? "macro" : "call", line, 0,
                                     &x->l2);
        P->macro_flags = saved;
        DT_CHECK(st);
        return jp_push(P, body, x);
    }
    if (is_name(t, "filter")) {
        next(P);
        DT_CHECK(jp_node(P, JN_FILTERBLOCK, line, &x));
        DT_CHECK(jp_filter(P, NULL, 1, &x->c));
        DT_CHECK(parse_statements(P, END_FILTER, 1, "filter", line, &x->l1));
        return jp_push(P, body, x);
    }
    if (is_name(t, "with")) {
        next(P);
        DT_CHECK(jp_node(P, JN_WITH, line, &x));
        while (cur(P)->type != JT_BLOCK_END) {
            if (x->l1.n) DT_CHECK(jp_expect_op(P, JO_COMMA, "','"));
            jj_node *target, *value;
            DT_CHECK(parse_target(P, NULL, 0, &target));
            DT_CHECK(jp_expect_op(P, JO_ASSIGN, "'='"));
            DT_CHECK(jp_expression(P, 1, &value));
            DT_CHECK(jp_push(P, &x->l1, target));
            DT_CHECK(jp_push(P, &x->l3, value));
        }
        DT_CHECK(scoped_body(P, END_WITH, 1, "with", line, 2, &x->l2));
        return jp_push(P, body, x);
    }
    if (is_name(t, "print")) {
        next(P);
        while (cur(P)->type != JT_BLOCK_END) {
            DT_CHECK(jp_node(P, JN_PRINT, line, &x));
            DT_CHECK(jp_expression(P, 1, &x->a));
            DT_CHECK(jp_push(P, body, x));
            if (cur(P)->type != JT_BLOCK_END) DT_CHECK(jp_expect_op(P, JO_COMMA, "','"));
        }
        return DT_STATUS_OK;
    }
    if (is_name(t, "generation")) {
        next(P);
        DT_CHECK(jp_node(P, JN_GENERATION, line, &x));
        P->t->has_generation = 1;
        DT_CHECK(scoped_body(P, END_GEN, 1, "generation", line, 0, &x->l1));
        return jp_push(P, body, x);
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        if (!P->loops) return jp_fail(P, DT_STATUS_FORMAT, line, "'%.*s' outside of a for loop", (int)t->n, t->p);
        next(P);
        DT_CHECK(jp_node(P, is_name(t, "break") ? JN_BREAK : JN_CONTINUE, line, &x));
        return jp_push(P, body, x);
    }
    static const char *const unsupported[] = {"block", "extends", "include", "import", "from", "autoescape", NULL};
    for (const char *const *u = unsupported; *u; u++)
        if (is_name(t, *u))
            return jp_fail(P, DT_STATUS_UNSUPPORTED, line, "the tag '%s' is not supported (chat templates are one "
                        "file: no loader, no blocks)", *u);
    return jp_fail(P, DT_STATUS_FORMAT, line, "Encountered unknown tag '%s'.", jp_describe(t, buf, sizeof buf));
}

static int is_end(const jj_tok *t, const char *const *ends) {
    for (; ends && *ends; ends++)
        if (is_name(t, *ends)) return 1;
    return 0;
}

static dt_status_t subparse(jj_parser *P, const char *const *ends, jj_nlist *body) {
    for (;;) {
        jj_tok *t = cur(P);
        jj_node *x;
        switch (t->type) {
        case JT_EOF: return DT_STATUS_OK;
        case JT_DATA:
            DT_CHECK(jp_node(P, JN_TEXT, t->line, &x));
            x->s = t->p;
            x->sn = t->n;
            DT_CHECK(jp_push(P, body, x));
            next(P);
            break;
        case JT_VAR_BEGIN:
            next(P);
            DT_CHECK(jp_node(P, JN_PRINT, t->line, &x));
            DT_CHECK(jp_tuple(P, 0, 1, NULL, 0, 0, &x->a));
            DT_CHECK(jp_push(P, body, x));
            DT_CHECK(jp_expect_type(P, JT_VAR_END, "end of print statement"));
            break;
        case JT_BLOCK_BEGIN:
            next(P);
            if (is_end(cur(P), ends)) return DT_STATUS_OK;
            DT_CHECK(parse_statement(P, body));
            DT_CHECK(jp_expect_type(P, JT_BLOCK_END, "end of statement block"));
            break;
        default: {
            char buf[64];
            return jp_fail(P, DT_STATUS_FORMAT, t->line, "jp_unexpected '%s'", jp_describe(t, buf, sizeof buf));
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
        jj_parser P = {.t = t, .tk = toks, .n = ntoks};
        st = subparse(&P, NULL, &t->body);
        if (st == DT_STATUS_OK && cur(&P)->type != JT_EOF) {
            char buf[64];
            st = jp_fail(&P, DT_STATUS_FORMAT, cur(&P)->line, "Encountered unknown tag '%s'.",
                      jp_describe(cur(&P), buf, sizeof buf));
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
