/*
 * layout.h - the parallel layout of a run: how its world of ranks is cut into
 * groups along each parallel dimension, and where one rank sits.
 *
 * world = TP x CP x PP x DP with TP innermost, then CP, then PP, then DP (rank =
 * ((dp_rank * pp_size + pp_rank) * cp_size + cp_rank) * tp_size + tp_rank): the T
 * ranks of a TP group are consecutive (and live on one node), the C ranks of a
 * context-parallel group are T apart (each holds 1/C of every sequence), the P
 * stages of a pipeline are T x C apart, the DP group of a rank is the ranks with its
 * TP rank, CP rank and stage. Parameters are replicated over CP as over DP: the
 * gradients of a CP group join the DP reduction (dt_layout_group_index_dp_cp). The configured sizes are
 * every dimension's but DP's; DP is what is left of the world (world / (TP x PP)),
 * derived here and nowhere else.
 *
 * A new dimension (context parallel, expert parallel) is one more dt_layout_dim_t
 * value at its place in the nesting order, its row in dim_rows (layout.c), and its
 * config key: callers read sizes and coordinates through the arrays or the named
 * accessors and do not change.
 */
#ifndef DT_RUNTIME_LAYOUT_H
#define DT_RUNTIME_LAYOUT_H

#include <stdint.h>

#include "common/status.h" /* defines: dt_status_t */

/* The dimensions in nesting order, innermost first; DP, the derived one, last. */
typedef enum dt_layout_dim {
    DT_LAYOUT_TP, /* tensor parallel: tensor_parallel.size */
    DT_LAYOUT_CP, /* context parallel: context_parallel.size */
    DT_LAYOUT_PP, /* pipeline parallel: pipeline.stages */
    DT_LAYOUT_DP, /* data parallel: the rest of the world */
    DT_LAYOUT_N_DIMS
} dt_layout_dim_t;

/* The configured sizes: size[d] for every dimension but DP (< 1 counts as 1; DP's
 * is ignored). */
typedef struct dt_layout_dims {
    int64_t size[DT_LAYOUT_N_DIMS]; /* as the config holds them (its bounds keep them int-sized) */
} dt_layout_dims;

/* A world cut by the dims, and one rank in it. */
typedef struct dt_layout {
    int world_size;
    int size[DT_LAYOUT_N_DIMS];   /* every group's size, DP's derived */
    int stride[DT_LAYOUT_N_DIMS]; /* rank distance between neighbours of a group */
    int rank;
    int coord[DT_LAYOUT_N_DIMS]; /* the rank's place in each of its groups */
} dt_layout;

/* The dims of a TP x PP run (CP 1). */
dt_layout_dims dt_layout_dims_tp_pp(int64_t tp_size, int64_t pp_size);
/* The dims of a TP x CP x PP run. */
dt_layout_dims dt_layout_dims_of(int64_t tp_size, int64_t cp_size, int64_t pp_size);

/* Cuts world_size ranks by dims and places rank (0 when only sizes are wanted) in
 * it. DT_STATUS_CONFIG when the world is < 1 or the configured sizes do not divide
 * it, with the message the config prints (naming its keys; dt_error_detail); *out
 * then holds DP size 0 (the rest as far as it goes: the coordinates of TP and PP,
 * DP's rank / (TP x PP)). */
dt_status_t dt_layout_of(const dt_layout_dims *dims, int world_size, int rank, dt_layout *out);

/* The ranks of one model replica: every dimension's size but DP's (TP x CP x PP). */
int dt_layout_replica_size(const dt_layout *l);

/* The index of the rank's group along dim among the world's groups along it: the
 * other coordinates in rank order, innermost fastest (the colour of dt_comm_split).
 * Its rank in that group is coord[dim]. */
int dt_layout_group_index(const dt_layout *l, dt_layout_dim_t dim);

/* The group that reduces the gradients: the ranks with the rank's TP rank and stage
 * (DP x CP of them), its index among the world's such groups (TP rank + TP x stage)
 * and the rank's place in it (dp_rank x CP + cp_rank). */
int dt_layout_group_index_dp_cp(const dt_layout *l);
int dt_layout_rank_dp_cp(const dt_layout *l);

/* The config key that sets a dimension ("tensor_parallel.size", ...; DP: NULL). */
const char *dt_layout_dim_key(dt_layout_dim_t dim);

static inline int dt_layout_tp_size(const dt_layout *l) { return l->size[DT_LAYOUT_TP]; }
static inline int dt_layout_pp_size(const dt_layout *l) { return l->size[DT_LAYOUT_PP]; }
static inline int dt_layout_cp_size(const dt_layout *l) { return l->size[DT_LAYOUT_CP]; }
static inline int dt_layout_cp_rank(const dt_layout *l) { return l->coord[DT_LAYOUT_CP]; }
static inline int dt_layout_dp_size(const dt_layout *l) { return l->size[DT_LAYOUT_DP]; }
static inline int dt_layout_tp_rank(const dt_layout *l) { return l->coord[DT_LAYOUT_TP]; }
static inline int dt_layout_pp_rank(const dt_layout *l) { return l->coord[DT_LAYOUT_PP]; }
static inline int dt_layout_dp_rank(const dt_layout *l) { return l->coord[DT_LAYOUT_DP]; }

#endif /* DT_RUNTIME_LAYOUT_H */
