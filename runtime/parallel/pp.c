/*
 * pp.c - the pipeline engine (pp.h): a schedule's actions on this rank's chunks, the
 * point-to-point traffic between stages, the tied head's gradient and refresh.
 */
#include "runtime/parallel/pp.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h" /* defines: dt_now_s */
#include "common/mem.h"   /* defines: dt_xcalloc */
#include "common/trace.h" /* defines: dt_trace_span */

struct dt_pp {
    dt_pp_opts o;
    dt_device_t *dev;
    dt_net_t *net;
    dt_dp_t *dp;
    int P, V, m, s;
    dt_comm_t *fwd, *bwd; /* copies of the PP group: activations forward, gradients back */
    dt_comm_dtype_t dtype;
    size_t elems;         /* of a boundary buffer */
    dt_pp_action *acts;
    int n_acts;
    /* arenas */
    int *arena_of;        /* [mb * V + chunk] */
    int n_arenas, cap, *free_arena, n_free, held, most; /* cap: dt_pp_arenas + 1 */
    dt_comm_req_t *send_req;
    int *send_live;
    char *taken;          /* [action]: its forward took an arena when its receive was posted */
    dt_comm_req_t recv_req[2];
    int recv_live[2];
    /* tied head: the first and last stage */
    dt_comm_t *emb;
    size_t tie_count;     /* elements of the embedding's rows */
    size_t tie_offset;    /* stage 0: the embedding tensor's local offset */
    int tie_unit;         /* stage 0: its unit */
    void *tie_buf;        /* device: the last stage's gradient (stage 0), the rows sent (stage 0) */
    int tie_add_pending;  /* stage 0: in its last backward of chunk 0 */
    dt_comm_req_t tie_req;
    int tie_live;
    dt_net_hook_fn dp_hook;
    void *dp_ctx;
    dt_status_t err;
    char err_detail[1024];
    /* figures */
    double wait_s;
    double bytes;
    dt_pp_stats stats;
};

static void fail(dt_pp_t *pp, dt_status_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(dt_pp_t *pp, dt_status_t st, const char *fmt, ...) {
    if (pp->err != DT_STATUS_OK) return;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    pp->err = st;
    snprintf(pp->err_detail, sizeof pp->err_detail, "pipeline stage %d: %s: %s", pp->s, what, dt_error_detail());
}

static dt_status_t take_err(dt_pp_t *pp) {
    if (pp->err == DT_STATUS_OK) return DT_STATUS_OK;
    return dt_error(pp->err, "%s", pp->err_detail);
}

/* This stage waited on a neighbour since t0: the step's wait (its bubble), and the
 * timeline's "bubble" span named what. */
static void waited(dt_pp_t *pp, const char *what, double t0) {
    double t1 = dt_now_s();
    pp->wait_s += t1 - t0;
    dt_trace_span(DT_TRACE_BUBBLE, what, t0, t1);
}

/* Waits for req, counting the time as waiting on a neighbour. */
static dt_status_t timed_wait(dt_pp_t *pp, dt_comm_req_t *req, const char *what) {
    double t0 = dt_now_s();
    dt_status_t st = dt_comm_wait(req);
    waited(pp, what, t0);
    return st;
}

/* The timeline's span of micro-batch mb's pass of chunk c since t0. */
static void trace_pass(int fwd, int mb, int c, double t0) {
    if (!dt_trace_on()) return;
    char name[24];
    snprintf(name, sizeof name, "%s mb%d c%d", fwd ? "forward" : "backward", mb, c);
    dt_trace_span(DT_TRACE_COMPUTE, name, t0, dt_now_s());
}

static int first_chunk(const dt_pp_t *pp, int chunk) { return chunk == 0 && pp->s == 0; }
static int last_chunk(const dt_pp_t *pp, int chunk) { return chunk == pp->V - 1 && pp->s == pp->P - 1; }

/* ---- the hook: the tied head's gradient joins the embedding's -------------------- */

static void pp_hook(void *ctx, int unit, dt_net_phase_t phase) {
    dt_pp_t *pp = ctx;
    if (pp->tie_add_pending && phase == DT_NET_BWD_POST && unit == pp->tie_unit) {
        pp->tie_add_pending = 0;
        double t0 = dt_now_s();
        dt_status_t st = dt_comm_broadcast(pp->emb, pp->tie_buf, pp->tie_count, pp->dtype, 1);
        waited(pp, "tied grad", t0);
        if (st != DT_STATUS_OK) {
            fail(pp, st, "receiving the tied head's gradient from stage %d", pp->P - 1);
        } else {
            const dt_model_layout *l = pp->net->layout;
            size_t es = pp->net->elsize;
            char *g = (char *)pp->net->unit_grads[unit] + (pp->tie_offset - l->units[unit].offset) * es;
            pp->dev->ops->residual_forward(pp->dev, g, g, pp->tie_buf, pp->tie_count);
        }
    }
    if (pp->dp_hook) pp->dp_hook(pp->dp_ctx, unit, phase);
}

/* ---- init / free ----------------------------------------------------------------- */

static dt_status_t init_tie(dt_pp_t *pp) {
    const dt_model_layout *l = pp->net->layout, *g = l->global ? l->global : l;
    int has_embed = pp->s == 0, has_copy = l->has_tied_copy;
    /* the embedding group: the first and the last stage, when the head is tied */
    int tied = g->tied_head && pp->P > 1;
    int color = tied && (pp->s == 0 || pp->s == pp->P - 1) ? 0 : -1;
    DT_CHECK(dt_comm_split(pp->o.pp_comm, color, pp->s, &pp->emb));
    if (!pp->emb) return DT_STATUS_OK;
    const dt_tensor_info *e = &g->tensors[0]; /* the embedding's rows (model.h: tensor 0 of unit 0) */
    pp->tie_count = e->numel / (size_t)(e->tp_split != DT_TP_REPLICATED && l->tp_size > 1 ? l->tp_size : 1);
    size_t bytes = pp->tie_count * pp->net->elsize;
    const dt_ops_t *o = pp->dev->ops;
    if (has_embed) {
        int u = dt_model_local_unit(l, 0);
        if (u < 0 || l->tensors[l->units[u].tensor0].numel != pp->tie_count)
            return dt_error(DT_STATUS_INVALID, "pipeline: stage 0 does not hold the tied embedding's %zu elements",
                            pp->tie_count);
        pp->tie_unit = u;
        pp->tie_offset = l->tensors[l->units[u].tensor0].offset;
        DT_CHECK(o->alloc(pp->dev, DT_MEM_COMM, bytes, &pp->tie_buf));
    } else {
        if (!has_copy)
            return dt_error(DT_STATUS_INVALID, "pipeline: the last stage's layout has no tied head copy");
        DT_CHECK(o->alloc(pp->dev, DT_MEM_PARAMS, bytes, &pp->net->head_w));
        DT_CHECK(o->alloc(pp->dev, DT_MEM_GRADS, bytes, &pp->net->head_dw));
        DT_CHECK(o->set(pp->dev, pp->net->head_dw, 0, bytes));
    }
    return DT_STATUS_OK;
}

dt_status_t dt_pp_init(dt_pp_t **out, const dt_pp_opts *opts, dt_device_t *dev, dt_net_t *net, dt_dp_t *dp) {
    *out = NULL;
    char msg[512];
    if (dt_pp_schedule_check(opts->schedule, opts->stages, opts->virtual_stages, opts->micro_batches, msg,
                             sizeof msg))
        return dt_error(DT_STATUS_CONFIG, "%s", msg);
    if (!opts->pp_comm || dt_comm_size(opts->pp_comm) != opts->stages)
        return dt_error(DT_STATUS_INVALID, "pipeline: the PP group must have %d ranks", opts->stages);
    dt_pp_t *pp = dt_xcalloc(1, sizeof *pp);
    pp->o = *opts;
    pp->dev = dev;
    pp->net = net;
    pp->dp = dp;
    pp->P = opts->stages;
    pp->V = opts->virtual_stages;
    pp->m = opts->micro_batches;
    pp->s = dt_comm_rank(opts->pp_comm);
    pp->dtype = dev->ops->dtype == DT_DTYPE_BF16 ? DT_COMM_BF16 : DT_COMM_F32;
    pp->elems = dt_net_stage_elems(net);
    int n = 2 * pp->m * pp->V;
    pp->acts = dt_xcalloc((size_t)n, sizeof *pp->acts);
    pp->n_acts = dt_pp_schedule_build(opts->schedule, pp->P, pp->V, pp->m, pp->s, pp->acts);
    pp->arena_of = dt_xcalloc((size_t)(pp->m * pp->V), sizeof(int));
    pp->taken = dt_xcalloc((size_t)n, 1);
    int cap = pp->cap = dt_pp_arenas(opts->schedule, pp->P, pp->V, pp->m, pp->s) + 1;
    pp->free_arena = dt_xcalloc((size_t)cap, sizeof(int));
    pp->send_req = dt_xcalloc((size_t)cap, sizeof *pp->send_req);
    pp->send_live = dt_xcalloc((size_t)cap, sizeof(int));
    pp->n_arenas = 1; /* dt_net_init's */
    pp->free_arena[pp->n_free++] = 0;
    *out = pp;
    DT_CHECK(dt_comm_split(opts->pp_comm, 0, pp->s, &pp->fwd));
    DT_CHECK(dt_comm_split(opts->pp_comm, 0, pp->s, &pp->bwd));
    DT_CHECK(init_tie(pp));
    pp->dp_hook = net->hook;
    pp->dp_ctx = net->hook_ctx;
    net->hook = pp_hook;
    net->hook_ctx = pp;
    return DT_STATUS_OK;
}

void dt_pp_free(dt_pp_t *pp) {
    if (!pp) return;
    for (int a = 0; a < pp->n_arenas; a++)
        if (pp->send_live[a]) (void)dt_comm_wait(&pp->send_req[a]);
    for (int i = 0; i < 2; i++)
        if (pp->recv_live[i]) (void)dt_comm_wait(&pp->recv_req[i]);
    if (pp->tie_live) (void)dt_comm_wait(&pp->tie_req);
    if (pp->net && pp->net->hook == pp_hook) {
        pp->net->hook = pp->dp_hook;
        pp->net->hook_ctx = pp->dp_ctx;
    }
    if (pp->tie_buf) pp->dev->ops->free(pp->dev, pp->tie_buf);
    if (pp->net && pp->net->head_w) pp->dev->ops->free(pp->dev, pp->net->head_w);
    if (pp->net && pp->net->head_dw) pp->dev->ops->free(pp->dev, pp->net->head_dw);
    if (pp->net) pp->net->head_w = pp->net->head_dw = NULL;
    dt_comm_free(pp->emb);
    dt_comm_free(pp->fwd);
    dt_comm_free(pp->bwd);
    free(pp->acts);
    free(pp->arena_of);
    free(pp->taken);
    free(pp->free_arena);
    free(pp->send_req);
    free(pp->send_live);
    free(pp);
}

/* ---- arenas ------------------------------------------------------------------------ */

/* Waits for the message arena a last sent (its forward's output, or its backward's
 * input gradient): one request per arena, so a new send waits for the old one. */
static dt_status_t finish_send(dt_pp_t *pp, int a) {
    if (!pp->send_live[a]) return DT_STATUS_OK;
    pp->send_live[a] = 0;
    dt_status_t st = timed_wait(pp, &pp->send_req[a], "send wait");
    if (st != DT_STATUS_OK) {
        fail(pp, st, "a send to a neighbouring stage");
        return take_err(pp);
    }
    return DT_STATUS_OK;
}

/* A free arena (a new one when none is free); its last send must have finished. */
static dt_status_t acquire(dt_pp_t *pp, int *out) {
    int a;
    if (pp->n_free > 0) {
        a = pp->free_arena[--pp->n_free];
    } else {
        if (pp->n_arenas == pp->cap)
            return dt_error(DT_STATUS_INVALID, "pipeline stage %d: more than the %d arenas the schedule holds", pp->s,
                            pp->cap);
        DT_CHECK(dt_net_arenas(pp->net, pp->n_arenas + 1));
        a = pp->n_arenas++;
    }
    DT_CHECK(finish_send(pp, a));
    if (++pp->held > pp->most) pp->most = pp->held;
    *out = a;
    return DT_STATUS_OK;
}

static void release(dt_pp_t *pp, int a) {
    pp->free_arena[pp->n_free++] = a;
    pp->held--;
}

/* ---- one step ---------------------------------------------------------------------- */

/* Posts the receive action i needs (into its arena: a new one for a forward). */
static dt_status_t post_recv(dt_pp_t *pp, int i) {
    const dt_pp_action *a = &pp->acts[i];
    if (!dt_pp_action_receives(a, pp->P, pp->V, pp->s)) return DT_STATUS_OK;
    int *slot = &pp->arena_of[a->mb * pp->V + a->chunk], arena;
    if (a->fwd) {
        DT_CHECK(acquire(pp, &arena));
        *slot = arena;
        pp->taken[i] = 1;
    } else {
        arena = *slot;
    }
    dt_net_use(pp->net, arena);
    void *buf = dt_net_stage_buf(pp->net, a->fwd ? DT_NET_STAGE_IN : DT_NET_STAGE_DOUT);
    int peer = a->fwd ? (pp->s + pp->P - 1) % pp->P : (pp->s + 1) % pp->P;
    dt_status_t st = dt_comm_recv_async(a->fwd ? pp->fwd : pp->bwd, buf, pp->elems, pp->dtype, peer,
                                        &pp->recv_req[i % 2]);
    if (st != DT_STATUS_OK) {
        fail(pp, st, "posting the receive of micro-batch %d's %s", a->mb, a->fwd ? "activation" : "gradient");
        return take_err(pp);
    }
    pp->recv_live[i % 2] = 1;
    return DT_STATUS_OK;
}

static dt_status_t wait_recv(dt_pp_t *pp, int i) {
    const dt_pp_action *a = &pp->acts[i];
    if (!pp->recv_live[i % 2]) return DT_STATUS_OK;
    pp->recv_live[i % 2] = 0;
    dt_status_t st = timed_wait(pp, &pp->recv_req[i % 2], a->fwd ? "recv act" : "recv grad");
    if (st != DT_STATUS_OK) {
        fail(pp, st, "receiving micro-batch %d's %s (chunk %d) from stage %d", a->mb,
             a->fwd ? "activation" : "gradient", a->chunk, a->fwd ? (pp->s + pp->P - 1) % pp->P : (pp->s + 1) % pp->P);
        return take_err(pp);
    }
    return DT_STATUS_OK;
}

static dt_status_t send_out(dt_pp_t *pp, const dt_pp_action *a, int arena) {
    if (!dt_pp_action_sends(a, pp->P, pp->V, pp->s)) return DT_STATUS_OK;
    DT_CHECK(finish_send(pp, arena)); /* the forward's output, before the backward's gradient goes */
    void *buf = dt_net_stage_buf(pp->net, a->fwd ? DT_NET_STAGE_OUT : DT_NET_STAGE_DIN);
    int peer = a->fwd ? (pp->s + 1) % pp->P : (pp->s + pp->P - 1) % pp->P;
    dt_status_t st = dt_comm_send_async(a->fwd ? pp->fwd : pp->bwd, buf, pp->elems, pp->dtype, peer,
                                        &pp->send_req[arena]);
    if (st != DT_STATUS_OK) {
        fail(pp, st, "sending micro-batch %d's %s to stage %d", a->mb, a->fwd ? "activation" : "gradient", peer);
        return take_err(pp);
    }
    pp->send_live[arena] = 1;
    pp->bytes += (double)pp->elems * (double)dt_comm_dtype_size(pp->dtype);
    return DT_STATUS_OK;
}

static void test_delay(const dt_pp_t *pp, double factor) {
    double ms = pp->o.test_delay_ms * factor;
    if (ms <= 0) return;
    struct timespec ts = {.tv_sec = (time_t)(ms / 1e3), .tv_nsec = (long)(fmod(ms, 1e3) * 1e6)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static dt_status_t run_action(dt_pp_t *pp, int i, const dt_batch *batches, float dscale, double *loss_sum) {
    const dt_pp_action *a = &pp->acts[i];
    dt_net_t *net = pp->net;
    int *slot = &pp->arena_of[a->mb * pp->V + a->chunk];
    net->chunk = a->chunk;
    if (a->fwd) {
        if (!pp->taken[i]) DT_CHECK(acquire(pp, slot));
        pp->taken[i] = 0;
        DT_CHECK(wait_recv(pp, i));
        dt_net_use(net, *slot);
        double l, t0 = dt_now_s();
        DT_CHECK(dt_net_forward(net, &batches[a->mb], &l));
        if (last_chunk(pp, a->chunk)) *loss_sum += l;
        DT_CHECK(pp->dev->ops->synchronize(pp->dev)); /* the output is complete before it travels */
        test_delay(pp, 1); /* (a test's compute time: before the output leaves) */
        trace_pass(1, a->mb, a->chunk, t0);
        DT_CHECK(send_out(pp, a, *slot));
    } else {
        DT_CHECK(wait_recv(pp, i));
        dt_net_use(net, *slot);
        double t0 = dt_now_s();
        dt_dp_micro_begin(pp->dp, a->mb == pp->m - 1);
        pp->tie_add_pending = pp->emb && first_chunk(pp, a->chunk) && a->mb == pp->m - 1;
        DT_CHECK(dt_net_backward(net, dscale));
        DT_CHECK(take_err(pp));
        DT_CHECK(dt_dp_micro_end(pp->dp));
        test_delay(pp, 2);
        trace_pass(0, a->mb, a->chunk, t0);
        DT_CHECK(send_out(pp, a, *slot));
        release(pp, *slot);
        if (pp->emb && last_chunk(pp, a->chunk) && a->mb == pp->m - 1) { /* the tie's gradient, summed */
            dt_status_t st = dt_comm_broadcast_async(pp->emb, net->head_dw, pp->tie_count, pp->dtype, 1,
                                                     &pp->tie_req);
            if (st != DT_STATUS_OK) {
                fail(pp, st, "sending the tied head's gradient to stage 0");
                return take_err(pp);
            }
            pp->tie_live = 1;
        }
    }
    return dt_tp_check(pp->o.tp);
}

dt_status_t dt_pp_step(dt_pp_t *pp, const dt_batch *batches, float dscale, double *loss_sum) {
    double t0 = dt_now_s();
    pp->wait_s = 0;
    pp->bytes = 0;
    pp->most = pp->held;
    *loss_sum = pp->s == pp->P - 1 ? 0 : NAN;
    if (pp->net->head_dw) DT_CHECK(pp->dev->ops->set(pp->dev, pp->net->head_dw, 0, pp->tie_count * pp->net->elsize));
    dt_status_t st = post_recv(pp, 0);
    for (int i = 0; i < pp->n_acts && st == DT_STATUS_OK; i++) {
        if (i + 1 < pp->n_acts) st = post_recv(pp, i + 1);
        if (st == DT_STATUS_OK) st = run_action(pp, i, batches, dscale, loss_sum);
    }
    /* the step ends when this stage's messages arrived (after a failure the step ends
     * now: its error stands, and dt_pp_free waits for what is left) */
    for (int a = 0; a < pp->n_arenas && st == DT_STATUS_OK; a++) st = finish_send(pp, a);
    if (pp->tie_live && st == DT_STATUS_OK) {
        pp->tie_live = 0;
        dt_status_t s2 = timed_wait(pp, &pp->tie_req, "tied grad send");
        if (st == DT_STATUS_OK && s2 != DT_STATUS_OK) {
            fail(pp, s2, "sending the tied head's gradient to stage 0");
            st = take_err(pp);
        }
    }
    double total = dt_now_s() - t0;
    pp->stats = (dt_pp_stats){.pipeline_ms = total * 1e3, .wait_ms = pp->wait_s * 1e3,
                              .bubble = total > 0 ? pp->wait_s / total : 0, .p2p_bytes = pp->bytes,
                              .arenas = pp->most};
    return st;
}

dt_status_t dt_pp_sync_tied(dt_pp_t *pp) {
    if (!pp || !pp->emb) return DT_STATUS_OK;
    double t0 = dt_now_s();
    dt_status_t st;
    if (pp->s == 0) {
        st = dt_dp_params_range(pp->dp, pp->tie_offset, pp->tie_count, pp->tie_buf);
        if (st == DT_STATUS_OK) st = dt_comm_broadcast(pp->emb, pp->tie_buf, pp->tie_count, pp->dtype, 0);
    } else {
        st = dt_comm_broadcast(pp->emb, pp->net->head_w, pp->tie_count, pp->dtype, 0);
    }
    waited(pp, "tied sync", t0);
    if (st != DT_STATUS_OK) {
        fail(pp, st, "refreshing the last stage's copy of the tied embedding");
        return take_err(pp);
    }
    return DT_STATUS_OK;
}

void dt_pp_get_stats(const dt_pp_t *pp, dt_pp_stats *out) { *out = pp->stats; }

dt_status_t dt_pp_forward_only(dt_pp_t *pp, const dt_batch *batch, double *loss) {
    dt_net_t *net = pp->net;
    *loss = NAN;
    dt_net_use(net, 0); /* between steps every arena is free */
    for (int c = 0; c < pp->V; c++) {
        dt_pp_action a = {.fwd = 1, .mb = 0, .chunk = c};
        net->chunk = c;
        if (dt_pp_action_receives(&a, pp->P, pp->V, pp->s)) {
            dt_status_t st = dt_comm_recv(pp->fwd, dt_net_stage_buf(net, DT_NET_STAGE_IN), pp->elems, pp->dtype,
                                          (pp->s + pp->P - 1) % pp->P);
            if (st != DT_STATUS_OK) {
                fail(pp, st, "evaluation: receiving chunk %d's input", c);
                return take_err(pp);
            }
        }
        double l;
        DT_CHECK(dt_net_forward(net, batch, &l));
        if (last_chunk(pp, c)) *loss = l;
        DT_CHECK(pp->dev->ops->synchronize(pp->dev));
        if (dt_pp_action_sends(&a, pp->P, pp->V, pp->s)) {
            dt_status_t st = dt_comm_send(pp->fwd, dt_net_stage_buf(net, DT_NET_STAGE_OUT), pp->elems, pp->dtype,
                                          (pp->s + 1) % pp->P);
            if (st != DT_STATUS_OK) {
                fail(pp, st, "evaluation: sending chunk %d's output", c);
                return take_err(pp);
            }
        }
        DT_CHECK(dt_tp_check(pp->o.tp));
    }
    net->have_forward = 0;
    return DT_STATUS_OK;
}
