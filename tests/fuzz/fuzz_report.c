/*
 * fuzz_report.c - libFuzzer target for the metrics.jsonl reader of `dtrun report`
 * (runtime/tools/report.c), built by `make fuzz`.
 *
 * The input is written as a run's metrics.jsonl and drawn as an SVG; the SVG,
 * when written, must hold no "nan" or "inf" coordinate.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "runtime/tools/report.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("metrics.jsonl", data, size);
    char mpath[512], spath[512];
    fuzz_path(mpath, sizeof mpath, "metrics.jsonl");
    fuzz_path(spath, sizeof spath, "report.svg");
    int points = 0, left_out = 0;
    if (dt_report_svg(mpath, spath, &points, &left_out) != DT_STATUS_OK) return 0;
    if (points < 0 || left_out < 0) abort();
    char *svg = NULL;
    size_t len = 0;
    if (dt_fs_read_file(spath, (size_t)64 << 20, &svg, &len) != DT_STATUS_OK) abort();
    if (strstr(svg, "=\"nan") || strstr(svg, "=\"-nan") || strstr(svg, "=\"inf") || strstr(svg, "=\"-inf"))
        abort(); /* a coordinate no viewer can draw */
    free(svg);
    return 0;
}
