/*
 * cmd_check_rank.c - `dtrun __comm_check_rank --device cpu|cuda|auto`, the hidden
 * per-rank command of `dtrun check` (cli/cmd_launch.c): after the agents' preflight
 * passed, each rank opens its device (GPU LOCAL_RANK % visible for cuda, as the
 * trainer does), creates the job's communicator from the launcher's environment
 * and runs the communicator's health check the built-in trainer runs before its
 * first step (dt_trainer_comm_health_); nothing is trained. Exit 0, or
 * DT_EXIT_PREFLIGHT when the check found a problem (the launcher exits 3), or the
 * status's code.
 */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "common/log.h"
#include "kernels/kernels.h"
#include "runtime/comm/comm.h"
#include "runtime/train/trainer.h" /* defines: dt_trainer_comm_health_ */

static int fail(int rank, const char *what, dt_status_t st) {
    fprintf(stderr, "dtrun rank %d: check: %s: %s\n", rank, what, dt_error_detail());
    return dt_trainer_preflight_failed() ? DT_EXIT_PREFLIGHT : (int)dt_status_exit_code(st);
}

int dt_cmd_comm_check_rank(int argc, char **argv) {
    const char *device = "auto";
    if (argc == 3 && !strcmp(argv[1], "--device")) device = argv[2];
    dt_comm_config_t cfg;
    dt_status_t st = dt_comm_config_from_env(&cfg);
    if (st != DT_STATUS_OK) return fail(-1, "the launcher's environment", st);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "dtrun rank %d", cfg.rank);
    dt_log_set_prefix(prefix);
    int ngpu = strcmp(device, "cpu") ? dt_device_count(DT_DEVICE_CUDA) : 0;
    if (!strcmp(device, "cuda") && ngpu <= 0) return fail(cfg.rank, "device cuda", dt_error(DT_STATUS_CONFIG, "no GPU is visible"));
    dt_device_t *dev = NULL;
    if (ngpu > 0) {
        dt_device_opts_t opts = {.kind = DT_DEVICE_CUDA, .nthreads = 1, .ordinal = cfg.local_rank % ngpu,
                                 .dtype = DT_DTYPE_F32};
        if ((st = dt_device_open(&dev, &opts)) != DT_STATUS_OK) return fail(cfg.rank, "opening the GPU", st);
        cfg.stage_dev = dev; /* shm/tcp/hier stage through host memory; NCCL ignores it */
        if (cfg.local_world_size <= ngpu) cfg.device = dev->ordinal; /* backend auto picks NCCL */
    }
    dt_comm_t *comm = NULL;
    int code = DT_EXIT_OK;
    if ((st = dt_comm_init(&cfg, &comm)) != DT_STATUS_OK) {
        code = fail(cfg.rank, "creating the communicator", st);
    } else {
        st = dt_trainer_comm_health_(comm, dev, cfg.local_world_size, cfg.rank);
        if (st != DT_STATUS_OK) code = fail(cfg.rank, "the communicator's health check", st);
        dt_comm_free(comm);
    }
    if (dev) dt_device_free(dev);
    return code;
}
