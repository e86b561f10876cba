/*
 * stragglers.c - the slowest rank at each logged step, the straggler warning and
 * the per-rank compute-time statistics of summary.json (stragglers.h).
 *
 * Every rank keeps every gathered sample (one double per rank per logged step: a
 * run of 100k steps printed every 10 is 10k samples per rank), so that rank 0's
 * percentiles are exact.
 */
#include "runtime/train/stragglers.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/mem.h"

struct dt_stragglers {
    dt_dp_t *dp;
    int rank, world_size;
    int slow_rank;     /* DTRUN_TEST_SLOW_RANK's rank, -1 when unset */
    double slow_ms;
    double *samples;   /* [n][world_size] compute ms */
    int64_t n, cap;
    int64_t *slowest;  /* times each rank was the slowest */
    int *streak;       /* logged steps in a row over the ratio */
    int *warned;       /* 1 once warned about */
};

dt_status_t dt_stragglers_init(dt_dp_t *dp, int rank, dt_stragglers_t **out) {
    *out = NULL;
    int slow_rank = -1;
    double slow_ms = 0;
    const char *e = getenv("DTRUN_TEST_SLOW_RANK");
    if (e && *e) {
        char *end;
        long r = strtol(e, &end, 10);
        if (end == e || *end != ':') return dt_error(DT_STATUS_CONFIG, "DTRUN_TEST_SLOW_RANK: expected RANK:MS, found \"%s\"", e);
        const char *ms = end + 1;
        slow_ms = strtod(ms, &end);
        if (end == ms || *end || r < 0 || !(slow_ms >= 0))
            return dt_error(DT_STATUS_CONFIG, "DTRUN_TEST_SLOW_RANK: expected RANK:MS, found \"%s\"", e);
        slow_rank = (int)r;
    }
    dt_stragglers_t *s = dt_xcalloc(1, sizeof *s);
    s->dp = dp;
    s->rank = rank;
    s->world_size = dt_dp_world_size(dp);
    s->slow_rank = slow_rank;
    s->slow_ms = slow_ms;
    s->slowest = dt_xcalloc((size_t)s->world_size, sizeof *s->slowest);
    s->streak = dt_xcalloc((size_t)s->world_size, sizeof *s->streak);
    s->warned = dt_xcalloc((size_t)s->world_size, sizeof *s->warned);
    *out = s;
    return DT_STATUS_OK;
}

void dt_stragglers_free(dt_stragglers_t *s) {
    if (!s) return;
    free(s->samples);
    free(s->slowest);
    free(s->streak);
    free(s->warned);
    free(s);
}

void dt_stragglers_test_delay(const dt_stragglers_t *s) {
    if (!s || s->slow_rank != s->rank || s->slow_ms <= 0) return;
    struct timespec ts = {(time_t)(s->slow_ms / 1e3), (long)(fmod(s->slow_ms, 1e3) * 1e6)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile (0..1) of v[0..n) sorted, by the nearest rank below. */
static double quantile(const double *v, int64_t n, double q) {
    if (n <= 0) return 0;
    int64_t k = (int64_t)floor(q * (double)(n - 1) + 0.5);
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

dt_status_t dt_stragglers_gather(dt_stragglers_t *s, int64_t step, double compute_ms, dt_straggler_row *out) {
    int w = s->world_size;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->samples = dt_xrealloc(s->samples, (size_t)s->cap * (size_t)w * sizeof *s->samples);
    }
    double *all = s->samples + (size_t)s->n * (size_t)w;
    DT_CHECK(dt_dp_all_gather_f64(s->dp, &compute_ms, 1, all)); /* one rank: a copy */
    s->n++;
    double *sorted = dt_xcalloc((size_t)w, sizeof *sorted);
    memcpy(sorted, all, (size_t)w * sizeof *sorted);
    qsort(sorted, (size_t)w, sizeof *sorted, cmp_double);
    double median = w % 2 ? sorted[w / 2] : 0.5 * (sorted[w / 2 - 1] + sorted[w / 2]);
    free(sorted);
    int slow = 0;
    for (int r = 1; r < w; r++)
        if (all[r] > all[slow]) slow = r;
    s->slowest[slow]++;
    *out = (dt_straggler_row){
        .slowest_rank = slow, .slowest_ms = all[slow], .median_ms = median, .rank_ms = all, .n_ranks = w};
    for (int r = 0; r < w; r++) {
        int over = all[r] > DT_STRAGGLER_RATIO * median && all[r] - median >= DT_STRAGGLER_MIN_MS;
        s->streak[r] = over ? s->streak[r] + 1 : 0;
        if (s->streak[r] == DT_STRAGGLER_PRINTS && s->rank == 0) {
            s->warned[r] = 1;
            DT_LOG_WARN("straggler: rank %d computed %.1f ms at step %lld, %.0f%% over the ranks' median %.1f ms, "
                        "for %d logged steps in a row (look at its host: a busy core, thermal throttling, a slow "
                        "link or GPU)",
                        r, all[r], (long long)step, 100.0 * (all[r] / median - 1.0), median, DT_STRAGGLER_PRINTS);
        }
    }
    return DT_STATUS_OK;
}

void dt_stragglers_summary(const dt_stragglers_t *s, struct cJSON *obj) {
    if (!s) return;
    int w = s->world_size;
    cJSON *st = cJSON_AddObjectToObject(obj, "step_time");
    cJSON_AddNumberToObject(st, "logged_steps", (double)s->n);
    cJSON_AddNumberToObject(st, "straggler_ratio", DT_STRAGGLER_RATIO);
    cJSON *warned = cJSON_AddArrayToObject(st, "stragglers");
    for (int r = 0; r < w; r++)
        if (s->warned[r]) cJSON_AddItemToArray(warned, cJSON_CreateNumber(r));
    cJSON *ranks = cJSON_AddArrayToObject(st, "ranks");
    double *v = dt_xcalloc((size_t)(s->n > 0 ? s->n : 1), sizeof *v);
    for (int r = 0; r < w; r++) {
        double sum = 0;
        for (int64_t i = 0; i < s->n; i++) sum += v[i] = s->samples[(size_t)i * (size_t)w + (size_t)r];
        qsort(v, (size_t)s->n, sizeof *v, cmp_double);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", r);
        cJSON_AddNumberToObject(o, "mean_compute_ms", s->n ? sum / (double)s->n : 0);
        cJSON_AddNumberToObject(o, "p50_compute_ms", quantile(v, s->n, 0.5));
        cJSON_AddNumberToObject(o, "p90_compute_ms", quantile(v, s->n, 0.9));
        cJSON_AddNumberToObject(o, "max_compute_ms", s->n ? v[s->n - 1] : 0);
        cJSON_AddNumberToObject(o, "times_slowest", (double)s->slowest[r]);
        cJSON_AddItemToArray(ranks, o);
    }
    free(v);
}
