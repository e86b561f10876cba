/*
 * test_launch_args.c - launch flag parsing: spellings, PET_ variables, SLURM,
 * endpoints, redirects/tee/filter, and the errors for bad or contradictory flags.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "runtime/launch/launch_args.h"

static char *no_env[] = {NULL};

/* Parses a list of arguments after "dtrun". The array lives only inside the
 * macro: tests that read prog_argv/config_path afterwards declare their own. */
#define PARSE(envp, spec, ...)                                                       \
    ({                                                                               \
        char *argv_[] = {"dtrun", __VA_ARGS__, NULL};                                \
        dt_launch_args_parse((int)(sizeof argv_ / sizeof argv_[0]) - 1, argv_, envp, \
                             spec);                                                  \
    })

Test(launch_args, defaults_and_exec) {
    dt_launch_spec_t s;
    char *argv[] = {"dtrun", "--exec", "prog", "-x", "--nnodes", "9", NULL};
    cr_assert_eq(dt_launch_args_parse(6, argv, no_env, &s), DT_STATUS_OK);
    cr_assert_eq(s.mode, DT_LAUNCH_MODE_EXEC);
    cr_assert_eq(s.prog_argc, 4); /* flags after --exec belong to the program */
    cr_assert_str_eq(s.prog_argv[0], "prog");
    cr_assert_str_eq(s.prog_argv[3], "9");
    cr_assert_eq(s.nnodes_min, 1);
    cr_assert_eq(s.nnodes_max, 1);
    cr_assert_eq(s.nproc_per_node, 1);
    cr_assert_eq(s.node_rank, -1);
    cr_assert_eq(s.max_restarts, 0);
    cr_assert_float_eq(s.join_timeout_s, 600, 1e-9);
    /* one node, no address: loopback and a free port, random run id */
    cr_assert_str_eq(s.endpoint_host, "127.0.0.1");
    cr_assert_eq(s.endpoint_port, 0);
    cr_assert_eq(strlen(s.rdzv_id), 17);
    dt_launch_spec_free(&s);
}

Test(launch_args, both_spellings_and_equals) {
    dt_launch_spec_t s;
    cr_assert_eq(PARSE(no_env, &s, "--nproc-per-node=3", "--nnodes", "2:4", "--node_rank=1",
                       "--rdzv-endpoint", "10.0.0.1:1234", "--max-restarts", "2",
                       "--monitor_interval=0.5", "--rdzv_id", "job7", "--exec", "x"),
                 DT_STATUS_OK);
    cr_assert_eq(s.nproc_per_node, 3);
    cr_assert_eq(s.nnodes_min, 2);
    cr_assert_eq(s.nnodes_max, 4);
    cr_assert_eq(s.node_rank, 1);
    cr_assert_str_eq(s.endpoint_host, "10.0.0.1");
    cr_assert_eq(s.endpoint_port, 1234);
    cr_assert_eq(s.max_restarts, 2);
    cr_assert_float_eq(s.monitor_interval_s, 0.5, 1e-9);
    cr_assert_str_eq(s.rdzv_id, "job7");
    dt_launch_spec_free(&s);
}

Test(launch_args, endpoints) {
    dt_launch_spec_t s;
    char *h;
    int p;
    cr_assert_eq(dt_launch_split_endpoint("[::1]:99", 5, &h, &p), DT_STATUS_OK);
    cr_assert_str_eq(h, "::1");
    cr_assert_eq(p, 99);
    free(h);
    cr_assert_eq(dt_launch_split_endpoint("node3", 29400, &h, &p), DT_STATUS_OK);
    cr_assert_str_eq(h, "node3");
    cr_assert_eq(p, 29400);
    free(h);
    cr_assert_eq(dt_launch_split_endpoint("h:99999", 5, &h, &p), DT_STATUS_USAGE);
    cr_assert_eq(dt_launch_split_endpoint(":5", 5, &h, &p), DT_STATUS_USAGE);
    /* master_addr/port defaults when several nodes */
    cr_assert_eq(PARSE(no_env, &s, "--nnodes", "2", "--master_addr", "127.0.0.5", "--exec", "x"),
                 DT_STATUS_OK);
    cr_assert_str_eq(s.endpoint_host, "127.0.0.5");
    cr_assert_eq(s.endpoint_port, 29500);
    dt_launch_spec_free(&s);
}

Test(launch_args, pet_env_and_cli_wins) {
    dt_launch_spec_t s;
    char *env[] = {"PET_NPROC_PER_NODE=4", "PET_NNODES=2", "PET_MASTER_ADDR=127.0.0.9",
                   "PET_MASTER_PORT=4444", "PET_MAX_RESTARTS=3", NULL};
    cr_assert_eq(PARSE(env, &s, "--nproc_per_node", "2", "--exec", "x"), DT_STATUS_OK);
    cr_assert_eq(s.nproc_per_node, 2); /* command line wins */
    cr_assert_eq(s.nnodes_max, 2);
    cr_assert_str_eq(s.endpoint_host, "127.0.0.9");
    cr_assert_eq(s.endpoint_port, 4444);
    cr_assert_eq(s.max_restarts, 3);
    dt_launch_spec_free(&s);
    char *env2[] = {"PET_STANDALONE=1", NULL};
    cr_assert_eq(PARSE(env2, &s, "--exec", "x"), DT_STATUS_OK);
    cr_assert_eq(s.standalone, 1);
    dt_launch_spec_free(&s);
}

static void expect_usage(char **envp, const char *needle, int argc, char **argv);

Test(launch_args, slurm) {
    dt_launch_spec_t s;
    /* a job step of srun: one task per node */
    char *env[] = {"SLURM_JOB_ID=123456", "SLURM_NNODES=3", "SLURM_NODEID=2", "SLURM_STEP_NUM_NODES=3",
                   "SLURM_STEP_NUM_TASKS=3", "SLURM_JOB_NODELIST=gpu[007-009,12],cpu1", NULL};
    cr_assert_eq(PARSE(env, &s, "--exec", "x"), DT_STATUS_OK);
    cr_assert_eq(s.nnodes_max, 3);
    cr_assert_eq(s.node_rank, 2);
    cr_assert_str_eq(s.endpoint_host, "gpu007");
    cr_assert_eq(s.endpoint_port, 15000 + 123456 % 20000);
    cr_assert_str_eq(s.rdzv_id, "123456");
    cr_assert_eq(s.n_notes, 3);
    dt_launch_spec_free(&s);
    /* flags say otherwise: they win */
    cr_assert_eq(PARSE(env, &s, "--nnodes", "1", "--node_rank", "0", "--exec", "x"),
                 DT_STATUS_OK);
    cr_assert_eq(s.nnodes_max, 1);
    cr_assert_eq(s.node_rank, 0);
    cr_assert_eq(s.endpoint_port, 0);
    dt_launch_spec_free(&s);
    /* salloc's shell or a batch script: the job's nodes, no step: the others would never join */
    expect_usage((char *[]){"SLURM_JOB_ID=7", "SLURM_NNODES=2", "SLURM_JOB_NODELIST=n[1-2]", NULL},
                 "not a job step", 3, (char *[]){"dtrun", "--exec", "x", NULL});
    /* srun --ntasks-per-node=2 on one node: two separate trainings */
    expect_usage((char *[]){"SLURM_JOB_ID=7", "SLURM_NNODES=1", "SLURM_STEP_NUM_NODES=1", "SLURM_STEP_NUM_TASKS=2",
                            "SLURM_JOB_NODELIST=n1", NULL},
                 "srun started 2 tasks on 1 node(s)", 3, (char *[]){"dtrun", "--exec", "x", NULL});
    /* srun -N2 -r1 in a 3-node job: the store on the step's first host, not the job's */
    char *env_r1[] = {"SLURM_JOB_ID=9", "SLURM_NNODES=3", "SLURM_NODEID=0", "SLURM_STEP_NUM_NODES=2",
                      "SLURM_STEP_NUM_TASKS=2", "SLURM_JOB_NODELIST=n[1-3]", "SLURM_STEP_NODELIST=n[2-3]", NULL};
    cr_assert_eq(PARSE(env_r1, &s, "--exec", "x"), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(s.nnodes_max, 2);
    cr_assert_str_eq(s.endpoint_host, "n2");
    dt_launch_spec_free(&s);
    /* gpu: the allocation's GPUs on this node when SLURM left CUDA_VISIBLE_DEVICES wider */
    char *env_g[] = {"CUDA_VISIBLE_DEVICES=0,1,2,3", "SLURM_GPUS_ON_NODE=2", NULL};
    cr_assert_eq(dt_launch_count_gpus(env_g), 2);
    char *env_g2[] = {"CUDA_VISIBLE_DEVICES=0,1", "SLURM_GPUS_ON_NODE=4", NULL};
    cr_assert_eq(dt_launch_count_gpus(env_g2), 2);
    /* one node, no step (salloc -N1, or a 1-node batch script): a one-node run */
    char *env_1[] = {"SLURM_JOB_ID=9", "SLURM_NNODES=1", "SLURM_JOB_NODELIST=n1", NULL};
    cr_assert_eq(PARSE(env_1, &s, "--exec", "x"), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(s.nnodes_max, 1);
    dt_launch_spec_free(&s);
    char buf[64];
    cr_assert_eq(dt_launch_slurm_first_host("rack[1-2]-n[01-04]", buf, sizeof buf), DT_STATUS_OK);
    cr_assert_str_eq(buf, "rack1-n01");
    cr_assert_eq(dt_launch_slurm_first_host("a,b", buf, sizeof buf), DT_STATUS_OK);
    cr_assert_str_eq(buf, "a");
    cr_assert_eq(dt_launch_slurm_first_host("bad[1-2", buf, sizeof buf), DT_STATUS_USAGE);
}

Test(launch_args, nproc_kinds) {
    dt_launch_spec_t s;
    char *env[] = {"CUDA_VISIBLE_DEVICES=0,3,5", NULL};
    cr_assert_eq(PARSE(env, &s, "--nproc_per_node", "gpu", "--exec", "x"), DT_STATUS_OK);
    cr_assert_eq(s.nproc_per_node, 3);
    dt_launch_spec_free(&s);
    cr_assert_eq(PARSE(env, &s, "--nproc_per_node", "auto", "--exec", "x"), DT_STATUS_OK);
    cr_assert_eq(s.nproc_per_node, 3);
    cr_assert_str_eq(s.nproc_source, "auto(gpu)");
    dt_launch_spec_free(&s);
    char *none[] = {"CUDA_VISIBLE_DEVICES=", NULL};
    cr_assert_eq(PARSE(none, &s, "--nproc_per_node", "auto", "--exec", "x"), DT_STATUS_OK);
    cr_assert_str_eq(s.nproc_source, "auto(cpu)");
    cr_assert_eq(s.nproc_per_node, (int)sysconf(_SC_NPROCESSORS_ONLN));
    dt_launch_spec_free(&s);
    cr_assert_eq(PARSE(none, &s, "--nproc_per_node", "gpu", "--exec", "x"), DT_STATUS_USAGE);
    cr_assert(strstr(dt_error_detail(), "no GPU"));
    cr_assert_eq(dt_launch_count_gpus((char *[]){"CUDA_VISIBLE_DEVICES=-1", NULL}), 0);
    cr_assert_eq(dt_launch_count_gpus((char *[]){"CUDA_VISIBLE_DEVICES=GPU-ab,GPU-cd", NULL}), 2);
}

Test(launch_args, redirects_tee_filter_rdzv_conf) {
    dt_launch_spec_t s;
    cr_assert_eq(PARSE(no_env, &s, "--redirects", "0:1,2:3", "--tee", "2", "--local_ranks_filter",
                       "0,2", "--rdzv_conf", "join_timeout=5,heartbeat_interval=0.2",
                       "--nproc_per_node", "3", "--exec", "x"),
                 DT_STATUS_OK);
    cr_assert_eq(dt_launch_spec_redirects(&s, 0), DT_STD_OUT);
    cr_assert_eq(dt_launch_spec_redirects(&s, 1), DT_STD_NONE);
    cr_assert_eq(dt_launch_spec_redirects(&s, 2), DT_STD_ALL);
    cr_assert_eq(dt_launch_spec_tee(&s, 1), DT_STD_ERR);
    cr_assert(dt_launch_spec_console(&s, 0));
    cr_assert(!dt_launch_spec_console(&s, 1));
    cr_assert(dt_launch_spec_console(&s, 2));
    cr_assert_float_eq(s.join_timeout_s, 5, 1e-9);
    cr_assert_float_eq(s.heartbeat_s, 0.2, 1e-9);
    dt_launch_spec_free(&s);
    /* --log_dir alone: files and console */
    cr_assert_eq(PARSE(no_env, &s, "--log_dir", "/tmp/x", "--exec", "x"), DT_STATUS_OK);
    cr_assert_eq(dt_launch_spec_tee(&s, 0), DT_STD_ALL);
    dt_launch_spec_free(&s);
}

Test(launch_args, config_and_bench_modes) {
    dt_launch_spec_t s;
    char *argv[] = {"dtrun", "--nproc_per_node", "2", "c.json", "a.b=3", "x=y", NULL};
    cr_assert_eq(dt_launch_args_parse(6, argv, no_env, &s), DT_STATUS_OK);
    cr_assert_eq(s.mode, DT_LAUNCH_MODE_CONFIG);
    cr_assert_str_eq(s.config_path, "c.json");
    cr_assert_eq(s.extra_argc, 2);
    dt_launch_spec_free(&s);
    cr_assert_eq(PARSE(no_env, &s, "bench", "comm", "--size", "1M"), DT_STATUS_OK);
    cr_assert_eq(s.mode, DT_LAUNCH_MODE_BENCH_COMM);
    cr_assert_eq(s.extra_argc, 2);
    dt_launch_spec_free(&s);
}

/* Each bad command line: DT_STATUS_USAGE and a message naming the culprit. */
static void expect_usage(char **envp, const char *needle, int argc, char **argv) {
    dt_launch_spec_t s;
    dt_status_t st = dt_launch_args_parse(argc, argv, envp, &s);
    cr_assert_eq(st, DT_STATUS_USAGE, "expected a usage error mentioning '%s'", needle);
    cr_assert(strstr(dt_error_detail(), needle), "detail '%s' lacks '%s'", dt_error_detail(),
              needle);
}
#define BAD(needle, ...)                                                          \
    do {                                                                          \
        char *a_[] = {"dtrun", __VA_ARGS__, NULL};                                \
        expect_usage(no_env, needle, (int)(sizeof a_ / sizeof a_[0]) - 1, a_);    \
    } while (0)

Test(launch_args, bad_flags) {
    BAD("--frobnicate", "--frobnicate", "--exec", "x");
    BAD("--nnodes", "--nnodes", "0", "--exec", "x");
    BAD("MIN is larger", "--nnodes", "4:2", "--exec", "x");
    BAD("nproc_per_node", "--nproc_per_node", "many", "--exec", "x");
    BAD("nproc_per_node", "--nproc_per_node", "0", "--exec", "x");
    BAD("--exec needs", "--exec");
    BAD("nothing to launch", "--nproc_per_node", "2");
    BAD("needs a value", "--nproc_per_node");
    BAD("--standalone contradicts --rdzv_endpoint", "--standalone", "--rdzv_endpoint", "h:1",
        "--exec", "x");
    BAD("--standalone contradicts --nnodes", "--standalone", "--nnodes", "2", "--exec", "x");
    BAD("--standalone contradicts --master_port", "--standalone", "--master_port", "5", "--exec", "x");
    BAD("--rdzv_endpoint contradicts --master_addr", "--rdzv_endpoint", "a:1", "--master_addr",
        "b", "--nnodes", "2", "--exec", "x");
    BAD("out of range", "--node_rank", "1", "--exec", "x");
    BAD("master_port", "--master_port", "70000", "--nnodes", "2", "--exec", "x");
    BAD("port 0", "--nnodes", "2", "--master_port", "0", "--exec", "x");
    BAD("unknown key 'foo'", "--rdzv_conf", "foo=1", "--exec", "x");
    BAD("join_timeout", "--rdzv_conf", "join_timeout=-3", "--exec", "x");
    BAD("--redirects", "--redirects", "7", "--exec", "x");
    BAD("--tee", "--tee", "0:9", "--exec", "x");
    BAD("--local_ranks_filter", "--local_ranks_filter", "0,a", "--exec", "x");
    BAD("max_restarts", "--max_restarts", "-1", "--exec", "x");
    BAD("monitor_interval", "--monitor_interval", "0", "--exec", "x");
    BAD("--standalone takes no value", "--standalone=maybe", "--exec", "x");
    BAD("not KEY=VALUE", "c.json", "oops");
    BAD("after the config file", "c.json", "--nnodes", "2");
    BAD("bench comm", "bench", "store");
    BAD("rdzv_backend", "--rdzv_backend", "etcd", "--exec", "x");
    BAD("rdzv_id", "--rdzv_id", "a/b", "--exec", "x");
}

Test(launch_args, bad_env) {
    char *a[] = {"dtrun", "--exec", "x", NULL};
    expect_usage((char *[]){"PET_NPROC_PER_NODE=zero", NULL}, "nproc_per_node", 3, a);
    expect_usage((char *[]){"DTRUN_SHUTDOWN_TIMEOUT=soon", NULL}, "DTRUN_SHUTDOWN_TIMEOUT", 3, a);
    expect_usage((char *[]){"SLURM_JOB_ID=1", "SLURM_NNODES=x", NULL}, "SLURM_NNODES", 3, a);
}

/* dtrun's own tools launch like `--standalone --nproc_per_node N`, whatever the
 * PET_ and SLURM_ variables say; only DTRUN_SHUTDOWN_TIMEOUT is taken. */
Test(launch_args, standalone_spec) {
    char *env[] = {"PET_NNODES=4", "PET_NPROC_PER_NODE=8", "SLURM_JOB_ID=77", "SLURM_NNODES=2",
                   "DTRUN_SHUTDOWN_TIMEOUT=2.5", NULL};
    dt_launch_spec_t s, t;
    cr_assert_eq(dt_launch_spec_standalone(3, DT_LAUNCH_MODE_BENCH_COMM, env, &s), DT_STATUS_OK);
    cr_assert_eq(s.mode, DT_LAUNCH_MODE_BENCH_COMM);
    cr_assert_eq(s.nproc_per_node, 3);
    cr_assert_str_eq(s.nproc_source, "N");
    cr_assert_eq(s.nnodes_min, 1);
    cr_assert_eq(s.nnodes_max, 1);
    cr_assert_eq(s.standalone, 1);
    cr_assert_str_eq(s.endpoint_host, "127.0.0.1");
    cr_assert_eq(s.endpoint_port, 0);
    cr_assert_eq(s.max_restarts, 0);
    cr_assert_null(s.log_dir);
    cr_assert_eq(dt_launch_spec_console(&s, 2), 1);
    cr_assert_eq(dt_launch_spec_redirects(&s, 0), DT_STD_NONE);
    cr_assert_float_eq(s.shutdown_timeout_s, 2.5, 1e-9);
    cr_assert_float_eq(s.monitor_interval_s, 0.1, 1e-9);
    /* a random run id each time, never SLURM's */
    cr_assert_eq(dt_launch_spec_standalone(1, DT_LAUNCH_MODE_EXEC, no_env, &t), DT_STATUS_OK);
    cr_assert_str_neq(s.rdzv_id, "77");
    cr_assert_str_neq(s.rdzv_id, t.rdzv_id);
    cr_assert_float_eq(t.shutdown_timeout_s, 30, 1e-9);
    dt_launch_spec_free(&s);
    dt_launch_spec_free(&t);
    cr_assert_eq(dt_launch_spec_standalone(0, DT_LAUNCH_MODE_EXEC, no_env, &s), DT_STATUS_USAGE);
    char *bad[] = {"DTRUN_SHUTDOWN_TIMEOUT=soon", NULL};
    cr_assert_eq(dt_launch_spec_standalone(2, DT_LAUNCH_MODE_EXEC, bad, &s), DT_STATUS_USAGE);
    cr_assert(strstr(dt_error_detail(), "DTRUN_SHUTDOWN_TIMEOUT='soon'") != NULL, "%s", dt_error_detail());
}
