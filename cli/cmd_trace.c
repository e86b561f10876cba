/*
 * cmd_trace.c - dtrun trace LOG_DIR [-o FILE]: the job timeline merged after the
 * fact from the ranks' files (<LOG_DIR>/trace/rank_<r>.json, log.trace) into one
 * Chrome/Perfetto trace-event JSON (default <LOG_DIR>/trace.json), as rank 0 does
 * at the end of a run; also for files copied together from several nodes.
 */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "common/fs_safe.h"
#include "common/trace.h" /* defines: DT_TRACE_SPANS_PER_STEP */
#include "runtime/tools/timeline.h"

static const char usage[] =
    "usage: dtrun trace LOG_DIR [-o FILE.json]\n"
    "  merges LOG_DIR/trace/rank_<r>.json (a run with log.trace=true) into one trace-event\n"
    "  JSON, LOG_DIR/trace.json by default: open it in https://ui.perfetto.dev or chrome://tracing\n";

int dt_cmd_trace(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return DT_EXIT_OK;
        } else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dtrun trace: %s needs a file\n%s", argv[i], usage);
                return DT_EXIT_USAGE;
            }
            out = argv[++i];
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "dtrun trace: unknown flag %s\n%s", argv[i], usage);
            return DT_EXIT_USAGE;
        } else if (!dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "dtrun trace: unexpected argument %s\n%s", argv[i], usage);
            return DT_EXIT_USAGE;
        }
    }
    if (!dir) {
        fputs(usage, stderr);
        return DT_EXIT_USAGE;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    if (out) snprintf(path, sizeof path, "%s", out);
    dt_timeline tl;
    dt_status_t st = dt_fs_check_target(path, 0, out ? "-o" : "the trace");
    if (st == DT_STATUS_OK) st = dt_timeline_from_ranks(dir, &tl);
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun trace: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    st = dt_timeline_write_json(&tl, path);
    if (st == DT_STATUS_OK) {
        printf("wrote %s (%zu events of %d rank(s))\n", path, tl.n, tl.n_ranks);
        if (tl.dropped)
            printf("%llu span(s) did not fit the ranks' rings (more than %d in a step)\n",
                   (unsigned long long)tl.dropped, DT_TRACE_SPANS_PER_STEP);
    }
    dt_timeline_free(&tl);
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun trace: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    return DT_EXIT_OK;
}
