/*
 * cmd_report.c - dtrun report RUN_DIR [-o FILE.svg] [--step N]: plot a run's
 * metrics, and with a job timeline (log.trace: RUN_DIR/trace.json, or the ranks'
 * files under RUN_DIR/trace/) draw step N of it (default: the last step it holds)
 * as RUN_DIR/timeline.svg.
 *   dtrun report --tensorboard DIR: the scalars of DIR's TensorBoard event files (or
 *   of DIR/tensorboard/), as TensorBoard shows them, one JSON line per step.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "common/fs_safe.h"
#include "runtime/tools/report.h"
#include "runtime/tools/tfevents.h"
#include "runtime/tools/timeline.h"

static const char usage[] =
    "usage: dtrun report RUN_DIR [-o FILE.svg] [--step N]\n"
    "  RUN_DIR/report.svg (or FILE.svg): loss, validation loss and tokens/s against step;\n"
    "  with a timeline (a run with log.trace=true): RUN_DIR/timeline.svg, step N of it\n"
    "  (default: the last step the trace holds), a row per rank and track\n"
    "       dtrun report --tensorboard DIR\n"
    "  the scalars of DIR's TensorBoard event files (or DIR/tensorboard's), as TensorBoard\n"
    "  shows them (a restart's steps replace the older ones), one JSON line per step\n";

/* One line per step: {"step": S, "<tag>": value, ...}, steps ascending. */
static int print_tensorboard(const char *dir) {
    dt_tfevents_run_t run;
    char sub[4096];
    dt_status_t st = dt_tfevents_load_dir(dir, &run);
    if (st == DT_STATUS_NOT_FOUND) { /* a run's log.dir: its default job folder */
        snprintf(sub, sizeof sub, "%s/tensorboard", dir);
        if (dt_tfevents_load_dir(sub, &run) == DT_STATUS_OK) st = DT_STATUS_OK;
        else dt_error(DT_STATUS_NOT_FOUND, "%s: no TensorBoard event file (events.out.tfevents.*), nor in %s", dir, sub);
    }
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun report: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    for (size_t i = 0; i < run.n;) {
        int64_t step = run.points[i].step;
        printf("{\"step\": %lld", (long long)step);
        for (; i < run.n && run.points[i].step == step; i++) {
            printf(", \"");
            for (const char *c = run.points[i].tag; *c; c++) /* tags are the writer's: escape anyway */
                if (*c == '"' || *c == '\\') printf("\\%c", *c);
                else if ((unsigned char)*c < 0x20) printf("\\u%04x", *c);
                else putchar(*c);
            printf("\": %.9g", run.points[i].value);
        }
        printf("}\n");
    }
    dt_tfevents_run_free(&run);
    return fflush(stdout) == 0 ? DT_EXIT_OK : DT_EXIT_FAILED;
}

/* The timeline of dir: trace.json, else the ranks' files; 0 (and nothing loaded)
 * when there is neither. */
static dt_status_t load_timeline(const char *dir, dt_timeline *tl, int *found) {
    char path[4200], ranks[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/trace.json", dir);
    snprintf(ranks, sizeof ranks, "%s/trace/rank_0.json", dir);
    *found = 1;
    if (lstat(path, &sb) == 0) return dt_timeline_read_json(path, tl);
    if (lstat(ranks, &sb) == 0) return dt_timeline_from_ranks(dir, tl);
    *found = 0;
    return DT_STATUS_OK;
}

static int draw_timeline(const char *dir, const char *step_arg) {
    dt_timeline tl;
    int found;
    int64_t step = 0, first, last;
    if (step_arg) {
        char *end;
        errno = 0;
        long long v = strtoll(step_arg, &end, 10);
        if (!*step_arg || *end || errno || v < 0) {
            fprintf(stderr, "dtrun report: --step wants a step number (a whole number >= 0), not \"%s\"\n", step_arg);
            return DT_EXIT_USAGE;
        }
        step = v;
    }
    dt_status_t st = load_timeline(dir, &tl, &found);
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun report: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    if (!found) {
        if (!step_arg) return DT_EXIT_OK; /* no timeline: the metrics' plot alone */
        fprintf(stderr, "dtrun report: --step %s: %s has no trace.json and no trace/rank_0.json (run with "
                "log.trace=true)\n", step_arg, dir);
        return DT_EXIT_USAGE;
    }
    st = dt_timeline_steps(&tl, &first, &last);
    char svg[4200];
    snprintf(svg, sizeof svg, "%s/timeline.svg", dir);
    if (st == DT_STATUS_OK) st = dt_timeline_svg(&tl, step_arg ? step : last, svg);
    dt_timeline_free(&tl);
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun report: timeline: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    printf("wrote %s (step %" PRId64 ")\n", svg, step_arg ? step : last);
    return DT_EXIT_OK;
}

int dt_cmd_report(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *step = NULL, *tb = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return DT_EXIT_OK;
        } else if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--tensorboard") && i + 1 < argc) tb = argv[++i];
        else if (!strcmp(argv[i], "--step")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dtrun report: --step needs a step number\n%s", usage);
                return DT_EXIT_USAGE;
            }
            step = argv[++i];
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "dtrun report: unknown flag %s\n%s", argv[i], usage);
            return DT_EXIT_USAGE;
        } else if (!dir) dir = argv[i];
        else {
            fprintf(stderr, "dtrun report: unexpected argument %s\n", argv[i]);
            return DT_EXIT_USAGE;
        }
    }
    if (tb && (dir || out || step)) {
        fprintf(stderr, "dtrun report: --tensorboard DIR prints scalars; it takes no RUN_DIR, -o or --step\n%s", usage);
        return DT_EXIT_USAGE;
    }
    if (tb) return print_tensorboard(tb);
    if (!dir) {
        fputs(usage, stderr);
        return DT_EXIT_USAGE;
    }
    char metrics[4096], svg[4096];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    snprintf(svg, sizeof svg, "%s", out ? out : "");
    if (!out) snprintf(svg, sizeof svg, "%s/report.svg", dir);
    int n = 0, left = 0;
    dt_status_t st = dt_report_svg(metrics, svg, &n, &left);
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun report: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    printf("wrote %s (%d points)\n", svg, n);
    if (left)
        printf("left out %d value(s) that were NaN, infinite or beyond +-1e15 (a diverged run?); the SVG lists their "
               "steps\n", left);
    return draw_timeline(dir, step);
}
