/*
 * train_trace.c - the trainer's part of the job timeline (train_trace.h): the clock
 * offset to rank 0 (Cristian's method over the world communicator), the recorder's
 * start, and at the end the rank files and rank 0's merge.
 */
#define _GNU_SOURCE
#include "runtime/train/train_trace.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/fs_safe.h"
#include "common/log.h"
#include "common/trace.h"
#include "runtime/tools/timeline.h"

static int64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* One 8-byte message (two f32 slots carrying an int64's bits) to or from peer,
 * through buf (device memory on a GPU: the communicator takes device buffers). */
static dt_status_t xfer(dt_comm_t *world, dt_device_t *dev, void *buf, int64_t *v, int peer, int send) {
    const dt_ops_t *o = dev->ops;
    if (send) DT_CHECK(o->copy(dev, buf, v, sizeof *v, DT_COPY_HOST_TO_DEVICE));
    DT_CHECK(send ? dt_comm_send(world, buf, 2, DT_COMM_F32, peer) : dt_comm_recv(world, buf, 2, DT_COMM_F32, peer));
    if (!send) DT_CHECK(o->copy(dev, v, buf, sizeof *v, DT_COPY_DEVICE_TO_HOST));
    return DT_STATUS_OK;
}

dt_status_t dt_train_trace_clock(dt_comm_t *world, dt_device_t *dev, int64_t *offset_ns, int64_t *rtt_ns) {
    *offset_ns = *rtt_ns = 0;
    if (!world || dt_comm_size(world) == 1) return DT_STATUS_OK;
    int rank = dt_comm_rank(world), size = dt_comm_size(world);
    void *buf = NULL;
    DT_CHECK(dev->ops->alloc(dev, DT_MEM_COMM, 2 * sizeof(float), &buf));
    dt_status_t st = DT_STATUS_OK;
    int64_t best = -1, v;
    if (rank == 0) { /* the server: every other rank's pings in turn */
        for (int r = 1; r < size && st == DT_STATUS_OK; r++)
            for (int k = 0; k < DT_TRAIN_TRACE_PINGS && st == DT_STATUS_OK; k++) {
                st = xfer(world, dev, buf, &v, r, 0);
                v = wall_ns();
                if (st == DT_STATUS_OK) st = xfer(world, dev, buf, &v, r, 1);
            }
    } else {
        for (int k = 0; k < DT_TRAIN_TRACE_PINGS && st == DT_STATUS_OK; k++) {
            int64_t t_send = wall_ns(), off, rtt;
            v = t_send;
            st = xfer(world, dev, buf, &v, 0, 1);
            if (st == DT_STATUS_OK) st = xfer(world, dev, buf, &v, 0, 0);
            if (st != DT_STATUS_OK) break;
            dt_trace_cristian(t_send, v, wall_ns(), &off, &rtt);
            if (best < 0 || rtt < best) best = rtt, *offset_ns = off, *rtt_ns = rtt;
        }
    }
    dev->ops->free(dev, buf);
    if (st != DT_STATUS_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dt_error_detail());
        return dt_error(st, "log.trace: measuring rank %d's clock against rank 0's: %s", rank, why);
    }
    return DT_STATUS_OK;
}

dt_status_t dt_train_trace_start(const dt_config_t *cfg, dt_comm_t *world, dt_device_t *dev, int64_t first_step) {
    if (!cfg->log.trace) return DT_STATUS_OK;
    int64_t off, rtt;
    DT_CHECK(dt_train_trace_clock(world, dev, &off, &rtt));
    DT_CHECK(dt_trace_init((int)cfg->log.trace_steps, first_step - 1));
    dt_trace_set_clock(off, rtt);
    if (world && dt_comm_rank(world) != 0)
        DT_LOG_DEBUG("log.trace: clock offset to rank 0 %+.1f us (round trip %.1f us)", (double)off / 1e3,
                     (double)rtt / 1e3);
    return DT_STATUS_OK;
}

void dt_train_trace_stop(void) { dt_trace_free(); }

dt_status_t dt_train_trace_finish(const dt_config_t *cfg, const char *log_dir, dt_comm_t *world, int rank,
                                  int world_size) {
    if (!cfg->log.trace || !dt_trace_on()) return DT_STATUS_OK;
    char dir[4096], path[4200], host[64] = "";
    snprintf(dir, sizeof dir, "%s/trace", log_dir);
    DT_CHECK(dt_fs_check_target(dir, 1, "log.trace's folder"));
    DT_CHECK(dt_fs_mkdir_p(dir));
    snprintf(path, sizeof path, "%s/rank_%d.json", dir, rank);
    gethostname(host, sizeof host - 1);
    dt_trace_rank_info info = {.rank = rank, .world_size = world_size, .host = host,
                               .n_steps = (int)cfg->log.trace_steps};
    dt_status_t st = dt_trace_write_rank(path, &info);
    dt_trace_free(); /* the barrier and the merge are not the run's */
    DT_CHECK(st);
    if (world && world_size > 1) DT_CHECK(dt_comm_barrier(world));
    if (rank != 0) return DT_STATUS_OK;
    dt_timeline tl;
    snprintf(path, sizeof path, "%s/trace.json", log_dir);
    st = dt_timeline_from_ranks(log_dir, &tl);
    if (st == DT_STATUS_OK) {
        st = dt_timeline_write_json(&tl, path);
        if (st == DT_STATUS_OK) {
            printf("dtrun: trace: %zu events of %d rank(s) in %s (open it in https://ui.perfetto.dev)%s\n", tl.n,
                   tl.n_ranks, path, tl.dropped ? "; some spans did not fit the ring (see dropped)" : "");
            fflush(stdout);
        }
        dt_timeline_free(&tl);
    }
    if (st != DT_STATUS_OK) /* another node's files are on its own disk: dtrun trace merges them later */
        DT_LOG_WARN("log.trace: no merged trace.json: %s (the rank files stay in %s; `dtrun trace %s` merges them)",
                    dt_error_detail(), dir, log_dir);
    return DT_STATUS_OK;
}
