/*
 * cmd_launch.c - `dtrun [LAUNCH FLAGS] CONFIG.json | --exec PROG ... | bench comm`:
 * parses the launch flags, checks what is to be run before anything starts (the
 * config, for its world size), and hands over to the agent (runtime/launch/agent.h), whose
 * workers are the program given to --exec or `dtrun __worker CONFIG ...`. For a
 * multi-node run (and `dtrun check`) it also hands the agent what every node must
 * agree on (dt_trainer_preflight_desc), which the agent's preflight compares.
 */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/config_check.h" /* defines: dt_cli_config_check */
#include "common/fs.h"
#include "common/log.h"
#include "common/mem.h"
#include "runtime/launch/agent.h"
#include "runtime/config/config.h"
#include "runtime/train/trainer.h" /* defines: dt_trainer_preflight_desc */
#include "runtime/launch/launch_args.h"
#include "runtime/launch/rdzv.h" /* defines: dt_rdzv_post_abort */

extern char **environ;

/* --nnodes MIN:MAX without a train_batch_size: the smallest one every size keeps
 * (dt_train_elastic_check), said and given to the workers as an override; without it
 * the first round's size fixed the batch, and a smaller round could not keep it. */
static void elastic_batch(dt_launch_spec_t *spec, int64_t pick) {
    DT_LOG_INFO("elastic: --nnodes %d:%d and no train_batch_size: train_batch_size=%lld, the smallest global batch "
                "that %d to %d nodes all keep (gradient accumulation makes up the difference; give "
                "train_batch_size to choose another)",
                spec->nnodes_min, spec->nnodes_max, (long long)pick, spec->nnodes_min, spec->nnodes_max);
    char **argv = dt_xcalloc((size_t)spec->extra_argc + 2, sizeof *argv);
    for (int i = 0; i < spec->extra_argc; i++) argv[i] = spec->extra_argv[i];
    char kv[64];
    snprintf(kv, sizeof kv, "train_batch_size=%lld", (long long)pick);
    argv[spec->extra_argc] = dt_xstrdup(kv);
    spec->extra_owned = argv; /* freed with the spec */
    spec->extra_argv = argv;
    spec->extra_argc++;
}

/* The config is loaded and checked (for the world size when it is fixed) before
 * anything starts: its errors are exit 2, as the worker would find them. */
static int check_config(dt_launch_spec_t *spec, char *why, size_t why_len) {
    dt_config_t cfg;
    int64_t pick = 0;
    dt_cli_config_req req = {.path = spec->config_path,
                             .overrides = (const char *const *)spec->extra_argv,
                             .n_overrides = spec->extra_argc,
                             .nnodes_min = spec->nnodes_min,
                             .nnodes_max = spec->nnodes_max,
                             .nproc_per_node = spec->nproc_per_node,
                             .who = "dtrun"};
    dt_status_t st = dt_cli_config_check(&req, &cfg, &pick);
    if (st == DT_STATUS_OK && pick > 0) /* the workers get it as an override */
        elastic_batch(spec, pick);
    if (st != DT_STATUS_OK) {
        const char *errs = dt_config_errors(&cfg);
        fputs(errs, stderr);
        char shown[1024];
        fprintf(stderr, "dtrun: error: config %s is not valid (nothing was started)\n",
                dt_fs_printable(spec->config_path, shown, sizeof shown));
        /* the first error, for the other nodes (tell_other_nodes) */
        const char *first = errs;
        while (*first == '\n') first++;
        if (!*first) first = dt_error_detail();
        if (!strncmp(first, "dtrun: error: ", 14)) first += 14;
        const char *nl = strchr(first, '\n');
        int wn = snprintf(why, why_len, "config %.200s is not valid: ", shown);
        if (wn > 0 && (size_t)wn < why_len)
            snprintf(why + wn, why_len - (size_t)wn, "%.*s", (int)(nl ? nl - first : (ptrdiff_t)strlen(first)), first);
    } else if (spec->print_config) { /* the config as the workers would see it */
        char *dump = dt_config_dump_json(&cfg);
        if (dump) printf("%s\n", dump);
        free(dump);
    } else if (!spec->no_preflight) {
        /* what every node must agree on, for the agent's preflight */
        if ((spec->nnodes_max > 1 || spec->check_only) &&
            dt_trainer_preflight_desc(&cfg, &spec->preflight_desc) != DT_STATUS_OK) {
            fprintf(stderr, "dtrun: error: %s\n", dt_error_detail());
            st = DT_STATUS_CONFIG;
        }
        spec->preflight_cpu = !dt_config_uses_cuda(&cfg);
        /* a CPU run's ranks share the host's memory, a GPU run's rank has its GPU: what
         * they need, when the world is fixed */
        double *need = spec->preflight_cpu ? &spec->preflight_mem_need : &spec->preflight_gpu_need;
        int multi = spec->nnodes_max > 1 || spec->check_only; /* one CPU node: its workers check */
        if (st == DT_STATUS_OK && (multi || !spec->preflight_cpu) && spec->nnodes_min == spec->nnodes_max &&
            dt_trainer_preflight_mem(&cfg, spec->nnodes_max * spec->nproc_per_node, spec->nproc_per_node,
                                     !spec->preflight_cpu, need) != DT_STATUS_OK) {
            DT_LOG_WARN("preflight: this node's memory need is unknown: %s", dt_error_detail());
            *need = 0;
        }
    }
    dt_config_free(&cfg);
    return st == DT_STATUS_OK ? DT_EXIT_OK : DT_EXIT_USAGE;
}

/* A node of a fixed-size multi-node job that cannot start tells the others through
 * the store (when one answers within 5 s), so that they exit 2 naming it rather than
 * wait join_timeout for it. Not the store's own node (node rank 0: nobody could be
 * connected yet; the others say they wait), not elastic jobs (a node that cannot
 * join does not stop the running ones). */
static void tell_other_nodes(const dt_launch_spec_t *spec, const char *why) {
    if (spec->nnodes_max < 2 || spec->nnodes_min != spec->nnodes_max || spec->node_rank == 0 ||
        spec->print_config || !spec->endpoint_host || spec->endpoint_port <= 0 || !why[0])
        return;
    char host[256], msg[1000];
    if (spec->local_addr) snprintf(host, sizeof host, "%s", spec->local_addr);
    else if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    if (spec->node_rank > 0) snprintf(msg, sizeof msg, "node_rank %d (%s): %s", spec->node_rank, host, why);
    else snprintf(msg, sizeof msg, "the node on %s: %s", host, why);
    dt_rdzv_post_abort(spec->endpoint_host, spec->endpoint_port, spec->have_token ? &spec->token : NULL,
                       spec->rdzv_id, msg, 5.0);
}

static const char check_usage[] =
    "usage: dtrun check [LAUNCH FLAGS] [CONFIG.json [KEY=VALUE ...]]\n"
    "       dtrun [LAUNCH FLAGS] check [CONFIG.json [KEY=VALUE ...]]\n"
    "\n"
    "Runs the preflight checks the launcher runs before it starts any worker, on every\n"
    "node (start it on each node as you would start the job), and prints a table per\n"
    "node: node, address, version, config digest, data, reachability, clock offset,\n"
    "CPU slots, memory, GPUs. No worker is started.\n"
    "\n"    "  LAUNCH FLAGS: those of the job (dtrun --help lists them): --nnodes,\n"
    "  --nproc_per_node, --rdzv_endpoint, --rdzv_id, --rdzv_conf, --local_addr,\n"
    "  --node_rank, --master_addr, --master_port, --preflight_min_busbw, ...\n"
    "\n"
    "  across nodes: dtrun's version and build, the launch flags that must agree and\n"
    "  the resolved config without the per-node keys (README \"Preflight\"), the data\n"
    "  files' names, sizes and header digests, model.pretrained's index digest;\n"
    "  each pair of nodes connects on the address its workers' collectives use\n"
    "\n"
    "Exit codes: 0 every check passed (warnings are printed), 2 the nodes differ or\n"
    "the config is not valid, 3 a pair of nodes cannot connect (or the rendezvous\n"
    "failed). The launcher runs the same checks before workers start; --no-preflight\n"
    "skips them.\n";

int dt_cmd_launch(int argc, char **argv) {
    dt_launch_spec_t spec;
    dt_log_set_prefix("dtrun agent");
    if (dt_launch_args_parse(argc, argv, environ, &spec) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun: error: %s\n(nothing was started; see dtrun --help)\n",
                dt_error_detail());
        return DT_EXIT_USAGE;
    }
    if (spec.check_help) {
        fputs(check_usage, stdout);
        dt_launch_spec_free(&spec);
        return DT_EXIT_OK;
    }
    for (int i = 0; i < spec.n_notes; i++) DT_LOG_INFO("SLURM: %s", spec.notes[i]);
    if (strcmp(spec.nproc_source, "N") != 0)
        DT_LOG_INFO("--nproc_per_node %s: %d worker(s) per node", spec.nproc_source,
                    spec.nproc_per_node);
    int code;
    if (spec.mode == DT_LAUNCH_MODE_BENCH_COMM) {
        code = dt_bench_comm_check(spec.extra_argc, spec.extra_argv, spec.nproc_per_node);
        if (code < 0) code = dt_cli_run_self(&spec, "__bench_comm_rank", NULL, spec.extra_argv, spec.extra_argc);
    } else if (spec.mode == DT_LAUNCH_MODE_CONFIG) {
        char why[700] = "";
        code = check_config(&spec, why, sizeof why);
        if (code == DT_EXIT_USAGE) tell_other_nodes(&spec, why);
        if (code == DT_EXIT_OK && spec.check_only) { /* the ranks check the communicator, train nothing */
            char *dev[] = {"--device", spec.preflight_cpu ? "cpu" : "cuda"};
            code = dt_cli_run_self(&spec, "__comm_check_rank", NULL, dev, 2);
        } else if (code == DT_EXIT_OK && !spec.print_config) {
            code = dt_cli_run_self(&spec, "__worker", spec.config_path, spec.extra_argv, spec.extra_argc);
        }
    } else if (spec.mode == DT_LAUNCH_MODE_CHECK) { /* check without a config: the communicator only */
        char *dev[] = {"--device", "auto"};
        code = dt_cli_run_self(&spec, "__comm_check_rank", NULL, dev, 2);
    } else if (!strcmp(spec.prog_argv[0], "-m")) { /* torchrun's -m MODULE: $PYTHON -m MODULE ... */
        char **argv2 = dt_xcalloc((size_t)spec.prog_argc + 2, sizeof *argv2);
        const char *py = getenv("PYTHON");
        argv2[0] = (char *)(py && *py ? py : "python3");
        for (int i = 0; i < spec.prog_argc; i++) argv2[i + 1] = spec.prog_argv[i];
        code = spec.prog_argc < 2 ? (fprintf(stderr, "dtrun: error: --exec -m needs a MODULE\n"), DT_EXIT_USAGE)
                                  : dt_agent_run(&spec, argv2, spec.prog_argc + 1);
        free(argv2);
    } else {
        code = dt_agent_run(&spec, spec.prog_argv, spec.prog_argc);
    }
    dt_launch_spec_free(&spec);
    return code;
}
