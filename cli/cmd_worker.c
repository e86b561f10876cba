/*
 * cmd_worker.c - `dtrun __worker CONFIG.json [KEY=VALUE ...]`: what the agent
 * execs once per rank. Reads torchrun's environment, loads the config and runs
 * the trainer. Exit 0 on success, 2 for a config error, 1 for a failed run.
 */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "common/log.h"
#include "runtime/config/config.h"
#include "runtime/train/trainer.h"

int dt_cmd_worker(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: dtrun __worker CONFIG.json [KEY=VALUE ...]\n");
        return DT_EXIT_USAGE;
    }
    dt_trainer_env env;
    if (dt_trainer_env_from_environ(&env) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun worker: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    char prefix[64];
    snprintf(prefix, sizeof prefix, "dtrun rank %d", env.rank);
    dt_log_set_prefix(prefix);
    dt_config_t cfg;
    if (dt_config_load(argv[1], (const char *const *)argv + 2, argc - 2, &cfg) != DT_STATUS_OK ||
        dt_config_resolve(&cfg, env.world_size) != DT_STATUS_OK) {
        fprintf(stderr, "%s", dt_config_errors(&cfg));
        dt_config_free(&cfg);
        return DT_EXIT_USAGE;
    }
    dt_status_t st = dt_trainer_run(&cfg, &env);
    dt_config_free(&cfg);
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun rank %d: training failed: %s: %s\n", env.rank, dt_strerror(st),
                dt_error_detail());
        return st == DT_STATUS_CONFIG || st == DT_STATUS_FORMAT || st == DT_STATUS_NOT_FOUND
                   ? DT_EXIT_USAGE
                   : DT_EXIT_FAILED;
    }
    return DT_EXIT_OK;
}
