/*
 * flight_report.h - the agent's side of the flight recorder (common/flight_ring.h,
 * written by each worker's communicators): it reads its ranks' rings (the
 * process may be stopped, stuck or dead), writes them as
 * <run_dir>/flight/rank_NNNNN.json, shares each rank's last op per
 * communicator through the store, and names the ranks that never entered the
 * op the others wait in (or entered another one: a desync).
 *
 * The analyser is a pure function over per-rank records so that it can be
 * tested on rings made up in a test.
 */
#ifndef DT_RUNTIME_LAUNCH_FLIGHT_REPORT_H
#define DT_RUNTIME_LAUNCH_FLIGHT_REPORT_H

#include <stddef.h>
#include <stdint.h>

#include "common/flight_ring.h" /* defines: dt_flight_entry_t */

#define DT_FLIGHT_MAX_COMMS 16
#define DT_FLIGHT_RECENT 4 /* ops per communicator kept before the last one */

/* One op of a rank's history in a communicator. */
typedef struct dt_flight_op {
    uint64_t seq, count;
    char op[16], dtype[8];
} dt_flight_op_t;

/* A rank's last op in one communicator, and the ones just before it (oldest first),
 * so that a rank ahead of the others can be compared at their number. */
typedef struct dt_flight_last {
    char comm[40];
    uint64_t seq, count;
    char op[16], dtype[8];
    int state; /* dt_flight_state_t */
    int nrecent;
    dt_flight_op_t recent[DT_FLIGHT_RECENT];
} dt_flight_last_t;

/* What one rank's ring shows (and what its agent saw of the process). */
typedef struct dt_flight_rank {
    int rank;
    char host[128];
    long pid;
    char proc[40]; /* "running", "stopped", "exited", "disk-sleep", "no ring" ... */
    int nlast;
    dt_flight_last_t last[DT_FLIGHT_MAX_COMMS];
} dt_flight_rank_t;

/* Fills r->last from a ring snapshot (entries oldest first): the newest op of
 * each communicator (point-to-point channels included). */
void dt_flight_rank_from_entries(dt_flight_rank_t *r, const dt_flight_entry_t *e, int n);

/* The analysis: for each communicator some rank waits in (its newest op not
 * completed), first the lowest number the ranks reached: when a rank ahead did
 * another op under it than the most ranks there (it skipped one, or added one), that
 * rank is named ("desync at #N"); else the ranks whose newest op there is older ("never entered") and
 * the ranks at the same number in another op (count, dtype) than the most
 * ranks ("desync"). A rank whose process failed (proc "exited N" with N != 0,
 * "killed ...") is not named as never entered: its own failure says why; one that
 * exited 0 while the others wait is (it left early), and so is one stopped inside
 * the op everyone entered (proc "stopped ..."). A rank named in one communicator
 * that itself waits in another for a named rank (hierarchical ops: it is stuck in
 * its node's stage) is not among culprits[] unless every named rank waits.
 * Writes one line per finding
 * into msg; culprits[] gets the
 * ranks named (each once, at most max). Returns their number (0: nothing found). */
int dt_flight_analyse(const dt_flight_rank_t *ranks, int n, char *msg, size_t len, int *culprits, int max);

/* JSON line <-> record (what agents post in the store). */
char *dt_flight_rank_json(const dt_flight_rank_t *r);
int dt_flight_rank_parse(const char *line, dt_flight_rank_t *r);

#endif /* DT_RUNTIME_LAUNCH_FLIGHT_REPORT_H */
