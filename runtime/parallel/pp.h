/*
 * pp.h - the pipeline engine: runs one optimizer step's micro-batches through a
 * pipeline schedule (pp_sched.h) on this rank's chunks of the model, exchanging the
 * boundary activations and their gradients with the neighbouring stages point to
 * point, and keeps a tied head's copy of the embedding in step with the first stage.
 *
 * Communicators: the PP group (stage s = its rank there) is split twice, one copy
 * carrying activations forward and one carrying gradients back, so that each link's
 * messages arrive in the order they were sent whatever the schedule interleaves
 * (tests/test_pp_sched.c: links_match). Sends are asynchronous: a stage computes while
 * its output travels. The receive of the next action is posted before the current one
 * computes (pp_sched.h: receiving ahead), into the arena the next forward will use
 * (net.h: dt_net_arenas), so a transfer overlaps compute and the arenas held at once
 * are dt_pp_arenas(...).
 *
 * Tied head (a model whose head is its embedding, on P > 1 stages): the last stage
 * holds a copy of the embedding's rows (net.h: head_w, head_dw; parameters and gradient
 * only, no optimizer state). Its gradient, summed over the step's micro-batches, goes
 * to the first stage at the end of its last backward and is added to the embedding's
 * gradient there just before that unit's last backward hook (so the data-parallel
 * reduction, clipping and the optimizer see the tie's whole gradient, once); after
 * the optimizer step the first stage sends the updated rows back (dt_pp_sync_tied).
 * Both travel on a communicator of the first and last stage (Megatron's embedding
 * group).
 *
 * Measured per step: the time blocked waiting for a neighbour (receives, and sends
 * that must finish before their arena is reused or the step ends) over the pipeline
 * phase's time is the stage's bubble; the rest is its compute. Bytes sent point to
 * point are counted.
 *
 * Hidden test facility: DTRUN_PP_TEST_DELAY_MS=F adds F ms after every forward and 2F
 * after every backward (a model with balanced stages whose compute does not depend
 * on how many processes share the CPU), for the bubble test.
 */
#ifndef DT_RUNTIME_PP_H
#define DT_RUNTIME_PP_H

#include "common/status.h"
#include "kernels/kernels.h"          /* defines: dt_device_t */
#include "runtime/comm/comm.h"        /* defines: dt_comm_t */
#include "runtime/model/net.h"        /* defines: dt_net_t, dt_batch */
#include "runtime/parallel/dp.h"      /* defines: dt_dp_t */
#include "runtime/layout/pp_sched.h" /* defines: dt_pp_schedule_t */
#include "runtime/parallel/tp.h"      /* defines: dt_tp_t */

typedef struct dt_pp dt_pp_t;

typedef struct dt_pp_opts {
    dt_pp_schedule_t schedule;
    int stages, virtual_stages, micro_batches;
    dt_comm_t *pp_comm; /* the PP group (not owned) */
    dt_tp_t *tp;        /* the net's TP collectives (errors checked after each action); NULL */
    double test_delay_ms; /* DTRUN_PP_TEST_DELAY_MS */
} dt_pp_opts;

/* Binds the engine to net (its layout is this rank's stage; net->hook must be dp's,
 * installed by dt_dp_init: the engine wraps it) and creates its communicators
 * (collective over the PP group). */
dt_status_t dt_pp_init(dt_pp_t **out, const dt_pp_opts *opts, dt_device_t *dev, dt_net_t *net, dt_dp_t *dp);
void dt_pp_free(dt_pp_t *pp);

/* One step's forward and backward passes: batches[mb] is micro-batch mb's host data
 * (every stage passes the same; the first reads the tokens, the last the targets);
 * dscale scales the gradient of the summed row losses as dt_net_backward's. Calls dp's
 * micro-step hooks around each backward. *loss_sum gets the sum of the micro-batches'
 * mean losses on the stage holding the last chunk, NAN elsewhere. */
dt_status_t dt_pp_step(dt_pp_t *pp, const dt_batch *batches, float dscale, double *loss_sum);

/* Forward only (evaluation): batch through every stage's chunks in pipeline order,
 * one micro-batch; *loss = its mean loss on the last stage, NAN elsewhere. */
dt_status_t dt_pp_forward_only(dt_pp_t *pp, const dt_batch *batch, double *loss);

/* After dt_dp_init / a checkpoint load / every optimizer step: the last stage's copy of
 * a tied embedding gets the first stage's current rows (collective over the first and
 * last stage and the first stage's DP group). No-op without a tied copy. */
dt_status_t dt_pp_sync_tied(dt_pp_t *pp);

/* The last step's figures on this rank. */
typedef struct dt_pp_stats {
    double pipeline_ms; /* the schedule's forward and backward passes */
    double wait_ms;     /* blocked on a neighbour within it */
    double bubble;      /* wait_ms / pipeline_ms */
    double p2p_bytes;   /* sent point to point */
    int arenas;         /* activation arenas held at most */
} dt_pp_stats;
void dt_pp_get_stats(const dt_pp_t *pp, dt_pp_stats *out);

#endif /* DT_RUNTIME_PP_H */
