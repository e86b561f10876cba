/*
 * plan_sweep.c - `dtrun plan`'s sweep (plan_sweep.h): the TP sizes and their
 * models, the pipeline layouts (auto: every power of two dividing the layers, under
 * 1f1b and interleaved), a config's batch at each GPU count, the rows of every
 * strategy x TP x layout x count, the recommendation and the cheapest pipeline's
 * stages. One row is plan.c's dt_plan_row_compute; a stage's cut is plan_pp.c's.
 */
#include "runtime/tools/plan_sweep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mem.h"                /* defines: dt_xcalloc */
#include "kernels/kernels.h"           /* defines: dt_device_init */
#include "runtime/layout/layout.h"   /* defines: dt_layout_of */
#include "runtime/layout/pp_sched.h" /* defines: dt_pp_schedule_check, dt_pp_schedule_name */
#include "runtime/layout/strategy.h" /* defines: dt_strategy_composes */

double dt_plan_cpu_peak_flops(int threads) {
    dt_device_t *dev;
    if (dt_device_init(&dev, DT_DEVICE_CPU, threads) != DT_STATUS_OK) return 0;
    double p = dev->ops->peak_flops(dev);
    dt_device_free(dev);
    return p;
}

int dt_plan_sweep_cpu_threads(const dt_plan_sweep *sw, int n) {
    if (sw->cfg_threads > 0) return sw->cfg_threads;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return n == 1 && cores > 1 ? (int)cores : 1;
}

/* The model at TP size tp: rank 0's TP layout of the config's model, or the sized
 * model cut by dt_plan_model_set_tp. DT_STATUS_USAGE naming what does not divide
 * (the caller prefixes --tp). */
static dt_status_t tp_model(const dt_plan_sweep *sw, int tp, dt_plan_model *out) {
    char msg[512];
    if (sw->spec) {
        if (dt_model_tp_check(sw->spec, tp, msg, sizeof msg)) return dt_error(DT_STATUS_USAGE, "%s", msg);
        dt_model_layout l;
        DT_CHECK(dt_model_layout_init_tp(sw->spec, tp, 0, sw->ax->sp, &l));
        dt_status_t st = dt_plan_model_from_layout(&l, out);
        dt_model_layout_free(&l);
        /* the config's context_parallel.mode prices every CP row */
        out->cp_ulysses = sw->cfg && sw->cfg->cp.mode == DT_CONFIG_CP_ULYSSES;
        return st;
    }
    *out = sw->in.model;
    out->unit_numel = NULL; /* sized models have none; the copy must not share it */
    return dt_plan_model_set_tp(out, tp, sw->ax->sp);
}

/* The model of TP model base (one of tp_models) at layout pl. */
static dt_status_t pp_model(const dt_plan_sweep *sw, const dt_plan_model *base, const dt_plan_pp_layout *pl,
                            dt_plan_model *out) {
    *out = *base;
    out->unit_numel = NULL; /* the base's; a pipeline row reads its stages' units */
    out->stages = NULL;
    int part = sw->ax->partition >= 0 ? sw->ax->partition : DT_PP_PARTITION_UNIFORM;
    int tp = base->tp_size > 1 ? base->tp_size : 1;
    return sw->spec ? dt_plan_model_set_pp_layout(out, sw->spec, tp, sw->ax->sp, pl->pp, pl->virtual_stages, part)
                    : dt_plan_model_set_pp(out, pl->pp, pl->virtual_stages, part);
}

dt_status_t dt_plan_sweep_model(const dt_plan_sweep *sw, int tp, const dt_plan_pp_layout *pl, dt_plan_model *out) {
    dt_plan_model m;
    DT_CHECK(tp_model(sw, tp, &m));
    if (!pl || pl->pp <= 1) {
        *out = m;
        return DT_STATUS_OK;
    }
    dt_status_t st = pp_model(sw, &m, pl, out);
    dt_plan_model_free(&m);
    return st;
}

dt_status_t dt_plan_sweep_setup_tp(dt_plan_sweep *sw) {
    dt_plan_sweep_axes *ax = sw->ax;
    int g = sw->in.gpus_per_node;
    if (ax->tp_auto) {
        int most = 1;
        for (int i = 0; i < ax->n_counts; i++) most = ax->counts[i] > most ? ax->counts[i] : most;
        int top = g > 0 ? g : most;
        for (int t = 1; t <= top && ax->n_tps < DT_PLAN_SWEEP_MAX_TP; t *= 2) {
            if ((g > 0 && g % t) || (sw->in.model.feature_rows && t > 1)) continue;
            dt_plan_model m;
            if (tp_model(sw, t, &m) != DT_STATUS_OK) continue;
            dt_plan_model_free(&m);
            ax->tps[ax->n_tps++] = t;
        }
    }
    if (!ax->n_tps) { /* the config's tensor_parallel section, else 1 */
        ax->tps[ax->n_tps++] = sw->cfg ? (int)sw->cfg->tp.size : 1;
        if (sw->cfg && sw->cfg->tp.sequence_parallel) ax->sp = 1;
    }
    for (int k = 0; k < ax->n_tps; k++) {
        int t = ax->tps[k];
        for (int j = 0; j < k; j++)
            if (ax->tps[j] == t) return dt_error(DT_STATUS_USAGE, "{tp}: %d is listed twice", t);
        if (t > 1 && g > 0 && g % t)
            return dt_error(DT_STATUS_USAGE,
                            "{tp} %d: does not divide the %d GPUs per node (a TP group is consecutive GPUs "
                            "of one node; set {gpus_per_node} or {nodes} MxG)",
                            t, g);
        if (tp_model(sw, t, &sw->tp_models[k]) != DT_STATUS_OK) {
            char why[1024];
            snprintf(why, sizeof why, "%s", dt_error_detail()); /* dt_error overwrites it */
            return dt_error(DT_STATUS_USAGE, "{tp} %d: %s", t, why);
        }
        sw->n_tp_models = k + 1;
    }
    return DT_STATUS_OK;
}

/* Adds (P, V, schedule) to the layouts. */
static void add_layout(dt_plan_sweep_axes *ax, int P, int V, int sched) {
    if (ax->n_layouts < DT_PLAN_SWEEP_MAX_LAYOUTS) ax->layouts[ax->n_layouts++] = (dt_plan_pp_layout){P, V, sched};
}

dt_status_t dt_plan_sweep_setup_pp(dt_plan_sweep *sw) {
    dt_plan_sweep_axes *o = sw->ax;
    const dt_plan_model *m = &sw->in.model;
    int L = m->feature_rows ? 0 : m->n_layer;
    if (sw->cfg && sw->cfg->pp.stages > 1) { /* the config's pipeline section: the defaults */
        if (!o->n_pps && !o->pp_auto) o->pps[o->n_pps++] = (int)sw->cfg->pp.stages;
        if (o->schedule < 0) o->schedule = sw->cfg->pp.schedule;
        if (!o->virtual_stages) o->virtual_stages = (int)sw->cfg->pp.virtual_stages;
        if (o->partition < 0) o->partition = sw->cfg->pp.partition;
    }
    if (o->virtual_stages > 1 && o->schedule < 0) o->schedule = DT_PP_INTERLEAVED;
    if (o->pp_auto) /* powers of two dividing the layers; 1 always */
        for (int P = 1; P <= L && P <= DT_PLAN_MAX_CHUNKS && o->n_pps < DT_PLAN_SWEEP_MAX_LAYOUTS; P *= 2)
            if (L % P == 0) o->pps[o->n_pps++] = P;
    if (!o->n_pps) o->pps[o->n_pps++] = 1;
    o->n_layouts = 0;
    for (int j = 0; j < o->n_pps; j++) {
        int P = o->pps[j];
        if (P == 1 && !(o->schedule == DT_PP_INTERLEAVED && !o->pp_auto)) {
            add_layout(o, 1, 1, DT_PP_1F1B);
            continue;
        }
        int scheds[2] = {o->schedule >= 0 ? o->schedule : DT_PP_1F1B, DT_PP_INTERLEAVED};
        int n_sched = o->schedule < 0 && o->pp_auto ? 2 : 1;
        for (int q = 0; q < n_sched; q++) {
            int V = scheds[q] == DT_PP_INTERLEAVED ? (o->virtual_stages ? o->virtual_stages : 2)
                                                   : (o->virtual_stages ? o->virtual_stages : 1);
            dt_plan_pp_layout pl = {P, V, scheds[q]};
            dt_plan_model pm;
            int bad = pp_model(sw, &sw->tp_models[0], &pl, &pm) != DT_STATUS_OK;
            if (!bad) dt_plan_model_free(&pm);
            if (o->pp_auto) { /* a layout auto cannot cut is left out */
                if (!bad) add_layout(o, P, V, scheds[q]);
                continue;
            }
            if (bad) return DT_STATUS_USAGE; /* pp_model's message */
            /* a sized model's micro-batches are known now; a config's per GPU count */
            char msg[512];
            if (!sw->cfg && dt_pp_schedule_check(scheds[q], P, V, sw->in.accum, msg, sizeof msg))
                return dt_error(DT_STATUS_USAGE, "{pp} %d {schedule} %s {virtual_stages} %d {accum} %d: %s", P,
                                dt_pp_schedule_name(scheds[q]), V, sw->in.accum, msg);
            add_layout(o, P, V, scheds[q]);
        }
    }
    if (!o->n_layouts) add_layout(o, 1, 1, DT_PP_1F1B);
    /* the CP sizes: given, else the config's context_parallel section, else 1 */
    if (!o->n_cps) o->cps[o->n_cps++] = sw->cfg && sw->cfg->cp.size > 1 ? (int)sw->cfg->cp.size : 1;
    for (int k = 0; k < o->n_cps; k++) {
        for (int j = 0; j < k; j++)
            if (o->cps[j] == o->cps[k]) return dt_error(DT_STATUS_USAGE, "{cp}: %d is listed twice", o->cps[k]);
        dt_plan_model cm = *m;
        DT_CHECK(dt_plan_model_set_cp(&cm, o->cps[k]));
    }
    return DT_STATUS_OK;
}

dt_status_t dt_plan_sweep_row_input(dt_plan_sweep *sw, int n, int tp, int cp, int pp) {
    if (sw->in.mem_shared) { /* CPU ranks: threads and their measured peak */
        sw->in.cpu_threads = dt_plan_sweep_cpu_threads(sw, n);
        if (!sw->peak_given) sw->in.peak_flops = dt_plan_cpu_peak_flops(sw->in.cpu_threads);
    }
    if (sw->cfg) {
        /* this row's TP, CP sizes and pipeline: the batch divides over DP = n / (tp x cp
         * x pp); the plan checks the row's schedule itself, so the config resolves as
         * one stage of n / pp ranks */
        dt_config_t *cfg = sw->cfg;
        cfg->tp.size = tp;
        cfg->cp.size = cp > 1 ? cp : 1;
        cfg->pp.stages = 1;
        int w = n / pp;
        if (dt_config_resolve(cfg, w) != DT_STATUS_OK)
            return dt_error(DT_STATUS_CONFIG, "{gpus} %d: the config's batch sizes do not fit %d GPUs (%lld "
                            "data-parallel):", w, w, (long long)(w / (cfg->tp.size > 0 ? cfg->tp.size : 1) /
                                                                 cfg->cp.size));
        sw->in.accum = (int)cfg->gradient_accumulation_steps;
        sw->in.micro_batch = (int)cfg->train_micro_batch_size_per_gpu;
    }
    return DT_STATUS_OK;
}

dt_status_t dt_plan_sweep_rows(dt_plan_sweep *sw, int strategy, int k, int cp, const dt_plan_pp_layout *pl,
                               dt_plan_row *rows, int *r) {
    const dt_plan_sweep_axes *o = sw->ax;
    dt_plan_model pm;
    const dt_plan_model *mm = &sw->tp_models[k];
    char msg[512];
    dt_status_t st = DT_STATUS_OK;
    /* a strategy the trainer does not run with a model-parallel dim (the strategy table:
     * hsdp, whose shard group is a node's ranks, where TP groups and stages live): no row */
    if ((o->tps[k] > 1 && !dt_strategy_composes(strategy, DT_LAYOUT_TP)) ||
        (pl->pp > 1 && !dt_strategy_composes(strategy, DT_LAYOUT_PP)) ||
        (cp > 1 && !dt_strategy_composes(strategy, DT_LAYOUT_CP)) || (sw->lora && (o->tps[k] > 1 || cp > 1 || pl->pp > 1)))
        return DT_STATUS_OK;
    if (pl->pp > 1) {
        if (pp_model(sw, mm, pl, &pm) != DT_STATUS_OK) return o->pp_auto ? DT_STATUS_OK : DT_STATUS_USAGE;
        mm = &pm;
    }
    for (int i = 0; i < o->n_counts; i++) {
        dt_layout_dims dims = dt_layout_dims_of(o->tps[k], cp, pl->pp);
        dt_layout lay;
        if (dt_layout_of(&dims, o->counts[i], 0, &lay) != DT_STATUS_OK) continue; /* TP x CP x PP does not divide it */
        st = dt_plan_sweep_row_input(sw, o->counts[i], o->tps[k], cp, pl->pp);
        if (st != DT_STATUS_OK) break;
        if (pl->pp > 1 && o->pp_auto &&
            dt_pp_schedule_check(pl->schedule, pl->pp, pl->virtual_stages, sw->in.accum, msg, sizeof msg))
            continue; /* auto leaves out what the schedule cannot run */
        dt_plan_input in = sw->in;
        in.model = *mm;
        in.model.cp_size = cp; /* checked by setup_pp */
        in.pp_schedule = pl->schedule;
        st = dt_plan_row_compute(&in, strategy, o->counts[i], &rows[*r]);
        if (st == DT_STATUS_OK && sw->lora) st = dt_plan_lora_row(&in, sw->lora, &rows[*r]);
        (*r)++;
        if (st != DT_STATUS_OK) {
            st = DT_STATUS_USAGE; /* its message names the flag */
            break;
        }
    }
    if (mm == &pm) dt_plan_model_free(&pm);
    return st;
}

/* The cheapest row's stages (a pipeline) into sw->stages and sw->stage_rows. */
static dt_status_t cheapest_stages(dt_plan_sweep *sw, const dt_plan_row *row) {
    const dt_plan_sweep_axes *o = sw->ax;
    int k = 0;
    while (k < o->n_tps && o->tps[k] != row->tp) k++;
    dt_plan_pp_layout pl = {row->pp, row->virtual_stages, row->schedule};
    dt_plan_model pm;
    if (k == o->n_tps || pp_model(sw, &sw->tp_models[k], &pl, &pm) != DT_STATUS_OK) return DT_STATUS_OK;
    pm.cp_size = row->cp;
    dt_status_t st = dt_plan_sweep_row_input(sw, row->n_gpus, row->tp, row->cp, row->pp);
    if (st == DT_STATUS_OK) {
        dt_plan_input in = sw->in;
        in.model = pm;
        in.pp_schedule = pl.schedule;
        dt_plan_row again;
        if (dt_plan_row_compute_pp(&in, row->strategy, row->n_gpus, &again, sw->stage_rows) == DT_STATUS_OK) {
            sw->n_stages = row->pp;
            for (int s = 0; s < row->pp; s++) {
                sw->stages[s] = pm.stages[s];
                sw->stages[s].unit_numel = NULL; /* freed with pm */
            }
        }
    }
    dt_plan_model_free(&pm);
    return st;
}

dt_status_t dt_plan_sweep_all(dt_plan_sweep *sw, dt_plan_row **rows_out, int *n_out, dt_plan_choice *ch) {
    const dt_plan_sweep_axes *o = sw->ax;
    /* a row per (strategy, TP size, CP size, pipeline layout, GPU count) where TP x CP
     * x PP divides the count (and, under --pp auto, the schedule can run) */
    int n_rows = o->n_strategies * o->n_tps * o->n_cps * o->n_layouts * o->n_counts;
    dt_plan_row *rows = dt_xcalloc((size_t)n_rows, sizeof *rows);
    int r = 0;
    dt_status_t st = DT_STATUS_OK;
    *rows_out = rows;
    *n_out = 0;
    for (int s = 0; s < o->n_strategies; s++)
        for (int k = 0; k < o->n_tps; k++)
            for (int c = 0; c < o->n_cps; c++)
                for (int j = 0; j < o->n_layouts; j++) {
                    st = dt_plan_sweep_rows(sw, o->strategies[s], k, o->cps[c], &o->layouts[j], rows, &r);
                    if (st != DT_STATUS_OK) return st;
                }
    *n_out = n_rows = r;
    if (!n_rows)
        return dt_error(DT_STATUS_USAGE, "{tp}/{cp}/{pp}: no GPU count of {gpus} is a multiple of a TP x CP x PP "
                        "size given (world = TP x CP x PP x DP)");
    /* the header shows the first row's batch */
    DT_CHECK(dt_plan_sweep_row_input(sw, rows[0].n_gpus, rows[0].tp, rows[0].cp, rows[0].pp));
    dt_plan_recommend(&sw->in, rows, n_rows, ch);
    if (ch->cheapest >= 0 && rows[ch->cheapest].pp > 1) st = cheapest_stages(sw, &rows[ch->cheapest]);
    return st;
}

dt_status_t dt_plan_sweep_row(dt_plan_sweep *sw, int strategy, int tp, int cp, int n, dt_plan_row *out) {
    int k = 0;
    while (k < sw->ax->n_tps && sw->ax->tps[k] != tp) k++;
    if (k == sw->ax->n_tps) return dt_error(DT_STATUS_USAGE, "TP size %d is not one of the plan's", tp);
    DT_CHECK(dt_plan_sweep_row_input(sw, n, tp, cp, 1));
    dt_plan_input in = sw->in;
    in.model = sw->tp_models[k];
    if (dt_plan_model_set_cp(&in.model, cp) != DT_STATUS_OK) return DT_STATUS_USAGE;
    if (dt_plan_row_compute(&in, strategy, n, out) != DT_STATUS_OK) return DT_STATUS_USAGE;
    if (sw->lora && dt_plan_lora_row(&in, sw->lora, out) != DT_STATUS_OK) return DT_STATUS_USAGE;
    return DT_STATUS_OK;
}

void dt_plan_sweep_free(dt_plan_sweep *sw) {
    for (int k = 0; k < sw->n_tp_models; k++) dt_plan_model_free(&sw->tp_models[k]);
    sw->n_tp_models = 0;
    dt_plan_model_free(&sw->in.model);
}
