/*
 * main.c - entry point: routes argv to a subcommand (cli/commands.h).
 *
 * Everything that is not a named subcommand is a launch: launch flags, then a
 * config file, `--exec PROGRAM ...` or `bench comm`.
 */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "common/cudalib.h" /* defines: dt_cudalib_present */
#include "kernels/kernels.h" /* defines: dt_device_load */

static const char usage[] =
    "usage:\n"
    "  dtrun [LAUNCH FLAGS] CONFIG.json [KEY=VALUE ...]   run the built-in trainer\n"
    "  dtrun [LAUNCH FLAGS] --exec PROGRAM [ARGS ...]     run any program once per rank\n"
    "  dtrun plan CONFIG.json [PLAN FLAGS]                memory / time / cost plan\n"
    "  dtrun [LAUNCH FLAGS] bench comm [BENCH FLAGS]      collective bandwidth table\n"
    "  dtrun bench store [--conns N,...]                  rendezvous store benchmark\n"
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
    "  dtrun --help | --version\n"
    "\n"
    "Launch flags (torchrun's names; '_' or '-'; also from PET_<FLAG> variables):\n"
    "  --nnodes N|MIN:MAX  --nproc_per_node N|auto|gpu|cpu  --node_rank R\n"
    "  --master_addr HOST  --master_port PORT  --rdzv_endpoint HOST[:PORT]  --rdzv_id ID\n"
    "  --rdzv_conf K=V,...  --standalone  --max_restarts K  --monitor_interval S\n"
    "  --log_dir DIR  --redirects SPEC  --tee SPEC  --local_ranks_filter LIST\n"
    "  --no-preflight (skip the checks across nodes before workers start; README \"Preflight\")\n"
    "  --preflight_min_busbw GBPS (the communicator's health check: a node or link under it is exit 3)\n"
    "\n"
    "  --nnodes MIN:MAX: elastic; lost nodes -> resume at the smaller size, a node that\n"
    "  arrives is admitted at the next checkpoint; the trainer keeps train_batch_size\n"
    "  (accumulation recomputed; README \"Elastic runs\")\n"
    "\n"
    "Exit codes: 0 ok, 1 job failed, 2 bad usage or config, 3 rendezvous/network,\n"
    "128+N ended by signal N (a worker's 75: stopped for an elastic resize).\n";

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
    return dt_cmd_launch(argc, argv);
}
