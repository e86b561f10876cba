/*
 * launch_args.h - the launch command line (torchrun's flags) parsed into a launch spec.
 *
 * Sources, weakest first: SLURM_* variables (only for what no flag or PET_ variable
 * sets), PET_<FLAG> variables (what Kubernetes operators set), the command line.
 * Every flag is spelled with '_' or '-' and given as `--flag V` or `--flag=V`.
 * Unknown and contradictory flags are DT_STATUS_USAGE with the flag named in
 * dt_error_detail(); nothing is started by parsing.
 */
#ifndef DT_RUNTIME_LAUNCH_ARGS_H
#define DT_RUNTIME_LAUNCH_ARGS_H

#include <stddef.h>

#include "common/status.h"
#include "rendezvous/store_auth.h" /* defines: dt_store_token_t */

#define DT_LAUNCH_DEFAULT_RDZV_PORT 29400
#define DT_LAUNCH_DEFAULT_MASTER_PORT 29500
#define DT_LAUNCH_MAX_LOCAL_RANKS 1024
#define DT_LAUNCH_MAX_NOTES 8

typedef enum dt_launch_mode {
    DT_LAUNCH_MODE_CONFIG = 0, /* dtrun [flags] CONFIG.json [KEY=VALUE ...] */
    DT_LAUNCH_MODE_EXEC,       /* dtrun [flags] --exec PROGRAM [ARGS ...]   */
    DT_LAUNCH_MODE_BENCH_COMM, /* dtrun [flags] bench comm [BENCH FLAGS]    */
    DT_LAUNCH_MODE_CHECK,      /* dtrun [flags] check [flags] (no config): preflight only */
} dt_launch_mode_t;

/* Bit set of streams for --redirects / --tee (torchrun's Std: 1 out, 2 err, 3 both). */
enum { DT_STD_NONE = 0, DT_STD_OUT = 1, DT_STD_ERR = 2, DT_STD_ALL = 3 };

typedef struct dt_launch_spec {
    int nnodes_min, nnodes_max;  /* --nnodes N or MIN:MAX (default 1:1) */
    int nproc_per_node;          /* resolved count (>= 1) */
    char nproc_source[16];       /* "N", "gpu", "cpu" or "auto(gpu)"/"auto(cpu)" */
    int node_rank;               /* -1: assigned at the rendezvous */
    int standalone;              /* single node, free port, generated run id */
    int print_config;            /* print the resolved config and start nothing */
    int no_preflight;            /* --no-preflight: skip the checks across nodes */
    int check_only;              /* `dtrun [flags] check [flags] [CONFIG.json]`: the
                                    preflight checks and their table, no worker */
    int check_help;              /* `check --help` */
    char *preflight_desc;        /* what must agree across nodes, "key\tvalue\n" lines
                                    (malloc'ed by the launcher from the resolved config;
                                    NULL: nothing beyond the launch itself) */
    double preflight_mem_need;   /* host bytes this node's ranks need (0: unknown) */
    double preflight_min_busbw;  /* --preflight_min_busbw GB/s: the health check's floor (0: none) */
    double preflight_gpu_need;   /* GPU bytes each rank needs on a GPU run (0: unknown) */
    int preflight_cpu;           /* the workers compute on the CPU (slots are checked) */
    char *endpoint_host;         /* rendezvous / store host (NULL: 127.0.0.1) */
    int endpoint_port;           /* 0: pick a free port (standalone) */
    int endpoint_given;          /* an endpoint came from a flag, PET_ or SLURM */
    char *rdzv_id;               /* run id ("none" unless given; standalone: random) */
    double join_timeout_s;       /* --rdzv_conf join_timeout (default 600) */
    double last_call_s;          /* --rdzv_conf last_call_timeout (default 1) */
    double heartbeat_s;          /* --rdzv_conf heartbeat_interval (default 1) */
    char *token_file;            /* --rdzv_conf token_file / DTRUN_RDZV_TOKEN_FILE,
                                    absolute (NULL: no token) */
    int have_token;              /* token holds the file's secret */
    dt_store_token_t token;
    char *bind_host;             /* --rdzv_conf bind (NULL: the endpoint's host) */
    int max_restarts;            /* default 0 */
    double monitor_interval_s;   /* default 0.1 */
    double shutdown_timeout_s;   /* DTRUN_SHUTDOWN_TIMEOUT (default 30) */
    char *log_dir;               /* NULL: no per-rank files */
    int redirects_all, tee_all;  /* DT_STD_* for ranks without an entry below */
    signed char redirects[DT_LAUNCH_MAX_LOCAL_RANKS]; /* -1: use _all */
    signed char tee[DT_LAUNCH_MAX_LOCAL_RANKS];
    int ranks_filter_n;          /* 0: every local rank on the console */
    int ranks_filter[DT_LAUNCH_MAX_LOCAL_RANKS];
    char *local_addr;            /* this node's address/name (default: hostname) */

    dt_launch_mode_t mode;
    char **prog_argv;            /* EXEC: program and args (points into argv) */
    int prog_argc;
    char *config_path;           /* CONFIG */
    char **extra_argv;           /* CONFIG: KEY=VALUE overrides; BENCH: bench flags */
    int extra_argc;
    char **extra_owned;          /* extra_argv when the launcher added to it (its last entry
                                  * malloc'ed too), freed with the spec */

    int n_notes;                 /* things taken from the environment, for the log */
    char notes[DT_LAUNCH_MAX_NOTES][400];
} dt_launch_spec_t;

/* Parses argv (argv[0] is the program name) with the variables of envp
 * (NULL-terminated "K=V" strings, usually environ). On failure the spec is
 * freed and dt_error_detail() names the offending flag or value. */
dt_status_t dt_launch_args_parse(int argc, char **argv, char **envp, dt_launch_spec_t *spec);
void dt_launch_spec_free(dt_launch_spec_t *spec);
/* The spec of `--standalone --nproc_per_node nproc` (one node, loopback, a free
 * port, a random run id; only DTRUN_SHUTDOWN_TIMEOUT is read from envp, no PET_
 * or SLURM_ variable): for dtrun's own tools that start their ranks themselves.
 * mode says what runs (DT_LAUNCH_MODE_EXEC makes the agent explain OMP_NUM_THREADS). */
dt_status_t dt_launch_spec_standalone(int nproc, dt_launch_mode_t mode, char **envp, dt_launch_spec_t *spec);

/* DT_STD_* of local rank lr for --redirects / --tee. */
int dt_launch_spec_redirects(const dt_launch_spec_t *spec, int local_rank);
int dt_launch_spec_tee(const dt_launch_spec_t *spec, int local_rank);
/* 1 when local rank lr's output goes to the console (--local_ranks_filter). */
int dt_launch_spec_console(const dt_launch_spec_t *spec, int local_rank);

/* First host of a SLURM node list ("gpu[003-005,9],cpu1" -> "gpu003") into buf. */
dt_status_t dt_launch_slurm_first_host(const char *nodelist, char *buf, size_t len);
/* Number of GPUs without touching CUDA: CUDA_VISIBLE_DEVICES (from envp) when set,
 * else NVML through dlopen; 0 when neither finds any. */
int dt_launch_count_gpus(char **envp);
/* "host:port", "host", "[v6]:port" -> host (malloc'ed) and port (default_port when absent). */
dt_status_t dt_launch_split_endpoint(const char *s, int default_port, char **host, int *port);

#endif /* DT_RUNTIME_LAUNCH_ARGS_H */
