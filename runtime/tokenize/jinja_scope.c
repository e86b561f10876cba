/*
 * jinja_scope.c - jinja2's static scoping, the part the evaluator's dynamic
 * scopes cannot see: jinja2 compiles each scope (the template, a for body, a
 * macro, ...) to a Python function whose variables it decides beforehand
 * (jinja2/idtracking.py). A name a scope assigns directly, before reading it and
 * with no enclosing scope knowing it, starts that scope as "missing": it reads as
 * undefined from nested scopes until the assignment runs, even when the template's
 * variables have it. E.g. with a=5 passed in,
 *   {% for i in [1] %}{{ a }}{% endfor %}{% set a = 1 %}   prints ""
 *   {{ a }}{% set a = 1 %}                                  prints "5"
 * This pass lists those names per scope (jj_node.miss / miss2, dt_jinja.miss);
 * the evaluator binds them to undefined when it enters the scope.
 */
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xrealloc */
#include "runtime/tokenize/jinja_internal.h"

enum { ACT_PARAM, ACT_RESOLVE, ACT_ALIAS, ACT_UNDEF };

typedef struct sym {
    const char *p;
    size_t n;
    int act;
} sym;

typedef struct scope {
    const struct scope *parent;
    sym *refs;
    size_t nrefs, caprefs;
    sym *stores; /* act unused */
    size_t nstores, capstores;
} scope;

static sym *find(sym *v, size_t n, const char *p, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (v[i].n == len && memcmp(v[i].p, p, len) == 0) return &v[i];
    return NULL;
}

static void add(sym **v, size_t *n, size_t *cap, const char *p, size_t len, int act) {
    sym *have = find(*v, *n, p, len);
    if (have) {
        have->act = act;
        return;
    }
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 8;
        *v = dt_xrealloc(*v, *cap * sizeof **v);
    }
    (*v)[(*n)++] = (sym){p, len, act};
}

static int has_ref(const scope *s, const char *p, size_t n) {
    for (; s; s = s->parent)
        if (find(s->refs, s->nrefs, p, n)) return 1;
    return 0;
}

static void load(scope *s, const char *p, size_t n) {
    if (!has_ref(s, p, n)) add(&s->refs, &s->nrefs, &s->caprefs, p, n, ACT_RESOLVE);
}

static void store(scope *s, const char *p, size_t n) {
    add(&s->stores, &s->nstores, &s->capstores, p, n, 0);
    if (find(s->refs, s->nrefs, p, n)) return;
    add(&s->refs, &s->nrefs, &s->caprefs, p, n, has_ref(s->parent, p, n) ? ACT_ALIAS : ACT_UNDEF);
}

static void param(scope *s, const char *p, size_t n) {
    add(&s->stores, &s->nstores, &s->capstores, p, n, 0);
    add(&s->refs, &s->nrefs, &s->caprefs, p, n, ACT_PARAM);
}

static void scope_free(scope *s) {
    free(s->refs);
    free(s->stores);
}

static scope scope_copy(const scope *s) {
    scope c = *s;
    c.refs = c.caprefs ? dt_xrealloc(NULL, c.caprefs * sizeof *c.refs) : NULL;
    c.stores = c.capstores ? dt_xrealloc(NULL, c.capstores * sizeof *c.stores) : NULL;
    if (s->nrefs) memcpy(c.refs, s->refs, s->nrefs * sizeof *c.refs);
    if (s->nstores) memcpy(c.stores, s->stores, s->nstores * sizeof *c.stores);
    return c;
}

static void visit_expr(scope *s, const jj_node *x) {
    if (!x) return;
    switch (x->type) {
    case JN_NAME: load(s, x->s, x->sn); return;
    case JN_NSREF: load(s, x->s, x->sn); return;
    case JN_CONST: return;
    default: break;
    }
    visit_expr(s, x->a);
    visit_expr(s, x->b);
    visit_expr(s, x->c);
    for (uint32_t i = 0; i < x->l1.n; i++) visit_expr(s, x->l1.v[i]);
    for (uint32_t i = 0; i < x->l2.n; i++) visit_expr(s, x->l2.v[i]);
}

static void visit_target(scope *s, const jj_node *t) {
    if (t->type == JN_NAME) store(s, t->s, t->sn);
    else if (t->type == JN_NSREF) load(s, t->s, t->sn);
    else
        for (uint32_t i = 0; i < t->l1.n; i++) visit_target(s, t->l1.v[i]);
}

static void visit_stmts(scope *s, const jj_nlist *body);

/* jinja2's FrameSymbolVisitor.visit_If: each branch on a copy; names the branches
 * assign (and the scope had not) then read from outside at entry, not "missing". */
static void visit_if(scope *s, const jj_node *x) {
    visit_expr(s, x->a);
    scope b[2] = {scope_copy(s), scope_copy(s)};
    visit_stmts(&b[0], &x->l1);
    visit_stmts(&b[1], &x->l2);
    size_t before = s->nstores;
    sym *had = before ? dt_xrealloc(NULL, before * sizeof *had) : NULL;
    if (before) memcpy(had, s->stores, before * sizeof *had);
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < b[k].nrefs; i++)
            add(&s->refs, &s->nrefs, &s->caprefs, b[k].refs[i].p, b[k].refs[i].n, b[k].refs[i].act);
        for (size_t i = 0; i < b[k].nstores; i++)
            add(&s->stores, &s->nstores, &s->capstores, b[k].stores[i].p, b[k].stores[i].n, 0);
    }
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < b[k].nstores; i++) {
            const sym *st = &b[k].stores[i];
            if (find(had, before, st->p, st->n)) continue;
            add(&s->refs, &s->nrefs, &s->caprefs, st->p, st->n, has_ref(s->parent, st->p, st->n) ? ACT_ALIAS
                                                                                                : ACT_RESOLVE);
        }
    free(had);
    scope_free(&b[0]);
    scope_free(&b[1]);
}

/* One statement as the scope around it sees it (nested scopes are analyzed after). */
static void visit_stmt(scope *s, const jj_node *x) {
    switch (x->type) {
    case JN_PRINT: visit_expr(s, x->a); break;
    case JN_IF: visit_if(s, x); break;
    case JN_FOR: visit_expr(s, x->b); break;
    case JN_SET: visit_expr(s, x->b); visit_target(s, x->a); break;
    case JN_SETBLOCK: visit_target(s, x->a); break;
    case JN_MACRO: store(s, x->s, x->sn); break;
    case JN_CALLBLOCK: visit_expr(s, x->a); break;
    case JN_FILTERBLOCK: visit_expr(s, x->c); break;
    case JN_WITH:
        for (uint32_t i = 0; i < x->l3.n; i++) visit_expr(s, x->l3.v[i]);
        break;
    default: break;
    }
}

static void visit_stmts(scope *s, const jj_nlist *body) {
    for (uint32_t i = 0; i < body->n; i++) visit_stmt(s, body->v[i]);
}

static dt_status_t frame(dt_jinja_t *t, const scope *parent, const jj_node *target, const jj_nlist *param_list,
                         int macro, const jj_nlist *exprs, const jj_nlist *body, jj_nlist *miss);

/* The scopes nested in a scope's statements, each with that scope as parent. */
static dt_status_t nested(dt_jinja_t *t, const scope *s, const jj_nlist *body) {
    for (uint32_t i = 0; i < body->n; i++) {
        jj_node *x = body->v[i];
        jj_nlist none = {0};
        switch (x->type) {
        case JN_IF:
            DT_CHECK(nested(t, s, &x->l1));
            DT_CHECK(nested(t, s, &x->l2));
            break;
        case JN_FOR:
            DT_CHECK(frame(t, s, x->a, NULL, 0, &none, &x->l1, &x->miss));
            DT_CHECK(frame(t, s, NULL, NULL, 0, &none, &x->l2, &x->miss2));
            break;
        case JN_MACRO: case JN_CALLBLOCK:
            DT_CHECK(frame(t, s, NULL, &x->l1, 1, &x->l3, &x->l2, &x->miss));
            break;
        case JN_WITH:
            DT_CHECK(frame(t, s, NULL, &x->l1, 0, &none, &x->l2, &x->miss));
            break;
        case JN_SETBLOCK: case JN_GENERATION:
            DT_CHECK(frame(t, s, NULL, NULL, 0, &none, &x->l1, &x->miss));
            break;
        case JN_FILTERBLOCK: {
            jj_nlist f = {.v = &x->c, .n = x->c ? 1 : 0};
            DT_CHECK(frame(t, s, NULL, NULL, 0, &f, &x->l1, &x->miss));
            break;
        }
        default: break;
        }
    }
    return DT_STATUS_OK;
}

/* One scope: its parameters (a for target, or a list of names; a macro's also
 * varargs, kwargs, caller), expressions read in it (macro defaults), its body; then
 * the scopes nested in it. */
static dt_status_t frame(dt_jinja_t *t, const scope *parent, const jj_node *target, const jj_nlist *param_list,
                         int macro, const jj_nlist *exprs, const jj_nlist *body, jj_nlist *miss) {
    scope s = {.parent = parent};
    dt_status_t st = DT_STATUS_OK;
    if (macro) {
        param(&s, "varargs", 7);
        param(&s, "kwargs", 6);
        param(&s, "caller", 6);
    }
    if (target) {
        param(&s, "loop", 4);
        const jj_node *stack[64];
        int top = 0;
        stack[top++] = target;
        while (top) {
            const jj_node *n = stack[--top];
            if (n->type == JN_NAME) param(&s, n->s, n->sn);
            for (uint32_t i = 0; i < n->l1.n && top < 64; i++) stack[top++] = n->l1.v[i];
        }
    }
    for (uint32_t i = 0; param_list && i < param_list->n; i++)
        if (param_list->v[i]->type == JN_NAME) param(&s, param_list->v[i]->s, param_list->v[i]->sn);
        else visit_target(&s, param_list->v[i]);
    for (uint32_t i = 0; i < exprs->n; i++) visit_expr(&s, exprs->v[i]);
    visit_stmts(&s, body);
    for (size_t i = 0; i < s.nrefs && st == DT_STATUS_OK; i++) {
        if (s.refs[i].act != ACT_UNDEF) continue;
        jj_node *nm = jj_alloc(&t->pool, sizeof *nm);
        jj_node **v = jj_alloc(&t->pool, (miss->n + 1) * sizeof *v);
        if (!nm || !v) {
            st = dt_error(DT_STATUS_NOMEM, "%s: template too large", t->name);
            break;
        }
        nm->type = JN_NAME;
        nm->s = s.refs[i].p;
        nm->sn = s.refs[i].n;
        if (miss->n) memcpy(v, miss->v, miss->n * sizeof *v);
        v[miss->n++] = nm;
        miss->v = v;
    }
    if (st == DT_STATUS_OK) st = nested(t, &s, body);
    scope_free(&s);
    return st;
}

dt_status_t jj_scope_analyze(dt_jinja_t *t) {
    jj_nlist none = {0};
    return frame(t, NULL, NULL, NULL, 0, &none, &t->body, &t->miss);
}
