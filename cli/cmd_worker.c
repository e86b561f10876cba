/*
 * cmd_worker.c - `dtrun __worker CONFIG.json [KEY=VALUE ...]`: what the agent
 * execs once per rank. Reads torchrun's environment, loads the config and runs
 * the trainer. Exit codes as dt_status_exit_code: 0 on success, 2 for a bad
 * environment, config or input file, 3 when the peers or the store were lost, 1
 * for any other failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/log.h"
#include "common/torchenv.h"
#include "runtime/config/config.h"
#include "runtime/train/train_elastic.h"
#include "runtime/train/trainer.h"

int dt_cmd_worker(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: dtrun __worker CONFIG.json [KEY=VALUE ...]\n");
        return DT_EXIT_USAGE;
    }
    dt_torchenv_t env;
    if (dt_torchenv_read(&env) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun worker: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    char prefix[64];
    snprintf(prefix, sizeof prefix, "dtrun rank %d", env.rank);
    dt_log_set_prefix(prefix);
    dt_config_t cfg;
    if (getenv("DTRUN_AGENT_PID")) dt_config_log_warnings(0); /* the agent said them */
    if (dt_config_load(argv[1], (const char *const *)argv + 2, argc - 2, &cfg) != DT_STATUS_OK) {
        fprintf(stderr, "%s", dt_config_errors(&cfg));
        dt_config_free(&cfg);
        return DT_EXIT_USAGE;
    }
    /* --nnodes MIN:MAX: the global batch stays the run's at this world size */
    if (dt_train_elastic_batch(&cfg, env.world_size) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun rank %d: error: %s\n", env.rank, dt_error_detail());
        dt_config_free(&cfg);
        return DT_EXIT_FAILED;
    }
    if (dt_config_resolve(&cfg, env.world_size) != DT_STATUS_OK) {
        fprintf(stderr, "%s", dt_config_errors(&cfg));
        dt_config_free(&cfg);
        return DT_EXIT_USAGE;
    }
    dt_status_t st = dt_trainer_run(&cfg, &env);
    dt_config_free(&cfg);
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun rank %d: training failed: %s: %s\n", env.rank, dt_strerror(st),
                dt_error_detail());
        return dt_trainer_preflight_failed() ? DT_EXIT_PREFLIGHT : (int)dt_status_exit_code(st);
    }
    return dt_train_elastic_resizing() ? DT_EXIT_RESIZE : DT_EXIT_OK;
}
