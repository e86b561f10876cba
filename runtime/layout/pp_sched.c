/*
 * pp_sched.c - pipeline schedules as action lists (pp_sched.h).
 */
#include "runtime/layout/pp_sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xcalloc */

static const char *const schedule_names[] = {
#define X(n, s) s,
    DT_PP_SCHEDULE_MAP(X)
#undef X
};
#define N_SCHEDULES ((int)(sizeof schedule_names / sizeof schedule_names[0]))

int dt_pp_schedule_parse(const char *s) {
    for (int i = 0; s && i < N_SCHEDULES; i++)
        if (!strcmp(s, schedule_names[i])) return i;
    return -1;
}

const char *dt_pp_schedule_name(dt_pp_schedule_t kind) {
    return (int)kind >= 0 && (int)kind < N_SCHEDULES ? schedule_names[kind] : "?";
}

int dt_pp_schedule_check(dt_pp_schedule_t kind, int P, int V, int m, char *msg, size_t len) {
    if (P < 1 || m < 1 || V < 1) {
        snprintf(msg, len, "pipeline: stages %d, virtual_stages %d and micro-batches %d must be >= 1", P, V, m);
        return 1;
    }
    if (kind == DT_PP_INTERLEAVED) {
        if (V < 2) {
            snprintf(msg, len, "pipeline.virtual_stages: the interleaved schedule needs 2 or more chunks per rank, "
                               "found %d", V);
            return 1;
        }
        if (m % P != 0) {
            snprintf(msg, len, "gradient_accumulation_steps: the interleaved schedule needs the micro-batches per "
                               "step (%d) to be a multiple of pipeline.stages (%d)", m, P);
            return 1;
        }
        return 0;
    }
    if (V != 1) {
        snprintf(msg, len, "pipeline.virtual_stages %d: only the interleaved schedule runs several chunks per rank "
                           "(pipeline.schedule is \"%s\")", V, dt_pp_schedule_name(kind));
        return 1;
    }
    if (kind == DT_PP_1F1B && m < P) {
        snprintf(msg, len, "gradient_accumulation_steps: 1f1b needs at least as many micro-batches per step as "
                           "pipeline.stages (%d), found %d (raise it, or use pipeline.schedule \"gpipe\")", P, m);
        return 1;
    }
    return 0;
}

/* Megatron's interleaved order: forward k runs chunk (k / P) % V of micro-batch
 * (k / (P V)) P + k % P; backward k the chunks in reverse. */
static dt_pp_action interleaved_at(int P, int V, int k, int fwd) {
    int c = (k / P) % V;
    return (dt_pp_action){.fwd = fwd, .mb = (k / (P * V)) * P + k % P, .chunk = fwd ? c : V - 1 - c};
}

int dt_pp_schedule_build(dt_pp_schedule_t kind, int P, int V, int m, int s, dt_pp_action *out) {
    int n = 0;
    if (kind == DT_PP_GPIPE) {
        for (int i = 0; i < m; i++) out[n++] = (dt_pp_action){1, i, 0};
        for (int i = 0; i < m; i++) out[n++] = (dt_pp_action){0, i, 0};
        return n;
    }
    if (kind == DT_PP_1F1B) {
        int w = P - s - 1 < m ? P - s - 1 : m;
        for (int i = 0; i < w; i++) out[n++] = (dt_pp_action){1, i, 0};
        for (int i = 0; i < m - w; i++) {
            out[n++] = (dt_pp_action){1, w + i, 0};
            out[n++] = (dt_pp_action){0, i, 0};
        }
        for (int i = m - w; i < m; i++) out[n++] = (dt_pp_action){0, i, 0};
        return n;
    }
    int total = m * V, w = (P - s - 1) * 2 + (V - 1) * P;
    if (w > total) w = total;
    for (int k = 0; k < w; k++) out[n++] = interleaved_at(P, V, k, 1);
    for (int k = 0; k < total - w; k++) {
        out[n++] = interleaved_at(P, V, w + k, 1);
        out[n++] = interleaved_at(P, V, k, 0);
    }
    for (int k = total - w; k < total; k++) out[n++] = interleaved_at(P, V, k, 0);
    return n;
}

int dt_pp_action_receives(const dt_pp_action *a, int P, int V, int s) {
    int k = a->chunk * P + s; /* virtual stage */
    return a->fwd ? k > 0 : k < P * V - 1;
}

int dt_pp_action_sends(const dt_pp_action *a, int P, int V, int s) {
    int k = a->chunk * P + s;
    return a->fwd ? k < P * V - 1 : k > 0;
}

int dt_pp_arenas(dt_pp_schedule_t kind, int P, int V, int m, int s) {
    int n = 2 * m * V, held = 0, most = 0;
    dt_pp_action *a = dt_xcalloc((size_t)n, sizeof *a);
    char *taken = dt_xcalloc((size_t)n, 1); /* forward i took its arena ahead */
    dt_pp_schedule_build(kind, P, V, m, s, a);
    if (n > 0 && a[0].fwd && dt_pp_action_receives(&a[0], P, V, s)) taken[0] = 1, held++;
    for (int i = 0; i < n; i++) {
        if (i + 1 < n && a[i + 1].fwd && dt_pp_action_receives(&a[i + 1], P, V, s)) taken[i + 1] = 1, held++;
        if (a[i].fwd && !taken[i]) held++;
        if (held > most) most = held;
        if (!a[i].fwd) held--;
    }
    free(a);
    free(taken);
    return most;
}

double dt_pp_bubble_ideal(dt_pp_schedule_t kind, int P, int V, int m) {
    double vm = kind == DT_PP_INTERLEAVED ? (double)V * m : (double)m;
    return (P - 1) / (vm + P - 1);
}
