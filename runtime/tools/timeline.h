/*
 * timeline.h - the job timeline (log.trace) after the run: the ranks' files
 * (<log_dir>/trace/rank_<r>.json, written by common/trace.h) merged into one
 * Chrome/Perfetto trace-event JSON (<log_dir>/trace.json: a process per rank, a
 * thread per track, "X" events in microseconds on rank 0's clock), read back, and
 * one step of it drawn as an SVG (timeline_svg.c).
 *
 * Tracks: "phases" (the step, data waits, forward, backward, optimizer, the DP/TP
 * communication waits, pipeline waits), "checkpoint", "comm <id>" (the collectives
 * of one communicator) and "p2p <id>" (one point-to-point channel). Each event's
 * cat is its phase kind (common/trace.h: step, data, compute, comm, bubble, op,
 * ckpt); its args hold the step, and for an op its op, count, bytes, dtype, peer,
 * communicator and sequence number.
 */
#ifndef DT_RUNTIME_TOOLS_TIMELINE_H
#define DT_RUNTIME_TOOLS_TIMELINE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct dt_tl_event {
    double ts, dur;   /* microseconds after the job's first event, rank 0's clock */
    int pid, tid;     /* rank, track */
    int cat;          /* dt_trace_cat_t */
    int64_t step;
    char name[24];
    /* ops (cat op) */
    char comm[40], dtype[8];
    uint64_t seq, count, bytes;
    int peer;
    double queued_us; /* issued this long before it started */
} dt_tl_event;

typedef struct dt_timeline {
    dt_tl_event *ev;
    size_t n;
    int n_ranks;
    char (*hosts)[64];   /* [n_ranks] */
    int64_t *offset_ns;  /* [n_ranks]: each rank's clock offset to rank 0's */
    int n_tracks;
    char (*tracks)[48];  /* tid t names tracks[t - 1] */
    char epoch_ns[24];   /* the wall-clock ns (rank 0's clock) of ts 0, as a string */
    uint64_t dropped;    /* spans the ranks' rings could not keep */
} dt_timeline;

/* Merges the rank files of log_dir: rank_0.json names the world size; every rank
 * below it must have its file (an error names the missing and the malformed ones,
 * with the field at fault). */
dt_status_t dt_timeline_from_ranks(const char *log_dir, dt_timeline *tl);
/* Reads a merged trace.json (as dt_timeline_write_json writes it). */
dt_status_t dt_timeline_read_json(const char *path, dt_timeline *tl);
/* The trace-event JSON, written atomically (never through a link). */
dt_status_t dt_timeline_write_json(const dt_timeline *tl, const char *path);
/* The steps the timeline holds a step span of: [*first, *last]; NOT_FOUND when none. */
dt_status_t dt_timeline_steps(const dt_timeline *tl, int64_t *first, int64_t *last);
/* Step `step` as an SVG (a row per rank and track, spans coloured by phase kind, a
 * time axis in ms, a legend), written atomically. NOT_FOUND naming the steps held
 * when the timeline has no such step. */
dt_status_t dt_timeline_svg(const dt_timeline *tl, int64_t step, const char *path);
void dt_timeline_free(dt_timeline *tl);

#endif /* DT_RUNTIME_TOOLS_TIMELINE_H */
