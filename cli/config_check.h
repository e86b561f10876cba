/*
 * config_check.h - the one check of a config before anything starts, shared by the
 * launcher (cmd_launch.c) and `dtrun config` (cmd_config.c), so that `dtrun config`
 * says "valid" (exit 0) exactly when the launcher would start workers for the same
 * config and world size, and exit 2 when it would refuse.
 */
#ifndef DT_CLI_CONFIG_CHECK_H
#define DT_CLI_CONFIG_CHECK_H

#include <stdint.h>

#include "runtime/config/config.h" /* defines: dt_config_t */

typedef struct dt_cli_config_req {
    const char *path;                /* CONFIG.json */
    const char *const *overrides;    /* KEY=VALUE ... */
    int n_overrides;
    int nnodes_min, nnodes_max;      /* equal unless elastic */
    int nproc_per_node;              /* ranks per node */
    const char *who;                 /* message prefix: "dtrun", "dtrun config" */
} dt_cli_config_req;

/* Loads the config (*cfg: dt_config_free it whatever this returns), resolves it for
 * nnodes x nproc_per_node ranks when the world is fixed, and runs every check the
 * launcher runs before a worker starts: the config table's, a TP group within a node,
 * the elastic batch, model.pretrained's tensors, the data files and their vocabulary,
 * the folders to write, checkpoint.resume, another run's checkpoints, device cuda
 * (a GPU visible, the CUDA library loadable). Returns DT_STATUS_OK, or
 * DT_STATUS_CONFIG with the reasons printed on stderr ("WHO: error: ..." lines; the
 * config table's own errors are left in cfg for the caller to print). elastic_pick:
 * the train_batch_size an elastic run without one gets (0: none). */
dt_status_t dt_cli_config_check(const dt_cli_config_req *req, dt_config_t *cfg, int64_t *elastic_pick);

#endif /* DT_CLI_CONFIG_CHECK_H */
