/*
 * trainer.h - the training loop a worker runs: config -> device -> model ->
 * data -> steps of (micro-batches of forward/backward, gradient reduction,
 * clipping, AdamW, schedule) -> metrics, evaluation, summary, sample.
 */
#ifndef DT_RUNTIME_TRAINER_H
#define DT_RUNTIME_TRAINER_H

#include "common/status.h"
#include "runtime/config/config.h" /* defines: dt_config_t */

typedef struct dt_trainer_env {
    int rank, world_size, local_rank, local_world_size;
    const char *master_addr;
    int master_port;
    const char *run_id;
} dt_trainer_env;

/* Reads RANK, WORLD_SIZE, ... from the environment (defaults: a single rank). */
dt_status_t dt_trainer_env_from_environ(dt_trainer_env *env);

/* Runs the whole training described by cfg (already loaded and resolved for
 * env->world_size). Rank 0 prints progress and writes the log directory. */
dt_status_t dt_trainer_run(const dt_config_t *cfg, const dt_trainer_env *env);

#endif /* DT_RUNTIME_TRAINER_H */
