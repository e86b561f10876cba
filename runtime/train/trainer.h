/*
 * trainer.h - the training loop a worker runs: config -> device -> model ->
 * data -> steps of (micro-batches of forward/backward, gradient reduction,
 * clipping, AdamW, schedule) -> metrics, evaluation, summary, sample.
 */
#ifndef DT_RUNTIME_TRAINER_H
#define DT_RUNTIME_TRAINER_H

#include "common/status.h"
#include "common/torchenv.h"         /* defines: dt_torchenv_t (RANK, WORLD_SIZE, ...) */
#include "runtime/config/config.h" /* defines: dt_config_t */

/* Runs the whole training described by cfg (already loaded and resolved for
 * env->world_size), as the rank env describes (dt_torchenv_read). Rank 0 prints progress and writes the log directory. */
dt_status_t dt_trainer_run(const dt_config_t *cfg, const dt_torchenv_t *env);

/* model.pretrained's weight files hold every tensor the configured model needs, with
 * its shape (headers only, no weights read): the launcher's check before workers
 * start. OK when model.pretrained is not set. */
dt_status_t dt_trainer_check_pretrained(const dt_config_t *cfg);

/* Every data.train source (and data.val) matches a file, the sources are one kind,
 * uint32 shards come with model.vocab_size, and under tensor parallelism the
 * vocabulary taken from the data divides among the TP ranks, and every file passes
 * the loader's own checks (dt_data_check_files): the launcher's check before workers
 * start. Errors name the key (data.train[1]). LoRA's checks come first
 * (train_lora.h: dt_train_lora_check_). */
dt_status_t dt_trainer_check_data(const dt_config_t *cfg);

/* log.dir can be created and written (its nearest existing ancestor is a writable
 * directory), and a checkpoint.resume PATH is a checkpoint the reader opens whose
 * layout is the configured model's: the launcher's check before workers start.
 * Errors are DT_STATUS_CONFIG naming the key. */
dt_status_t dt_trainer_check_paths(const dt_config_t *cfg);

/* What must be equal on every node of a multi-node run, for the launcher's preflight
 * (train_preflight.c): *out (malloc'ed) gets one "key\tvalue\n" line per key: the
 * resolved config flattened to dotted keys without the keys that may differ per node
 * (log.dir, checkpoint.dir, tensorboard.output_path, threads, data.prefetch,
 * comm.timeout_s, the data and pretrained paths), each data file's name, size and
 * header digest and model.pretrained's index digest. */
dt_status_t dt_trainer_preflight_desc(const dt_config_t *cfg, char **out);
/* The health check of the job's communicator (comm_bench.h: dt_comm_health_run)
 * when the launcher asked for it (DT_PREFLIGHT_COMM_ENV, common/torchenv.h): rank 0 prints the
 * figures; a problem on any rank is DT_STATUS_RENDEZVOUS (exit 3) on every rank. */
struct dt_comm;
struct dt_device;
dt_status_t dt_trainer_comm_health_(struct dt_comm *comm, struct dt_device *dev, int local_world_size, int rank);
/* 1 when this process's health check failed (the worker exits DT_EXIT_PREFLIGHT). */
int dt_trainer_preflight_failed(void);
/* The host bytes a node's local_world_size CPU ranks need (gpu 0), or the GPU bytes
 * one rank needs (gpu 1): plan's arithmetic, as the workers' memory check prices them,
 * for the preflight; cfg resolved for world_size. */
dt_status_t dt_trainer_preflight_mem(const dt_config_t *cfg, int world_size, int local_world_size, int gpu,
                                     double *need);

#endif /* DT_RUNTIME_TRAINER_H */
