/*
 * trace.h - the job timeline's recorder (log.trace): this process's spans of the
 * last N steps, each a named interval on a track, for one rank's part of the
 * merged Chrome/Perfetto trace (runtime/tools/trace.h merges the ranks' files).
 *
 * One recorder per process (the communicator's threads record the ops they run,
 * the trainer's thread the phases), kept in a ring of N step buckets: the spans of
 * step s go into bucket s % N, which dt_trace_step_begin(s) empties first, so the
 * recorder holds the last N steps (and whatever ran before the first of them, in
 * the bucket of the step before) in bounded memory. A bucket holds at most
 * DT_TRACE_SPANS_PER_STEP spans; more are counted as dropped, not kept.
 *
 * Recording costs no system call: the clock is the vDSO's (the callers pass
 * dt_now_s() times they read anyway), a slot comes from one atomic add, the rest
 * are plain stores. When the recorder is off, dt_trace_span and dt_trace_op are
 * one load and a branch (inline), and nothing is allocated.
 *
 * Times are monotonic (dt_now_s / dt_now_ns); the rank file gives them on the
 * wall clock (the monotonic-to-wall difference read once at dt_trace_init) plus
 * the offset to rank 0's clock the trainer measured (dt_trace_set_clock), which
 * the merge adds, so ranks on different nodes line up.
 */
#ifndef DT_COMMON_TRACE_H
#define DT_COMMON_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "common/clock.h" /* defines: dt_now_s */
#include "common/status.h"

#define DT_TRACE_SPANS_PER_STEP 4096
#define DT_TRACE_MAX_STEPS 100000

/* A span's phase kind: its "cat" in the trace. metrics.jsonl's figures per step:
 * data_ms is the sum of the DATA spans, comm_ms of the COMM spans, step_ms the
 * STEP span, compute_ms the step less both. BUBBLE (a pipeline stage waiting for
 * a neighbour) counts as compute there, as it does in metrics.jsonl. */
typedef enum dt_trace_cat {
    DT_TRACE_STEP = 0,
    DT_TRACE_DATA,
    DT_TRACE_COMPUTE,
    DT_TRACE_COMM,   /* the trainer's thread blocked in a DP/TP collective */
    DT_TRACE_BUBBLE, /* pipeline: waiting for a neighbouring stage */
    DT_TRACE_OP,     /* one collective or point-to-point op, as its communicator ran it */
    DT_TRACE_CKPT,   /* checkpoint staging and writing */
    DT_TRACE_N_CATS
} dt_trace_cat_t;

/* Phases, data, waits: the "phases" track; CKPT: the "checkpoint" track; OP: one
 * track per communicator ("comm <id>", or "p2p <id>" for a point-to-point channel). */
typedef struct dt_trace_rec {
    uint64_t t0_ns, t1_ns;   /* monotonic; ops: when the backend started it, and ended */
    uint64_t queued_ns;      /* ops: issued at (<= t0_ns) */
    int64_t step;
    uint64_t seq, count;     /* ops: sequence number in its communicator, elements */
    int32_t peer;            /* point to point: the peer's global rank; else -1 */
    uint8_t cat;             /* dt_trace_cat_t */
    uint8_t p2p;             /* ops: of a point-to-point channel */
    uint8_t elem_bytes;      /* ops: bytes of one element */
    uint8_t failed;          /* ops: ended in an error */
    char name[24];           /* "forward", "all_reduce" ... */
    char dtype[8];
    char comm[40];           /* ops: the communicator's id */
} dt_trace_rec;

/* 1 while recording (read inline by the hooks; set by dt_trace_init). */
extern int dt_trace_on_;
static inline int dt_trace_on(void) { return dt_trace_on_; }

/* Starts recording: a ring of n_steps (2 .. DT_TRACE_MAX_STEPS) step buckets, the
 * current step first_step (spans before the first dt_trace_step_begin go there).
 * INVALID for a bad n_steps; a second init without dt_trace_free is INVALID. */
dt_status_t dt_trace_init(int n_steps, int64_t first_step);
/* Stops recording and frees the spans. */
void dt_trace_free(void);
/* Step `step` begins: its bucket is emptied and takes the spans from now on. */
void dt_trace_step_begin(int64_t step);
/* The step spans go to; -1 when off. */
int64_t dt_trace_current_step(void);

void dt_trace_add_(const dt_trace_rec *s);
void dt_trace_phase_(int cat, const char *name, double t0_s, double t1_s);
/* A span of kind cat named name from t0_s to t1_s (dt_now_s() times) on the
 * phases track (CKPT: the checkpoint track), in the current step. */
static inline void dt_trace_span(int cat, const char *name, double t0_s, double t1_s) {
    if (dt_trace_on_) dt_trace_phase_(cat, name, t0_s, t1_s);
}
/* dt_now_s() when recording, else 0 (no clock read). */
static inline double dt_trace_now(void) { return dt_trace_on_ ? dt_now_s() : 0; }
/* A span from t0_s to now (no clock read when off). */
static inline void dt_trace_end(int cat, const char *name, double t0_s) {
    if (dt_trace_on_) dt_trace_phase_(cat, name, t0_s, dt_now_s());
}
/* An op span (cat DT_TRACE_OP, fields filled by the caller; step: the current). */
static inline void dt_trace_op(const dt_trace_rec *s) {
    if (dt_trace_on_) dt_trace_add_(s);
}

/* This rank's clock against rank 0's: rank 0's wall clock = ours + offset_ns,
 * measured with round-trip rtt_ns (0, 0 on rank 0 or one rank). */
void dt_trace_set_clock(int64_t offset_ns, int64_t rtt_ns);

/* The kept spans, oldest step first, in each step by start (malloc'd; *n their
 * number; *dropped the spans that did not fit). Ops on one track never overlap:
 * an op that started before the previous one of its communicator ended (NCCL's
 * stream runs them in order) starts at that end. */
dt_status_t dt_trace_collect(dt_trace_rec **out, size_t *n, uint64_t *dropped);

/* The rank file (JSON; runtime/tools/trace.h reads it): this rank's spans on its
 * wall clock with its offset to rank 0, written atomically (never through a link). */
typedef struct dt_trace_rank_info {
    int rank, world_size;
    const char *host;
    int n_steps; /* log.trace_steps */
} dt_trace_rank_info;
dt_status_t dt_trace_write_rank(const char *path, const dt_trace_rank_info *info);

const char *dt_trace_cat_name(int cat);
/* cat name -> dt_trace_cat_t, -1 when unknown. */
int dt_trace_cat_parse(const char *name);

/* Cristian's estimate of one ping-pong: the client sent at t_send, the server's
 * clock read t_server, the client received at t_recv (ns, each on its own
 * clock). *offset_ns: what to add to the client's clock to get the server's;
 * *rtt_ns: the round trip. */
void dt_trace_cristian(int64_t t_send, int64_t t_server, int64_t t_recv, int64_t *offset_ns, int64_t *rtt_ns);

#endif /* DT_COMMON_TRACE_H */
