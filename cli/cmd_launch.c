/*
 * cmd_launch.c - `dtrun [LAUNCH FLAGS] CONFIG.json | --exec PROG ... | bench comm`:
 * parses the launch flags, checks what is to be run before anything starts, and
 * hands over to the agent (runtime/agent.h).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "common/log.h"
#include "common/mem.h"
#include "runtime/agent.h"
#include "runtime/launch_args.h"

extern char **environ;

/* The config must exist and be JSON before anything starts. */
static int check_config(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "dtrun: error: cannot open config %s: %s\n", path, strerror(errno));
        return DT_EXIT_USAGE;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (len < 0 || len > (64L << 20)) {
        fclose(f);
        fprintf(stderr, "dtrun: error: config %s: not a regular file of at most 64 MiB\n", path);
        return DT_EXIT_USAGE;
    }
    char *buf = dt_xmalloc((size_t)len + 1);
    size_t n = fread(buf, 1, (size_t)len, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *root = cJSON_ParseWithLength(buf, n);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at ? (long)(at - buf) : -1;
        int line = 1;
        for (long i = 0; i < off && i < (long)n; i++) line += buf[i] == '\n';
        fprintf(stderr, "dtrun: error: config %s is not valid JSON (near line %d)\n", path, line);
        free(buf);
        return DT_EXIT_USAGE;
    }
    cJSON_Delete(root);
    free(buf);
    return DT_EXIT_OK;
}

int dt_cmd_launch(int argc, char **argv) {
    dt_launch_spec_t spec;
    dt_log_set_prefix("dtrun agent");
    if (dt_launch_args_parse(argc, argv, environ, &spec) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun: error: %s\n(nothing was started; see dtrun --help)\n",
                dt_error_detail());
        return DT_EXIT_USAGE;
    }
    for (int i = 0; i < spec.n_notes; i++) DT_LOG_INFO("SLURM: %s", spec.notes[i]);
    int code;
    if (spec.mode == DT_LAUNCH_MODE_BENCH_COMM) {
        fprintf(stderr, "dtrun: error: 'bench comm' is not built yet in this version (%s); "
                        "nothing was started\n", DT_VERSION);
        code = DT_EXIT_USAGE;
    } else if (spec.mode == DT_LAUNCH_MODE_CONFIG) {
        code = check_config(spec.config_path);
        if (code == DT_EXIT_OK) {
            /* The worker command line, ready for when the trainer lands:
             * dtrun __worker CONFIG [KEY=VALUE ...] with the same environment. */
            fprintf(stderr, "dtrun: error: the built-in trainer is not built yet; use --exec "
                            "PROGRAM to launch your own program (nothing was started)\n");
            code = DT_EXIT_USAGE;
        }
    } else {
        code = dt_agent_run(&spec, spec.prog_argv, spec.prog_argc);
    }
    dt_launch_spec_free(&spec);
    return code;
}
