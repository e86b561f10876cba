/*
 * rdzv.h - the multi-node rendezvous of the agents, over node 0's store.
 *
 * Keys live under "/dtrun/<run_id>/r<round>/". Joining a round is a constant
 * number of store operations per agent plus one MULTI_GET of the node records:
 *   1. (fixed ranks) COMPARE_SET claim/<node_rank>, COMPARE_SET nnodes: a clash is
 *      APPENDed to "error" (duplicate node rank, rank out of range, --nnodes differs);
 *   2. (assigned ranks) the host is node 0, ADD arrivals 1 -> the others' node rank;
 *      ADD joined 1 -> the count;
 *   3. SET node/<rank> (host, nproc) and hb/<rank>;
 *   4. the agent that completes the count SETs "complete" (with MIN:MAX, the agent
 *      that reaches MIN closes the round after last_call_timeout if MAX is not reached);
 *   5. WAIT complete (join_timeout); CHECK error; MULTI_GET node/0..n-1.
 * During the round each agent SETs its heartbeat counter and reads everyone's every
 * heartbeat interval; a counter unchanged for 3 intervals (measured on the reader's
 * monotonic clock, so no clock sync is needed) marks that node lost: it is declared
 * lost within 4 intervals plus one store round trip. The first agent to see a failure
 * COMPARE_SETs "stop"; the others see it at their next tick (monitor interval).
 *
 * Elastic runs (--nnodes MIN:MAX, assigned ranks): an agent that finds its round
 * already closed ("complete" set) does not fail: it ADDs 1 to the round's "waiting"
 * and polls latest_round; the running agents see "waiting" at a heartbeat (while
 * the round has fewer than MAX nodes), their workers stop at the next checkpoint
 * boundary with DT_EXIT_RESIZE, the first agent to see that SETs "resizing" (from
 * then on a node that stops heartbeating has left for the next round, it is not
 * lost) and all join round r+1, the waiting agent with them. A re-rendezvous that
 * times out below MIN names the previous round's nodes that did not come back.
 */
#ifndef DT_RUNTIME_RDZV_H
#define DT_RUNTIME_RDZV_H

#include <stddef.h>

#include "common/status.h"
#include "rendezvous/store.h"

typedef struct dt_rdzv_node {
    char host[128];
    int nproc;
    int base_rank;
} dt_rdzv_node_t;

typedef struct dt_rdzv {
    dt_store_t *store;
    char *run_id;
    char *endpoint; /* "host:port" for messages */
    int nnodes_min, nnodes_max;
    double join_timeout_s, last_call_s, heartbeat_s;

    /* results of the latest dt_rdzv_join */
    int round;
    int nnodes;     /* nodes in this round */
    int node_rank;
    int base_rank;  /* global rank of this node's local rank 0 */
    int world_size;
    dt_rdzv_node_t *nodes; /* nnodes entries */

    /* liveness */
    long long hb_counter;
    double last_hb;       /* monotonic time of the last heartbeat sent */
    long long *hb_seen;   /* last counter read per node */
    double *hb_changed;   /* monotonic time it last changed */

    /* elastic (MIN < MAX) */
    int resize_seen;            /* this round's "waiting" count was seen (reported once) */
    dt_rdzv_node_t *prev_nodes; /* the previous round's nodes, to name those that did not return */
    int prev_nnodes;
} dt_rdzv_t;

/* What dt_rdzv_tick found. */
typedef enum dt_rdzv_event {
    DT_RDZV_EVENT_NONE = 0,
    DT_RDZV_EVENT_STOP,      /* another agent asked the group to stop (failure) */
    DT_RDZV_EVENT_NODE_LOST, /* a node stopped heartbeating */
    DT_RDZV_EVENT_RESIZE,    /* elastic: a node waits to be admitted (reported once a round) */
} dt_rdzv_event_t;

/* Connects to the store with retries until join_timeout_s (DT_STATUS_RENDEZVOUS,
 * naming the endpoint and how long it tried), proving it holds token (NULL: none);
 * a store that refuses the token is DT_STATUS_REFUSED at once (exit 3). */
dt_status_t dt_rdzv_connect(const char *host, int port, const dt_store_token_t *token,
                            const char *run_id, int nnodes_min,
                            int nnodes_max, double join_timeout_s, double last_call_s,
                            double heartbeat_s, dt_rdzv_t **out);
void dt_rdzv_close(dt_rdzv_t *rz);

/* The newest round any agent of the run has joined (0 when none). An agent that
 * starts while the others are already in round r > 0 (its node was lost and it
 * returns, or it was restarted by hand) joins round r rather than round 0. A value
 * no agent writes is DT_STATUS_RENDEZVOUS naming the key (as every value the agents
 * read from the store: counts, ranks, node records are checked against bounds). */
dt_status_t dt_rdzv_latest_round(dt_rdzv_t *rz, int *round);
/* Joins round `round`. want_rank -1 lets the rendezvous assign node ranks (the
 * store's host, is_host = 1, is node 0; the others follow in arrival order). On a
 * clash every agent of the round gets DT_STATUS_USAGE naming it; on a timeout
 * DT_STATUS_RENDEZVOUS naming how many joined. */
dt_status_t dt_rdzv_join(dt_rdzv_t *rz, int round, int want_rank, int is_host, int nproc,
                         const char *host);

/* One liveness step: bump own heartbeat, check "stop", check everyone's heartbeat.
 * *lost_node gets the node rank for DT_RDZV_EVENT_NODE_LOST. A store that no longer
 * answers is DT_STATUS_RENDEZVOUS. */
dt_status_t dt_rdzv_tick(dt_rdzv_t *rz, dt_rdzv_event_t *ev, int *lost_node);

/* Asks every agent of the round to stop; the first reason set wins (*won = 1 when
 * it was ours; won may be NULL). */
dt_status_t dt_rdzv_request_stop(dt_rdzv_t *rz, const char *reason, int *won);
/* A node stopped heartbeating: request_stop, and when ours won, count the node as
 * lost so that the host does not wait for it to leave. */
dt_status_t dt_rdzv_declare_lost(dt_rdzv_t *rz, const char *reason, int *won);
/* The stop reason (malloc'ed, caller frees) or NULL if none was set. */
dt_status_t dt_rdzv_stop_reason(dt_rdzv_t *rz, char **reason);
/* Appends failure records (one JSON object per line) for the summary. */
dt_status_t dt_rdzv_post_failures(dt_rdzv_t *rz, const char *jsonl);
/* All failure records of the round (malloc'ed "" when none). */
dt_status_t dt_rdzv_get_failures(dt_rdzv_t *rz, char **jsonl);

/* Elastic: this node's workers stopped for a resize; the others' heartbeats may
 * stop from now on without the node being lost. */
dt_status_t dt_rdzv_mark_resizing(dt_rdzv_t *rz);

/* Exit barrier: marks this node's workers done. dt_rdzv_barrier_check sets *all to
 * 1 once every node of the round is done. */
dt_status_t dt_rdzv_mark_done(dt_rdzv_t *rz);
dt_status_t dt_rdzv_barrier_check(dt_rdzv_t *rz, int *all);

/* Before the agent exits: non-hosts say they are leaving; the host (which stops the
 * store) waits up to timeout_s for them so they can read what they need first. */
void dt_rdzv_leave(dt_rdzv_t *rz, int is_host, double timeout_s);
/* A node that cannot start (its config refused, its program missing) tells the
 * others, so that they exit 2 at once naming it instead of waiting join_timeout:
 * it SETs "/dtrun/<run_id>/abort" to why, on the store at host:port when one
 * answers within wait_s (nothing otherwise: the others' wait then says it waits). */
void dt_rdzv_post_abort(const char *host, int port, const dt_store_token_t *token, const char *run_id,
                        const char *why, double wait_s);

#endif /* DT_RUNTIME_RDZV_H */
