/*
 * cmd_plan_usage.c - `dtrun plan`'s usage error, shared by its flag files
 * (cmd_plan.c, cmd_plan_pp.c, cmd_plan_lora.c): a file below them, so that they
 * call down to it instead of into each other. Also `dtrun plan`'s words for the
 * inputs plan's messages name (runtime/tools/plan.h's "{name}" placeholders): its
 * flags, so that a message of plan's functions reads as it always has.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/cmd_plan.h"
#include "runtime/tools/plan.h" /* defines: DT_PLAN_INPUT_MAP, dt_plan_msg_expand */

/* the flag of each input: "--" and its name with '-' for '_' ("{tp}" -> "--tp") */
static const char *const plan_flags[DT_PLAN_INPUT_COUNT] = {
    [DT_PLAN_INPUT_params] = "--params",
    [DT_PLAN_INPUT_hidden] = "--hidden",
    [DT_PLAN_INPUT_layers] = "--layers",
    [DT_PLAN_INPUT_heads] = "--heads",
    [DT_PLAN_INPUT_kv_heads] = "--kv-heads",
    [DT_PLAN_INPUT_seq] = "--seq",
    [DT_PLAN_INPUT_vocab] = "--vocab",
    [DT_PLAN_INPUT_ffn] = "--ffn",
    [DT_PLAN_INPUT_tp] = "--tp",
    [DT_PLAN_INPUT_pp] = "--pp",
    [DT_PLAN_INPUT_virtual_stages] = "--virtual-stages",
    [DT_PLAN_INPUT_schedule] = "--schedule",
    [DT_PLAN_INPUT_accum] = "--accum",
    [DT_PLAN_INPUT_gpus] = "--gpus",
    [DT_PLAN_INPUT_gpus_per_node] = "--gpus-per-node",
    [DT_PLAN_INPUT_nodes] = "--nodes",
    [DT_PLAN_INPUT_base_dtype] = "--base-dtype",
    [DT_PLAN_INPUT_cp] = "--cp",
};

const char *cmd_plan_detail(void) {
    static char buf[1024]; /* dt_error_detail's size: each flag is its placeholder's length */
    return dt_plan_msg_expand(dt_error_detail(), plan_flags, buf, sizeof buf);
}

void cmd_plan_expand(char *msg, size_t len) {
    char buf[1024];
    if (len > sizeof buf) len = sizeof buf;
    dt_plan_msg_expand(msg, plan_flags, buf, len);
    memcpy(msg, buf, strlen(buf) + 1);
}

int cmd_plan_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("dtrun plan: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n(dtrun plan --help for the flags)\n", stderr);
    va_end(ap);
    return DT_EXIT_USAGE;
}
