/*
 * test_metrics.c - metrics.jsonl lines, atomic files, the SVG report, MFU peaks.
 */
#define _GNU_SOURCE /* strcasestr */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/train/metrics.h"
#include "runtime/tools/report.h"

static char dir[64];
static void make_dir(void) {
    strcpy(dir, "/tmp/dt-metrics-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}
static void rm_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
TestSuite(metrics, .init = make_dir, .fini = rm_dir);

Test(metrics, jsonl_lines_have_contract_keys_and_report_draws_them) {
    char sub[128];
    snprintf(sub, sizeof sub, "%s/a/b", dir);
    dt_metrics_t *m;
    cr_assert_eq(dt_metrics_open(sub, 1, &m), DT_STATUS_OK, "%s", dt_error_detail());
    for (int i = 1; i <= 5; i++) {
        dt_step_metrics s = {.step = i, .total_steps = 5, .loss = 5.0 - i, .lr = 1e-3,
                             .grad_norm = 0.5, .tokens_per_s = 1000 + i, .step_ms = 10,
                             .compute_ms = 8, .comm_ms = 1, .data_ms = 1,
                             .val_loss = i == 5 ? 1.5 : NAN};
        cr_assert_eq(dt_metrics_log(m, &s), DT_STATUS_OK);
    }
    dt_metrics_close(m);
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", sub);
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0;
    const char *keys[] = {"step", "loss", "lr", "tokens_per_s", "step_ms", "compute_ms",
                          "comm_ms", "data_ms", "grad_norm"};
    while (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        cr_assert_not_null(o);
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
            cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(o, keys[k])), "missing %s", keys[k]);
        cr_assert_eq(cJSON_GetObjectItem(o, "val_loss") != NULL, n == 4);
        cJSON_Delete(o);
        n++;
    }
    fclose(f);
    cr_assert_eq(n, 5);
    char svg[256];
    snprintf(svg, sizeof svg, "%s/r.svg", dir);
    int pts = 0;
    cr_assert_eq(dt_report_svg(path, svg, &pts, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(pts, 5);
    f = fopen(svg, "r");
    char buf[16384];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    buf[len] = 0;
    fclose(f);
    cr_assert(strstr(buf, "<svg") && strstr(buf, "polyline") && strstr(buf, "val loss"));
}

Test(metrics, report_rejects_garbage_naming_the_line) {
    char path[256], svg[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(svg, sizeof svg, "%s/r.svg", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"step\":1,\"loss\":2}\nnot json\n", f);
    fclose(f);
    int pts;
    cr_assert_eq(dt_report_svg(path, svg, &pts, NULL), DT_STATUS_FORMAT);
    cr_assert(strstr(dt_error_detail(), "metrics.jsonl:2"), "%s", dt_error_detail());
}

/* A diverged run: non-finite and huge values are left out and counted, never
 * written into the SVG as inf or nan. */
Test(metrics, report_leaves_out_nonfinite_values) {
    char path[256], svg[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(svg, sizeof svg, "%s/r.svg", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"step\":1,\"loss\":5,\"tokens_per_s\":100}\n{\"step\":2,\"loss\":NaN,\"tokens_per_s\":-Infinity}\n"
          "{\"step\":3,\"loss\":1e309,\"val_loss\":1e308}\n{\"step\":1e309,\"loss\":1}\n"
          "{\"step\":4,\"loss\":4,\"tokens_per_s\":110}\n",
          f);
    fclose(f);
    int pts = 0, left = -1;
    cr_assert_eq(dt_report_svg(path, svg, &pts, &left), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(pts, 5);
    cr_assert_eq(left, 5, "left out %d", left);
    f = fopen(svg, "r");
    char buf[16384];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    buf[len] = 0;
    fclose(f);
    cr_assert(!strcasestr(buf, "nan") && !strcasestr(buf, "inf"), "%s", buf);
    cr_assert(strstr(buf, "left out: 5 value(s)") && strstr(buf, "at step(s) 2, 3, "), "%s", buf);
}

Test(metrics, atomic_write_replaces_whole_file) {
    cr_assert_eq(dt_metrics_write_file(dir, "summary.json", "{\"a\":1}\n"), DT_STATUS_OK);
    cr_assert_eq(dt_metrics_write_file(dir, "summary.json", "{\"a\":2}\n"), DT_STATUS_OK);
    char path[256], buf[64] = {0};
    snprintf(path, sizeof path, "%s/summary.json", dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(fgets(buf, sizeof buf, f));
    fclose(f);
    cr_assert_str_eq(buf, "{\"a\":2}\n");
    cr_assert_eq(dt_metrics_write_file("/proc/no/such", "x", "y"), DT_STATUS_IO);
}

Test(metrics, peaks) {
    cr_assert_float_eq(dt_peak_flops_gpu("NVIDIA H200"), 989e12, 1);
    cr_assert_float_eq(dt_peak_flops_gpu("NVIDIA A100-SXM4-80GB"), 312e12, 1);
    cr_assert_eq(dt_peak_flops_gpu("Mystery GPU"), 0);
    setenv("DTRUN_PEAK_TFLOPS", "100", 1);
    cr_assert_float_eq(dt_peak_flops_gpu("Mystery GPU"), 100e12, 1);
}

Test(metrics, progress_line) {
    dt_step_metrics s = {.step = 3, .total_steps = 10, .loss = 2.5, .lr = 1e-3, .tokens_per_s = 1234,
                         .mfu = 0.25, .step_ms = 10, .eta_s = 125, .val_loss = NAN};
    char buf[512];
    dt_metrics_format(&s, buf, sizeof buf);
    cr_assert(strstr(buf, "step 3/10") && strstr(buf, "loss 2.5000") && strstr(buf, "MFU 25.0%") &&
              strstr(buf, "ETA 2m05s"), "%s", buf);
}

Test(metrics, mfu_over_100_percent_is_never_shown_as_a_measure) {
    /* a CPU run printed MFU 128-153%: the peak it used was too low */
    dt_step_metrics s = {.step = 1, .total_steps = 2, .mfu = 1.4, .val_loss = NAN};
    char buf[512];
    dt_metrics_format(&s, buf, sizeof buf);
    cr_assert(strstr(buf, "MFU >100% (the peak is an estimate)") && !strstr(buf, "140"), "%s", buf);
}
