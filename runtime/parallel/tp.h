/*
 * tp.h - tensor parallelism's communicator side: fills a net's TP collective seam
 * (runtime/model/net.h: dt_net_tp_ops) with the TP group's communicator, and the rank
 * layout of a run cut in TP groups.
 *
 * Rank layout: runtime/layout/layout.h's (world = TP x PP x DP with TP innermost, so
 * the T ranks of a TP group are consecutive and live on one node; then the pipeline
 * stages; the DP group of rank r is the ranks with the same TP rank and stage). The
 * model calls the
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

/* Where a rank sits in world = TP x PP x DP (the layout's coordinates,
 * runtime/layout/layout.h: rank = (dp_rank * pp_size + pp_rank) * tp_size + tp_rank);
 * sizes that do not divide the world give DP 0. */
typedef struct dt_tp_place {
    int tp_size, tp_rank, pp_size, pp_rank, dp_size, dp_rank;
    int cp_size, cp_rank; /* context parallelism (1, 0: off) */
} dt_tp_place;
dt_tp_place dt_tp_place_of(int rank, int world_size, int tp_size, int cp_size, int pp_size);

/* Splits world into this rank's TP group (same DP, CP and PP coordinates, ordered by
 * TP rank), CP group (same DP, TP and PP, ordered by CP rank), PP group (same DP, CP
 * and TP, ordered by stage) and the group that reduces its gradients, dp_comm (same
 * TP and PP: the DP x CP ranks, ordered by DP rank then CP rank; CP 1: the DP group);
 * collective over world. A group of one rank comes back NULL; pp_comm and cp_comm
 * may be NULL when their size is 1. */
dt_status_t dt_tp_split(dt_comm_t *world, int tp_size, int cp_size, int pp_size, dt_comm_t **tp_comm,
                        dt_comm_t **cp_comm, dt_comm_t **pp_comm, dt_comm_t **dp_comm);

/* Binds net's TP seam to comm (the TP group; not owned). */
dt_status_t dt_tp_init(dt_tp_t **out, dt_comm_t *comm, dt_device_t *dev, dt_net_t *net);
void dt_tp_free(dt_tp_t *tp);
/* The first failed collective since the last call (then clears it). */
dt_status_t dt_tp_check(dt_tp_t *tp);
/* Milliseconds blocked in TP collectives since the last call. */
double dt_tp_take_comm_ms(dt_tp_t *tp);

#endif /* DT_RUNTIME_TP_H */
