/*
 * elastic.c - the agent's side of an elastic run (--nnodes MIN:MAX; the
 * rendezvous side is in rdzv.c, the trainer's in runtime/train/train_elastic.c):
 * a node waiting to be admitted becomes a request to the workers (a flag file they
 * poll at checkpoint boundaries), and workers that stop with DT_EXIT_RESIZE end the
 * round as a resize: the agents re-rendezvous without using up --max_restarts.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "runtime/launch/agent_impl.h"

int dt_agent_elastic(const agent_t *ag) { return ag->spec->nnodes_min < ag->spec->nnodes_max; }

void dt_agent_elastic_flag_path(const agent_t *ag, char *buf, size_t len) {
    snprintf(buf, len, "%s/resize_r%d", ag->run_dir, ag->restart_count);
}

void dt_agent_elastic_request(agent_t *ag) {
    char path[PATH_MAX];
    dt_agent_elastic_flag_path(ag, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        DT_LOG_WARN("elastic: cannot create %s to ask the workers for a resize: %s", path, strerror(errno));
        return;
    }
    close(fd);
    DT_LOG_INFO("elastic: a node waits to join the %d-node round: the workers save at the next checkpoint and "
                "the group re-rendezvous (up to %d nodes)", ag->nnodes, ag->spec->nnodes_max);
}

int dt_agent_elastic_exit(agent_t *ag, int wstatus) {
    if (!ag->rz || !dt_agent_elastic(ag) || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != DT_EXIT_RESIZE) return 0;
    if (!ag->resize_exit) {
        ag->resize_exit = 1;
        if (dt_rdzv_mark_resizing(ag->rz) != DT_STATUS_OK) DT_LOG_WARN("%s", dt_error_detail());
    }
    return 1;
}
