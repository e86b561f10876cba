/*
 * cmd_debug.c - `dtrun debug dump RUN`: asks a running job's agents, through its
 * store, to write every rank's flight recorder ring (the last communicator ops)
 * to <run_dir>/flight/rank_NNNNN.json on each node. The job goes on.
 *
 *   RUN is the run directory of node 0's agent, <log_dir>/<rdzv_id> (its file
 *   `endpoint` names the store, the run id and the token file), or
 *   --rdzv_endpoint HOST:PORT --rdzv_id ID (a token from DTRUN_RDZV_TOKEN_FILE).
 *   Waits up to --timeout S (default 10) for the agents' answers and prints them.
 * Exit: 0 answered, 1 no agent answered in time, 2 usage, 3 store unreachable.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h" /* defines: dt_arg_int, dt_arg_double */
#include "cli/commands.h"
#include "common/clock.h"
#include "common/fs.h"
#include "rendezvous/store.h"
#include "rendezvous/store_auth.h"

static const char debug_usage[] =
    "usage: dtrun debug dump RUN_DIR [--timeout S]\n"
    "       dtrun debug dump --rdzv_endpoint HOST:PORT --rdzv_id ID [--timeout S]\n"
    "  Asks a running job's agents to write every rank's flight recorder (its last\n"
    "  collectives and point-to-point ops) to <run_dir>/flight/rank_NNNNN.json; the\n"
    "  job goes on. RUN_DIR is node 0's <log_dir>/<rdzv_id>.\n";

int dt_cmd_debug(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(debug_usage, stdout);
            return DT_EXIT_OK;
        }
    if (argc < 2 || strcmp(argv[1], "dump") != 0) {
        fputs(debug_usage, stderr);
        return DT_EXIT_USAGE;
    }
    const char *run_dir = NULL, *endpoint = NULL, *run_id = NULL;
    double timeout = 10;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--rdzv_endpoint") && i + 1 < argc) endpoint = argv[++i];
        else if (!strcmp(argv[i], "--rdzv_id") && i + 1 < argc) run_id = argv[++i];
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
            /* strict: "abc" was 0 (then 10 s), "inf" or "nan" waited forever or not at all */
            const char *v = argv[++i];
            if (dt_arg_double(v, 0, 3600, &timeout) || !(timeout > 0)) {
                fprintf(stderr, "dtrun debug dump: --timeout '%s': expected seconds in (0, 3600]\n", v);
                return DT_EXIT_USAGE;
            }
        }
        else if (argv[i][0] != '-' && !run_dir) run_dir = argv[i];
        else {
            fprintf(stderr, "dtrun debug dump: unexpected argument '%s'\n%s", argv[i], debug_usage);
            return DT_EXIT_USAGE;
        }
    }
    char host[256] = "", id[256] = "", tokfile[4096] = "-";
    int port = 0;
    if (run_dir) {
        char path[4200], *txt = NULL;
        size_t n = 0;
        snprintf(path, sizeof path, "%s/endpoint", run_dir);
        if (dt_fs_read_file(path, 8192, &txt, &n) != DT_STATUS_OK ||
            sscanf(txt, "%255s %d %255s %4095s", host, &port, id, tokfile) != 4) {
            fprintf(stderr, "dtrun debug dump: %s: no endpoint file of a running job's agent (%s)\n", run_dir,
                    txt ? "malformed" : dt_error_detail());
            free(txt);
            return DT_EXIT_USAGE;
        }
        free(txt);
    } else if (endpoint && run_id) {
        const char *c = strrchr(endpoint, ':');
        if (!c || dt_arg_int(c + 1, 1, 65535, &port)) {
            fprintf(stderr, "dtrun debug dump: --rdzv_endpoint '%s': expected HOST:PORT\n", endpoint);
            return DT_EXIT_USAGE;
        }
        snprintf(host, sizeof host, "%.*s", (int)(c - endpoint), endpoint);
        snprintf(id, sizeof id, "%s", run_id);
    } else {
        fputs(debug_usage, stderr);
        return DT_EXIT_USAGE;
    }
    dt_store_token_t token;
    int have_token = 0;
    if (strcmp(tokfile, "-") != 0) {
        if (dt_store_token_load(tokfile, &token) != DT_STATUS_OK) {
            fprintf(stderr, "dtrun debug dump: %s\n", dt_error_detail());
            return DT_EXIT_USAGE;
        }
        have_token = 1;
    } else if (dt_store_token_from_env(&token, &have_token) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun debug dump: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    dt_store_t *st = NULL;
    if (dt_store_connect_auth(host, port, 5.0, have_token ? &token : NULL, &st) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun debug dump: cannot reach the job's store at %s:%d: %s\n", host, port,
                dt_error_detail());
        return DT_EXIT_NETWORK;
    }
    char key[600];
    snprintf(key, sizeof key, "/dtrun/%s/debug/dump", id);
    int64_t nth = 0;
    int code = DT_EXIT_FAILED;
    if (dt_store_add(st, key, 1, &nth) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun debug dump: %s\n", dt_error_detail());
        dt_store_close(st);
        return DT_EXIT_NETWORK;
    }
    /* The answers: one line per agent; after the first, a second for the others. */
    snprintf(key, sizeof key, "/dtrun/%s/debug/ack/%lld", id, (long long)nth);
    double t0 = dt_now_s(), first = 0;
    while (dt_now_s() - t0 < timeout && (!first || dt_now_s() - first < 1.5)) {
        const char *keys[] = {key};
        int ready = 0;
        if (dt_store_check(st, keys, 1, &ready) != DT_STATUS_OK) break;
        if (ready && !first) first = dt_now_s();
        dt_sleep_ms(100);
    }
    if (first) {
        void *v = NULL;
        size_t n = 0;
        if (dt_store_get(st, key, &v, &n) == DT_STATUS_OK) {
            printf("dtrun debug dump #%lld:\n%.*s", (long long)nth, (int)n, (char *)v);
            free(v);
            code = DT_EXIT_OK;
        }
    } else {
        fprintf(stderr, "dtrun debug dump: no agent answered within %.0f s (is the job running?)\n", timeout);
    }
    dt_store_close(st);
    return code;
}
