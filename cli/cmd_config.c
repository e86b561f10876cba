/*
 * cmd_config.c - hidden subcommand: check a config the way the launcher does.
 *
 *   dtrun config CONFIG.json [KEY=VALUE ...] [--world-size N] [--print-config]
 *   dtrun config --keys
 *
 * Runs the launcher's own checks (config_check.h) for one node of --world-size
 * ranks (default 1): the config table, the data files, the folders, the checkpoint
 * to resume, the device; prints the resolved config as JSON on stdout (exit 0)
 * exactly when the launcher would start the workers, else the errors on stderr
 * (exit 2). Warnings (ignored DeepSpeed keys, "auto")
 * go to stderr either way.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h" /* defines: dt_arg_int */
#include "cli/commands.h"
#include "cli/config_check.h" /* defines: dt_cli_config_check: the launcher's checks */
#include "common/mem.h" /* defines: dt_xcalloc */
#include "runtime/config/config.h" /* defines: dt_config_load, dt_config_resolve, dt_config_dump_json */

static const char config_usage[] =
    "usage: dtrun config CONFIG.json [KEY=VALUE ...] [--world-size N] [--print-config]\n"
    "       dtrun config --keys\n"
    "Checks a config as the launcher does for one node of N ranks (default 1): the\n"
    "keys, the data files (data.train, data.val), log.dir and checkpoint.dir, a\n"
    "checkpoint.resume PATH, model.pretrained, device cuda (a GPU visible); prints it\n"
    "resolved, as JSON.\n"
    "  --world-size N    resolve the batch for N ranks (the launcher's nnodes x nproc_per_node)\n"
    "  --print-config    accepted (printing is what this command does)\n"
    "  --keys            every key: type, default, help\n"
    "Exit 0 when the launcher would start it, 2 with the errors otherwise.\n";

int dt_cmd_config(int argc, char **argv) {
    const char *path = NULL;
    int world_size = 1;
    const char **overrides = dt_xcalloc((size_t)(argc > 0 ? argc : 1), sizeof *overrides);
    int n_overrides = 0;
    int rc = DT_EXIT_USAGE;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--keys")) {
            dt_config_print_keys(stdout);
            rc = DT_EXIT_OK;
            goto out_free_overrides;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(config_usage, stdout);
            rc = DT_EXIT_OK;
            goto out_free_overrides;
        } else if (!strcmp(a, "--print-config") || !strcmp(a, "--print_config")) {
            /* printing is what this command does; accepted as the launcher's flag */
        } else if (!strncmp(a, "--world-size", 12) || !strncmp(a, "--world_size", 12)) {
            const char *v = a[12] == '=' ? a + 13 : (a[12] == '\0' && i + 1 < argc ? argv[++i] : NULL);
            if (!v || dt_arg_int(v, 1, 1000000, &world_size) != 0) {
                fprintf(stderr, "dtrun config: --world-size: expected an integer >= 1, found %s\n",
                        v ? v : "nothing");
                goto out_free_overrides;
            }
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "dtrun config: unknown flag %s\n%s", a, config_usage);
            goto out_free_overrides;
        } else if (!path && !strchr(a, '=')) {
            path = a;
        } else if (strchr(a, '=')) {
            overrides[n_overrides++] = a;
        } else {
            fprintf(stderr, "dtrun config: expected KEY=VALUE after the config file, found %s\n",
                    a);
            goto out_free_overrides;
        }
    }
    if (!path) {
        fputs(config_usage, stderr);
        goto out_free_overrides;
    }

    dt_config_t cfg;
    int64_t pick;
    dt_cli_config_req req = {.path = path,
                             .overrides = overrides,
                             .n_overrides = n_overrides,
                             .nnodes_min = 1,
                             .nnodes_max = 1,
                             .nproc_per_node = world_size,
                             .who = "dtrun config"};
    if (dt_cli_config_check(&req, &cfg, &pick) != DT_STATUS_OK) {
        if (cfg.n_errors > 0)
            fprintf(stderr, "dtrun config: %d error%s in %s:\n%s", cfg.n_errors, cfg.n_errors == 1 ? "" : "s",
                    path, dt_config_errors(&cfg));
        rc = DT_EXIT_USAGE;
    } else {
        char *json = dt_config_dump_json(&cfg);
        if (json) {
            printf("%s\n", json);
            rc = DT_EXIT_OK;
        } else {
            fprintf(stderr, "dtrun config: out of memory printing the config\n");
            rc = DT_EXIT_FAILED;
        }
        free(json);
    }
    dt_config_free(&cfg);
out_free_overrides:
    free(overrides);
    return rc;
}
