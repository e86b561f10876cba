/*
 * mem_check.c - the memory a rank of a config needs, by plan's arithmetic, against
 * what it can get, and the cheapest change that fits (mem_check.h).
 *
 * Every candidate (strategy x recomputation policy x micro-batch, and optimizer
 * offload on a GPU) is one dt_plan_row_compute: its memory is the row's total under
 * the candidate's policy, its cost plan's step time with the policy's recompute
 * factor. The cheapest candidate that fits is the one with the shortest step (ties
 * within 1%: the fewest changed keys); offload, whose time plan does not price,
 * only when nothing else fits.
 */
#include "runtime/tools/mem_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gpuinfo.h"            /* defines: dt_gpu_spec_find */
#include "runtime/layout/pp_sched.h" /* defines: dt_pp_schedule_check */
#include "runtime/layout/strategy.h" /* defines: dt_strategy_composes, the strategy table */
#include "runtime/tools/plan.h"
#include "runtime/tools/plan_sweep.h" /* defines: dt_plan_sweep_model, dt_plan_lora_row */

typedef struct cand {
    dt_strategy_t strategy;
    int policy;   /* dt_model_recompute_t */
    int micro, accum;
    int offload;
    /* priced */
    double need, step_s;
    dt_plan_row row;
} cand;

static void fmt_bytes(double b, char *buf, size_t len) {
    if (b >= 1e9) snprintf(buf, len, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(buf, len, "%.2f MB", b / 1e6);
    else if (b >= 1e3) snprintf(buf, len, "%.1f kB", b / 1e3);
    else snprintf(buf, len, "%.0f B", b);
}

/* plan's input for the config: the model at its TP size (rank 0's piece) cut into
 * its pipeline (the sweep's dt_plan_sweep_model, as `dtrun plan CONFIG` cuts it), at
 * its CP size,
 * its batch, precision and buckets, this node's ranks. */
static dt_status_t plan_input(const dt_mem_check_in *in, int bf16, dt_plan_input *pi) {
    const dt_config_t *cfg = in->cfg;
    dt_plan_input_defaults(pi);
    int tp = cfg->tp.size > 1 ? (int)cfg->tp.size : 1, pp = cfg->pp.stages > 1 ? (int)cfg->pp.stages : 1;
    dt_plan_sweep_axes ax = {.sp = cfg->tp.sequence_parallel, .partition = cfg->pp.partition};
    dt_plan_sweep sw = {.ax = &ax, .spec = in->spec};
    dt_plan_pp_layout pl = {pp, (int)cfg->pp.virtual_stages, cfg->pp.schedule};
    DT_CHECK(dt_plan_sweep_model(&sw, tp, &pl, &pi->model));
    pi->model.recompute_every = (int)cfg->recompute.every;
    /* context parallelism: a rank's rows of every sequence, its ring (plan.h) */
    dt_status_t st = dt_plan_model_set_cp(&pi->model, cfg->cp.size > 1 ? (int)cfg->cp.size : 1);
    pi->model.cp_ulysses = cfg->cp.mode == DT_CONFIG_CP_ULYSSES;
    if (st != DT_STATUS_OK) {
        dt_plan_model_free(&pi->model);
        return st;
    }
    pi->pp_schedule = cfg->pp.schedule;
    pi->micro_batch = (int)cfg->train_micro_batch_size_per_gpu;
    pi->accum = (int)cfg->gradient_accumulation_steps;
    pi->precision = bf16 ? DT_PLAN_PRECISION_BF16 : DT_PLAN_PRECISION_FP32;
    pi->comm_bytes = bf16 ? 2 : 4; /* as `dtrun plan CONFIG` reads it */
    if (in->gpu) pi->comm_bytes = cfg->communication_data_type == DT_CONFIG_DTYPE_BF16 ? 2 : 4;
    pi->gpu_attention = in->gpu;
    pi->gpu_attention_fused = in->gpu_attention_fused;
    pi->cpu_threads = in->cpu_threads > 0 ? in->cpu_threads : 1;
    pi->bucket_elems = (double)cfg->zero.reduce_bucket_size;
    pi->gpus_per_node = in->local_world_size;
    /* the time only ranks the candidates: the device's peak and its usual link */
    pi->peak_flops = in->peak_flops > 0 ? in->peak_flops : 1e12;
    const dt_gpu_spec *g = in->gpu ? dt_gpu_spec_by_device_name(in->device_name) : dt_gpu_spec_find("cpu");
    const dt_plan_link *li = g && g->intra_link ? dt_plan_link_find(g->intra_link) : NULL;
    if (li) pi->intra = *li;
    return DT_STATUS_OK;
}

/* c's memory and step time. The memory budget selects which policy plan's
 * total_ckpt is for (selective when it fits the budget, else full): the candidate's. */
static dt_status_t price(const dt_plan_input *base, const dt_plan_lora *lora, int n, cand *c) {
    dt_plan_input pi = *base;
    pi.micro_batch = c->micro;
    pi.accum = c->accum;
    pi.mem_bytes = c->policy == DT_MODEL_RECOMPUTE_FULL ? 0 : 1e30;
    pi.mem_shared = 0;
    DT_CHECK(dt_plan_row_compute(&pi, c->strategy, n, &c->row));
    if (lora) DT_CHECK(dt_plan_lora_row(&pi, lora, &c->row)); /* the adapters trained, the base frozen */
    dt_plan_row *r = &c->row;
    if (c->policy == DT_MODEL_RECOMPUTE_NONE) r->acts_ckpt = r->acts;
    c->need = c->policy == DT_MODEL_RECOMPUTE_NONE ? r->total : r->total_ckpt;
    if (c->offload) { /* the fp32 master and Adam moments move to host memory */
        c->need -= r->optim;
        r->optim = 0;
    }
    c->step_s = r->step_s + r->compute_s * (dt_plan_recompute_factor(&pi.model, c->policy) - 1.0);
    return DT_STATUS_OK;
}

static int changes(const cand *c, const cand *cfg) {
    return (c->strategy != cfg->strategy) + (c->policy != cfg->policy) + (c->micro != cfg->micro) +
           (c->offload != cfg->offload);
}

/* The overrides that turn the config into c ("" for the config itself). */
static void overrides(const cand *c, const cand *cfg, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = '\0';
#define ADD(...)                                                                 \
    do {                                                                         \
        if (n < len) n += (size_t)snprintf(buf + n, len - n, __VA_ARGS__);       \
    } while (0)
    if (c->strategy != cfg->strategy) ADD("%sstrategy=%s", n ? " " : "", dt_strategy_name(c->strategy));
    if (c->policy != cfg->policy)
        ADD("%sactivation_checkpointing.policy=%s", n ? " " : "",
            dt_model_recompute_name((dt_model_recompute_t)c->policy));
    if (c->micro != cfg->micro)
        ADD("%strain_micro_batch_size_per_gpu=%d gradient_accumulation_steps=%d", n ? " " : "", c->micro, c->accum);
    if (c->offload != cfg->offload) ADD("%szero_optimization.offload_optimizer.device=cpu", n ? " " : "");
#undef ADD
}

/* The biggest of the row's parts, and its name. */
static const char *biggest(const dt_plan_row *r, double *bytes) {
    static const char *names[] = {"parameters", "gradients", "optimizer state", "activations",
                                  "communication buffers"};
    double v[] = {r->params, r->grads, r->optim, r->acts_ckpt, r->comm_buf};
    int k = 0;
    for (int i = 1; i < 5; i++)
        if (v[i] > v[k]) k = i;
    *bytes = v[k];
    return names[k];
}

/* The config's LoRA (the trainer's rules, train_lora.c: the base int8 or the compute
 * dtype) priced by plan's LoRA arithmetic. */
static dt_status_t lora_of(const dt_config_t *cfg, const dt_model_spec *spec, dt_dtype_t compute, dt_plan_lora *out) {
    dt_lora_spec ls;
    memset(&ls, 0, sizeof ls);
    ls.r = (int)cfg->lora.r;
    ls.alpha = cfg->lora.alpha;
    ls.base = cfg->lora.base_dtype == DT_CONFIG_LORA_BASE_INT8 ? DT_LORA_BASE_INT8 : DT_LORA_BASE_COMPUTE;
    DT_CHECK(dt_lora_parse_targets(&ls, cfg->lora.target_modules));
    return dt_plan_lora_compute(spec, &ls, compute, out);
}

dt_status_t dt_mem_check(const dt_mem_check_in *in, dt_mem_check_out *out) {
    memset(out, 0, sizeof *out);
    const dt_config_t *cfg = in->cfg;
    int bf16 = dt_config_compute_dtype(cfg, in->gpu) == DT_DTYPE_BF16;
    dt_plan_input base;
    DT_CHECK(plan_input(in, bf16, &base));
    dt_plan_lora lora_plan, *lora = NULL;
    if (cfg->lora.r > 0) { /* a LoRA run: the trained buffer is the adapters' */
        dt_status_t lst = lora_of(cfg, in->spec, bf16 ? DT_DTYPE_BF16 : DT_DTYPE_F32, &lora_plan);
        if (lst != DT_STATUS_OK) {
            dt_plan_model_free(&base.model);
            return lst;
        }
        lora = &lora_plan;
    }
    int n = in->world_size, sharers = in->gpu ? in->gpu_sharers : in->local_world_size;
    out->usable = in->avail_bytes * (1.0 - base.reserve) / (sharers > 0 ? sharers : 1);
    cand mine = {.strategy = cfg->strategy, .policy = cfg->recompute.policy,
                 .micro = base.micro_batch, .accum = base.accum,
                 .offload = in->gpu && cfg->zero.offload_optimizer.device == DT_CONFIG_OFFLOAD_CPU};
    dt_status_t st = price(&base, lora, n, &mine);
    if (st != DT_STATUS_OK) goto out_free_model;
    out->checked = 1;
    out->need = mine.need;
    out->fits = mine.need <= out->usable;
    if (out->fits) goto out_free_model;

    /* the candidates: every strategy the layout allows x policy x micro-batch dividing
     * the config's (the global batch kept), then each with offload on a GPU */
    cand best = {0};
    int found = 0;
    for (int pass = 0; pass < 2 && !found; pass++) {
        if (pass == 1 && (!in->gpu || mine.offload)) break;
        for (dt_strategy_t s = 0; s < DT_STRATEGY_COUNT; s++) {
            /* a strategy the layout's dims allow (the strategy table); one sharding
             * over a node's ranks is the config's choice of shape, never a suggestion */
            if ((cfg->tp.size > 1 && !dt_strategy_composes(s, DT_LAYOUT_TP)) ||
                (cfg->cp.size > 1 && !dt_strategy_composes(s, DT_LAYOUT_CP)) ||
                (cfg->pp.stages > 1 && !dt_strategy_composes(s, DT_LAYOUT_PP)))
                continue;
            if (dt_strategy_get(s)->over == DT_STRATEGY_OVER_NODE && mine.strategy != s) continue;
            for (int p = DT_MODEL_RECOMPUTE_NONE; p <= DT_MODEL_RECOMPUTE_FULL; p++) {
                if (base.model.feature_rows && p != mine.policy) continue; /* no checkpointing */
                for (int b = mine.micro; b >= 1; b--) {
                    if (mine.micro % b) continue;
                    cand c = {.strategy = s, .policy = p, .micro = b, .accum = mine.accum * (mine.micro / b),
                              .offload = pass == 1};
                    char why[256];
                    if (cfg->pp.stages > 1 && dt_pp_schedule_check(cfg->pp.schedule, (int)cfg->pp.stages,
                                                                   (int)cfg->pp.virtual_stages, c.accum, why,
                                                                   sizeof why))
                        continue;
                    if (price(&base, lora, n, &c) != DT_STATUS_OK) continue;
                    if (c.need > out->usable) continue;
                    int better = !found || c.step_s < best.step_s * 0.99 ||
                                 (c.step_s <= best.step_s * 1.01 && changes(&c, &mine) < changes(&best, &mine));
                    if (better) best = c, found = 1;
                }
            }
        }
    }

    char need_s[32], usable_s[32], avail_s[32], short_s[32], part_s[5][32], big_s[32];
    fmt_bytes(mine.need, need_s, sizeof need_s);
    fmt_bytes(out->usable, usable_s, sizeof usable_s);
    fmt_bytes(in->avail_bytes, avail_s, sizeof avail_s);
    fmt_bytes(mine.need - out->usable, short_s, sizeof short_s);
    const dt_plan_row *r = &mine.row;
    double parts[5] = {r->params, r->grads, r->optim, r->acts_ckpt, r->comm_buf}, big;
    for (int i = 0; i < 5; i++) fmt_bytes(parts[i], part_s[i], sizeof part_s[i]);
    const char *big_name = biggest(r, &big);
    fmt_bytes(big, big_s, sizeof big_s);
    char shared[96] = "";
    if (sharers > 1) snprintf(shared, sizeof shared, ", shared by %d ranks", sharers);
    const char *unit = in->gpu ? "GPU" : "rank";
    /* lines under 240 characters: the failure summary shows the last 8 of stderr */
    int len = snprintf(out->message, sizeof out->message,
                       "not enough memory: the run needs %s per %s but %s is usable (%s %s less plan's %.0f%% "
                       "reserve%s): short by %s\n"
                       "  dtrun plan's bytes per %s: parameters %s, gradients %s, optimizer state %s, activations %s, "
                       "communication buffers %s; the biggest consumer is the %s (%s)\n",
                       need_s, unit, usable_s, avail_s, in->avail_what ? in->avail_what : "available",
                       100 * base.reserve, shared, short_s, unit, part_s[0], part_s[1], part_s[2], part_s[3],
                       part_s[4], big_name, big_s);
    if (len < 0 || (size_t)len >= sizeof out->message) goto out_free_model;
    if (found) {
        char fit_s[32];
        fmt_bytes(best.need, fit_s, sizeof fit_s);
        overrides(&best, &mine, out->suggestion, sizeof out->suggestion);
        snprintf(out->message + len, sizeof out->message - (size_t)len,
                 "  the cheapest change that fits: %s: %s per %s%s (see dtrun plan CONFIG %s)\n"
                 "  DTRUN_SKIP_MEMORY_CHECK=1 skips this check",
                 out->suggestion, fit_s, unit, best.offload ? " (plan does not price offload's time)" : "",
                 out->suggestion);
    } else {
        snprintf(out->message + len, sizeof out->message - (size_t)len,
                 "  no change of strategy, activation_checkpointing.policy, micro-batch%s fits: use more %ss "
                 "(dtrun plan CONFIG --gpus N)\n  DTRUN_SKIP_MEMORY_CHECK=1 skips this check",
                 in->gpu ? " or optimizer offload" : "", unit);
    }
out_free_model:
    if (lora) dt_plan_lora_free(lora);
    dt_plan_model_free(&base.model);
    return st;
}

