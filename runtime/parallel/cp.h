/*
 * cp.h - context parallelism's communicator side: fills a net's ring seam
 * (runtime/model/net.h: dt_net_cp_ops) with the CP group's communicator. Each
 * exchange sends a block to the next rank of the group and receives one from the
 * previous (point-to-point, both started at once, so a ring never waits on itself).
 * A failure is recorded here, the buffers keep valid memory, and dt_cp_check returns
 * it after the micro-step; the time the caller was blocked counts in tp_comm_ms'
 * sibling cp_comm_ms (dt_cp_take_comm_ms).
 */
#ifndef DT_RUNTIME_CP_H
#define DT_RUNTIME_CP_H

#include "common/status.h"
#include "kernels/kernels.h"   /* defines: dt_device_t */
#include "runtime/comm/comm.h" /* defines: dt_comm_t */
#include "runtime/model/net.h" /* defines: dt_net_t */

typedef struct dt_cp dt_cp_t;

/* Binds net's CP seam to comm (the CP group; not owned). UNSUPPORTED when the
 * device lacks the attention_block ops. */
dt_status_t dt_cp_init(dt_cp_t **out, dt_comm_t *comm, dt_device_t *dev, dt_net_t *net);
void dt_cp_free(dt_cp_t *cp);
/* The first failed exchange since the last call (then clears it). */
dt_status_t dt_cp_check(dt_cp_t *cp);
/* Milliseconds blocked in ring exchanges since the last call. */
double dt_cp_take_comm_ms(dt_cp_t *cp);

#endif /* DT_RUNTIME_CP_H */
