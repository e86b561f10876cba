/*
 * pp_sched.h - pipeline schedules as lists of actions, and what follows from them:
 * the activation arenas a stage holds at most and the ideal bubble. Pure arithmetic:
 * the pipeline engine (pp.h) runs these lists, `dtrun plan` prices them, and both
 * count arenas with the same function, so the plan's activation bytes are the run's.
 *
 * P pipeline ranks, V chunks (virtual stages) per rank, m micro-batches per step.
 * Chunk c of rank s is virtual stage k = c * P + s; activations flow k -> k + 1
 * (rank s -> s + 1, and rank P-1 -> rank 0 between chunks), gradients back.
 *
 *   gpipe        every forward (micro-batches 0..m-1), then every backward: m
 *                micro-batches of activations in flight.
 *   1f1b         (PipeDream-Flush, Megatron's default) P - s - 1 warm-up forwards,
 *                then one forward / one backward alternately, then the cool-down
 *                backwards: at most P - s in flight. Needs m >= P.
 *   interleaved  Megatron's interleaved 1F1B over V chunks: forward k runs chunk
 *                (k / P) % V of micro-batch (k / (P V)) P + k % P, backward k the same
 *                with chunk V - 1 - (k / P) % V; warm-up (P - s - 1) 2 + (V - 1) P.
 *                Needs V >= 2 and m a multiple of P.
 *
 * Ideal bubble (idle share of a stage's pipeline time with balanced stages):
 * (P - 1) / (m + P - 1) for gpipe and 1f1b, (P - 1) / (V m + P - 1) interleaved.
 *
 * Receiving ahead: the engine posts the receive of action i + 1 before it computes
 * action i, so the transfer overlaps the compute. A forward that receives its input
 * takes its arena then; others take it when they run; a backward frees its arena.
 * dt_pp_arenas counts the largest number taken at once this way.
 */
#ifndef DT_RUNTIME_PP_SCHED_H
#define DT_RUNTIME_PP_SCHED_H

#include <stddef.h>

#define DT_PP_SCHEDULE_MAP(X) X(GPIPE, "gpipe") X(1F1B, "1f1b") X(INTERLEAVED, "interleaved")
typedef enum dt_pp_schedule {
#define X(n, s) DT_PP_##n,
    DT_PP_SCHEDULE_MAP(X)
#undef X
} dt_pp_schedule_t;

/* "gpipe", "1f1b", "interleaved" -> kind; -1 when unknown. */
int dt_pp_schedule_parse(const char *s);
const char *dt_pp_schedule_name(dt_pp_schedule_t kind);

typedef struct dt_pp_action {
    int fwd;   /* 1 forward, 0 backward */
    int mb;    /* micro-batch 0..m-1 */
    int chunk; /* the rank's chunk 0..V-1 */
} dt_pp_action;

/* Whether (kind, P, V, m) can run: 0, or 1 with a message naming the config key
 * (pipeline.schedule, pipeline.virtual_stages, gradient_accumulation_steps). */
int dt_pp_schedule_check(dt_pp_schedule_t kind, int P, int V, int m, char *msg, size_t len);

/* The 2 m V actions of rank s in the order it runs them into out (2 m V entries);
 * returns their number. The arguments must pass dt_pp_schedule_check. */
int dt_pp_schedule_build(dt_pp_schedule_t kind, int P, int V, int m, int s, dt_pp_action *out);

/* Whether an action of rank s receives before it runs: a forward unless it is the
 * pipeline's first virtual stage, a backward unless it is the last. */
int dt_pp_action_receives(const dt_pp_action *a, int P, int V, int s);
/* Whether it sends after it ran: a forward unless last, a backward unless first. */
int dt_pp_action_sends(const dt_pp_action *a, int P, int V, int s);

/* The most activation arenas rank s holds at once (see receiving ahead above). */
int dt_pp_arenas(dt_pp_schedule_t kind, int P, int V, int m, int s);

/* The ideal bubble fraction. */
double dt_pp_bubble_ideal(dt_pp_schedule_t kind, int P, int V, int m);

#endif /* DT_RUNTIME_PP_SCHED_H */
