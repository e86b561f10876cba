/*
 * commands.h - the subcommands of the dtrun binary. Each lives in its own file
 * under cli/ (cmd_<name>.c) and returns the process exit code (docs/interface.md:
 * 0 ok, 1 job failed, 2 usage/config, 3 rendezvous/network, 128+N signal).
 */
#ifndef DT_CLI_COMMANDS_H
#define DT_CLI_COMMANDS_H

#include "common/status.h" /* defines: DT_EXIT_* */

/* dtrun [LAUNCH FLAGS] CONFIG.json | --exec PROG ... | bench comm ... */
int dt_cmd_launch(int argc, char **argv);
/* hidden: the worker side, exec'd by the agent */
int dt_cmd_worker(int argc, char **argv);
/* hidden dev server: dtrun store --host H --port P */
int dt_cmd_store(int argc, char **argv);
/* dtrun debug dump RUN_DIR: a running job's flight recorders to files (cmd_debug.c) */
int dt_cmd_debug(int argc, char **argv);
/* dtrun bench store ... (bench comm goes through the launcher) */
int dt_cmd_bench_store(int argc, char **argv);
/* The agent's check of `bench comm` flags before it starts any rank (argv: the
 * flags after "comm"): usage errors, a --nproc other than local_world_size, and
 * --device/--backend against the GPUs
 * visible (counted without initialising CUDA) for local_world_size ranks per
 * node. Returns -1 when the ranks may start, else the exit code to return now
 * (0 after --help, 2 after a usage error, with the reason on stderr). */
int dt_bench_comm_check(int argc, char **argv, int local_world_size);
/* hidden: one rank of the collective benchmark (what the agent runs per rank), or
 * with --nproc N and no RANK set, a standalone launch of N such ranks */
int dt_cmd_bench_comm_rank(int argc, char **argv);
/* hidden: one rank of `dtrun check` (cmd_check_rank.c) */
int dt_cmd_comm_check_rank(int argc, char **argv);
/* Runs this binary's hidden per-rank command on every rank through the agent:
 * `dtrun SUBCOMMAND [FIRST] ARGS...` (first may be NULL). Returns the agent's exit
 * code. (cmd_launch.c; the trainer's __worker, bench comm's __bench_comm_rank.) */
struct dt_launch_spec;
int dt_cli_run_self(const struct dt_launch_spec *spec, const char *subcommand, const char *first,
                    char *const *args, int nargs);
int dt_cmd_plan(int argc, char **argv);
int dt_cmd_sample(int argc, char **argv);
int dt_cmd_export(int argc, char **argv);
int dt_cmd_report(int argc, char **argv);
/* dtrun trace LOG_DIR [-o FILE]: the ranks' timeline files merged (cmd_trace.c) */
int dt_cmd_trace(int argc, char **argv);
/* dtrun tokenize --tokenizer PATH INPUT... -o PREFIX | --decode SHARD (cmd_tokenize.c) */
int dt_cmd_tokenize(int argc, char **argv);
/* hidden: dtrun config CONFIG.json [KEY=VALUE ...] [--world-size N] | --keys */
int dt_cmd_config(int argc, char **argv);

#endif /* DT_CLI_COMMANDS_H */
