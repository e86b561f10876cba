/*
 * cmd_plan_pp.c - `dtrun plan`'s pipeline flags (cmd_plan.h): --pp LIST|auto,
 * --schedule, --virtual-stages, --partition, into the sweep's axes (the layouts a
 * plan searches are runtime/tools/plan_sweep.c's).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/model/model.h"
#include "runtime/layout/pp_sched.h" /* defines: dt_pp_schedule_parse, dt_pp_schedule_check */
#include "runtime/tools/plan.h"

#include "cli/args.h" /* defines: dt_arg_int */
#include "cli/cmd_plan.h"

int cmd_plan_parse_pp_flag(const char *flag, const char *val, plan_opts *o) {
    if (!strcmp(flag, "--pp")) {
        o->ax.n_pps = 0;
        o->ax.pp_auto = !strcasecmp(val, "auto");
        if (o->ax.pp_auto) return 0;
        char buf[256];
        if (strlen(val) >= sizeof buf) return cmd_plan_usage_error("--pp: the list is too long");
        snprintf(buf, sizeof buf, "%s", val);
        char *save = NULL;
        for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            int v;
            if (dt_arg_int(t, 1, DT_PLAN_MAX_CHUNKS, &v))
                return cmd_plan_usage_error("--pp: expected pipeline stages from 1 to %d like 1,2,4 (or auto), "
                                            "found \"%s\"",
                                            DT_PLAN_MAX_CHUNKS, val);
            for (int j = 0; j < o->ax.n_pps; j++)
                if (o->ax.pps[j] == v) return cmd_plan_usage_error("--pp: %d is listed twice", v);
            if (o->ax.n_pps == MAX_PP_LAYOUTS) return cmd_plan_usage_error("--pp: at most %d sizes", MAX_PP_LAYOUTS);
            o->ax.pps[o->ax.n_pps++] = v;
        }
        if (!o->ax.n_pps) return cmd_plan_usage_error("--pp: expected a list of stage counts like 1,2,4 (or auto)");
        return 0;
    }
    if (!strcmp(flag, "--schedule")) {
        o->ax.schedule = dt_pp_schedule_parse(val);
        if (o->ax.schedule < 0)
            return cmd_plan_usage_error("--schedule: expected 1f1b, gpipe or interleaved, found \"%s\"", val);
        return 0;
    }
    if (!strcmp(flag, "--virtual-stages")) {
        if (dt_arg_int(val, 1, DT_PLAN_MAX_CHUNKS, &o->ax.virtual_stages))
            return cmd_plan_usage_error("--virtual-stages: expected chunks per rank from 1 to %d, found \"%s\"",
                                        DT_PLAN_MAX_CHUNKS, val);
        return 0;
    }
    if (!strcmp(flag, "--partition")) {
        dt_pp_partition_t k;
        if (dt_pp_partition_parse(val, &k))
            return cmd_plan_usage_error("--partition: expected uniform, parameters or flops, found \"%s\"", val);
        o->ax.partition = (int)k;
        return 0;
    }
    return 1;
}
