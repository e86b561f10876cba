/*
 * report.c - an SVG of a run's metrics (no plotting library needed).
 *
 * A diverged run's metrics hold values no axis can show: NaN and Infinity (as
 * Python's json writes them; dtrun's own writer writes null), numbers past a
 * double's range (1e309 parses as infinity) or merely huge (1e308). Such points
 * are left out of the plot, the axes are computed from the rest so every
 * coordinate and label is finite, and the SVG says how many points were left out
 * and at which steps.
 */
#include "runtime/tools/report.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs_safe.h" /* defines: dt_fs_open_regular, dt_fs_write_atomic */
#include "common/mem.h"

/* Values beyond this (either sign) are left out: no loss, throughput or step is
 * that large, and the axes' arithmetic stays far from overflow. */
#define REPORT_MAX_ABS 1e15
/* A metrics line is a few hundred bytes: a longer one is not read whole. */
#define REPORT_MAX_LINE (1 << 20)
/* Steps of left-out points named in the SVG; the rest are counted. */
#define REPORT_LEFT_OUT_SHOWN 8

typedef struct left_out {
    int n;       /* values left out */
    int n_steps; /* distinct steps among them, in file order (the first few kept) */
    double steps[REPORT_LEFT_OUT_SHOWN];
} left_out;

static int plottable(double v) { return isfinite(v) && fabs(v) <= REPORT_MAX_ABS; }

/* One value left out at step (NaN: the step itself was not a plottable number). */
static void note_left_out(left_out *lo, double step) {
    lo->n++;
    if (lo->n_steps > 0 && lo->n_steps <= REPORT_LEFT_OUT_SHOWN) {
        double last = lo->steps[lo->n_steps - 1];
        if (last == step || (isnan(last) && isnan(step))) return; /* the same line's other values */
    }
    if (lo->n_steps < REPORT_LEFT_OUT_SHOWN) lo->steps[lo->n_steps] = step;
    lo->n_steps++;
}

/* A copy of line (malloc'd) with the bare words NaN, Infinity and -Infinity
 * outside strings replaced by null, so that cJSON parses what Python's json.dumps
 * writes for non-finite floats; *n_replaced counts them. */
static char *nonfinite_to_null(const char *line, int *n_replaced) {
    static const char *const words[] = {"-Infinity", "Infinity", "NaN"};
    size_t len = strlen(line);
    char *out = dt_xmalloc(2 * len + 1), *o = out;
    int in_str = 0;
    *n_replaced = 0;
    for (const char *p = line; *p;) {
        if (in_str) {
            if (*p == '\\' && p[1]) *o++ = *p++;
            else if (*p == '"') in_str = 0;
            *o++ = *p++;
            continue;
        }
        if (*p == '"') in_str = 1;
        size_t w = 0;
        for (int k = 0; k < 3 && !w; k++)
            if (!strncmp(p, words[k], strlen(words[k]))) w = strlen(words[k]);
        if (w) {
            memcpy(o, "null", 4);
            o += 4, p += w;
            (*n_replaced)++;
        } else {
            *o++ = *p++;
        }
    }
    *o = 0;
    return out;
}

typedef struct series {
    double *x, *y;
    int n, cap;
} series;

static void push(series *s, double x, double y) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->x = dt_xrealloc(s->x, (size_t)s->cap * sizeof *s->x);
        s->y = dt_xrealloc(s->y, (size_t)s->cap * sizeof *s->y);
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
}

typedef struct panel {
    double x0, y0, w, h; /* pixel box */
    double xmin, xmax, ymin, ymax;
} panel;

static void range_of(const series *s, int nser, double *lo, double *hi, int use_x) {
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int k = 0; k < nser; k++)
        for (int i = 0; i < s[k].n; i++) {
            double v = use_x ? s[k].x[i] : s[k].y[i];
            if (v < *lo) *lo = v;
            if (v > *hi) *hi = v;
        }
    if (!isfinite(*lo)) *lo = 0, *hi = 1; /* no points */
    if (*hi - *lo < 1e-12) *hi = *lo + 1;
}

static void draw_panel(FILE *f, panel *p, const series *s, const char *const *names,
                       const char *const *colors, int nser, const char *title) {
    fprintf(f, "<rect x='%.0f' y='%.0f' width='%.0f' height='%.0f' fill='white' stroke='#999'/>\n",
            p->x0, p->y0, p->w, p->h);
    fprintf(f, "<text x='%.0f' y='%.0f' font-size='15' font-weight='bold'>%s</text>\n", p->x0,
            p->y0 - 10, title);
    for (int t = 0; t <= 4; t++) { /* grid and tick labels */
        double fy = p->y0 + p->h * t / 4.0, vy = p->ymax - (p->ymax - p->ymin) * t / 4.0;
        double fx = p->x0 + p->w * t / 4.0, vx = p->xmin + (p->xmax - p->xmin) * t / 4.0;
        fprintf(f, "<line x1='%.0f' y1='%.1f' x2='%.0f' y2='%.1f' stroke='#eee'/>\n", p->x0, fy,
                p->x0 + p->w, fy);
        char label[32];
        if (fabs(vy) >= 1e9) snprintf(label, sizeof label, "%.3g", vy);
        else if (fabs(vy) >= 1e6) snprintf(label, sizeof label, "%.2fM", vy / 1e6);
        else if (fabs(vy) >= 1e4) snprintf(label, sizeof label, "%.1fk", vy / 1e3);
        else snprintf(label, sizeof label, "%.4g", vy);
        fprintf(f, "<text x='%.0f' y='%.1f' font-size='11' text-anchor='end'>%s</text>\n",
                p->x0 - 4, fy + 4, label);
        fprintf(f, "<text x='%.1f' y='%.0f' font-size='11' text-anchor='middle'>%.0f</text>\n", fx,
                p->y0 + p->h + 14, vx);
    }
    for (int k = 0; k < nser; k++) {
        if (s[k].n == 0) continue;
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.5' points='", colors[k]);
        for (int i = 0; i < s[k].n; i++) {
            double px = p->x0 + (s[k].x[i] - p->xmin) / (p->xmax - p->xmin) * p->w;
            double py = p->y0 + p->h - (s[k].y[i] - p->ymin) / (p->ymax - p->ymin) * p->h;
            fprintf(f, "%.1f,%.1f ", px, py);
        }
        fprintf(f, "'/>\n");
        fprintf(f, "<text x='%.0f' y='%.0f' font-size='12' fill='%s'>%s</text>\n",
                p->x0 + p->w - 110, p->y0 + 16 + 14 * k, colors[k], names[k]);
    }
    fprintf(f, "<text x='%.0f' y='%.0f' font-size='12' text-anchor='middle'>step</text>\n",
            p->x0 + p->w / 2, p->y0 + p->h + 30);
}

/* The SVG's last line when points were left out: how many, and their steps. */
static void draw_left_out(FILE *f, const left_out *lo) {
    if (lo->n == 0) return;
    fprintf(f, "<text x='80' y='625' font-size='12' fill='#b00'>left out: %d value(s) not finite or beyond "
               "&#177;1e15 (a diverged run?), at step(s) ", lo->n);
    int shown = lo->n_steps < REPORT_LEFT_OUT_SHOWN ? lo->n_steps : REPORT_LEFT_OUT_SHOWN;
    for (int i = 0; i < shown; i++) {
        if (plottable(lo->steps[i])) fprintf(f, "%s%.0f", i ? ", " : "", lo->steps[i]);
        else fprintf(f, "%s(a step that is not a number)", i ? ", " : "");
    }
    fprintf(f, "%s</text>\n", lo->n_steps > shown ? ", ..." : "");
}

dt_status_t dt_report_svg(const char *metrics_path, const char *svg_path, int *n_points, int *n_left_out) {
    /* a directory, FIFO or device is refused, never read or blocked on */
    int in_fd;
    DT_CHECK(dt_fs_open_regular(metrics_path, O_RDONLY, 0, &in_fd, NULL));
    FILE *in = fdopen(in_fd, "r");
    if (!in) {
        close(in_fd);
        return dt_error(DT_STATUS_NOMEM, "%s: %s", metrics_path, strerror(errno));
    }
    char *svg = NULL;
    size_t svg_len = 0;
    series loss = {0}, val = {0}, tps = {0};
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, n = 0, nonfinite;
    left_out lo = {0};
    dt_status_t st = DT_STATUS_OK;
    ssize_t got;
    while ((got = getline(&line, &cap, in)) > 0) {
        lineno++;
        if ((size_t)got > REPORT_MAX_LINE) {
            st = dt_error(DT_STATUS_FORMAT, "%s:%d: a line of %zd bytes is no metrics line (at most %d)", metrics_path,
                          lineno, got, REPORT_MAX_LINE);
            goto out_free;
        }
        if (line[0] == '\n') continue;
        char *text = nonfinite_to_null(line, &nonfinite);
        cJSON *o = cJSON_Parse(text);
        free(text);
        cJSON *step = cJSON_GetObjectItem(o, "step");
        if (o && (cJSON_IsNull(step) || (cJSON_IsNumber(step) && !plottable(step->valuedouble)))) {
            note_left_out(&lo, cJSON_IsNumber(step) ? step->valuedouble : NAN); /* the whole line */
            cJSON_Delete(o);
            n++;
            continue;
        }
        if (!o || !cJSON_IsNumber(step)) {
            cJSON_Delete(o);
            st = dt_error(DT_STATUS_FORMAT, "%s:%d: not a metrics line (JSON with a step)",
                          metrics_path, lineno);
            goto out_free;
        }
        cJSON *l = cJSON_GetObjectItem(o, "loss"), *v = cJSON_GetObjectItem(o, "val_loss"),
              *t = cJSON_GetObjectItem(o, "tokens_per_s");
        /* A value present but null (NaN in the file) or unplottable is left out. */
        const cJSON *vals[3] = {l, v, t};
        series *to[3] = {&loss, &val, &tps};
        for (int k = 0; k < 3; k++) {
            if (cJSON_IsNumber(vals[k]) && plottable(vals[k]->valuedouble))
                push(to[k], step->valuedouble, vals[k]->valuedouble);
            else if (cJSON_IsNumber(vals[k]) || cJSON_IsNull(vals[k]))
                note_left_out(&lo, step->valuedouble);
        }
        cJSON_Delete(o);
        n++;
    }
    if (n == 0) {
        st = dt_error(DT_STATUS_FORMAT, "%s: no metrics lines", metrics_path);
        goto out_free;
    }
    /* Drawn in memory, then written beside svg_path and renamed over it: a link
     * planted at svg_path is replaced, never written through. */
    FILE *f = open_memstream(&svg, &svg_len);
    if (!f) {
        st = dt_error(DT_STATUS_NOMEM, "%s: %s", svg_path, strerror(errno));
        goto out_free;
    }
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='900' height='640' "
               "font-family='sans-serif'>\n<rect width='900' height='640' fill='#fafafa'/>\n");
    series ls[2] = {loss, val};
    panel p1 = {80, 40, 780, 240, 0, 0, 0, 0};
    range_of(ls, 2, &p1.xmin, &p1.xmax, 1);
    range_of(ls, 2, &p1.ymin, &p1.ymax, 0);
    draw_panel(f, &p1, ls, (const char *const[]){"train loss", "val loss"},
               (const char *const[]){"#1f77b4", "#d62728"}, 2, "loss");
    panel p2 = {80, 360, 780, 220, 0, 0, 0, 0};
    range_of(&tps, 1, &p2.xmin, &p2.xmax, 1);
    range_of(&tps, 1, &p2.ymin, &p2.ymax, 0);
    p2.ymin = 0;
    draw_panel(f, &p2, &tps, (const char *const[]){"tokens/s"}, (const char *const[]){"#2ca02c"},
               1, "throughput (tokens/s)");
    draw_left_out(f, &lo);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0) st = dt_error(DT_STATUS_NOMEM, "%s: %s", svg_path, strerror(errno));
    if (st == DT_STATUS_OK) st = dt_fs_write_atomic(svg_path, svg, svg_len, NULL, 0);
    if (st != DT_STATUS_OK) goto out_free;
    *n_points = n;
    if (n_left_out) *n_left_out = lo.n;
out_free:
    free(line);
    free(svg);
    fclose(in);
    free(loss.x), free(loss.y), free(val.x), free(val.y), free(tps.x), free(tps.y);
    return st;
}
