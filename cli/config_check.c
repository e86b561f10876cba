/*
 * config_check.c - dt_cli_config_check: what the launcher checks in a config before
 * anything starts, also what `dtrun config` answers with (config_check.h).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/config_check.h"
#include "common/fs.h"      /* defines: dt_fs_self_exe */
#include "common/gpuinfo.h" /* defines: dt_gpuinfo_count */
#include "runtime/train/train_ckpt.h"    /* defines: dt_train_ckpt_check_start */
#include "runtime/train/train_elastic.h" /* defines: dt_train_elastic_check */
#include "runtime/train/trainer.h" /* defines: dt_trainer_check_pretrained, dt_trainer_check_data, dt_trainer_check_paths */

/* Whether a CUDA worker could load the CUDA library, asked of a short child
 * (`dtrun __cuda_probe`, fork + exec) so that the agent itself never maps CUDA.
 * The child prints the loader's message; returns its exit status (0: loadable). */
static int cuda_probe(void) {
    char self[PATH_MAX];
    if (dt_fs_self_exe(self, sizeof self) != DT_STATUS_OK) return 0; /* the worker will say */
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        execl(self, self, "__cuda_probe", (char *)NULL);
        _exit(127);
    }
    int ws;
    while (waitpid(pid, &ws, 0) < 0)
        if (errno != EINTR) return 0;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : DT_EXIT_FAILED;
}

/* A failed check's detail as one line on stderr; the check's status as a config error. */
static dt_status_t said(const dt_cli_config_req *req, const char *what) {
    fprintf(stderr, "%s: error: %s%s\n", req->who, what ? what : "", dt_error_detail());
    return DT_STATUS_CONFIG;
}

dt_status_t dt_cli_config_check(const dt_cli_config_req *req, dt_config_t *cfg, int64_t *elastic_pick) {
    *elastic_pick = 0;
    dt_status_t st = dt_config_load(req->path, req->overrides, req->n_overrides, cfg);
    if (st == DT_STATUS_OK && req->nnodes_min == req->nnodes_max)
        st = dt_config_resolve(cfg, req->nnodes_max * req->nproc_per_node);
    if (st == DT_STATUS_OK) /* elastic or not: a TP group must fit in each node */
        st = dt_config_check_nodes(cfg, req->nproc_per_node);
    if (st != DT_STATUS_OK) return DT_STATUS_CONFIG; /* the errors are in cfg */
    /* elastic: train_batch_size must be reachable at every size */
    if (dt_train_elastic_check(cfg, req->nnodes_min, req->nnodes_max, req->nproc_per_node, elastic_pick) !=
        DT_STATUS_OK)
        return said(req, NULL);
    if (dt_trainer_check_pretrained(cfg) != DT_STATUS_OK) return said(req, "model.pretrained: ");
    if (dt_trainer_check_data(cfg) != DT_STATUS_OK) return said(req, NULL);
    if (dt_trainer_check_paths(cfg) != DT_STATUS_OK) return said(req, NULL);
    if (dt_train_ckpt_check_start(cfg) != DT_STATUS_OK) return said(req, NULL); /* never onto another run's */
    if (cfg->device == DT_CONFIG_DEVICE_CUDA && dt_gpuinfo_count() == 0) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        fprintf(stderr, "%s: error: device cuda: no GPU is visible on this node%s%s%s\n", req->who,
                vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", vis ? ")" : "");
        return DT_STATUS_CONFIG;
    }
    if (dt_config_uses_cuda(cfg) && cuda_probe() != 0)
        return DT_STATUS_CONFIG; /* device cuda, or auto on a node with a GPU: the probe said why */
    return DT_STATUS_OK;
}
