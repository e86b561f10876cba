/*
 * cmd_report.c - dtrun report RUN_DIR [-o FILE.svg]: plot a run's metrics.
 *   dtrun report --tensorboard DIR: the scalars of DIR's TensorBoard event files (or
 *   of DIR/tensorboard/), as TensorBoard shows them, one JSON line per step.
 */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "runtime/tools/report.h"
#include "runtime/tools/tfevents.h"

static const char report_usage[] = "usage: dtrun report RUN_DIR [-o FILE.svg]\n"
                                   "       dtrun report --tensorboard DIR   (scalars of DIR's event files as JSON lines)\n";

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

int dt_cmd_report(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *tb = NULL;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--tensorboard") && i + 1 < argc) tb = argv[++i];
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(report_usage, stdout);
            return DT_EXIT_OK;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "dtrun report: unknown flag %s\n%s", argv[i], report_usage);
            return DT_EXIT_USAGE;
        } else if (!dir) dir = argv[i];
        else {
            fprintf(stderr, "dtrun report: unexpected argument %s\n", argv[i]);
            return DT_EXIT_USAGE;
        }
    }
    if (tb && (dir || out)) {
        fprintf(stderr, "dtrun report: --tensorboard DIR prints scalars; it takes no RUN_DIR or -o\n%s", report_usage);
        return DT_EXIT_USAGE;
    }
    if (tb) return print_tensorboard(tb);
    if (!dir) {
        fputs(report_usage, stderr);
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
    return DT_EXIT_OK;
}
