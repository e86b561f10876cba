/*
 * main.c - entry point: routes argv to a subcommand (cli/commands.h).
 *
 * Everything that is not a named subcommand is a launch: launch flags, then a
 * config file, `--exec PROGRAM ...` or `bench comm`.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "common/cudalib.h" /* defines: dt_cudalib_present */
#include "kernels/kernels.h" /* defines: dt_device_load */

static const char usage[] =
    "usage:\n"
    "  dtrun [LAUNCH FLAGS] CONFIG.json [KEY=VALUE ...]   run the built-in trainer\n"
    "  dtrun [LAUNCH FLAGS] --exec PROGRAM [ARGS ...]     run any program once per rank\n"
    "  dtrun [LAUNCH FLAGS] --exec -m MODULE [ARGS ...]   $PYTHON -m MODULE (python3 by default)\n"
    "  dtrun config CONFIG.json [KEY=VALUE ...] [--world-size N]\n"
    "                                                     check a config as the launcher does\n"
    "                                                     (exit 0 only when it would start)\n"
    "  dtrun plan CONFIG.json [PLAN FLAGS]                memory / time / cost plan\n"
    "  dtrun [LAUNCH FLAGS] bench comm [BENCH FLAGS]      collective bandwidth table\n"
    "  dtrun bench store [--conns N,...]                  rendezvous store benchmark\n"
    "  dtrun store [--host HOST] [--port PORT]            a rendezvous store alone\n"
    "  dtrun check [LAUNCH FLAGS] [CONFIG.json]           preflight only: the nodes agree,\n"
    "                                                     every pair connects (a table per node)\n"
    "  dtrun sample CHECKPOINT [--prompt S] [--tokens N]  generate text from a checkpoint\n"
    "  dtrun export CHECKPOINT -o FILE.safetensors        consolidated weights\n"
    "  dtrun tokenize --tokenizer tokenizer.json INPUT... -o PREFIX [--jobs J]\n"
    "                                                     text/jsonl -> llm.c token shards\n"
    "  dtrun report RUN_DIR [--step N]                    plot of a run's metrics (+ the\n"
    "                                                     timeline of step N with log.trace)\n"
    "  dtrun trace LOG_DIR [-o FILE.json]                 merge the ranks' timelines (log.trace)\n"
    "  dtrun debug dump RUN_DIR                           a running job's flight recorders\n"
    "                                                     -> RUN_DIR/flight/rank_NNNNN.json\n"
    "  dtrun --help | --version | SUBCOMMAND --help\n"
    "\n"
    "Launch flags (torchrun's names; '_' or '-'; also from PET_<FLAG> variables):\n"
    "  --nnodes N|MIN:MAX  --nproc_per_node N|auto|gpu|cpu  --node_rank R\n"
    "  --master_addr HOST  --master_port PORT  --rdzv_endpoint HOST[:PORT]  --rdzv_id ID\n"
    "  --rdzv_conf K=V,...  --standalone  --max_restarts K  --monitor_interval S\n"
    "  --log_dir DIR  --redirects SPEC  --tee SPEC  --local_ranks_filter LIST\n"
    "  --local_addr ADDR (this node's address: the node whose ADDR is the endpoint's host\n"
    "                     hosts the store; its name in logs and preflight; lets several\n"
    "                     \"nodes\" run on loopback addresses of one machine)\n"
    "  --shutdown_timeout S (a worker's grace after SIGTERM before SIGKILL)\n"
    "  --print-config (print the config resolved for the world size, start nothing)\n"
    "  --no-python (torchrun's; accepted: --exec runs the program as given)\n"
    "  --no-preflight (skip the checks across nodes before workers start; README \"Preflight\")\n"
    "  --preflight_min_busbw GBPS (the communicator's health check: a node or link under it is exit 3)\n"
    "\n"
    "  --nnodes MIN:MAX: elastic; lost nodes -> resume at the smaller size, a node that\n"
    "  arrives is admitted at the next checkpoint; the trainer keeps train_batch_size\n"
    "  (accumulation recomputed; README \"Elastic runs\")\n"
    "\n"
    "Exit codes: 0 ok, 1 job failed, 2 bad usage or config, 3 rendezvous/network,\n"
    "128+N ended by signal N (a worker's 75: stopped for an elastic resize).\n";

/* The subcommands a first word may name (the launch takes a config file there). */
static const char *const subcommands[] = {"plan",  "sample", "export", "tokenize", "report", "trace", "config",
                                          "debug", "store",  "bench",  "check",    "help",   "version"};

/* Edit distance between a and b (both short), with transpositions ("plna"). */
static int distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 32 || lb > 32) return 99;
    int d[33][33];
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
                c = d[i - 2][j - 2] + 1;
            d[i][j] = c;
        }
    return d[la][lb];
}

/* A first word that is no subcommand, no file and no .json name is a mistyped
 * subcommand, not a config to look for: exit 2 with the nearest one. Returns -1
 * when the word may be a config (the launcher takes it). */
static int unknown_command(const char *w) {
    size_t n = strlen(w);
    if (w[0] == '-' || strchr(w, '=') || strchr(w, '/') || (n > 5 && !strcmp(w + n - 5, ".json")) ||
        (n > 3 && !strcmp(w + n - 3, ".py")) || access(w, F_OK) == 0)
        return -1;
    const char *best = NULL;
    int bd = 3;
    for (size_t i = 0; i < sizeof subcommands / sizeof *subcommands; i++)
        if (!strcmp(w, subcommands[i])) return -1; /* `bench comm`: the launcher's */
    for (size_t i = 0; i < sizeof subcommands / sizeof *subcommands; i++) {
        int d = distance(w, subcommands[i]);
        if (d < bd) bd = d, best = subcommands[i];
    }
    if (best && bd <= (n <= 4 ? 1 : 2))
        fprintf(stderr, "dtrun: error: unknown command '%s', did you mean '%s'? (see dtrun --help)\n", w, best);
    else
        fprintf(stderr, "dtrun: error: unknown command '%s': not a subcommand, and no such config file (see dtrun --help)\n", w);
    return DT_EXIT_USAGE;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage, stderr);
        return DT_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(usage, stdout);
        return DT_EXIT_OK;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        /* whether the CUDA library is at hand, without loading it */
        char lib[4096];
        if (dt_cudalib_present(lib, sizeof lib))
            printf("dtrun %s (%s) cuda: %s\n", DT_VERSION, DT_GIT_REV, lib);
        else
            printf("dtrun %s (%s) cpu-only (no %s beside this binary or in LD_LIBRARY_PATH)\n", DT_VERSION,
                   DT_GIT_REV, dt_cudalib_name());
        return DT_EXIT_OK;
    }
    if (!strcmp(cmd, "__cuda_probe")) { /* the agent's check that a CUDA worker could load CUDA */
        if (dt_device_load(DT_DEVICE_CUDA) == DT_STATUS_OK) return DT_EXIT_OK;
        fprintf(stderr, "dtrun: error: device cuda: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    if (!strcmp(cmd, "__worker")) return dt_cmd_worker(argc - 1, argv + 1);
    if (!strcmp(cmd, "__bench_comm_rank")) return dt_cmd_bench_comm_rank(argc - 1, argv + 1);
    if (!strcmp(cmd, "__comm_check_rank")) return dt_cmd_comm_check_rank(argc - 1, argv + 1);
    if (!strcmp(cmd, "store")) return dt_cmd_store(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench") && argc > 2 && !strcmp(argv[2], "store"))
        return dt_cmd_bench_store(argc - 2, argv + 2);
    if (!strcmp(cmd, "plan")) return dt_cmd_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "sample")) return dt_cmd_sample(argc - 1, argv + 1);
    if (!strcmp(cmd, "export")) return dt_cmd_export(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return dt_cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "report")) return dt_cmd_report(argc - 1, argv + 1);
    if (!strcmp(cmd, "trace")) return dt_cmd_trace(argc - 1, argv + 1);
    if (!strcmp(cmd, "config")) return dt_cmd_config(argc - 1, argv + 1);
    if (!strcmp(cmd, "debug")) return dt_cmd_debug(argc - 1, argv + 1);
    int rc = unknown_command(cmd);
    if (rc >= 0) return rc;
    return dt_cmd_launch(argc, argv);
}
