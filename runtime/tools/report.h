/*
 * report.h - a picture of a run: loss and validation loss against step, and
 * tokens/s against step, drawn as an SVG from <run_dir>/metrics.jsonl.
 */
#ifndef DT_RUNTIME_REPORT_H
#define DT_RUNTIME_REPORT_H

#include "common/status.h"

/* Reads metrics_path and writes svg_path; *n_points gets the lines read and
 * *n_left_out (may be NULL) the values not drawn: NaN, Infinity, null, or beyond
 * +-1e15 (a diverged run), which the SVG also lists by step. */
dt_status_t dt_report_svg(const char *metrics_path, const char *svg_path, int *n_points, int *n_left_out);

#endif /* DT_RUNTIME_REPORT_H */
