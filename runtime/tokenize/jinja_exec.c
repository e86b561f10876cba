/*
 * jinja_exec.c - runs a parsed template: statements with jinja2's scoping (a for
 * loop's body is a fresh scope each iteration, if is not a scope, namespaces carry
 * values out, jinja_scope.c's names start undefined), macros and call blocks,
 * captured output, {% generation %} spans, and the limits that stop a hostile
 * template (output, memory, steps, macro depth, nesting).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xrealloc, dt_xcalloc */
#include "runtime/tokenize/jinja_internal.h"

#define DEFAULT_MAX_OUTPUT ((size_t)64 << 20)
#define DEFAULT_MAX_MEMORY ((size_t)256 << 20)
#define DEFAULT_MAX_STEPS 10000000ull
#define DEFAULT_MAX_DEPTH 64

static dt_status_t exec(jj_render *r, jj_frame *f, const jj_nlist *body);

/* Binds the names a scope starts undefined (jinja_scope.c). */
dt_status_t jj_bind_missing(jj_render *r, jj_frame *f, const jj_nlist *miss) {
    for (uint32_t i = 0; i < miss->n; i++)
        DT_CHECK(jj_frame_set(r, f, miss->v[i]->s, miss->v[i]->sn, jv_undef_name(miss->v[i]->s, miss->v[i]->sn)));
    return DT_STATUS_OK;
}

/* ---- output ---- */

static dt_status_t emit(jj_render *r, const char *p, size_t n) { return jj_buf_put(r, r->out, p, n); }

static void capture_begin(jj_render *r, jj_buf *b, jj_buf **saved) {
    jj_buf_init(b);
    *saved = r->out;
    r->out = b;
    r->capture++;
}

static dt_status_t capture_end(jj_render *r, jj_buf *b, jj_buf *saved, dt_status_t st, jv *out) {
    r->out = saved;
    r->capture--;
    if (st == DT_STATUS_OK) st = jj_buf_take(r, b, out);
    free(b->p);
    return st;
}

/* ---- assignment ---- */

static dt_status_t assign(jj_render *r, jj_frame *f, const jj_node *target, jv v) {
    if (target->type == JN_NAME) return jj_frame_set(r, f, target->s, target->sn, v);
    if (target->type == JN_NSREF) {
        jv *ns = jj_frame_find(f, target->s, target->sn);
        if (!ns || ns->kind != JV_NS)
            return jj_fail(r, target->line, DT_STATUS_INVALID, "cannot assign attribute on non-namespace object");
        if (target->s2n && target->s2[0] == '_')
            return jj_fail(r, target->line, DT_STATUS_INVALID, "Chat templates cannot store underscore-prefixed "
                           "attributes on a namespace, but got '%.*s'.", (int)target->s2n, target->s2);
        return jj_dict_set(r, ns->u.d, jv_str(target->s2, target->s2n), v);
    }
    /* a tuple: unpack */
    jv *items;
    size_t n;
    DT_CHECK(jj_iter(r, v, target->line, &items, &n));
    if (n != target->l1.n)
        return jj_fail(r, target->line, DT_STATUS_INVALID, n > target->l1.n ? "too many values to unpack (expected %u)"
                       : "not enough values to unpack (expected %u, got %zu)", target->l1.n, n);
    for (uint32_t i = 0; i < target->l1.n; i++) DT_CHECK(assign(r, f, target->l1.v[i], items[i]));
    return DT_STATUS_OK;
}

static dt_status_t call_macro_in(jj_render *r, const jj_macro *m, const jv *args, size_t nargs,
                                 const char *const *kwn, const size_t *kwl, const jv *kwv, size_t nkw, uint32_t line,
                                 jv *out);

static dt_status_t call_macro(jj_render *r, const jj_macro *m, const jv *args, size_t nargs,
                              const char *const *kwn, const size_t *kwl, const jv *kwv, size_t nkw, uint32_t line,
                              jv *out) {
    if (r->depth >= r->lim.max_depth)
        return jj_fail(r, line, DT_STATUS_LIMIT, "macros nested more than %d calls deep", r->lim.max_depth);
    DT_CHECK(jj_step(r, line));
    r->depth++;
    dt_status_t st = call_macro_in(r, m, args, nargs, kwn, kwl, kwv, nkw, line, out);
    r->depth--;
    return st;
}

static dt_status_t call_macro_in(jj_render *r, const jj_macro *m, const jv *args, size_t nargs,
                                 const char *const *kwn, const size_t *kwl, const jv *kwv, size_t nkw, uint32_t line,
                                 jv *out) {
    const jj_node *def = m->def;
    int mname_n = def->type == JN_MACRO ? (int)def->sn : 6;
    const char *mname = def->type == JN_MACRO ? def->s : "caller";
    jj_frame *f = jj_frame_new(r, m->closure);
    if (!f) return jj_oom(r);
    uint32_t np = def->l1.n;
    if (nargs > np && !(def->flag & JJ_USES_VARARGS))
        return jj_fail(r, line, DT_STATUS_INVALID, "macro '%.*s' takes not more than %u argument(s)", mname_n, mname,
                       np);
    jj_dict *extra = jj_dict_new(r, 0);
    if (!extra) return jj_oom(r);
    jv caller = m->caller;
    for (size_t k = 0; k < nkw; k++) {
        uint32_t p;
        for (p = 0; p < np; p++)
            if (def->l1.v[p]->sn == kwl[k] && memcmp(def->l1.v[p]->s, kwn[k], kwl[k]) == 0) break;
        if (p < np && p < nargs)
            return jj_fail(r, line, DT_STATUS_INVALID, "macro '%.*s' got multiple values for argument '%.*s'",
                           mname_n, mname, (int)kwl[k], kwn[k]);
        if (p < np) continue;
        if (kwl[k] == 6 && memcmp(kwn[k], "caller", 6) == 0 && (def->flag & JJ_USES_CALLER)) {
            caller = kwv[k];
            continue;
        }
        if (!(def->flag & JJ_USES_KWARGS))
            return jj_fail(r, line, DT_STATUS_INVALID, "macro '%.*s' takes no keyword argument '%.*s'", mname_n, mname,
                           (int)kwl[k], kwn[k]);
        DT_CHECK(jj_dict_set(r, extra, jv_str(kwn[k], kwl[k]), kwv[k]));
    }
    for (uint32_t p = 0; p < np; p++) {
        const jj_node *param = def->l1.v[p];
        jv v = jv_undef_name(param->s, param->sn);
        int found = 0;
        if (p < nargs) {
            v = args[p];
            found = 1;
        }
        for (size_t k = 0; k < nkw && !found; k++)
            if (param->sn == kwl[k] && memcmp(param->s, kwn[k], kwl[k]) == 0) v = kwv[k], found = 1;
        if (!found && def->l3.v[p]) DT_CHECK(jj_eval(r, f, def->l3.v[p], &v));
        DT_CHECK(jj_frame_set(r, f, param->s, param->sn, v));
    }
    if (def->flag & JJ_USES_VARARGS) {
        jj_list *l = jj_list_new(r, 0);
        if (!l) return jj_oom(r);
        for (size_t i = np; i < nargs; i++) DT_CHECK(jj_list_push(r, l, args[i]));
        DT_CHECK(jj_frame_set(r, f, "varargs", 7, (jv){.kind = JV_LIST, .sub = JL_TUPLE, .u.l = l}));
    }
    if (def->flag & JJ_USES_KWARGS) DT_CHECK(jj_frame_set(r, f, "kwargs", 6, (jv){.kind = JV_DICT, .u.d = extra}));
    if (def->flag & JJ_USES_CALLER) {
        if (caller.kind == JV_UNDEF) caller = (jv){.kind = JV_UNDEF, .sub = JU_MSG, .u.s = {"No caller defined", 17}};
        DT_CHECK(jj_frame_set(r, f, "caller", 6, caller));
    }
    DT_CHECK(jj_bind_missing(r, f, &def->miss));
    jj_buf b, *saved;
    capture_begin(r, &b, &saved);
    dt_status_t st = exec(r, f, &def->l2);
    return capture_end(r, &b, saved, st, out);
}

dt_status_t jj_call(jj_render *r, jv fn, const jv *args, size_t nargs, const char *const *kwn, const size_t *kwl,
                    const jv *kwv, size_t nkw, uint32_t line, jv *out) {
    switch (fn.kind) {
    case JV_MACRO: return call_macro(r, fn.u.m, args, nargs, kwn, kwl, kwv, nkw, line, out);
    case JV_FUNC: return jj_global_call(r, (int)fn.u.i, args, nargs, kwn, kwl, kwv, nkw, line, out);
    case JV_METHOD: return jj_method_call(r, fn.u.meth, args, nargs, kwn, kwl, kwv, nkw, line, out);
    case JV_UNDEF: return jj_undef_fail(r, fn, line);
    default: return jj_fail(r, line, DT_STATUS_INVALID, "'%s' object is not callable", jj_type_name(fn));
    }
}

/* ---- statements ---- */

static dt_status_t exec_for(jj_render *r, jj_frame *f, const jj_node *x) {
    jv seq, *items;
    size_t n;
    DT_CHECK(jj_eval(r, f, x->b, &seq));
    DT_CHECK(jj_iter(r, seq, x->line, &items, &n));
    jj_frame *it = jj_frame_new(r, f);
    if (!it) return jj_oom(r);
    if (x->c) { /* `for a in b if c`: filtered first, so loop.length counts what passes */
        jv *kept = jj_alloc(&r->arena, (n ? n : 1) * sizeof *kept);
        if (!kept) return jj_oom(r);
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            DT_CHECK(jj_step(r, x->line));
            it->n = 0;
            DT_CHECK(assign(r, it, x->a, items[i]));
            jv ok;
            DT_CHECK(jj_eval(r, it, x->c, &ok));
            if (jj_truthy(ok)) kept[k++] = items[i];
        }
        items = kept;
        n = k;
    }
    jj_loop *loop = jj_alloc(&r->arena, sizeof *loop);
    if (!loop) return jj_oom(r);
    loop->items = items;
    loop->n = n;
    /* jinja2 clears its "no iteration" flag at the end of the body: the else block
     * runs unless some iteration got there (not cut by break or continue) */
    int completed = 0;
    for (size_t i = 0; i < n; i++) {
        DT_CHECK(jj_step(r, x->line));
        loop->i = i;
        it->n = 0;
        DT_CHECK(jj_frame_set(r, it, "loop", 4, (jv){.kind = JV_LOOP, .u.loop = loop}));
        DT_CHECK(assign(r, it, x->a, items[i]));
        DT_CHECK(jj_bind_missing(r, it, &x->miss));
        DT_CHECK(exec(r, it, &x->l1));
        int ctl = r->ctl;
        r->ctl = JJ_CTL_NONE;
        if (ctl == JJ_CTL_BREAK) break;
        if (ctl == JJ_CTL_NONE) completed = 1;
    }
    if (completed || !x->l2.n) return DT_STATUS_OK;
    it->n = 0;
    DT_CHECK(jj_bind_missing(r, it, &x->miss2));
    return exec(r, it, &x->l2);
}

/* Applies a filter chain (FILTER nodes whose innermost input is the captured text). */
static dt_status_t apply_filters(jj_render *r, jj_frame *f, const jj_node *chain, jv in, jv *out) {
    if (!chain) {
        *out = in;
        return DT_STATUS_OK;
    }
    jv saved = r->filter_input;
    r->filter_input = in;
    dt_status_t st = jj_eval(r, f, chain, out);
    r->filter_input = saved;
    return st;
}

static dt_status_t exec_node(jj_render *r, jj_frame *f, const jj_node *x) {
    jv v;
    jj_buf b, *saved;
    switch (x->type) {
    case JN_TEXT: return emit(r, x->s, x->sn);
    case JN_PRINT:
        DT_CHECK(jj_eval(r, f, x->a, &v));
        return jj_str_into(r, r->out, v, x->line);
    case JN_IF:
        DT_CHECK(jj_eval(r, f, x->a, &v));
        return exec(r, f, jj_truthy(v) ? &x->l1 : &x->l2);
    case JN_FOR: return exec_for(r, f, x);
    case JN_SET:
        DT_CHECK(jj_eval(r, f, x->b, &v));
        return assign(r, f, x->a, v);
    case JN_SETBLOCK: case JN_FILTERBLOCK: {
        jj_frame *inner = jj_frame_new(r, f); /* the body is a scope of its own */
        if (!inner) return jj_oom(r);
        DT_CHECK(jj_bind_missing(r, inner, &x->miss));
        capture_begin(r, &b, &saved);
        dt_status_t st = exec(r, inner, &x->l1);
        DT_CHECK(capture_end(r, &b, saved, st, &v));
        if (r->ctl != JJ_CTL_NONE) return DT_STATUS_OK; /* a break inside: jinja2 never gets to the end */
        DT_CHECK(apply_filters(r, f, x->c, v, &v));
        if (x->type == JN_SETBLOCK) return assign(r, f, x->a, v);
        return jj_str_into(r, r->out, v, x->line);
    }
    case JN_MACRO: {
        jj_macro *m = jj_alloc(&r->arena, sizeof *m);
        if (!m) return jj_oom(r);
        m->def = x;
        m->closure = f;
        return jj_frame_set(r, f, x->s, x->sn, (jv){.kind = JV_MACRO, .u.m = m});
    }
    case JN_CALLBLOCK: {
        jj_macro *m = jj_alloc(&r->arena, sizeof *m);
        if (!m) return jj_oom(r);
        m->def = x;
        m->closure = f;
        jv fn;
        jj_callargs c;
        DT_CHECK(jj_eval(r, f, x->a->a, &fn));
        DT_CHECK(jj_eval_args(r, f, x->a, 1, &c));
        c.kwn[c.nkw] = "caller";
        c.kwl[c.nkw] = 6;
        c.kwv[c.nkw++] = (jv){.kind = JV_MACRO, .u.m = m};
        DT_CHECK(jj_call(r, fn, c.args, c.nargs, c.kwn, c.kwl, c.kwv, c.nkw, x->line, &v));
        return jj_str_into(r, r->out, v, x->line);
    }
    case JN_WITH: {
        jj_frame *w = jj_frame_new(r, f);
        if (!w) return jj_oom(r);
        for (uint32_t i = 0; i < x->l1.n; i++) {
            DT_CHECK(jj_eval(r, f, x->l3.v[i], &v));
            DT_CHECK(assign(r, w, x->l1.v[i], v));
        }
        DT_CHECK(jj_bind_missing(r, w, &x->miss));
        return exec(r, w, &x->l2);
    }
    case JN_BREAK: r->ctl = JJ_CTL_BREAK; return DT_STATUS_OK;
    case JN_CONTINUE: r->ctl = JJ_CTL_CONTINUE; return DT_STATUS_OK;
    case JN_GENERATION: { /* transformers' AssistantTracker: a call block, so a scope of its own */
        size_t start = r->out->n;
        int track = r->capture == 0;
        jj_frame *inner = jj_frame_new(r, f);
        if (!inner) return jj_oom(r);
        DT_CHECK(jj_bind_missing(r, inner, &x->miss));
        DT_CHECK(exec(r, inner, &x->l1));
        if (track) {
            if (r->nspans == r->capspans) {
                r->capspans = r->capspans ? 2 * r->capspans : 8;
                r->spans = dt_xrealloc(r->spans, r->capspans * sizeof *r->spans);
            }
            r->spans[r->nspans++] = (dt_jinja_span){start, r->out->n};
        }
        return DT_STATUS_OK;
    }
    default:
        return jj_eval(r, f, x, &v);
    }
}

static dt_status_t exec(jj_render *r, jj_frame *f, const jj_nlist *body) {
    if (++r->nest > JJ_MAX_NEST) {
        r->nest--;
        return jj_fail(r, body->n ? body->v[0]->line : 0, DT_STATUS_LIMIT, "the template nests blocks and calls more "
                       "than %d deep", JJ_MAX_NEST);
    }
    dt_status_t st = DT_STATUS_OK;
    for (uint32_t i = 0; i < body->n && st == DT_STATUS_OK; i++) {
        st = exec_node(r, f, body->v[i]);
        if (r->ctl != JJ_CTL_NONE) break;
    }
    r->nest--;
    return st;
}

/* ---- the render ---- */

dt_status_t dt_jinja_render(const dt_jinja_t *t, const cJSON *vars, const dt_jinja_limits *limits,
                            dt_jinja_result *res) {
    memset(res, 0, sizeof *res);
    jj_render r = {.t = t};
    if (limits) r.lim = *limits;
    if (!r.lim.max_output) r.lim.max_output = DEFAULT_MAX_OUTPUT;
    if (!r.lim.max_memory) r.lim.max_memory = DEFAULT_MAX_MEMORY;
    if (!r.lim.max_steps) r.lim.max_steps = DEFAULT_MAX_STEPS;
    if (!r.lim.max_depth) r.lim.max_depth = DEFAULT_MAX_DEPTH;
    r.arena.limit = r.lim.max_memory;
    jj_buf_init(&r.root);
    r.out = &r.root;
    dt_status_t st = DT_STATUS_OK;
    jj_frame *top = jj_frame_new(&r, NULL);
    if (!top) st = jj_oom(&r);
    if (vars && !cJSON_IsObject(vars))
        st = dt_error(DT_STATUS_INVALID, "%s: the template's variables must be a JSON object", t->name);
    for (const cJSON *e = vars ? vars->child : NULL; e && st == DT_STATUS_OK; e = e->next) {
        jv v;
        st = jj_from_json(&r, e, &v);
        if (st == DT_STATUS_OK) st = jj_frame_set(&r, top, e->string, strlen(e->string), v);
    }
    if (st == DT_STATUS_OK) st = jj_bind_missing(&r, top, &t->miss);
    if (st == DT_STATUS_OK) st = exec(&r, top, &t->body);
    jj_arena_free(&r.arena);
    if (st != DT_STATUS_OK) {
        free(r.root.p);
        free(r.spans);
        return st;
    }
    res->text = r.root.p ? r.root.p : dt_xcalloc(1, 1);
    res->len = r.root.n;
    res->spans = r.spans;
    res->nspans = r.nspans;
    return DT_STATUS_OK;
}

void dt_jinja_result_free(dt_jinja_result *res) {
    if (!res) return;
    free(res->text);
    free(res->spans);
    memset(res, 0, sizeof *res);
}
