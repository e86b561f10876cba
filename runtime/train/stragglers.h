/*
 * stragglers.h - which rank is slow: at every logged step the ranks' compute times
 * of that step are gathered over every rank of the world (one all_gather of one
 * double per rank, on every rank the same step), rank 0 names the slowest rank and
 * the median for metrics.jsonl, warns when one rank stays more than 20% slower than
 * the median for DT_STRAGGLER_PRINTS logged steps in a row, and keeps per-rank
 * statistics for summary.json.
 *
 * Hidden test facility: DTRUN_TEST_SLOW_RANK=RANK:MS makes rank RANK sleep MS
 * milliseconds in every step's compute (inert unless set).
 */
#ifndef DT_RUNTIME_STRAGGLERS_H
#define DT_RUNTIME_STRAGGLERS_H

#include <stdint.h>

#include "common/status.h"
#include "runtime/parallel/dp.h" /* defines: dt_dp_t */

/* A rank is a straggler when its compute time exceeds the median by this factor,
 * and by at least DT_STRAGGLER_MIN_MS (steps of a few ms differ by more than 20%
 * from timer and scheduler noise alone), at this many logged steps in a row. */
#define DT_STRAGGLER_RATIO 1.2
#define DT_STRAGGLER_MIN_MS 10.0
#define DT_STRAGGLER_PRINTS 5

typedef struct dt_stragglers dt_stragglers_t;

/* One logged step's figures (every rank gets them). */
typedef struct dt_straggler_row {
    int slowest_rank;
    double slowest_ms, median_ms;
    const double *rank_ms; /* every rank's compute ms (valid until the next gather) */
    int n_ranks;
} dt_straggler_row;

/* dp gathers over every rank of the world (dt_dp_all_gather_f64, also with TP and
 * PP). Reads DTRUN_TEST_SLOW_RANK; DT_STATUS_CONFIG naming it when malformed. */
dt_status_t dt_stragglers_init(dt_dp_t *dp, int rank, dt_stragglers_t **out);
void dt_stragglers_free(dt_stragglers_t *s);

/* The test facility's sleep, in this rank's compute (nothing unless set). */
void dt_stragglers_test_delay(const dt_stragglers_t *s);

/* Collective over the world (every rank, the same steps): gathers compute_ms,
 * fills *out, updates the statistics and, on rank 0, warns about a rank that has
 * been more than DT_STRAGGLER_RATIO x the median DT_STRAGGLER_PRINTS times in a row. */
dt_status_t dt_stragglers_gather(dt_stragglers_t *s, int64_t step, double compute_ms, dt_straggler_row *out);

/* summary.json's "step_time" object added to obj: the number of logged
 * steps gathered and per rank mean, p50, p90 and max compute ms and the times it
 * was the slowest, and the ranks warned about. */
struct cJSON;
void dt_stragglers_summary(const dt_stragglers_t *s, struct cJSON *obj);

#endif /* DT_RUNTIME_STRAGGLERS_H */
