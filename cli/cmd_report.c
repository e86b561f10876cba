/*
 * cmd_report.c - dtrun report RUN_DIR [-o FILE.svg]: plot a run's metrics.
 */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "runtime/tools/report.h"

int dt_cmd_report(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) out = argv[++i];
        else if (argv[i][0] == '-') {
            fprintf(stderr, "dtrun report: unknown flag %s\nusage: dtrun report RUN_DIR [-o FILE.svg]\n", argv[i]);
            return DT_EXIT_USAGE;
        } else if (!dir) dir = argv[i];
        else {
            fprintf(stderr, "dtrun report: unexpected argument %s\n", argv[i]);
            return DT_EXIT_USAGE;
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: dtrun report RUN_DIR [-o FILE.svg]\n");
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
