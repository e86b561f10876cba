/*
 * tp.h - tensor parallelism's communicator side: fills a net's TP collective seam
 * (runtime/model/net.h: dt_net_tp_ops) with the TP group's communicator, and the rank
 * layout of a run cut in TP groups.
 *
 * Rank layout (CONTRACT.md): world = TP x DP with TP innermost, so the T ranks of a TP
 * group are consecutive (rank r is TP rank r % T of group r / T) and live on one node;
 * the DP group of rank r is the ranks with the same TP rank. The model calls the
 * collectives inside its layers (blocking for it: its next op reads the result); a
 * failure is recorded here, the buffers keep valid memory, and dt_tp_check returns it
 * after the micro-step. The time the caller was blocked is kept apart from the
 * data-parallel communication's (metrics: tp_comm_ms).
 */
#ifndef DT_RUNTIME_TP_H
#define DT_RUNTIME_TP_H

#include <stddef.h>

#include "common/status.h"
#include "kernels/kernels.h"     /* defines: dt_device_t */
#include "runtime/comm/comm.h"   /* defines: dt_comm_t */
#include "runtime/model/net.h"   /* defines: dt_net_t */

typedef struct dt_tp dt_tp_t;

/* Where a rank sits: TP rank and group, DP rank and size. */
typedef struct dt_tp_place {
    int tp_size, tp_rank, dp_size, dp_rank;
} dt_tp_place;
dt_tp_place dt_tp_place_of(int rank, int world_size, int tp_size);

/* Splits world into the TP group (*tp_comm) and the DP group (*dp_comm) of this rank
 * (collective over world). A group of one rank comes back NULL. */
dt_status_t dt_tp_split(dt_comm_t *world, int tp_size, dt_comm_t **tp_comm, dt_comm_t **dp_comm);

/* Binds net's TP seam to comm (the TP group; not owned). */
dt_status_t dt_tp_init(dt_tp_t **out, dt_comm_t *comm, dt_device_t *dev, dt_net_t *net);
void dt_tp_free(dt_tp_t *tp);
/* The first failed collective since the last call (then clears it). */
dt_status_t dt_tp_check(dt_tp_t *tp);
/* Milliseconds blocked in TP collectives since the last call. */
double dt_tp_take_comm_ms(dt_tp_t *tp);

#endif /* DT_RUNTIME_TP_H */
