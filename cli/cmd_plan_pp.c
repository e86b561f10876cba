/*
 * cmd_plan_pp.c - `dtrun plan`'s pipeline flags (cmd_plan.h): --pp LIST|auto,
 * --schedule, --virtual-stages, --partition; the pipeline layouts a plan searches
 * (auto: every power of two dividing the layers, under 1f1b and interleaved); the
 * model cut into stages at one layout (runtime/tools/plan_pp.c does the arithmetic).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/model/model.h"
#include "runtime/layout/pp_sched.h" /* defines: dt_pp_schedule_parse, dt_pp_schedule_check */
#include "runtime/tools/plan.h"

#include "cli/cmd_plan.h"

static int parse_int_range(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int cmd_plan_parse_pp_flag(const char *flag, const char *val, plan_opts *o) {
    if (!strcmp(flag, "--pp")) {
        o->n_pps = 0;
        o->pp_auto = !strcasecmp(val, "auto");
        if (o->pp_auto) return 0;
        char buf[256];
        if (strlen(val) >= sizeof buf) return cmd_plan_usage_error("--pp: the list is too long");
        snprintf(buf, sizeof buf, "%s", val);
        char *save = NULL;
        for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            int v;
            if (parse_int_range(t, 1, DT_PLAN_MAX_CHUNKS, &v))
                return cmd_plan_usage_error("--pp: expected pipeline stages from 1 to %d like 1,2,4 (or auto), "
                                            "found \"%s\"",
                                            DT_PLAN_MAX_CHUNKS, val);
            for (int j = 0; j < o->n_pps; j++)
                if (o->pps[j] == v) return cmd_plan_usage_error("--pp: %d is listed twice", v);
            if (o->n_pps == MAX_PP_LAYOUTS) return cmd_plan_usage_error("--pp: at most %d sizes", MAX_PP_LAYOUTS);
            o->pps[o->n_pps++] = v;
        }
        if (!o->n_pps) return cmd_plan_usage_error("--pp: expected a list of stage counts like 1,2,4 (or auto)");
        return 0;
    }
    if (!strcmp(flag, "--schedule")) {
        o->schedule = dt_pp_schedule_parse(val);
        if (o->schedule < 0)
            return cmd_plan_usage_error("--schedule: expected 1f1b, gpipe or interleaved, found \"%s\"", val);
        return 0;
    }
    if (!strcmp(flag, "--virtual-stages")) {
        if (parse_int_range(val, 1, DT_PLAN_MAX_CHUNKS, &o->virtual_stages))
            return cmd_plan_usage_error("--virtual-stages: expected chunks per rank from 1 to %d, found \"%s\"",
                                        DT_PLAN_MAX_CHUNKS, val);
        return 0;
    }
    if (!strcmp(flag, "--partition")) {
        dt_pp_partition_t k;
        if (dt_pp_partition_parse(val, &k))
            return cmd_plan_usage_error("--partition: expected uniform, parameters or flops, found \"%s\"", val);
        o->partition = (int)k;
        return 0;
    }
    return 1;
}

int cmd_plan_pp_model(const plan_opts *o, const plan_ctx *c, const dt_plan_model *base, const plan_pp_layout *pl,
                      dt_plan_model *out, char *msg, size_t len) {
    *out = *base;
    out->unit_numel = NULL; /* the base's; a pipeline row reads its stages' units */
    out->stages = NULL;
    int part = o->partition >= 0 ? o->partition : DT_PP_PARTITION_UNIFORM;
    int tp = base->tp_size > 1 ? base->tp_size : 1;
    dt_status_t st = c->have_spec ? dt_plan_model_set_pp_layout(out, &c->spec, tp, o->sp, pl->pp, pl->virtual_stages,
                                                                part)
                                  : dt_plan_model_set_pp(out, pl->pp, pl->virtual_stages, part);
    if (st != DT_STATUS_OK) {
        snprintf(msg, len, "%s", dt_error_detail());
        return 1;
    }
    return 0;
}

/* Adds (P, V, schedule) to the layouts. */
static void add_layout(plan_opts *o, int P, int V, int sched) {
    if (o->n_layouts < MAX_PP_LAYOUTS) o->layouts[o->n_layouts++] = (plan_pp_layout){P, V, sched};
}

int cmd_plan_setup_pp(plan_opts *o, plan_ctx *c) {
    const dt_plan_model *m = &c->in.model;
    int L = m->feature_rows ? 0 : m->n_layer;
    if (c->have_cfg && c->cfg.pp.stages > 1) { /* the config's pipeline section: the defaults */
        if (!o->n_pps && !o->pp_auto) o->pps[o->n_pps++] = (int)c->cfg.pp.stages;
        if (o->schedule < 0) o->schedule = c->cfg.pp.schedule;
        if (!o->virtual_stages) o->virtual_stages = (int)c->cfg.pp.virtual_stages;
        if (o->partition < 0) o->partition = c->cfg.pp.partition;
    }
    if (o->virtual_stages > 1 && o->schedule < 0) o->schedule = DT_PP_INTERLEAVED;
    if (o->pp_auto) /* powers of two dividing the layers; 1 always */
        for (int P = 1; P <= L && P <= DT_PLAN_MAX_CHUNKS && o->n_pps < MAX_PP_LAYOUTS; P *= 2)
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
            plan_pp_layout pl = {P, V, scheds[q]};
            dt_plan_model pm;
            char msg[512];
            int bad = cmd_plan_pp_model(o, c, &c->tp_models[0], &pl, &pm, msg, sizeof msg);
            if (!bad) dt_plan_model_free(&pm);
            if (o->pp_auto) { /* a layout auto cannot cut is left out */
                if (!bad) add_layout(o, P, V, scheds[q]);
                continue;
            }
            if (bad) return cmd_plan_usage_error("%s", msg);
            /* a sized model's micro-batches are known now; a config's per GPU count */
            if (!c->have_cfg && dt_pp_schedule_check(scheds[q], P, V, c->in.accum, msg, sizeof msg))
                return cmd_plan_usage_error("--pp %d --schedule %s --virtual-stages %d --accum %d: %s", P,
                                            dt_pp_schedule_name(scheds[q]), V, c->in.accum, msg);
            add_layout(o, P, V, scheds[q]);
        }
    }
    if (!o->n_layouts) add_layout(o, 1, 1, DT_PP_1F1B);
    return 0;
}
