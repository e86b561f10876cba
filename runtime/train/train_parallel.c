/*
 * train_parallel.c - the trainer's model-parallel parts (trainer_impl.h): this rank's
 * piece of the model (its TP piece of its pipeline stage) and the partition line, one
 * step's micro-batches run through the pipeline engine, evaluation through the
 * stages, the loss held by the last stage, and the whole model's parameters gathered
 * from every piece.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/mem.h"
#include "runtime/train/trainer_impl.h"

dt_status_t dt_train_layout_(dt_trainer_t *t, const dt_model_spec *spec) {
    const dt_config_t *cfg = t->cfg;
    dt_tp_place p = t->place;
    if (p.pp_size <= 1)
        return dt_model_layout_init_tp(spec, p.tp_size, p.tp_rank, cfg->tp.sequence_parallel, &t->layout);
    int V = (int)cfg->pp.virtual_stages, n = p.pp_size * V;
    dt_model_layout whole;
    DT_CHECK(dt_model_layout_init(spec, &whole));
    t->pp_bounds = dt_xcalloc((size_t)n + 1, sizeof(int));
    dt_status_t st = dt_model_pp_partition(&whole, p.pp_size, V, (dt_pp_partition_t)cfg->pp.partition, t->pp_bounds);
    if (st == DT_STATUS_OK && t->env->rank == 0) { /* the partition, as Megatron and DeepSpeed print it */
        char chunks[48] = "";
        if (V > 1) snprintf(chunks, sizeof chunks, " x %d chunks each", V);
        printf("dtrun: pipeline of %d stages%s, %s schedule, %s partition:\n", p.pp_size, chunks,
               dt_pp_schedule_name(dt_train_pp_schedule_(cfg)),
               dt_pp_partition_name((dt_pp_partition_t)cfg->pp.partition));
        for (int k = 0; k < n; k++) {
            double prm, fl;
            char chunk[32] = "";
            if (V > 1) snprintf(chunk, sizeof chunk, " chunk %d", k / p.pp_size);
            dt_model_pp_chunk_cost(&whole, t->pp_bounds, k, &prm, &fl);
            printf("dtrun:   stage %d%s: layers %d-%d (%d)%s%s, %.0f parameters, %.4g FLOPs/token\n", k % p.pp_size,
                   chunk, t->pp_bounds[k], t->pp_bounds[k + 1] - 1, t->pp_bounds[k + 1] - t->pp_bounds[k],
                   k == 0 ? " + embedding" : "", k == n - 1 ? " + final norm, head and loss" : "", prm, fl);
        }
        fflush(stdout);
    }
    dt_model_layout_free(&whole);
    DT_CHECK(st);
    return dt_model_layout_init_stage(spec, p.tp_size, p.tp_rank, cfg->tp.sequence_parallel, p.pp_size, p.pp_rank,
                                      V, t->pp_bounds, &t->layout);
}

/* The config holds the schedule as pp_sched.h's enum (config.h). */
dt_pp_schedule_t dt_train_pp_schedule_(const dt_config_t *cfg) { return cfg->pp.schedule; }

dt_status_t dt_train_pp_init_(dt_trainer_t *t) {
    if (t->place.pp_size <= 1) return DT_STATUS_OK;
    const char *delay = getenv("DTRUN_PP_TEST_DELAY_MS");
    dt_pp_opts o = {.schedule = dt_train_pp_schedule_(t->cfg), .stages = t->place.pp_size,
                    .virtual_stages = (int)t->cfg->pp.virtual_stages, .micro_batches = t->accum,
                    .pp_comm = t->pp_comm, .tp = t->tp, .test_delay_ms = delay ? atof(delay) : 0};
    size_t rows = (size_t)t->B * (size_t)t->T;
    t->mb_tokens = dt_xcalloc(rows * (size_t)t->accum, sizeof(int32_t));
    t->mb_targets = dt_xcalloc(rows * (size_t)t->accum, sizeof(int32_t));
    t->mb_batches = dt_xcalloc((size_t)t->accum, sizeof(dt_batch));
    return dt_pp_init(&t->pp, &o, t->dev, &t->net, t->dp);
}

dt_status_t dt_train_pp_step_(dt_trainer_t *t, double *loss_sum, double *data_s) {
    size_t rows = (size_t)t->B * (size_t)t->T;
    double d0 = dt_now_s();
    for (int a = 0; a < t->accum; a++) { /* every stage reads the same micro-batches: the data position stays one */
        int32_t *tok = t->mb_tokens + (size_t)a * rows, *tgt = t->mb_targets + (size_t)a * rows;
        DT_CHECK(dt_data_next(t->data, tok, tgt));
        t->mb_batches[a] = (dt_batch){.tokens = tok, .targets = tgt};
    }
    *data_s += dt_now_s() - d0;
    return dt_pp_step(t->pp, t->mb_batches, 1.0f / ((float)t->net.n_rows * (float)t->accum), loss_sum);
}

dt_status_t dt_train_pp_figures_(dt_trainer_t *t, double out[4]) {
    dt_pp_stats ps;
    dt_pp_get_stats(t->pp, &ps);
    int n = dt_dp_world_size(t->dp);
    /* The stages leave the step's last collective together, so the pipeline's span is
     * the longest stage's passes; a stage's bubble is the share of the span it did
     * not compute (waiting for a neighbour, or done before the others). */
    double mine[3] = {ps.pipeline_ms, ps.wait_ms, ps.p2p_bytes}, *all = dt_xcalloc((size_t)n * 3, sizeof *all);
    dt_status_t st = dt_dp_all_gather_f64(t->dp, mine, 3, all);
    double span = 0;
    for (int r = 0; r < n; r++) span = all[3 * r] > span ? all[3 * r] : span;
    out[0] = out[2] = out[3] = 0;
    for (int r = 0; r < n; r++) {
        double compute = all[3 * r] - all[3 * r + 1];
        out[0] += (span > 0 ? 1 - compute / span : 0) / n;
        out[2] += (span - compute) / n;
        out[3] += all[3 * r + 2];
    }
    out[1] = dt_pp_bubble_ideal(dt_train_pp_schedule_(t->cfg), t->place.pp_size, (int)t->cfg->pp.virtual_stages,
                                t->accum);
    t->pp_span_ms += span;
    t->pp_compute_ms += ps.pipeline_ms - ps.wait_ms;
    t->pp_steps++;
    if (ps.arenas > t->pp_arenas) t->pp_arenas = ps.arenas;
    free(all);
    return st;
}

dt_status_t dt_train_mean_loss_(dt_trainer_t *t, double *x) {
    int n = dt_dp_world_size(t->dp);
    if (n == 1) return DT_STATUS_OK;
    /* the ranks holding the loss (the last stage's) count; the others send 0 of 0 */
    int holds = t->place.pp_rank == t->place.pp_size - 1;
    double mine[2] = {holds ? *x : 0, holds}, *all = dt_xcalloc((size_t)n * 2, sizeof *all), sum = 0, cnt = 0;
    dt_status_t st = dt_dp_all_gather_f64(t->dp, mine, 2, all);
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
static dt_status_t piece_layout(const dt_trainer_t *t, int tp_rank, int pp_rank, dt_model_layout *out) {
    const dt_model_layout *l = &t->layout;
    if (t->place.pp_size <= 1) return dt_model_layout_init_tp(&l->spec, t->place.tp_size, tp_rank, l->sequence_parallel, out);
    return dt_model_layout_init_stage(&l->spec, t->place.tp_size, tp_rank, l->sequence_parallel, t->place.pp_size,
                                      pp_rank, (int)t->cfg->pp.virtual_stages, t->pp_bounds, out);
}

dt_status_t dt_train_gather_params_(dt_trainer_t *t, float **out) {
    size_t n = t->layout.n_params;
    float *piece = dt_mem_alloc(DT_MEM_OTHER, (n ? n : 1) * sizeof(float));
    if (!piece) return DT_STATUS_NOMEM;
    dt_status_t st = dt_dp_gather_params(t->dp, piece);
    if (st != DT_STATUS_OK || !t->layout.global) {
        if (st == DT_STATUS_OK) *out = piece;
        else dt_mem_free(piece);
        return st;
    }
    /* the model-parallel group: the TP x PP ranks of this DP rank, ordered stage-major */
    int T = t->place.tp_size, P = t->place.pp_size, M = T * P;
    dt_comm_t *mp = NULL;
    st = dt_comm_split(t->comm, t->place.dp_rank, t->place.pp_rank * T + t->place.tp_rank, &mp);
    /* pieces differ in size (stages): each is sent padded to the largest */
    size_t most = n;
    if (st == DT_STATUS_OK) {
        double mine = (double)n;
        int world = dt_dp_world_size(t->dp);
        double *all = dt_xcalloc((size_t)world, sizeof(double));
        st = dt_dp_all_gather_f64(t->dp, &mine, 1, all);
        for (int r = 0; r < world; r++) most = all[r] > (double)most ? (size_t)all[r] : most;
        free(all);
    }
    const dt_model_layout *g = t->layout.global;
    const dt_ops_t *o = t->dev->ops;
    float *allp = dt_mem_alloc(DT_MEM_OTHER, (size_t)M * most * sizeof(float));
    float *global = dt_mem_alloc(DT_MEM_OTHER, g->n_params * sizeof(float));
    void *dsend = NULL, *drecv = NULL;
    int ok = allp && global && o->alloc(t->dev, DT_MEM_OTHER, most * sizeof(float), &dsend) == DT_STATUS_OK &&
             o->alloc(t->dev, DT_MEM_OTHER, (size_t)M * most * sizeof(float), &drecv) == DT_STATUS_OK;
    /* every rank reaches the gather or none does: agree on the buffers first */
    if (st == DT_STATUS_OK) {
        int world = dt_dp_world_size(t->dp);
        double mine = ok, *oks = dt_xcalloc((size_t)world, sizeof *oks);
        st = dt_dp_all_gather_f64(t->dp, &mine, 1, oks);
        for (int r = 0; r < world; r++) ok = ok && oks[r] != 0;
        free(oks);
        if (st == DT_STATUS_OK && !ok)
            st = dt_error(DT_STATUS_NOMEM, "gathering the whole model's parameters: a rank cannot hold %.1f MB more",
                          (double)(2 * M * most + g->n_params) * 4 / 1e6);
    }
    if (st != DT_STATUS_OK) goto out_free;
    memset(allp, 0, (size_t)M * most * sizeof(float));
    DT_CHECK_GOTO(o->set(t->dev, dsend, 0, most * sizeof(float)), st, out_free);
    DT_CHECK_GOTO(o->copy(t->dev, dsend, piece, n * sizeof(float), DT_COPY_HOST_TO_DEVICE), st, out_free);
    DT_CHECK_GOTO(o->synchronize(t->dev), st, out_free);
    DT_CHECK_GOTO(dt_comm_all_gather(mp, dsend, drecv, most, DT_COMM_F32), st, out_free);
    DT_CHECK_GOTO(o->copy(t->dev, allp, drecv, (size_t)M * most * sizeof(float), DT_COPY_DEVICE_TO_HOST), st, out_free);
    DT_CHECK_GOTO(o->synchronize(t->dev), st, out_free);
    for (int r = M - 1; r >= 0 && st == DT_STATUS_OK; r--) { /* TP rank 0 last: its replicated tensors stand */
        dt_model_layout lr;
        st = piece_layout(t, r % T, r / T, &lr);
        if (st != DT_STATUS_OK) break;
        place_ctx c = {allp + (size_t)r * most, global};
        dt_model_tp_segments(&lr, 0, lr.n_params, place_piece, &c);
        dt_model_layout_free(&lr);
    }
out_free:
    dt_comm_free(mp);
    o->free(t->dev, dsend);
    o->free(t->dev, drecv);
    dt_mem_free(allp);
    dt_mem_free(piece);
    if (st == DT_STATUS_OK) *out = global;
    else dt_mem_free(global);
    return st;
}
