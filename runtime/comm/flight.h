/*
 * flight.h - the communicator's flight recorder: every collective and point-to-
 * point op of every communicator of this process goes into one ring
 * (common/flight_ring.h), from issue to completion, at the cost of a few
 * stores per op.
 *
 * Where the ring lives: DTRUN_FLIGHT_FILE when set; else, in a worker started
 * by the agent, $DTRUN_RUN_DIR/attempt_<TORCHELASTIC_RESTART_COUNT>/<RANK>/flight.ring
 * (the directory of its error file), a file the agent maps to read this rank's
 * ops even when the process is stopped, stuck or gone; otherwise anonymous
 * memory. DTRUN_FLIGHT_SLOTS sets the number of entries (default 256; 0 turns
 * the recorder off).
 *
 * Test hook: DTRUN_TEST_SKIP_COLLECTIVE=RANK:SEQ makes global rank RANK skip
 * the op that would have been number SEQ of its first communicator ("0"): the
 * op returns at once without running and takes no number, as a program that
 * forgot a collective would (its next op then meets the others' SEQ: a desync).
 * Inert unless set.
 */
#ifndef DT_RUNTIME_COMM_FLIGHT_H
#define DT_RUNTIME_COMM_FLIGHT_H

#include "common/flight_ring.h" /* defines: dt_flight_state_t, dt_flight_ring_t */
#include "runtime/comm/comm.h"

/* The process's ring (NULL when the recorder is off); set up on first use. */
dt_flight_ring_t *dt_comm_flight_ring(void);
/* req (numbered, filled) was issued on comm: a new entry. */
void dt_comm_flight_issue_(dt_comm_t *comm, dt_comm_req_t *req);
/* req's entry moves to state. */
void dt_comm_flight_state_(dt_comm_req_t *req, dt_flight_state_t state);
/* The test hook above: 1 when req, about to be issued on comm, is to be skipped. */
int dt_comm_flight_skip_(dt_comm_t *comm, const dt_comm_req_t *req);

#endif /* DT_RUNTIME_COMM_FLIGHT_H */
