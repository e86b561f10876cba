/*
 * torchenv.h - the torchrun environment a worker is started with (docs/interface.md
 * "Environment of each worker"), read in one place: RANK, LOCAL_RANK,
 * WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
 * TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_RUN_ID.
 *
 * A variable that is unset (or empty) takes the single-process default; one
 * that is set must hold a value in range, else DT_STATUS_CONFIG names the
 * variable, its value and what was expected.
 */
#ifndef DT_COMMON_TORCHENV_H
#define DT_COMMON_TORCHENV_H

#include "common/status.h"

/* The launcher asks the built-in trainer's ranks for the communicator's health
 * check before the first step through it: "BYTES,ITERS,MIN_BUSBW_GBPS". */
#define DT_PREFLIGHT_COMM_ENV "DTRUN_PREFLIGHT_COMM"

typedef struct dt_torchenv {
    int rank;             /* RANK (default 0), in [0, world_size) */
    int world_size;       /* WORLD_SIZE (default 1) */
    int local_rank;       /* LOCAL_RANK (default rank), in [0, local_world_size) */
    int local_world_size; /* LOCAL_WORLD_SIZE (default world_size), in [1, world_size] */
    int group_rank;       /* GROUP_RANK: the node's rank (default 0) */
    const char *master_addr; /* MASTER_ADDR (NULL when unset) */
    int master_port;      /* MASTER_PORT (0 when unset), else in [1, 65535] */
    int restart_count;    /* TORCHELASTIC_RESTART_COUNT (default 0) */
    const char *run_id;   /* TORCHELASTIC_RUN_ID ("none" when unset, as torchrun) */
    int launched;         /* RANK was set: a launcher started this process */
} dt_torchenv_t;

/* Reads the variables above from the process environment into env (whose
 * strings point into the environment). */
dt_status_t dt_torchenv_read(dt_torchenv_t *env);

/* DT_STATUS_CONFIG naming the first of MASTER_ADDR, MASTER_PORT, WORLD_SIZE and
 * RANK that is not set: what a process needs to reach its peers' store. */
dt_status_t dt_torchenv_require_store(const dt_torchenv_t *env);

/* The agent's stop after a failure in the group (a worker died, a node was lost,
 * the store stopped answering), as opposed to a preemption: SIGTERM sent to each
 * worker with sigqueue() carrying this value, then to its process group as ever.
 * The built-in trainer reads it from siginfo (SI_QUEUE, sent by its parent) and
 * exits at once without the preemption save, which would only fail at the barrier
 * of a broken group; a plain SIGTERM (scheduler, user, the agent's own signal)
 * still saves. A program under --exec just gets SIGTERM. */
#define DT_STOP_GROUP_FAILURE 0x64744746 /* "dtGF" */

#endif /* DT_COMMON_TORCHENV_H */
