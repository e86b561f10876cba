/*
 * plan_pp.c - `dtrun plan`'s pipeline arithmetic (formulas in plan.h): a sized
 * model cut into stages, the view of one stage that plan.c prices as a row, and the
 * pipeline row: memory of the worst stage (its arenas from the schedule,
 * runtime/layout/pp_sched.h, as the engine holds them), the slowest stage's time
 * with the schedule's bubble, point-to-point traffic and each stage's DP collectives.
 */
#include "runtime/tools/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"                  /* defines: dt_xcalloc */
#include "runtime/layout/layout.h"     /* defines: dt_layout_of */
#include "runtime/layout/pp_sched.h"   /* defines: dt_pp_arenas, dt_pp_bubble_ideal */

/* ---- cutting the blocks into chunks --------------------------------------------- */

/* n chunks of L identical blocks of cost b, chunk 0 costing e_first more and chunk
 * n-1 e_last more: contiguous chunks of >= 1 block minimising the largest chunk's
 * cost, ties giving the later chunks more blocks (as the model's partition does).
 * bounds gets n + 1 entries. */
static void partition_sized(int L, int n, double b, double e_first, double e_last, int *bounds) {
    double *extra = dt_xcalloc((size_t)n, sizeof *extra);
    extra[0] += e_first;
    extra[n - 1] += e_last;
    /* the least largest cost X: chunk k holds at most floor((X - extra_k) / b) blocks;
     * X is feasible when every chunk holds one and together they hold L */
    double lo = 0, hi = 0;
    for (int k = 0; k < n; k++) hi = fmax(hi, extra[k]);
    hi += b * L;
    for (int it = 0; it < 200 && hi - lo > 1e-12 * hi; it++) {
        double x = (lo + hi) / 2, held = 0;
        int ok = 1;
        for (int k = 0; k < n && ok; k++) {
            double cap = floor((x - extra[k]) / b + 1e-9);
            ok = cap >= 1;
            held += fmin(cap, L);
        }
        if (ok && held >= L) hi = x;
        else lo = x;
    }
    /* from the last chunk back: each takes what fits, leaving one block per earlier chunk */
    int left = L;
    bounds[n] = L;
    for (int k = n - 1; k > 0; k--) {
        int cap = (int)fmin(floor((hi - extra[k]) / b + 1e-9), L);
        int take = cap < left - k ? cap : left - k;
        if (take < 1) take = 1;
        left -= take;
        bounds[k] = left;
    }
    bounds[0] = 0;
    free(extra);
}

/* The checks --pp and --virtual-stages share; 0 or DT_STATUS_USAGE. */
static dt_status_t check_pp(const dt_plan_model *m, int pipeline, int pp, int V) {
    int L = m->n_layer;
    if (pp < 1) return dt_error(DT_STATUS_USAGE, "{pp}: expected stages >= 1, found %d", pp);
    if (V < 1) return dt_error(DT_STATUS_USAGE, "{virtual_stages}: expected >= 1, found %d", V);
    if (!pipeline)
        return dt_error(DT_STATUS_USAGE, "{pp} %d: the %s model has no pipeline stages (only gpt and llama do)", pp,
                        m->type);
    if (V > 1 && pp < 2)
        return dt_error(DT_STATUS_USAGE, "{virtual_stages} %d: needs {pp} 2 or more", V);
    if (pp * V > L || pp * V > DT_PLAN_MAX_CHUNKS)
        return dt_error(DT_STATUS_USAGE,
                        "{virtual_stages} %d: {pp} %d x %d chunks exceed the %d layers (or %d chunks in all)", V,
                        pp, V, L, DT_PLAN_MAX_CHUNKS);
    return DT_STATUS_OK;
}

static void free_stages(dt_plan_model *m) {
    for (int k = 0; m->stages && k < m->pp_size; k++) free(m->stages[k].unit_numel);
    free(m->stages);
    m->stages = NULL;
}

dt_status_t dt_plan_model_set_pp(dt_plan_model *m, int pp, int V, int partition) {
    int L = m->n_layer;
    DT_CHECK(check_pp(m, !m->feature_rows && m->size_block > 0, pp, V));
    int n = pp * V;
    free_stages(m);
    m->pp_size = pp;
    m->pp_virtual = V;
    m->pp_partition = partition;
    if (pp == 1 && V == 1) return DT_STATUS_OK;

    /* the whole model's pieces (plan.h: sized models in stages) */
    int tp = m->tp_size > 1 ? m->tp_size : 1;
    double C = m->n_embd, T = m->seq_len, VC = (double)m->vocab_padded * C;
    double block = m->size_block, cut = m->size_block_cut;
    double rest = fmax(0, m->n_params_global - L * block);
    double vocab = fmin(rest, (m->tied ? 1 : 2) * VC); /* rows TP cuts: embedding, untied head */
    double emb_cut = fmin(vocab, VC), head_cut = vocab - emb_cut;
    double uncut = rest - vocab; /* positions and the final norm */
    double last_uncut = fmin(uncut, m->norm_stats * C), first_uncut = uncut - last_uncut;
    double first = emb_cut + first_uncut, last = head_cut + last_uncut;
    double block_tp = block - cut + cut / tp;
    double first_tp = emb_cut / tp + first_uncut, last_tp = head_cut / tp + last_uncut;
    /* FLOPs per token: 6 per parameter and the attention's 12·C·T per block; a tied
     * head's 6·V·C move from the embedding to the last chunk */
    double block_fl = 6 * block + 12 * C * T;
    double tied_fl = m->tied ? 6 * emb_cut : 0;
    double first_fl = 6 * first - tied_fl, last_fl = 6 * last + tied_fl;

    int *bounds = dt_xcalloc((size_t)n + 1, sizeof *bounds);
    if (partition == 1) partition_sized(L, n, block, first, last, bounds);
    else if (partition == 2) partition_sized(L, n, block_fl, first_fl, last_fl, bounds);
    else partition_sized(L, n, 1, 0, 0, bounds);
    m->stages = dt_xcalloc((size_t)pp, sizeof *m->stages);
    for (int k = 0; k < n; k++) {
        dt_plan_stage *st = &m->stages[k % pp];
        int nb = bounds[k + 1] - bounds[k];
        st->chunk_l0[st->n_chunks] = bounds[k];
        st->chunk_l1[st->n_chunks] = bounds[k + 1];
        st->n_chunks++;
        st->blocks += nb;
        if (nb > st->arena_blocks) st->arena_blocks = nb;
        st->n_params += nb * block_tp;
        st->n_units += nb;
        if (nb > 0) st->largest_unit = fmax(st->largest_unit, block_tp);
        double fl = nb * block_fl;
        if (k == 0) {
            st->first = 1;
            st->n_params += first_tp;
            st->n_units++;
            st->largest_unit = fmax(st->largest_unit, first_tp);
            fl += first_fl;
        }
        if (k == n - 1) {
            st->last = 1;
            st->n_params += last_tp;
            st->n_units++;
            st->largest_unit = fmax(st->largest_unit, last_tp);
            fl += last_fl;
            if (m->tied && pp > 1) st->tied_copy = emb_cut / tp;
        }
        st->flops_per_token += fl;
        st->chunk_flops_max = fmax(st->chunk_flops_max, fl);
    }
    free(bounds);
    return DT_STATUS_OK;
}

dt_status_t dt_plan_model_set_pp_layout(dt_plan_model *m, const dt_model_spec *spec, int tp, int sp, int pp,
                                        int V, int partition) {
    DT_CHECK(check_pp(m, spec->ops->pipeline, pp, V));
    free_stages(m);
    m->pp_size = pp;
    m->pp_virtual = V;
    m->pp_partition = partition;
    if (pp == 1 && V == 1) return DT_STATUS_OK;
    int n = pp * V;
    dt_model_layout g, piece;
    DT_CHECK(dt_model_layout_init(spec, &g));
    dt_status_t st = dt_model_layout_init_tp(spec, tp, 0, sp, &piece);
    if (st != DT_STATUS_OK) goto out_free_global;
    int *bounds = dt_xcalloc((size_t)n + 1, sizeof *bounds);
    st = dt_model_pp_partition(&g, pp, V, (dt_pp_partition_t)partition, bounds);
    if (st != DT_STATUS_OK) {
        st = dt_error_prefix(DT_STATUS_USAGE, "{pp} %d {virtual_stages} %d", pp, V);
        goto out_free_bounds;
    }
    m->stages = dt_xcalloc((size_t)pp, sizeof *m->stages);
    for (int s = 0; s < pp; s++) {
        dt_model_layout l;
        st = dt_model_layout_init_stage(spec, tp, 0, sp, pp, s, V, bounds, &l);
        if (st != DT_STATUS_OK) {
            st = dt_error_prefix(DT_STATUS_USAGE, "{pp} %d: stage %d", pp, s);
            goto out_free_bounds;
        }
        dt_plan_stage *ps = &m->stages[s];
        ps->n_params = (double)l.n_params;
        ps->first = dt_model_has_first(&l);
        ps->last = dt_model_has_last(&l);
        ps->arena_blocks = dt_model_max_chunk_blocks(&l);
        /* the tied head's copy: the embedding's rows of this TP rank (tensor 0) */
        ps->tied_copy = l.has_tied_copy ? (double)piece.tensors[0].numel : 0;
        ps->n_units = l.n_units;
        ps->unit_numel = dt_xcalloc((size_t)l.n_units, sizeof *ps->unit_numel);
        for (int u = 0; u < l.n_units; u++) {
            ps->unit_numel[u] = (double)l.units[u].numel;
            ps->largest_unit = fmax(ps->largest_unit, ps->unit_numel[u]);
        }
        dt_model_layout_free(&l);
        for (int j = 0; j < V; j++) {
            int k = j * pp + s;
            double params, flops;
            dt_model_pp_chunk_cost(&g, bounds, k, &params, &flops);
            ps->chunk_l0[j] = bounds[k];
            ps->chunk_l1[j] = bounds[k + 1];
            ps->blocks += bounds[k + 1] - bounds[k];
            ps->flops_per_token += flops;
            ps->chunk_flops_max = fmax(ps->chunk_flops_max, flops);
        }
        ps->n_chunks = V;
    }
out_free_bounds:
    free(bounds);
    dt_model_layout_free(&piece);
out_free_global:
    dt_model_layout_free(&g);
    if (st != DT_STATUS_OK) free_stages(m);
    return st;
}

void dt_plan_stage_view(const dt_plan_model *m, int k, dt_plan_model *v) {
    const dt_plan_stage *st = &m->stages[k];
    *v = *m;
    v->stages = NULL;
    v->pp_size = 1;
    v->pp_virtual = 1;
    v->unit_numel = st->unit_numel;
    v->n_params = st->n_params;
    v->n_layer = st->arena_blocks;
    v->pp_blocks = st->blocks;
    v->pp_no_first = !st->first;
    v->pp_no_head = !st->last;
    v->largest_unit = st->largest_unit;
    v->n_units = st->n_units;
    v->flops_per_token = st->flops_per_token;
}

/* ---- the pipeline row -------------------------------------------------------------- */

/* The node of pipeline rank s (TP rank 0, DP rank 0: the layout's rank s x the PP
 * stride), or 0 on one node. */
static int node_of(int s, const dt_layout *l, int g, int nodes) {
    return nodes > 1 && g > 0 ? s * l->stride[DT_LAYOUT_PP] / g : 0;
}

dt_status_t dt_plan_row_compute_pp(const dt_plan_input *in, dt_strategy_t strat, int n_gpus,
                                   dt_plan_row *out, dt_plan_row *stage_rows) {
    const dt_plan_model *m = &in->model;
    int P = m->pp_size, V = m->pp_virtual, M = in->accum;
    int tp = m->tp_size > 1 ? m->tp_size : 1;
    dt_pp_schedule_t kind = (dt_pp_schedule_t)in->pp_schedule;
    memset(out, 0, sizeof *out);
    if (!m->stages) return dt_error(DT_STATUS_USAGE, "{pp} %d: the model was not cut into stages", P);
    char msg[256];
    if (dt_pp_schedule_check(kind, P, V, M, msg, sizeof msg))
        return dt_error(DT_STATUS_USAGE, "{pp} %d {schedule} %s {virtual_stages} %d {accum} %d: %s", P,
                        dt_pp_schedule_name(kind), V, M, msg);
    int cb = in->precision == DT_PLAN_PRECISION_BF16 ? 2 : 4;
    dt_plan_row *rows = dt_xcalloc((size_t)P, sizeof *rows);
    dt_status_t st = DT_STATUS_OK;

    /* memory: each stage's states, arenas x one arena, its tied copy; the job fits
     * (without or with recompute) when every stage does */
    int all_yes = 1, all_ckpt = 1;
    for (int k = 0; k < P; k++) {
        dt_plan_model view;
        dt_plan_stage_view(m, k, &view);
        st = dt_plan_row_stage(in, &view, strat, n_gpus, P, -1, &rows[k]);
        if (st != DT_STATUS_OK) goto out_free_rows;
        dt_plan_row *r = &rows[k];
        r->arenas = dt_pp_arenas(kind, P, V, M, k);
        r->acts *= r->arenas;
        r->acts_ckpt *= r->arenas;
        double copy = m->stages[k].tied_copy * cb; /* param + grad, no optimizer state */
        r->params += copy;
        r->grads += copy;
        double states = r->params + r->grads + r->optim;
        r->total = states + r->acts + r->comm_buf;
        r->total_ckpt = states + r->acts_ckpt + r->comm_buf;
        /* the stage row chose its policy for one arena: with the schedule's arenas
         * selective may not fit where full does */
        if (!view.feature_rows && r->ckpt_policy == DT_MODEL_RECOMPUTE_SELECTIVE && r->total_ckpt > r->usable) {
            r->ckpt_policy = DT_MODEL_RECOMPUTE_FULL;
            r->acts_ckpt = r->arenas * dt_plan_input_activation_bytes(in, &view, DT_MODEL_RECOMPUTE_FULL);
            r->total_ckpt = states + r->acts_ckpt + r->comm_buf;
        }
        all_yes &= r->total <= r->usable;
        all_ckpt &= r->total_ckpt <= r->usable;
    }
    dt_plan_fit_t fit = all_yes ? DT_PLAN_FIT_YES : all_ckpt ? DT_PLAN_FIT_CKPT : DT_PLAN_FIT_NO;
    int ckpt = fit == DT_PLAN_FIT_CKPT;

    /* time: each stage's per-micro-batch compute and TP collectives at the job's
     * recompute; its DP collectives as its own row prices them */
    double rate = in->peak_flops * in->mfu;
    double tokens_mb = (double)in->micro_batch * dt_plan_model_rows(m); /* a CP rank's rows */
    double t_max = 0, c_max = 0, tp_max = 0, chunk_max = 0, dp_exposed = 0, dp_comm = 0, dp_coll = 0;
    dt_plan_row ring = {0}; /* the slowest stage's CP ring */
    int worst = 0, slowest = 0;
    for (int k = 0; k < P; k++) {
        dt_plan_model view;
        dt_plan_stage_view(m, k, &view);
        dt_plan_row t;
        st = dt_plan_row_stage(in, &view, strat, n_gpus, P, ckpt, &t);
        if (st != DT_STATUS_OK) goto out_free_rows;
        /* its policy's cost over all its blocks (view.n_layer: one chunk's, the arena's) */
        dt_plan_model all = view;
        all.n_layer = m->stages[k].blocks;
        double rec = ckpt ? dt_plan_recompute_factor(&all, rows[k].ckpt_policy) : 1.0;
        double c = m->stages[k].flops_per_token * tokens_mb / tp / rate * rec;
        /* its TP collectives and CP ring's exposed part, both per micro-batch on its path */
        double tpc = (t.tp_comm_s + t.cp_exposed_s) / M;
        double chunk = m->stages[k].chunk_flops_max * tokens_mb / tp / rate * rec + tpc / m->stages[k].n_chunks;
        if (c + tpc > t_max) t_max = c + tpc, c_max = c, tp_max = t.tp_comm_s / M, slowest = k, ring = t;
        chunk_max = fmax(chunk_max, chunk);
        dp_exposed = fmax(dp_exposed, t.exposed_s - t.tp_comm_s - t.cp_exposed_s);
        dp_comm = fmax(dp_comm, t.comm_s - t.tp_comm_s - t.cp_s);
        dp_coll = fmax(dp_coll, t.n_collectives);
        rows[k].compute_s = M * c;
        rows[k].tp_comm_s = t.tp_comm_s;
        rows[k].exposed_s = t.exposed_s;
        rows[k].comm_s = t.comm_s;
        rows[k].fit = rows[k].total <= rows[k].usable        ? DT_PLAN_FIT_YES
                      : rows[k].total_ckpt <= rows[k].usable ? DT_PLAN_FIT_CKPT
                                                             : DT_PLAN_FIT_NO;
        if ((ckpt ? rows[k].total_ckpt : rows[k].total) > (ckpt ? rows[worst].total_ckpt : rows[worst].total))
            worst = k;
    }

    /* the pipeline: (m + P - 1) slots of the slowest stage's micro-batch, or
     * (V m + P - 1) of the slowest chunk interleaved */
    double pipe = kind == DT_PP_INTERLEAVED ? (V * (double)M + P - 1) * chunk_max : (M + P - 1.0) * t_max;
    *out = rows[worst];
    out->strategy = strat;
    out->fit = fit;
    out->pp = P;
    out->virtual_stages = V;
    out->schedule = kind;
    out->partition = m->pp_partition;
    out->worst_stage = worst;
    out->slowest_stage = slowest;
    out->compute_s = M * c_max;
    out->tp_comm_s = M * tp_max;
    out->cp = ring.cp > 1 ? ring.cp : 1;
    out->cp_bytes = ring.cp_bytes;
    out->cp_s = ring.cp_s;
    out->cp_exposed_s = ring.cp_exposed_s;
    out->cp_inter = ring.cp_inter;
    out->bubble_s = fmax(0, pipe - M * t_max);
    out->bubble_ideal = dt_pp_bubble_ideal(kind, P, V, M);

    /* point to point: per micro-batch, each chunk boundary carries the activation
     * forward and its gradient back, B·T·C (/ TP with sequence parallelism) each */
    double S = tokens_mb * m->n_embd * cb / (m->sequence_parallel ? tp : 1);
    int g = in->gpus_per_node, nodes = rows[0].n_nodes;
    dt_layout_dims dims = dt_layout_dims_of(tp, m->cp_size > 1 ? m->cp_size : 1, P);
    dt_layout lay;
    (void)dt_layout_of(&dims, n_gpus, 0, &lay); /* the stages' rows checked that it divides */
    double exposed_p2p = 0, most_bytes = 0, most_s = 0;
    for (int k = 0; k + 1 < P * V; k++) { /* one message per boundary per step exposed */
        int a = k % P, b = (k + 1) % P;
        const dt_plan_link *ln = node_of(a, &lay, g, nodes) != node_of(b, &lay, g, nodes) ? &in->inter : &in->intra;
        if (ln == &in->inter) out->p2p_inter = 1;
        exposed_p2p += S / (ln->gbps * 1e9) + ln->alpha_us * 1e-6;
    }
    for (int s = 0; s < P; s++) { /* what rank s sends: forward unless last, backward unless first */
        double sends_s = 0, sends = 0;
        for (int j = 0; j < V; j++) {
            int k = j * P + s;
            if (k + 1 < P * V) {
                const dt_plan_link *ln = node_of(s, &lay, g, nodes) != node_of((s + 1) % P, &lay, g, nodes)
                                             ? &in->inter : &in->intra;
                sends += M, sends_s += M * (S / (ln->gbps * 1e9) + ln->alpha_us * 1e-6);
            }
            if (k > 0) {
                const dt_plan_link *ln = node_of(s, &lay, g, nodes) != node_of((s + P - 1) % P, &lay, g, nodes)
                                             ? &in->inter : &in->intra;
                sends += M, sends_s += M * (S / (ln->gbps * 1e9) + ln->alpha_us * 1e-6);
            }
        }
        most_bytes = fmax(most_bytes, sends * S);
        most_s = fmax(most_s, sends_s);
    }
    out->p2p_bytes = most_bytes;
    out->p2p_s = most_s;
    out->p2p_exposed_s = fmin(exposed_p2p, most_s);

    out->comm_s = dp_comm + out->tp_comm_s + out->cp_s + out->p2p_s;
    out->exposed_s = dp_exposed + out->tp_comm_s + out->cp_exposed_s + out->p2p_exposed_s;
    out->overlapped_s = out->comm_s - out->exposed_s;
    out->n_collectives = dp_coll; /* the busiest stage's DP and TP collectives */
    out->step_s = out->compute_s + out->bubble_s + out->exposed_s;
    double tokens_gpu = tokens_mb * M;
    /* ideal: the whole model's FLOPs over the TP x PP GPUs of one replica */
    double fpt = 0;
    for (int k = 0; k < P; k++) fpt += m->stages[k].flops_per_token;
    double ideal = fpt * tokens_gpu / (tp * P) / rate;
    out->efficiency = out->step_s > 0 ? ideal / out->step_s : 0;
    out->tokens_per_s = out->step_s > 0 ? out->dp * out->cp * tokens_gpu / out->step_s : 0;
    dt_plan_cost(in->hours_1gpu, n_gpus, in->price, out->efficiency, &out->hours, &out->cost);
    if (stage_rows) memcpy(stage_rows, rows, (size_t)P * sizeof *rows);
out_free_rows:
    free(rows);
    return st;
}
