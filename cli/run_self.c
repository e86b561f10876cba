/*
 * run_self.c - dt_cli_run_self: this binary's hidden per-rank command on every rank,
 * through the agent (the trainer's `__worker`, bench comm's `__bench_comm_rank`).
 * A file of its own so that the commands that launch ranks (cmd_launch.c,
 * cmd_bench_comm.c) call down to it instead of into each other.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/commands.h"
#include "common/fs.h"  /* defines: dt_fs_self_exe */
#include "common/mem.h" /* defines: dt_xcalloc */
#include "runtime/launch/agent.h" /* defines: dt_agent_run */

int dt_cli_run_self(const struct dt_launch_spec *spec, const char *subcommand, const char *first,
                    char *const *args, int nargs) {
    char self[PATH_MAX];
    if (dt_fs_self_exe(self, sizeof self) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun: error: %s\n", dt_error_detail());
        return DT_EXIT_FAILED;
    }
    char **argv = dt_xcalloc((size_t)nargs + 4, sizeof *argv);
    int argc = 0;
    argv[argc++] = self;
    argv[argc++] = (char *)subcommand;
    if (first) argv[argc++] = (char *)first;
    for (int i = 0; i < nargs; i++) argv[argc++] = args[i];
    int code = dt_agent_run(spec, argv, argc);
    free(argv);
    return code;
}
