/*
 * stage.c - pipeline stages of a model (model.h): cutting the blocks into chunks
 * (uniform, or balancing parameters or FLOPs), what each chunk costs, and the layout
 * of one pipeline rank, which holds the units of its chunks in one flat buffer and
 * maps them to the whole model's layout as a tensor-parallel piece does (goffset,
 * out->global), so init, checkpoints and Hugging Face weights read and write a stage
 * as they do a TP piece.
 *
 * Only models with ops->pipeline can be cut: units [embedding = 0][block l = 1 + l]
 * [final = L + 1], tensor 0 the (Vp, C) embedding a tied head uses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xcalloc */
#include "runtime/model/model.h"

#define NAME_(n, s) s,
static const char *const partition_names[] = {DT_PP_PARTITION_MAP(NAME_)};
#undef NAME_

const char *dt_pp_partition_name(dt_pp_partition_t kind) {
    return (unsigned)kind < 3 ? partition_names[kind] : "?";
}

int dt_pp_partition_parse(const char *name, dt_pp_partition_t *out) {
    for (int i = 0; name && i < 3; i++)
        if (!strcmp(name, partition_names[i])) {
            *out = (dt_pp_partition_t)i;
            return 0;
        }
    return -1;
}

/* The whole model's layout behind l (a piece's global, or l). */
static const dt_model_layout *whole_of(const dt_model_layout *l) { return l->global ? l->global : l; }

static int n_blocks(const dt_model_layout *g) { return g->n_units - 2; }

/* The costs the partition balances: per block, and the extras of the first chunk
 * (the embedding) and the last (final norm and head). */
typedef struct stage_costs {
    double *block; /* (L) */
    double first, last;
} stage_costs;

static void costs_of(const dt_model_layout *g, dt_pp_partition_t kind, stage_costs *c) {
    int L = n_blocks(g);
    c->block = dt_xcalloc((size_t)(L > 0 ? L : 1), sizeof *c->block);
    if (kind == DT_PP_PARTITION_PARAMETERS) {
        for (int l = 0; l < L; l++) c->block[l] = (double)g->units[1 + l].numel;
        c->first = (double)g->units[0].numel;
        c->last = (double)g->units[L + 1].numel;
        return;
    }
    if (kind == DT_PP_PARTITION_UNIFORM) {
        for (int l = 0; l < L; l++) c->block[l] = 1;
        c->first = c->last = 0;
        return;
    }
    /* FLOPs: 6 per matmul parameter and token; the head multiplies by a (Vp, C)
     * weight, its own (untied: in the final unit) or the embedding (tied); the
     * attention term is what dt_model_flops_per_token counts beyond that, per block. */
    double matmul = 0;
    for (int l = 0; l < L; l++) matmul += 6.0 * (double)g->units[1 + l].numel;
    c->first = 0;
    c->last = 6.0 * (double)g->units[L + 1].numel + (g->tied ? 6.0 * (double)g->tensors[0].numel : 0);
    double attn = L > 0 ? (dt_model_flops_per_token(g) - matmul - c->last) / L : 0;
    for (int l = 0; l < L; l++) c->block[l] = 6.0 * (double)g->units[1 + l].numel + attn;
}

/* Cost of chunk c (of n) holding blocks [i, j); pre: prefix sums of the blocks. */
static double chunk_cost(const stage_costs *c, const double *pre, int n, int k, int i, int j) {
    return pre[j] - pre[i] + (k == 0 ? c->first : 0) + (k == n - 1 ? c->last : 0);
}

/* Contiguous chunks minimising the largest cost (dynamic programming over the
 * prefix: best[k][j] = the least largest cost of k chunks over blocks [0, j)), then
 * the cut that gives the later chunks the most blocks at that cost. */
static void partition_balanced(const stage_costs *c, int L, int n, int *bounds) {
    double *pre = dt_xcalloc((size_t)L + 1, sizeof *pre);
    for (int l = 0; l < L; l++) pre[l + 1] = pre[l] + c->block[l];
    size_t w = (size_t)L + 1;
    double *best = dt_xcalloc((size_t)(n + 1) * w, sizeof *best);
    for (int j = 1; j <= L; j++) best[1 * w + j] = chunk_cost(c, pre, n, 0, 0, j);
    for (int k = 2; k <= n; k++)
        for (int j = k; j <= L - (n - k); j++) {
            double m = -1;
            for (int i = k - 1; i < j; i++) {
                double a = best[(size_t)(k - 1) * w + i], b = chunk_cost(c, pre, n, k - 1, i, j);
                double v = a > b ? a : b;
                if (m < 0 || v < m) m = v;
            }
            best[(size_t)k * w + j] = m;
        }
    double M = best[(size_t)n * w + L];
    bounds[0] = 0;
    bounds[n] = L;
    int j = L;
    for (int k = n - 1; k >= 1; k--) {
        int i = k;
        while (i < j - 1 && !(chunk_cost(c, pre, n, k, i, j) <= M && best[(size_t)k * w + i] <= M)) i++;
        bounds[k] = i;
        j = i;
    }
    free(best);
    free(pre);
}

dt_status_t dt_model_pp_partition(const dt_model_layout *global, int stages, int virtual_stages,
                                  dt_pp_partition_t kind, int *bounds) {
    const dt_model_layout *g = whole_of(global);
    if (!g->spec.ops->pipeline)
        return dt_error(DT_STATUS_CONFIG, "pipeline.stages: model.type %s cannot be cut into pipeline stages",
                        g->spec.ops->name);
    if (stages < 1 || virtual_stages < 1)
        return dt_error(DT_STATUS_CONFIG, "pipeline.stages (%d) and pipeline.virtual_stages (%d): expected >= 1",
                        stages, virtual_stages);
    int L = n_blocks(g), n = stages * virtual_stages;
    if (n > L)
        return dt_error(DT_STATUS_CONFIG,
                        "pipeline.stages (%d) x pipeline.virtual_stages (%d) = %d chunks, but the model has %d "
                        "layers: each chunk needs at least one",
                        stages, virtual_stages, n, L);
    if (n > DT_MODEL_MAX_CHUNKS)
        return dt_error(DT_STATUS_CONFIG,
                        "pipeline.stages (%d) x pipeline.virtual_stages (%d) = %d chunks: at most %d are supported",
                        stages, virtual_stages, n, DT_MODEL_MAX_CHUNKS);
    if (kind == DT_PP_PARTITION_UNIFORM) {
        int base = L / n, extra = L % n;
        bounds[0] = 0;
        for (int k = 0; k < n; k++) bounds[k + 1] = bounds[k] + base + (k >= n - extra ? 1 : 0);
        return DT_STATUS_OK;
    }
    if (kind != DT_PP_PARTITION_PARAMETERS && kind != DT_PP_PARTITION_FLOPS)
        return dt_error(DT_STATUS_CONFIG, "pipeline.partition: expected uniform, parameters or flops");
    stage_costs c;
    costs_of(g, kind, &c);
    partition_balanced(&c, L, n, bounds);
    free(c.block);
    return DT_STATUS_OK;
}

void dt_model_pp_chunk_cost(const dt_model_layout *global, const int *bounds, int k, double *params, double *flops) {
    const dt_model_layout *g = whole_of(global);
    int L = n_blocks(g), n = 0;
    while (bounds[n] < L) n++; /* bounds[n] = L ends the chunks */
    stage_costs c;
    double p = 0, f = 0;
    costs_of(g, DT_PP_PARTITION_PARAMETERS, &c);
    for (int l = bounds[k]; l < bounds[k + 1]; l++) p += c.block[l];
    p += (k == 0 ? c.first : 0) + (k == n - 1 ? c.last : 0);
    free(c.block);
    costs_of(g, DT_PP_PARTITION_FLOPS, &c);
    for (int l = bounds[k]; l < bounds[k + 1]; l++) f += c.block[l];
    f += (k == 0 ? c.first : 0) + (k == n - 1 ? c.last : 0);
    free(c.block);
    if (params) *params = p;
    if (flops) *flops = f;
}

/* ---- stage layouts ---- */

int dt_model_local_unit(const dt_model_layout *l, int gunit) {
    if (gunit >= 0 && gunit < l->n_units && l->units[gunit].gunit == gunit) return gunit; /* whole model */
    for (int u = 0; u < l->n_units; u++)
        if (l->units[u].gunit == gunit) return u;
    return -1;
}

int dt_model_max_chunk_blocks(const dt_model_layout *l) {
    int m = 0;
    for (int k = 0; k < l->n_chunks; k++)
        if (l->chunks[k].l1 - l->chunks[k].l0 > m) m = l->chunks[k].l1 - l->chunks[k].l0;
    return m;
}

int dt_model_has_first(const dt_model_layout *l) {
    for (int k = 0; k < l->n_chunks; k++)
        if (l->chunks[k].first) return 1;
    return 0;
}

int dt_model_has_last(const dt_model_layout *l) {
    for (int k = 0; k < l->n_chunks; k++)
        if (l->chunks[k].last) return 1;
    return 0;
}

/* The checks of dt_model_layout_init_stage's arguments against the whole model g. */
static dt_status_t stage_check(const dt_model_layout *g, int pp_size, int pp_rank, int V, const int *bounds) {
    if (!g->spec.ops->pipeline)
        return dt_error(DT_STATUS_CONFIG, "pipeline.stages: model.type %s cannot be cut into pipeline stages",
                        g->spec.ops->name);
    if (pp_size < 1 || V < 1 || pp_size * V > DT_MODEL_MAX_CHUNKS)
        return dt_error(DT_STATUS_INVALID, "pipeline of %d stages x %d virtual stages: expected 1..%d chunks",
                        pp_size, V, DT_MODEL_MAX_CHUNKS);
    if (pp_size == 1 && V > 1)
        return dt_error(DT_STATUS_CONFIG, "pipeline.virtual_stages (%d) needs pipeline.stages >= 2", V);
    if (pp_rank < 0 || pp_rank >= pp_size)
        return dt_error(DT_STATUS_INVALID, "pipeline rank %d outside 0..%d", pp_rank, pp_size - 1);
    int n = pp_size * V, L = n_blocks(g);
    if (!bounds || bounds[0] != 0 || bounds[n] != L)
        return dt_error(DT_STATUS_INVALID, "pipeline partition must run from block 0 to %d", L);
    for (int k = 0; k < n; k++)
        if (bounds[k + 1] <= bounds[k])
            return dt_error(DT_STATUS_INVALID, "pipeline chunk %d holds no block ([%d, %d))", k, bounds[k],
                            bounds[k + 1]);
    return DT_STATUS_OK;
}

dt_status_t dt_model_layout_init_stage(const dt_model_spec *spec, int tp_size, int tp_rank, int sp, int pp_size,
                                       int pp_rank, int virtual_stages, const int *bounds, dt_model_layout *out) {
    memset(out, 0, sizeof *out); /* freeable on every error below */
    if (pp_size <= 1 && virtual_stages <= 1) return dt_model_layout_init_tp(spec, tp_size, tp_rank, sp, out);
    dt_model_layout piece; /* the whole model at this TP rank */
    DT_CHECK(dt_model_layout_init_tp(spec, tp_size, tp_rank, sp, &piece));
    dt_model_layout *g = piece.global;
    piece.global = NULL;
    if (!g) {
        g = dt_xcalloc(1, sizeof *g);
        dt_status_t st = dt_model_layout_init(spec, g);
        if (st != DT_STATUS_OK) {
            free(g);
            dt_model_layout_free(&piece);
            return st;
        }
    }
    dt_status_t st = stage_check(g, pp_size, pp_rank, virtual_stages, bounds);
    if (st != DT_STATUS_OK) {
        dt_model_layout_free(g);
        free(g);
        dt_model_layout_free(&piece);
        return st;
    }
    int n = pp_size * virtual_stages, L = n_blocks(g);
    /* which whole-model units this rank holds */
    int *hold = dt_xcalloc((size_t)L + 2, sizeof *hold);
    out->spec = piece.spec;
    out->seq_len = piece.seq_len;
    out->in_features = piece.in_features;
    out->vocab_padded = piece.vocab_padded;
    out->tp_size = piece.tp_size;
    out->tp_rank = piece.tp_rank;
    out->sequence_parallel = piece.sequence_parallel;
    out->pp_size = pp_size;
    out->pp_rank = pp_rank;
    out->tied = piece.tied_head;
    for (int j = 0; j < virtual_stages; j++) {
        int k = pp_rank + j * pp_size;
        out->chunks[out->n_chunks++] = (dt_model_chunk){bounds[k], bounds[k + 1], k == 0, k == n - 1};
        for (int l = bounds[k]; l < bounds[k + 1]; l++) hold[1 + l] = 1;
        if (k == 0) hold[0] = 1;
        if (k == n - 1) hold[L + 1] = 1;
    }
    out->tied_head = out->tied && hold[0] && hold[L + 1];
    out->has_tied_copy = out->tied && hold[L + 1] && !hold[0];
    int nu = 0;
    for (int u = 0; u < L + 2; u++) nu += hold[u];
    out->units = dt_xcalloc((size_t)nu, sizeof *out->units);
    out->tensors = dt_xcalloc((size_t)piece.n_tensors, sizeof *out->tensors);
    for (int u = 0; u < L + 2; u++) {
        if (!hold[u]) continue;
        const dt_unit_info *pu = &piece.units[u];
        dt_unit_info *su = &out->units[out->n_units];
        *su = (dt_unit_info){.offset = out->n_params, .gunit = u, .tensor0 = out->n_tensors,
                             .n_tensors = pu->n_tensors};
        for (int i = pu->tensor0; i < pu->tensor0 + pu->n_tensors; i++) {
            dt_tensor_info *t = &out->tensors[out->n_tensors++];
            *t = piece.tensors[i]; /* goffset: already the whole model's offset */
            t->offset = out->n_params;
            t->unit = out->n_units;
            out->n_params += t->numel;
            su->numel += t->numel;
        }
        out->n_units++;
    }
    out->global = g;
    free(hold);
    dt_model_layout_free(&piece);
    return DT_STATUS_OK;
}
