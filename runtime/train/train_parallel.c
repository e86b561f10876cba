/*
 * train_parallel.c - the trainer's model-parallel part (train_parallel.h): this rank's
 * piece of the model (its TP piece of its pipeline stage) and the partition line, the
 * pipeline's state (dt_train_pp): one step's micro-batches run through the pipeline
 * engine, the loss held by the last stage, the bubble figures and the pipeline's keys
 * of summary.json; and the whole model's parameters gathered from every piece.
 */
#include "runtime/train/train_parallel.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/trace.h" /* defines: dt_trace_span */
#include "common/clock.h"
#include "common/mem.h"

void dt_train_pp_init_(dt_train_pp *pp, const dt_config_t *cfg, dt_tp_place place) {
    *pp = (dt_train_pp){.cfg = cfg, .place = place, .virtual_stages = (int)cfg->pp.virtual_stages,
                        .micro_batches = (int)cfg->gradient_accumulation_steps,
                        .schedule = cfg->pp.schedule};
}

void dt_train_pp_free_(dt_train_pp *pp) {
    dt_pp_free(pp->engine);
    free(pp->mb_tokens);
    free(pp->mb_targets);
    free(pp->mb_batches);
    free(pp->bounds);
    pp->engine = NULL, pp->mb_tokens = pp->mb_targets = NULL, pp->mb_batches = NULL, pp->bounds = NULL;
}

int dt_train_pp_on_(const dt_train_pp *pp) { return pp->engine != NULL; }

dt_status_t dt_train_layout_(dt_train_pp *pp, const dt_model_spec *spec, int print, dt_model_layout *out) {
    const dt_config_t *cfg = pp->cfg;
    dt_tp_place p = pp->place;
    if (p.pp_size <= 1)
        return dt_model_layout_init_tp(spec, p.tp_size, p.tp_rank, cfg->tp.sequence_parallel, out);
    int V = pp->virtual_stages, n = p.pp_size * V;
    dt_model_layout whole;
    DT_CHECK(dt_model_layout_init(spec, &whole));
    pp->bounds = dt_xcalloc((size_t)n + 1, sizeof(int));
    dt_status_t st = dt_model_pp_partition(&whole, p.pp_size, V, cfg->pp.partition, pp->bounds);
    if (st == DT_STATUS_OK && print) { /* the partition, as Megatron and DeepSpeed print it */
        char chunks[48] = "";
        if (V > 1) snprintf(chunks, sizeof chunks, " x %d chunks each", V);
        printf("dtrun: pipeline of %d stages%s, %s schedule, %s partition:\n", p.pp_size, chunks,
               dt_pp_schedule_name(pp->schedule),
               dt_pp_partition_name(cfg->pp.partition));
        for (int k = 0; k < n; k++) {
            double prm, fl;
            char chunk[32] = "";
            if (V > 1) snprintf(chunk, sizeof chunk, " chunk %d", k / p.pp_size);
            dt_model_pp_chunk_cost(&whole, pp->bounds, k, &prm, &fl);
            printf("dtrun:   stage %d%s: layers %d-%d (%d)%s%s, %.0f parameters, %.4g FLOPs/token\n", k % p.pp_size,
                   chunk, pp->bounds[k], pp->bounds[k + 1] - 1, pp->bounds[k + 1] - pp->bounds[k],
                   k == 0 ? " + embedding" : "", k == n - 1 ? " + final norm, head and loss" : "", prm, fl);
        }
        fflush(stdout);
    }
    dt_model_layout_free(&whole);
    DT_CHECK(st);
    return dt_model_layout_init_stage(spec, p.tp_size, p.tp_rank, cfg->tp.sequence_parallel, p.pp_size, p.pp_rank,
                                      V, pp->bounds, out);
}

dt_status_t dt_train_pp_start_(dt_train_pp *pp, dt_device_t *dev, dt_net_t *net, dt_dp_t *dp, dt_comm_t *pp_comm,
                               dt_tp_t *tp, int B, int T) {
    if (pp->place.pp_size <= 1) return DT_STATUS_OK;
    const char *delay = getenv("DTRUN_PP_TEST_DELAY_MS");
    int m = pp->micro_batches;
    dt_pp_opts o = {.schedule = pp->schedule, .stages = pp->place.pp_size, .virtual_stages = pp->virtual_stages,
                    .micro_batches = m, .pp_comm = pp_comm, .tp = tp, .test_delay_ms = delay ? atof(delay) : 0};
    pp->rows = (size_t)B * (size_t)T;
    pp->mb_tokens = dt_xcalloc(pp->rows * (size_t)m, sizeof(int32_t));
    pp->mb_targets = dt_xcalloc(pp->rows * (size_t)m, sizeof(int32_t));
    pp->mb_batches = dt_xcalloc((size_t)m, sizeof(dt_batch));
    return dt_pp_init(&pp->engine, &o, dev, net, dp);
}

dt_status_t dt_train_pp_step_(dt_train_pp *pp, dt_data_t *data, int n_rows, double *loss_sum, double *data_s) {
    size_t rows = pp->rows;
    double d0 = dt_now_s();
    /* every stage reads the same micro-batches: the data position stays one */
    for (int a = 0; a < pp->micro_batches; a++) {
        int32_t *tok = pp->mb_tokens + (size_t)a * rows, *tgt = pp->mb_targets + (size_t)a * rows;
        DT_CHECK(dt_data_next(data, tok, tgt));
        pp->mb_batches[a] = (dt_batch){.tokens = tok, .targets = tgt};
    }
    double d1 = dt_now_s();
    *data_s += d1 - d0;
    dt_trace_span(DT_TRACE_DATA, "data", d0, d1);
    return dt_pp_step(pp->engine, pp->mb_batches, 1.0f / ((float)n_rows * (float)pp->micro_batches), loss_sum);
}

dt_status_t dt_train_pp_step_batches_(dt_train_pp *pp, const dt_batch *batches, float dscale, double *loss_sum) {
    return dt_pp_step(pp->engine, batches, dscale, loss_sum);
}

dt_status_t dt_train_pp_figures_(dt_train_pp *pp, dt_dp_t *dp, double out[4]) {
    dt_pp_stats ps;
    dt_pp_get_stats(pp->engine, &ps);
    int n = dt_dp_world_size(dp);
    /* The stages leave the step's last collective together, so the pipeline's span is
     * the longest stage's passes; a stage's bubble is the share of the span it did
     * not compute (waiting for a neighbour, or done before the others). */
    double mine[3] = {ps.pipeline_ms, ps.wait_ms, ps.p2p_bytes}, *all = dt_xcalloc((size_t)n * 3, sizeof *all);
    dt_status_t st = dt_dp_all_gather_f64(dp, mine, 3, all);
    double span = 0;
    for (int r = 0; r < n; r++) span = all[3 * r] > span ? all[3 * r] : span;
    out[0] = out[2] = out[3] = 0;
    for (int r = 0; r < n; r++) {
        double compute = all[3 * r] - all[3 * r + 1];
        out[0] += (span > 0 ? 1 - compute / span : 0) / n;
        out[2] += (span - compute) / n;
        out[3] += all[3 * r + 2];
    }
    out[1] = dt_pp_bubble_ideal(pp->schedule, pp->place.pp_size, pp->virtual_stages, pp->micro_batches);
    pp->span_ms += span;
    pp->compute_ms += ps.pipeline_ms - ps.wait_ms;
    pp->steps++;
    if (ps.arenas > pp->arenas) pp->arenas = ps.arenas;
    free(all);
    return st;
}

dt_status_t dt_train_mean_loss_(const dt_train_pp *pp, dt_dp_t *dp, double *x) {
    int n = dt_dp_world_size(dp);
    if (n == 1) return DT_STATUS_OK;
    /* the ranks holding the loss (the last stage's) count; the others send 0 of 0 */
    int holds = pp->place.pp_rank == pp->place.pp_size - 1;
    double mine[2] = {holds ? *x : 0, holds}, *all = dt_xcalloc((size_t)n * 2, sizeof *all), sum = 0, cnt = 0;
    dt_status_t st = dt_dp_all_gather_f64(dp, mine, 2, all);
    for (int r = 0; r < n; r++) sum += all[2 * r], cnt += all[2 * r + 1];
    free(all);
    if (st == DT_STATUS_OK) *x = cnt > 0 ? sum / cnt : NAN;
    return st;
}

/* ---- the whole model's parameters from every piece -------------------------------- */

typedef struct place_ctx {
    const float *piece;
    float *global;
} place_ctx;

static void place_piece(void *ctx, size_t local, size_t global, size_t n, int replicated) {
    (void)replicated;
    place_ctx *c = ctx;
    memcpy(c->global + global, c->piece + local, n * sizeof(float));
}

/* The layout of model-parallel rank (tp_rank, pp_rank). */
static dt_status_t piece_layout(const dt_train_pp *pp, const dt_model_layout *l, int tp_rank, int pp_rank,
                                dt_model_layout *out) {
    if (pp->place.pp_size <= 1)
        return dt_model_layout_init_tp(&l->spec, pp->place.tp_size, tp_rank, l->sequence_parallel, out);
    return dt_model_layout_init_stage(&l->spec, pp->place.tp_size, tp_rank, l->sequence_parallel, pp->place.pp_size,
                                      pp_rank, pp->virtual_stages, pp->bounds, out);
}

dt_status_t dt_train_gather_params_(const dt_train_pp *pp, const dt_model_layout *layout, dt_device_t *dev,
                                     dt_dp_t *dp, dt_comm_t *all, float **out) {
    size_t n = layout->n_params;
    float *piece = dt_mem_alloc(DT_MEM_OTHER, (n ? n : 1) * sizeof(float));
    if (!piece) return DT_STATUS_NOMEM;
    dt_status_t st = dt_dp_gather_params(dp, piece);
    if (st != DT_STATUS_OK || !layout->global) {
        if (st == DT_STATUS_OK) *out = piece;
        else dt_mem_free(piece);
        return st;
    }
    /* the model-parallel group: the TP x PP ranks of this DP rank (and CP rank: CP
     * replicates the parameters), ordered stage-major */
    int T = pp->place.tp_size, P = pp->place.pp_size, M = T * P;
    dt_comm_t *mp = NULL;
    st = dt_comm_split(all, pp->place.dp_rank * (pp->place.cp_size > 0 ? pp->place.cp_size : 1) + pp->place.cp_rank,
                       pp->place.pp_rank * T + pp->place.tp_rank, &mp);
    /* pieces differ in size (stages): each is sent padded to the largest */
    size_t most = n;
    if (st == DT_STATUS_OK) {
        double mine = (double)n;
        int world = dt_dp_world_size(dp);
        double *sizes = dt_xcalloc((size_t)world, sizeof(double));
        st = dt_dp_all_gather_f64(dp, &mine, 1, sizes);
        for (int r = 0; r < world; r++) most = sizes[r] > (double)most ? (size_t)sizes[r] : most;
        free(sizes);
    }
    const dt_model_layout *g = layout->global;
    const dt_ops_t *o = dev->ops;
    float *allp = dt_mem_alloc(DT_MEM_OTHER, (size_t)M * most * sizeof(float));
    float *global = dt_mem_alloc(DT_MEM_OTHER, g->n_params * sizeof(float));
    void *dsend = NULL, *drecv = NULL;
    int ok = allp && global && o->alloc(dev, DT_MEM_OTHER, most * sizeof(float), &dsend) == DT_STATUS_OK &&
             o->alloc(dev, DT_MEM_OTHER, (size_t)M * most * sizeof(float), &drecv) == DT_STATUS_OK;
    /* every rank reaches the gather or none does: agree on the buffers first */
    if (st == DT_STATUS_OK) {
        int world = dt_dp_world_size(dp);
        double mine = ok, *oks = dt_xcalloc((size_t)world, sizeof *oks);
        st = dt_dp_all_gather_f64(dp, &mine, 1, oks);
        for (int r = 0; r < world; r++) ok = ok && oks[r] != 0;
        free(oks);
        if (st == DT_STATUS_OK && !ok)
            st = dt_error(DT_STATUS_NOMEM, "gathering the whole model's parameters: a rank cannot hold %.1f MB more",
                          (double)(2 * M * most + g->n_params) * 4 / 1e6);
    }
    if (st != DT_STATUS_OK) goto out_free;
    memset(allp, 0, (size_t)M * most * sizeof(float));
    DT_CHECK_GOTO(o->set(dev, dsend, 0, most * sizeof(float)), st, out_free);
    DT_CHECK_GOTO(o->copy(dev, dsend, piece, n * sizeof(float), DT_COPY_HOST_TO_DEVICE), st, out_free);
    DT_CHECK_GOTO(o->synchronize(dev), st, out_free);
    DT_CHECK_GOTO(dt_comm_all_gather(mp, dsend, drecv, most, DT_COMM_F32), st, out_free);
    DT_CHECK_GOTO(o->copy(dev, allp, drecv, (size_t)M * most * sizeof(float), DT_COPY_DEVICE_TO_HOST), st, out_free);
    DT_CHECK_GOTO(o->synchronize(dev), st, out_free);
    for (int r = M - 1; r >= 0 && st == DT_STATUS_OK; r--) { /* TP rank 0 last: its replicated tensors stand */
        dt_model_layout lr;
        st = piece_layout(pp, layout, r % T, r / T, &lr);
        if (st != DT_STATUS_OK) break;
        place_ctx c = {allp + (size_t)r * most, global};
        dt_model_tp_segments(&lr, 0, lr.n_params, place_piece, &c);
        dt_model_layout_free(&lr);
    }
out_free:
    dt_comm_free(mp);
    o->free(dev, dsend);
    o->free(dev, drecv);
    dt_mem_free(allp);
    dt_mem_free(piece);
    if (st == DT_STATUS_OK) *out = global;
    else dt_mem_free(global);
    return st;
}

/* ---- summary.json ------------------------------------------------------------------ */

void dt_train_pp_my_figures_(const dt_train_pp *pp, double v[DT_TRAIN_PP_FIGS]) {
    double steps = pp->steps > 0 ? (double)pp->steps : 1;
    v[0] = pp->place.pp_rank;
    v[1] = pp->span_ms > 0 ? 1 - pp->compute_ms / pp->span_ms : 0;
    v[2] = pp->compute_ms / steps;
    v[3] = pp->arenas;
}

void dt_train_pp_write_summary_(const dt_train_pp *pp, cJSON *lay) {
    if (!pp->engine) return;
    cJSON_AddStringToObject(lay, "schedule", dt_pp_schedule_name(pp->schedule));
    cJSON_AddNumberToObject(lay, "virtual_stages", (double)pp->cfg->pp.virtual_stages);
    cJSON_AddNumberToObject(lay, "micro_batches", pp->micro_batches);
    cJSON_AddNumberToObject(lay, "bubble_ideal",
                            dt_pp_bubble_ideal(pp->schedule, pp->place.pp_size, pp->virtual_stages, pp->micro_batches));
    cJSON *b = cJSON_AddArrayToObject(lay, "bounds"); /* chunk k: blocks [bounds[k], bounds[k+1]) */
    for (int k = 0; k <= pp->place.pp_size * pp->virtual_stages; k++)
        cJSON_AddItemToArray(b, cJSON_CreateNumber(pp->bounds[k]));
}

void dt_train_pp_write_rank_summary_(const dt_train_pp *pp, const double v[DT_TRAIN_PP_FIGS], cJSON *r) {
    if (!pp->engine) return; /* its stage, what it computed per step and how long it waited (the bubble) */
    cJSON *p = cJSON_AddObjectToObject(r, "pipeline");
    cJSON_AddNumberToObject(p, "stage", v[0]);
    cJSON_AddNumberToObject(p, "compute_ms_per_step", v[2]);
    cJSON_AddNumberToObject(p, "bubble", v[1]);
    cJSON_AddNumberToObject(p, "activation_arenas", v[3]);
}
