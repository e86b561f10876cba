/*
 * timeline_svg.c - one step of the job timeline as an SVG (timeline.h): a row per
 * rank and track, the spans coloured by phase kind and nested spans drawn inside
 * their parent, a time axis in ms from the step's first event, a legend. A
 * pipeline's bubbles show as the yellow waits and the gaps between passes; a slow
 * rank as the longer step the others wait for in their collectives.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs_safe.h"
#include "common/mem.h"
#include "common/trace.h"
#include "common/strbuf.h"
#include "runtime/tools/timeline.h"

#define SVG_W 1200
#define LABEL_W 200
#define PLOT_X0 (LABEL_W + 10)
#define PLOT_W (SVG_W - PLOT_X0 - 20)
#define ROW_H 24
#define PHASE_ROW_H 40
#define TOP 86


/* s as SVG text (the XML specials escaped; other control characters dropped). */
static void sb_text(dt_strbuf *b, const char *s) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '<') dt_strbuf_printf(b, "&lt;");
        else if (*c == '>') dt_strbuf_printf(b, "&gt;");
        else if (*c == '&') dt_strbuf_printf(b, "&amp;");
        else if (*c == '"') dt_strbuf_printf(b, "&quot;");
        else if (*c >= 0x20 && *c != 0x7f) dt_strbuf_printf(b, "%c", *c);
    }
}

/* The legend's kinds, in its order; kind_of maps a span to one. */
static const struct {
    const char *label, *fill;
} kinds[] = {
    {"step", "#e6e6e6"},          {"data wait", "#f28e2b"},      {"forward", "#7aa6d6"},
    {"backward", "#2f5f98"},      {"reduce / optimizer", "#59a14f"}, {"DP/TP comm wait", "#e15759"},
    {"pipeline wait", "#edc948"}, {"collective", "#b07aa1"},     {"point to point", "#9c755f"},
    {"checkpoint", "#76b7b2"},
};

static int kind_of(const dt_tl_event *e) {
    switch (e->cat) {
    case DT_TRACE_STEP: return 0;
    case DT_TRACE_DATA: return 1;
    case DT_TRACE_COMPUTE:
        if (!strncmp(e->name, "forward", 7)) return 2;
        if (!strncmp(e->name, "backward", 8)) return 3;
        return 4;
    case DT_TRACE_COMM: return 5;
    case DT_TRACE_BUBBLE: return 6;
    case DT_TRACE_OP: return e->peer >= 0 ? 8 : 7;
    default: return 9;
    }
}

/* A tick step of 1, 2 or 5 x 10^k giving about 8 ticks over span ms. */
static double tick_of(double span) {
    double raw = span / 8, p = pow(10, floor(log10(raw > 0 ? raw : 1e-3))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

typedef struct row {
    int pid, tid, h, y;
} row;

dt_status_t dt_timeline_svg(const dt_timeline *tl, int64_t step, const char *path) {
    double lo = INFINITY, hi = -INFINITY;
    size_t n_in = 0;
    for (size_t i = 0; i < tl->n; i++) {
        const dt_tl_event *e = &tl->ev[i];
        if (e->step != step) continue;
        n_in++;
        if (e->ts < lo) lo = e->ts;
        if (e->ts + e->dur > hi) hi = e->ts + e->dur;
    }
    int64_t first = 0, last = 0;
    if (n_in == 0) {
        if (dt_timeline_steps(tl, &first, &last) != DT_STATUS_OK)
            return dt_error(DT_STATUS_NOT_FOUND, "the trace holds no step");
        return dt_error(DT_STATUS_NOT_FOUND, "step %" PRId64 " is not in the trace (it holds steps %" PRId64 "..%" PRId64
                        ": log.trace_steps keeps the last N)", step, first, last);
    }
    if (hi <= lo) hi = lo + 1;
    /* the rows: each rank's tracks that have events in the step, in track order */
    row *rows = dt_xcalloc((size_t)tl->n_ranks * (size_t)(tl->n_tracks + 1) + 1, sizeof *rows);
    int n_rows = 0, y = TOP;
    for (int r = 0; r < tl->n_ranks; r++)
        for (int t = 1; t <= tl->n_tracks; t++) {
            int has = 0;
            for (size_t i = 0; i < tl->n && !has; i++)
                has = tl->ev[i].pid == r && tl->ev[i].tid == t && tl->ev[i].step == step;
            if (!has) continue;
            int h = !strcmp(tl->tracks[t - 1], "phases") ? PHASE_ROW_H : ROW_H;
            rows[n_rows++] = (row){r, t, h, y};
            y += h + 4;
        }
    int height = y + 40;
    double span_ms = (hi - lo) / 1e3, xs = PLOT_W / (hi - lo);
    dt_strbuf b = {dt_xmalloc(1 << 16), 0, 1 << 16};
    dt_strbuf_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                  "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
              SVG_W, height, SVG_W, height);
    dt_strbuf_printf(&b, "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">dtrun timeline: step %" PRId64
                  " (%.2f ms across %d rank(s))</text>\n", step, span_ms, tl->n_ranks);
    /* the legend */
    int lx = 10;
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        dt_strbuf_printf(&b, "<rect x=\"%d\" y=\"32\" width=\"12\" height=\"12\" fill=\"%s\" stroke=\"#555\" stroke-width=\"0.5\"/>"
                      "<text x=\"%d\" y=\"42\">%s</text>\n", lx, kinds[k].fill, lx + 16, kinds[k].label);
        lx += 22 + 7 * (int)strlen(kinds[k].label);
    }
    /* the time axis: grid lines and labels in ms from the step's first event */
    double tick = tick_of(span_ms);
    for (double t = 0; t <= span_ms + 1e-9; t += tick) {
        double x = PLOT_X0 + t * 1e3 * xs;
        dt_strbuf_printf(&b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>"
                      "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"#444\">%g</text>\n",
                  x, TOP - 12, x, y, x, TOP - 16, t);
    }
    dt_strbuf_printf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" fill=\"#444\">time (ms)</text>\n", LABEL_W,
              TOP - 16);
    /* the rows */
    for (int k = 0; k < n_rows; k++) {
        const row *w = &rows[k];
        dt_strbuf_printf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\"/>\n", PLOT_X0, w->y, PLOT_W, w->h,
                  k % 2 ? "#fafafa" : "#f3f3f3");
        dt_strbuf_printf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">rank %d", LABEL_W, w->y + w->h / 2 + 4, w->pid);
        if (w->pid < tl->n_ranks && tl->hosts[w->pid][0]) {
            dt_strbuf_printf(&b, " (");
            sb_text(&b, tl->hosts[w->pid]);
            dt_strbuf_printf(&b, ")");
        }
        dt_strbuf_printf(&b, " \xc2\xb7 ");
        sb_text(&b, tl->tracks[w->tid - 1]);
        dt_strbuf_printf(&b, "</text>\n");
        /* the spans, parents before children (the events are by start, enclosing first) */
        double end[8] = {0};
        int depth = 0;
        for (size_t i = 0; i < tl->n; i++) {
            const dt_tl_event *e = &tl->ev[i];
            if (e->pid != w->pid || e->tid != w->tid || e->step != step) continue;
            while (depth > 0 && e->ts >= end[depth - 1] - 1e-3) depth--;
            int d = depth < 7 ? depth : 7;
            if (depth < 8) end[depth] = e->ts + e->dur;
            depth++;
            double x = PLOT_X0 + (e->ts - lo) * xs, wd = e->dur * xs;
            double inset = d * 5.0, yy = w->y + inset, hh = w->h - 2 * inset;
            if (hh < 4) hh = 4, yy = w->y + (w->h - 4) / 2.0;
            if (wd < 0.6) wd = 0.6;
            int kd = kind_of(e);
            dt_strbuf_printf(&b, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"%s><title>", x, yy, wd,
                      hh, kinds[kd].fill, kd == 0 ? " stroke=\"#999\" stroke-width=\"0.5\"" : "");
            sb_text(&b, e->name);
            dt_strbuf_printf(&b, " (%s): %.3f ms at %.3f ms", dt_trace_cat_name(e->cat), e->dur / 1e3, (e->ts - lo) / 1e3);
            if (e->cat == DT_TRACE_OP) {
                dt_strbuf_printf(&b, ", %" PRIu64 " x %s (%" PRIu64 " bytes), comm ", e->count, e->dtype, e->bytes);
                sb_text(&b, e->comm);
                dt_strbuf_printf(&b, " #%" PRIu64, e->seq);
                if (e->peer >= 0) dt_strbuf_printf(&b, ", peer %d", e->peer);
            }
            dt_strbuf_printf(&b, "</title></rect>\n");
            if (wd > 7.0 * (double)strlen(e->name) + 6 && kd != 0 && hh >= 10)
            {
                dt_strbuf_printf(&b, "<text x=\"%.2f\" y=\"%.1f\" font-size=\"9\" fill=\"%s\">", x + 3, yy + hh / 2 + 3,
                          kd == 3 ? "white" : "#222");
                sb_text(&b, e->name);
                dt_strbuf_printf(&b, "</text>\n");
            }
        }
    }
    dt_strbuf_printf(&b, "<text x=\"10\" y=\"%d\" fill=\"#666\">clocks aligned to rank 0's (offsets measured at start); "
                  "hover a span for its figures; the whole job: trace.json in https://ui.perfetto.dev</text>\n</svg>\n",
              height - 14);
    free(rows);
    dt_status_t st = dt_fs_write_atomic(path, b.p, b.len, NULL, 0);
    free(b.p);
    return st;
}
