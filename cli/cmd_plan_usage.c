/*
 * cmd_plan_usage.c - `dtrun plan`'s usage error, shared by its flag files
 * (cmd_plan.c, cmd_plan_pp.c, cmd_plan_lora.c): a file below them, so that they
 * call down to it instead of into each other.
 */
#include <stdarg.h>
#include <stdio.h>

#include "cli/commands.h"
#include "cli/cmd_plan.h"

int cmd_plan_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("dtrun plan: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n(dtrun plan --help for the flags)\n", stderr);
    va_end(ap);
    return DT_EXIT_USAGE;
}
