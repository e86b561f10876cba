/*
 * trace.c - the job timeline's recorder (trace.h): a ring of step buckets filled
 * by atomic adds, the spans collected per step, Cristian's offset arithmetic and
 * this rank's file.
 */
#include "common/trace.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/fs_safe.h"
#include "common/mem.h"
#include "common/strbuf.h"

static const char *const cat_names[DT_TRACE_N_CATS] = {"step", "data", "compute", "comm", "bubble", "op", "ckpt"};

typedef struct bucket {
    _Atomic int64_t step;
    _Atomic uint32_t n;       /* slots handed out (may pass the capacity: those are dropped) */
    dt_trace_rec *spans;     /* DT_TRACE_SPANS_PER_STEP */
} bucket;

static struct {
    int n_steps;
    bucket *b;
    _Atomic int64_t cur;      /* the current step */
    _Atomic uint64_t dropped; /* spans of emptied buckets that did not fit */
    int64_t wall_minus_mono;  /* ns, read at init */
    int64_t offset_ns, rtt_ns;
} g;

int dt_trace_on_;

const char *dt_trace_cat_name(int cat) { return cat >= 0 && cat < DT_TRACE_N_CATS ? cat_names[cat] : "?"; }

int dt_trace_cat_parse(const char *name) {
    for (int i = 0; name && i < DT_TRACE_N_CATS; i++)
        if (!strcmp(name, cat_names[i])) return i;
    return -1;
}

static int64_t clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

dt_status_t dt_trace_init(int n_steps, int64_t first_step) {
    if (dt_trace_on_ || g.b) return dt_error(DT_STATUS_INVALID, "trace: the recorder is already on");
    if (n_steps < 2 || n_steps > DT_TRACE_MAX_STEPS)
        return dt_error(DT_STATUS_INVALID, "trace: log.trace_steps %d outside [2, %d]", n_steps, DT_TRACE_MAX_STEPS);
    g.n_steps = n_steps;
    g.b = dt_xcalloc((size_t)n_steps, sizeof *g.b);
    for (int i = 0; i < n_steps; i++) atomic_store(&g.b[i].step, -1);
    atomic_store(&g.dropped, 0);
    g.offset_ns = g.rtt_ns = 0;
    /* the pair read back to back: their difference converts every span to the wall clock */
    int64_t m0 = clock_ns(CLOCK_MONOTONIC), w = clock_ns(CLOCK_REALTIME), m1 = clock_ns(CLOCK_MONOTONIC);
    g.wall_minus_mono = w - (m0 + (m1 - m0) / 2);
    atomic_store(&g.cur, first_step - 1);
    dt_trace_step_begin(first_step);
    atomic_thread_fence(memory_order_release);
    dt_trace_on_ = 1;
    return DT_STATUS_OK;
}

void dt_trace_free(void) {
    dt_trace_on_ = 0;
    if (!g.b) return;
    for (int i = 0; i < g.n_steps; i++) free(g.b[i].spans);
    free(g.b);
    g.b = NULL;
    g.n_steps = 0;
}

static bucket *bucket_of(int64_t step) { return &g.b[(uint64_t)step % (uint64_t)g.n_steps]; }

void dt_trace_step_begin(int64_t step) {
    if (!g.b) return;
    bucket *b = bucket_of(step);
    if (!b->spans) b->spans = dt_xcalloc(DT_TRACE_SPANS_PER_STEP, sizeof *b->spans); /* the trainer's thread */
    uint32_t had = atomic_load(&b->n);
    if (had > DT_TRACE_SPANS_PER_STEP) atomic_fetch_add(&g.dropped, had - DT_TRACE_SPANS_PER_STEP);
    atomic_store(&b->n, 0);
    atomic_store(&b->step, step);
    atomic_store(&g.cur, step);
}

int64_t dt_trace_current_step(void) { return dt_trace_on_ ? atomic_load(&g.cur) : -1; }

void dt_trace_add_(const dt_trace_rec *s) {
    int64_t step = atomic_load_explicit(&g.cur, memory_order_acquire);
    bucket *b = bucket_of(step);
    uint32_t i = atomic_fetch_add_explicit(&b->n, 1, memory_order_relaxed);
    if (i >= DT_TRACE_SPANS_PER_STEP || !b->spans) return; /* counted as dropped when collected */
    b->spans[i] = *s;
    b->spans[i].step = step;
}

static void copy_name(char *dst, size_t cap, const char *src) {
    size_t n = src ? strnlen(src, cap - 1) : 0;
    memcpy(dst, src ? src : "", n);
    dst[n] = 0;
}

void dt_trace_phase_(int cat, const char *name, double t0_s, double t1_s) {
    dt_trace_rec s;
    memset(&s, 0, offsetof(dt_trace_rec, name));
    s.t0_ns = (uint64_t)(t0_s * 1e9 + 0.5);
    s.t1_ns = (uint64_t)(t1_s * 1e9 + 0.5);
    if (s.t1_ns < s.t0_ns) s.t1_ns = s.t0_ns;
    s.queued_ns = s.t0_ns;
    s.peer = -1;
    s.cat = (uint8_t)cat;
    copy_name(s.name, sizeof s.name, name);
    s.dtype[0] = s.comm[0] = 0;
    dt_trace_add_(&s);
}

void dt_trace_set_clock(int64_t offset_ns, int64_t rtt_ns) {
    g.offset_ns = offset_ns;
    g.rtt_ns = rtt_ns;
}

void dt_trace_cristian(int64_t t_send, int64_t t_server, int64_t t_recv, int64_t *offset_ns, int64_t *rtt_ns) {
    int64_t rtt = t_recv - t_send;
    if (rtt < 0) rtt = 0;
    /* the server read its clock, on average, half a round trip before we received */
    *offset_ns = t_server + rtt / 2 - t_recv;
    *rtt_ns = rtt;
}

/* ---- collecting ------------------------------------------------------------------ */

static int by_start(const void *a, const void *b) {
    const dt_trace_rec *x = a, *y = b;
    if (x->t0_ns != y->t0_ns) return x->t0_ns < y->t0_ns ? -1 : 1;
    if (x->t1_ns != y->t1_ns) return x->t1_ns > y->t1_ns ? -1 : 1; /* the enclosing span first */
    return 0;
}

static int by_step(const void *a, const void *b) {
    const bucket *x = *(bucket *const *)a, *y = *(bucket *const *)b;
    int64_t s = atomic_load(&x->step), t = atomic_load(&y->step);
    return s < t ? -1 : s > t;
}

/* Ops of one communicator run in order: an op whose start the backend reported
 * before its predecessor's end (issued to NCCL's stream meanwhile) starts there. */
static void serialise_ops(dt_trace_rec *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i].cat != DT_TRACE_OP) continue;
        for (size_t j = i + 1; j < n; j++) {
            if (s[j].cat != DT_TRACE_OP || strcmp(s[j].comm, s[i].comm)) continue;
            if (s[j].t0_ns < s[i].t1_ns) s[j].t0_ns = s[i].t1_ns < s[j].t1_ns ? s[i].t1_ns : s[j].t1_ns;
            break;
        }
    }
}

dt_status_t dt_trace_collect(dt_trace_rec **out, size_t *n, uint64_t *dropped) {
    *out = NULL;
    *n = 0;
    *dropped = 0;
    if (!g.b) return dt_error(DT_STATUS_INVALID, "trace: the recorder is off");
    bucket **order = dt_xcalloc((size_t)g.n_steps, sizeof *order);
    size_t total = 0;
    int nb = 0;
    *dropped = atomic_load(&g.dropped);
    for (int i = 0; i < g.n_steps; i++) {
        if (atomic_load(&g.b[i].step) < 0 || !g.b[i].spans) continue;
        order[nb++] = &g.b[i];
        uint32_t k = atomic_load(&g.b[i].n);
        if (k > DT_TRACE_SPANS_PER_STEP) *dropped += k - DT_TRACE_SPANS_PER_STEP, k = DT_TRACE_SPANS_PER_STEP;
        total += k;
    }
    qsort(order, (size_t)nb, sizeof *order, by_step);
    dt_trace_rec *all = dt_xcalloc(total + 1, sizeof *all);
    size_t at = 0;
    for (int i = 0; i < nb; i++) {
        uint32_t k = atomic_load(&order[i]->n);
        if (k > DT_TRACE_SPANS_PER_STEP) k = DT_TRACE_SPANS_PER_STEP;
        if (at + k > total) k = (uint32_t)(total - at); /* a span added since: left out */
        memcpy(all + at, order[i]->spans, (size_t)k * sizeof *all);
        qsort(all + at, k, sizeof *all, by_start);
        serialise_ops(all + at, k);
        at += k;
    }
    free(order);
    *out = all;
    *n = at;
    return DT_STATUS_OK;
}

/* ---- the rank file ---------------------------------------------------------------- */



dt_status_t dt_trace_write_rank(const char *path, const dt_trace_rank_info *info) {
    dt_trace_rec *s;
    size_t n;
    uint64_t dropped;
    DT_CHECK(dt_trace_collect(&s, &n, &dropped));
    /* times: ns after epoch_ns (a string: past 2^53), on this rank's wall clock */
    uint64_t epoch = n ? s[0].queued_ns : 0;
    for (size_t i = 0; i < n; i++)
        if (s[i].queued_ns < epoch) epoch = s[i].queued_ns;
    int64_t epoch_wall = (int64_t)epoch + g.wall_minus_mono;
    dt_strbuf b = {dt_xmalloc(4096), 0, 4096};
    dt_strbuf_printf(&b, "{\"format\": \"dtrun-trace-rank\", \"version\": 1, \"rank\": %d, \"world_size\": %d, \"host\": ",
              info->rank, info->world_size);
    dt_strbuf_json_str(&b, info->host ? info->host : "");
    dt_strbuf_printf(&b, ",\n \"trace_steps\": %d, \"epoch_ns\": \"%" PRId64 "\", \"clock_offset_ns\": %" PRId64
              ", \"clock_rtt_ns\": %" PRId64 ", \"dropped\": %" PRIu64 ",\n \"spans\": [",
              info->n_steps, epoch_wall, g.offset_ns, g.rtt_ns, dropped);
    for (size_t i = 0; i < n; i++) {
        const dt_trace_rec *x = &s[i];
        dt_strbuf_printf(&b, "%s\n  {\"t0\": %" PRIu64 ", \"t1\": %" PRIu64 ", \"step\": %" PRId64 ", \"cat\": \"%s\", \"name\": ",
                  i ? "," : "", x->t0_ns - epoch, x->t1_ns - epoch, x->step, dt_trace_cat_name(x->cat));
        dt_strbuf_json_str(&b, x->name);
        if (x->cat == DT_TRACE_OP) {
            dt_strbuf_printf(&b, ", \"queued\": %" PRIu64 ", \"comm\": ", x->queued_ns - epoch);
            dt_strbuf_json_str(&b, x->comm);
            dt_strbuf_printf(&b, ", \"seq\": %" PRIu64 ", \"count\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"dtype\": ", x->seq,
                      x->count, x->count * x->elem_bytes);
            dt_strbuf_json_str(&b, x->dtype);
            dt_strbuf_printf(&b, ", \"peer\": %d, \"p2p\": %s%s", x->peer, x->p2p ? "true" : "false",
                      x->failed ? ", \"failed\": true" : "");
        }
        dt_strbuf_printf(&b, "}");
    }
    dt_strbuf_printf(&b, "\n]}\n");
    free(s);
    dt_status_t st = dt_fs_write_atomic(path, b.p, b.len, NULL, 0);
    free(b.p);
    return st;
}
