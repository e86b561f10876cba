/*
 * jinja_parser.h - what jinja_parse.c (expressions) and jinja_stmt.c (statements)
 * share: the parser's state, the token helpers, the expression entry points.
 * Not a contract.
 */
#ifndef DT_RUNTIME_TOKENIZE_JINJA_PARSER_H
#define DT_RUNTIME_TOKENIZE_JINJA_PARSER_H

#include <string.h>

#include "runtime/tokenize/jinja_internal.h"

#define JP_MAX_NEST 200 /* nested expressions and blocks: bounded C stack */

typedef struct jj_parser {
    dt_jinja_t *t;
    jj_tok *tk;
    size_t n, i;
    int depth;
    int soft;       /* inside an if / conditional expression: unknown filters fail when run */
    int loops;      /* enclosing for loops (break / continue) */
    uint8_t *macro_flags; /* the macro being parsed: what its body reads */
} jj_parser;

static inline jj_tok *cur(jj_parser *P) { return &P->tk[P->i]; }
static inline jj_tok *look(jj_parser *P) { return &P->tk[P->i + 1 < P->n ? P->i + 1 : P->i]; }
static inline jj_tok *next(jj_parser *P) {
    jj_tok *t = cur(P);
    if (P->i + 1 < P->n) P->i++;
    return t;
}
static inline int is_name(const jj_tok *t, const char *s) {
    return t->type == JT_NAME && t->n == strlen(s) && memcmp(t->p, s, t->n) == 0;
}
static inline int is_op(const jj_tok *t, int op) { return t->type == JT_OP && t->op == op; }

const char *jp_describe(const jj_tok *t, char *buf, size_t len);
dt_status_t jp_fail(jj_parser *P, dt_status_t st, uint32_t line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* "expected WANT, got '...'" at the current token. */
dt_status_t jp_unexpected(jj_parser *P, const char *want);
dt_status_t jp_expect_op(jj_parser *P, int op, const char *what);
dt_status_t jp_expect_type(jj_parser *P, int type, const char *what);
/* A zeroed node of the template's pool. */
dt_status_t jp_node(jj_parser *P, int type, uint32_t line, jj_node **out);
dt_status_t jp_push(jj_parser *P, jj_nlist *l, jj_node *x);
/* One level deeper (JP_MAX_NEST at most); the caller decrements P->depth. */
dt_status_t jp_deeper(jj_parser *P);
/* jinja2's parse_expression, parse_tuple and parse_filter (in == NULL: a filter block's chain). */
dt_status_t jp_expression(jj_parser *P, int with_condexpr, jj_node **out);
dt_status_t jp_tuple(jj_parser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_parens,
                     int with_namespace, jj_node **out);
dt_status_t jp_filter(jj_parser *P, jj_node *in, int start_inline, jj_node **out);

#endif /* DT_RUNTIME_TOKENIZE_JINJA_PARSER_H */
