/*
 * preflight_gpu.c - the preflight's GPU health (preflight.c posts and compares
 * records; this file says what a node's GPUs are and judges them):
 *
 *   - each node posts the GPUs its ranks will use (the first min(nproc_per_node,
 *     visible) of CUDA_VISIBLE_DEVICES, as rank r opens GPU r % visible), as the
 *     driver reports them through NVML without a CUDA context (common/gpuinfo.h):
 *     name, memory, volatile uncorrectable ECC errors, row remapping state; and the
 *     GPU memory each rank needs (the memory check's bytes, dtrun plan's formula);
 *   - an uncorrectable ECC error, a failed or pending row remapping on a GPU a rank
 *     will use is an error naming the node and the GPU (exit 3: the node cannot take
 *     part; nothing was started);
 *   - GPUs of one node that are not alike, a node whose GPUs differ from node 0's,
 *     a GPU with less memory than a rank needs are warnings naming them.
 *
 * Record lines (key TAB value): "@gpu_run 1", "@gpu_need BYTES", and per used GPU
 * "@gpu K" = "NAME|MEM_BYTES|ECC|REMAP_FAILED|REMAP_PENDING" (ECC -1: not reported).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gpuinfo.h" /* defines: dt_gpuinfo_health */
#include "runtime/launch/agent_impl.h"

#define PF_GPU_MAX 64

/* Does this launch's workers compute on GPUs? A config run says (its device); under
 * --exec, bench comm and `dtrun check` without a config, any visible GPU is taken to
 * be used, as torchrun's users do. */
int dt_pf_gpu_run(const dt_launch_spec_t *sp) {
    if (sp->mode == DT_LAUNCH_MODE_CONFIG) return !sp->preflight_cpu;
    return 1;
}

size_t dt_pf_gpu_record(const dt_launch_spec_t *sp, char *out, size_t cap) {
    if (!dt_pf_gpu_run(sp) || cap == 0) return 0;
    dt_gpu_health h[PF_GPU_MAX];
    int n = dt_gpuinfo_health(h, PF_GPU_MAX);
    if (n <= 0) return 0; /* no driver to ask, or no GPU: the GPU count says so */
    int used = sp->nproc_per_node < n ? sp->nproc_per_node : n;
    size_t o = 0;
    o += (size_t)snprintf(out + o, cap - o, "@gpu_run\t1\n@gpu_need\t%.0f\n", sp->preflight_gpu_need);
    for (int k = 0; k < used && o < cap; k++) {
        for (char *c = h[k].name; *c; c++)
            if (*c == '|' || *c == '\t' || *c == '\n') *c = ' ';
        o += (size_t)snprintf(out + o, cap - o, "@gpu %d\t%s|%.0f|%lld|%d|%d\n", k, h[k].name, h[k].mem_bytes,
                              h[k].ecc_uncorrected, h[k].remap_failed, h[k].remap_pending);
    }
    return o < cap ? o : cap - 1;
}

typedef struct gpu {
    char name[100];
    double mem;
    long long ecc;
    int failed, pending;
} gpu_t;

static int gpu_get(dt_pf_get_fn get, const void *rec, int k, gpu_t *g) {
    char key[32];
    snprintf(key, sizeof key, "@gpu %d", k);
    const char *v = get(rec, key);
    if (!v) return 0;
    const char *bar = strchr(v, '|');
    if (!bar) return 0;
    snprintf(g->name, sizeof g->name, "%.*s", (int)(bar - v < 99 ? bar - v : 99), v);
    if (sscanf(bar + 1, "%lf|%lld|%d|%d", &g->mem, &g->ecc, &g->failed, &g->pending) != 4) return 0;
    return 1;
}

static void gib(double b, char *out, size_t len) {
    if (b >= 1024.0 * 1024 * 1024) snprintf(out, len, "%.0f GiB", b / (1024.0 * 1024 * 1024));
    else snprintf(out, len, "%.0f MiB", b / (1024.0 * 1024));
}

int dt_pf_gpu_judge(dt_pf_get_fn get, const void *rec, const void *rec0, char *err, size_t errlen, char *warn,
                    size_t warnlen, char *cell, size_t celllen) {
    err[0] = warn[0] = '\0';
    snprintf(cell, celllen, "-");
    if (!get(rec, "@gpu_run")) return 0;
    gpu_t g0, g;
    int used = 0, bad = 0, unlike = 0;
    size_t eo = 0, wo = 0;
    if (!gpu_get(get, rec, 0, &g0)) return 0;
    double need = atof(get(rec, "@gpu_need") ? get(rec, "@gpu_need") : "0");
    for (int k = 0; gpu_get(get, rec, k, &g); k++, used++) {
        const char *why = NULL;
        char what[160];
        if (g.ecc > 0) {
            snprintf(what, sizeof what, "has %lld uncorrectable ECC error(s) since the driver loaded", g.ecc);
            why = what;
        } else if (g.failed) {
            why = "has a failed row remapping (the GPU needs service)";
        } else if (g.pending) {
            why = "has a row remapping pending (reset the GPU first)";
        }
        if (why && eo + 200 < errlen) {
            eo += (size_t)snprintf(err + eo, errlen - eo, "%sGPU %d (%s) %s", eo ? "; " : "", k, g.name, why);
            bad++;
        }
        if (k > 0 && (strcmp(g.name, g0.name) || g.mem != g0.mem) && !unlike++ && wo + 300 < warnlen) {
            char a[24], b[24];
            gib(g0.mem, a, sizeof a);
            gib(g.mem, b, sizeof b);
            wo += (size_t)snprintf(warn + wo, warnlen - wo, "%sGPUs are not alike: GPU 0 is %s (%s), GPU %d is %s (%s)",
                                   wo ? "; " : "", g0.name, a, k, g.name, b);
        }
        if (need > 0 && g.mem > 0 && g.mem < need && wo + 200 < warnlen) {
            char a[24], b[24];
            gib(g.mem, a, sizeof a);
            gib(need, b, sizeof b);
            wo += (size_t)snprintf(warn + wo, warnlen - wo, "%sGPU %d (%s) has %s, each rank needs %s (dtrun plan)",
                                   wo ? "; " : "", k, g.name, a, b);
        }
    }
    gpu_t h0;
    if (rec0 != rec && gpu_get(get, rec0, 0, &h0) && strcmp(h0.name, g0.name) && wo + 200 < warnlen)
        wo += (size_t)snprintf(warn + wo, warnlen - wo, "%sits GPUs are %s, node 0's are %s", wo ? "; " : "",
                               g0.name, h0.name);
    char m[24];
    gib(g0.mem, m, sizeof m);
    snprintf(cell, celllen, "%d x %.24s %s%s", used, g0.name, m, bad ? " BAD" : " ok");
    return bad;
}
