/*
 * agent_impl.h - the agent's state shared by its files (private to runtime/launch):
 *
 *   agent.c    the round's state machine: store, rendezvous, signals, health
 *              ticks, the exit barrier, restarts (torch elastic's agent/server/api.py)
 *   spawn.c    starting a worker: its environment, its output pipes and log files
 *              (torch elastic's multiprocessing/api.py, tail_log.py, redirects.py)
 *   failure.c  what a failed worker leaves: its error file, the failure record
 *              shared through the store, torchrun's summary (multiprocessing/errors/)
 *   preflight.c before a round's workers: the nodes agree, every pair connects
 *   orphans.c  nothing left running: worker process groups killed when a round ends,
 *              the agent as child subreaper, the guardian that outlives a killed agent
 */
#ifndef DT_RUNTIME_LAUNCH_AGENT_IMPL_H
#define DT_RUNTIME_LAUNCH_AGENT_IMPL_H

#include <limits.h>
#include <sys/types.h>
#include <sys/resource.h>
#include <uv.h>

#include "rendezvous/store.h" /* defines: dt_store_server_t */
#include "runtime/launch/agent.h"
#include "runtime/launch/logpipe.h"
#include "runtime/launch/rdzv.h"

/* Stop reasons that start with this tag come from an agent ended by a signal: the
 * others stop too and do not restart (that node is going away). */
#define SIGNAL_STOP_TAG "signal: "

/* The signals the agent forwards to its workers (spawn.c resets them in the child). */
#define DT_AGENT_N_FWD 6
extern const int dt_agent_forwarded_signals[DT_AGENT_N_FWD];

typedef enum phase {
    PHASE_RUNNING = 0, /* workers running */
    PHASE_BARRIER,     /* local workers all exited 0; waiting for the other nodes */
    PHASE_STOPPING,    /* stopping the group (failure or signal) */
    PHASE_OVER,        /* round over */
} phase_t;

typedef enum outcome {
    OUTCOME_SUCCESS = 0,
    OUTCOME_FAILED,     /* a worker here or elsewhere failed, or a node was lost */
    OUTCOME_SIGNAL,     /* the agent got a signal */
    OUTCOME_STORE_LOST, /* the store (node 0) stopped answering */
    OUTCOME_RESIZE,     /* elastic: the workers stopped at a checkpoint for a resize */
} outcome_t;

struct agent;

typedef struct worker {
    struct agent *ag;
    int local_rank, rank;
    pid_t pid;
    int exited;
    int wstatus;
    int signaled_by_agent; /* we sent it a signal while it ran */
    int group_gone;        /* its process group was found empty or killed at round end */
    int reaped_seq;        /* order within one SIGCHLD batch, 0 when handled */
    double end_wall;
    uv_pipe_t pipe[2];     /* [0] stdout, [1] stderr */
    int pipe_open[2];
    dt_logpipe_t lp[2];
    int file_fd[2];
    char error_file[PATH_MAX];
} worker_t;

/* One failure, local or read back from the store. */
typedef struct failure {
    double time;
    char host[128];
    int rank, local_rank;
    long pid;
    int exitcode; /* torchrun's convention: -N for signal N */
    int lost;     /* the node stopped heartbeating */
    int hung;     /* named by the flight recorder: never arrived in the op the others waited in */
    char error_file[PATH_MAX];
    char *message;
} failure_t;

typedef struct agent {
    const dt_launch_spec_t *spec;
    struct rlimit nofile; /* RLIMIT_NOFILE as the agent started: the store raises the
                             agent's, workers get this one back (select() users) */
    uv_loop_t loop;
    uv_signal_t sig[DT_AGENT_N_FWD];
    uv_signal_t sigchld;
    uv_timer_t tick, grace;
    int signals_on;

    char host[128];
    char launch_id[17];             /* 16 hex digits, one per launch, the same on every node
                                     * (agent.c: launch_id); workers get it as DTRUN_LAUNCH_ID */
    char *run_dir;
    int run_dir_tmp;
    char *prog_path;
    char **argv;
    const char *title;

    dt_store_server_t *server;
    dt_rdzv_t *rz;
    int is_host;
    char master_addr[256];
    int master_port;

    int restart_count; /* the rendezvous round (restarts + resizes) */
    int resizes;       /* rounds that were resizes, not failures (--max_restarts counts the rest) */
    int resize_exit;   /* a worker of this round exited DT_EXIT_RESIZE */
    int joined_once; /* the first join looks for a round in progress */
    int nnodes, node_rank, base_rank, world_size;
    double node_mem;            /* the host memory sampled before this round's workers */
    const char *node_mem_what;  /* its source (static), NULL: not passed on */

    worker_t *w;
    int nw, running;
    int guard_fd;      /* write end of the guardian's pipe (orphans.c), -1 without one */
    int guard_done_fd; /* reads end-of-file when the guardian has exited */
    pid_t guard_pid;   /* not the agent's child (unless the agent is pid 1) */
    phase_t phase;
    outcome_t outcome;
    int signo, sigint_count;
    char stop_note[512];
    int no_restart;     /* the group cannot be restarted (spawn failure, a signalled node) */
    failure_t *fails;
    int nfails;
    struct dt_agent_flight *flight; /* flight_agent.c's state, NULL until used */
    double preflight_s;             /* how long this round's preflight took */
    int preflight_off;              /* this round's nodes skip the preflight (a node's --no-preflight):
                                     * the workers skip the communicator's health check too */
    char readbuf[65536];
} agent_t;

/* ---- spawn.c ---- */

/* Starts worker w of the current round (w->rank, w->local_rank set): its run
 * directory attempt_<restart>/<rank>/ (error.json, per-rank logs), its pipes
 * read on ag->loop, its process. On failure nothing of w is left running. */
dt_status_t dt_agent_spawn_worker(agent_t *ag, worker_t *w);
/* After w exited: reads what is left in its pipes without blocking, then closes them. */
void dt_agent_drain_pipes(worker_t *w);
/* Signals each worker's process group, also once its leader exited (what it left
 * behind is in the group), and each running worker itself if it left its group. */
void dt_agent_signal_workers(agent_t *ag, int sig);
/* Before the SIGTERM of a stop after a failure (not a signal to the agent): each
 * live worker gets SIGTERM by sigqueue with DT_STOP_GROUP_FAILURE (torchenv.h), so
 * the built-in trainer stops without a preemption save. */
void dt_agent_signal_group_failure(agent_t *ag);

/* ---- orphans.c ---- */

/* Makes the agent a child subreaper and forks the guardian (before any thread or
 * socket exists). Without either it warns and the run goes on. */
void dt_agent_orphans_init(agent_t *ag);
/* Tells the guardian that process group pgid is a worker's, to kill if the agent dies. */
void dt_agent_orphans_watch(agent_t *ag, pid_t pgid);
/* A worker was reaped: when its process group is already empty it is marked gone and
 * the guardian forgets it, so the group's number, free for reuse from now on, is never
 * signalled (a group with processes left keeps its number while they live). */
void dt_agent_orphans_reaped(agent_t *ag, worker_t *w);
/* The round is over (every worker reaped): SIGKILLs each worker's process group and
 * every other child of the agent (descendants re-parented to it), and tells the
 * guardian to forget the groups. */
void dt_agent_orphans_sweep(agent_t *ag);
/* An orderly end: the guardian leaves without killing anything and is reaped. */
void dt_agent_orphans_end(agent_t *ag);

/* ---- preflight.c ---- */

/* After the round's rendezvous (ag->rz; NULL: one node, only this node's own checks),
 * before any worker: every node's record (version, launch flags, spec->preflight_desc)
 * compared with node 0's, every pair of nodes connected on the collectives' address.
 * Differences are DT_STATUS_CONFIG (exit 2) and a pair that cannot connect
 * DT_STATUS_RENDEZVOUS (exit 3), their lines printed on stderr, the same on every
 * node; warnings (clock, slots, memory, GPUs) are logged. With spec->check_only the
 * table per node goes to stdout. ag->preflight_s gets the time it took. */
dt_status_t dt_agent_preflight(agent_t *ag);
/* --no-preflight on a multi-node launch: posts this node's record as "skip" without
 * waiting, so that the nodes that run the preflight skip it too (with a warning
 * naming this node) instead of waiting for a record that never comes. */
dt_status_t dt_agent_preflight_skip(agent_t *ag);

/* ---- preflight_gpu.c ---- */

/* A record's value by key (NULL when absent): how preflight_gpu.c reads records. */
typedef const char *(*dt_pf_get_fn)(const void *rec, const char *key);
/* 1 when this launch's workers compute on GPUs: a config run's device; under --exec
 * and bench comm, the visible GPUs are taken to be used. */
int dt_pf_gpu_run(const dt_launch_spec_t *sp);
/* Appends this node's GPU lines (the GPUs its ranks will use, as NVML reports them)
 * to out; returns the bytes written (0: not a GPU run, or no driver to ask). */
size_t dt_pf_gpu_record(const dt_launch_spec_t *sp, char *out, size_t cap);
/* Judges one node's GPU lines (rec0: node 0's, for the model): err gets the GPUs a
 * rank must not use (uncorrectable ECC errors, row remapping), warn what is odd (not
 * alike, another model than node 0's, less memory than a rank needs), cell the table's
 * text. Returns the number of bad GPUs. */
int dt_pf_gpu_judge(dt_pf_get_fn get, const void *rec, const void *rec0, char *err, size_t errlen, char *warn,
                    size_t warnlen, char *cell, size_t celllen);

/* ---- elastic.c ---- */

/* 1 for --nnodes MIN:MAX with MIN < MAX. */
int dt_agent_elastic(const agent_t *ag);
/* The flag file the workers of this round poll (DTRUN_RESIZE_FILE). */
void dt_agent_elastic_flag_path(const agent_t *ag, char *buf, size_t len);
/* A node waits to be admitted: creates the flag file (the workers stop at their next
 * checkpoint boundary). */
void dt_agent_elastic_request(agent_t *ag);
/* A worker exited with wstatus: 1 when it stopped for a resize (then the round ends
 * as OUTCOME_RESIZE, and the store says so to the other agents). */
int dt_agent_elastic_exit(agent_t *ag, int wstatus);

/* ---- failure.c ---- */

/* "SIGTERM" for 15 ("<N/A>" for an unknown number); a static buffer. */
const char *dt_agent_signame(int sig);
/* The failure record of reaped worker w: its error file's message, else the
 * last lines of its stderr. message is malloc'ed. */
failure_t dt_agent_worker_failure(agent_t *ag, worker_t *w);
/* Appends f (taking its message) to this node's failures of the round. */
void dt_agent_add_failure(agent_t *ag, const failure_t *f);
/* f as one line of JSON ending in '\n' (malloc'ed): what the store's failure list holds. */
char *dt_agent_failure_json(const failure_t *f);
/* One "lost" failure line per rank of node nd, reason as the message (malloc'ed JSONL). */
char *dt_agent_lost_node_failures(const dt_rdzv_node_t *nd, const char *reason);
/* The job is over and failed: prints torchrun's summary of every node's failures
 * (from the store when there is one, else this node's), or the stop reason. */
void dt_agent_report_failures(agent_t *ag);
/* A worker's exit 2 (it refused the config: memory, a check only a rank can make):
 * one line naming the rank and its reason, instead of the failure summary (its own
 * message is above it in the log; nothing to restart, no collective to look for). */
void dt_agent_report_refusal(agent_t *ag);
/* The exit code of the round's first observed failure (every node's when there is a
 * store), -1 when none: 2 (the built-in trainer refused its config or input: the
 * memory check, a bad file) and DT_EXIT_PREFLIGHT (its communicator's health check
 * failed) are what a restart would only repeat. */
int dt_agent_failure_first_exit(agent_t *ag);
void dt_agent_failures_free(failure_t *fs, int n);

/* ---- flight_agent.c (the workers' flight recorders) ---- */

/* The first failure of the round (why): every local rank's ring to
 * <run_dir>/flight/rank_NNNNN.json, its last ops posted for the other agents,
 * the analysis logged. Once per round; call before signalling the workers. */
void dt_agent_flight_collect(agent_t *ag, const char *why);
/* The analysis of every rank posted this round (msg: one finding per line);
 * returns the number of ranks named in culprits[] (the ranks that never
 * arrived or desynced). */
int dt_agent_flight_analyse(agent_t *ag, char *msg, size_t len, int *culprits, int max);
/* host and pid of a rank posted this round; 0 when it was not posted. */
int dt_agent_flight_rank_info(agent_t *ag, int rank, char *host, size_t hlen, long *pid);
/* Every tick: answers `dtrun debug dump` requests (at most every 0.5 s). */
void dt_agent_flight_poll(agent_t *ag);
/* The summary's root cause: the rank the analysis names (its failure, the finding
 * put first; else a record made for it and appended to *fs). -1: none named. */
int dt_agent_flight_root(agent_t *ag, failure_t **fs, int *n);
void dt_agent_flight_free(agent_t *ag);
/* Multi-node, when this node collected this round: waits up to max_s for the
 * records of expect ranks (every node's) in the store, so the summary analyses
 * the whole group and not only the ranks of the node that failed first. Returns
 * the ranks posted. */
int dt_agent_flight_wait(agent_t *ag, int expect, double max_s);

#endif /* DT_RUNTIME_LAUNCH_AGENT_IMPL_H */
