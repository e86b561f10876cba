/*
 * train_mask.c - the loss over the trained targets of the global batch
 * (train_mask.h).
 */
#include "runtime/train/train_mask.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"

void dt_train_mask_init_(dt_train_mask *m, dt_data_t *data, int accum, int B, int seq_len, int dp_size, int cp_size,
                         int cp_rank) {
    *m = (dt_train_mask){0};
    if (!data || !dt_data_masked(data, NULL)) return;
    size_t rows = (size_t)B * (size_t)seq_len;
    m->on = 1;
    m->accum = accum;
    m->rows = rows;
    m->dp_size = dp_size;
    m->B = B, m->seq_len = seq_len, m->cp_size = cp_size > 1 ? cp_size : 1, m->cp_rank = cp_size > 1 ? cp_rank : 0;
    m->loss_rows = rows / (size_t)m->cp_size;
    m->tok = dt_xcalloc((size_t)accum * rows, sizeof *m->tok);
    m->tgt = dt_xcalloc((size_t)accum * rows, sizeof *m->tgt);
    m->pos = dt_xcalloc((size_t)accum * rows, sizeof *m->pos);
    m->batches = dt_xcalloc((size_t)accum, sizeof *m->batches);
}

void dt_train_mask_free_(dt_train_mask *m) {
    free(m->tok);
    free(m->tgt);
    free(m->pos);
    free(m->batches);
    *m = (dt_train_mask){0};
}

double dt_train_mask_count_(const dt_train_mask *m, const int32_t *tgt) {
    double n = 0;
    int T = m->seq_len / m->cp_size;
    for (int b = 0; b < m->B; b++)
        for (int t = 0; t < T; t++) n += tgt[(size_t)b * m->seq_len + dt_model_cp_row(m->seq_len, m->cp_size, m->cp_rank, t)] >= 0;
    return n;
}

dt_status_t dt_train_mask_step_(dt_train_mask *m, dt_data_t *data, dt_dp_t *dp) {
    double mine = 0;
    for (int a = 0; a < m->accum; a++) {
        size_t o = (size_t)a * m->rows;
        DT_CHECK(dt_data_next_pos(data, m->tok + o, m->tgt + o, m->pos + o));
        m->batches[a] = (dt_batch){.tokens = m->tok + o, .targets = m->tgt + o, .positions = m->pos + o};
        mine += dt_train_mask_count_(m, m->tgt + o);
    }
    /* Every rank of a replica (its TP and pipeline ranks) read the same batches and
     * count the same rows (a CP rank its own): the sum over the ranks counts each
     * replica's world / dp_size times. */
    int world = dp ? dt_dp_world_size(dp) : 1;
    double sum = mine;
    if (world > 1) {
        double *all = dt_xcalloc((size_t)world, sizeof *all);
        dt_status_t st = dt_dp_all_gather_f64(dp, &mine, 1, all);
        sum = 0;
        for (int r = 0; r < world; r++) sum += all[r];
        free(all);
        DT_CHECK(st);
    }
    m->trained = sum * m->dp_size / world;
    m->dscale = m->trained > 0 ? (float)((double)m->dp_size / m->trained) : 0.0f;
    return DT_STATUS_OK;
}

double dt_train_mask_loss_(const dt_train_mask *m, double sum_of_means) {
    if (!(m->trained > 0)) return 0.0;
    return sum_of_means * (double)m->loss_rows * m->dp_size / m->trained;
}

dt_status_t dt_train_mask_val_loss_(dt_dp_t *dp, int holds, double sum, double trained, double *val_loss) {
    int n = dt_dp_world_size(dp);
    double mine[2] = {holds ? sum : 0, holds ? trained : 0}, *all = dt_xcalloc((size_t)n * 2, sizeof *all);
    dt_status_t st = DT_STATUS_OK;
    if (n > 1) st = dt_dp_all_gather_f64(dp, mine, 2, all);
    else memcpy(all, mine, sizeof mine);
    for (int r = 1; r < n; r++) all[0] += all[2 * r], all[1] += all[2 * r + 1];
    if (st == DT_STATUS_OK) *val_loss = all[1] > 0 ? all[0] / all[1] : 0.0;
    free(all);
    return st;
}

void dt_train_mask_describe_(dt_data_t *data, int seq_len, char *buf, size_t len) {
    dt_data_pack_info p;
    dt_data_masked(data, &p);
    double cap = (double)p.sequences * seq_len;
    snprintf(buf, len,
             "data: %llu documents in %llu sequences of %d positions: %.1f%% real tokens (packing efficiency), "
             "%.1f%% trained on",
             (unsigned long long)p.documents, (unsigned long long)p.sequences, seq_len,
             cap > 0 ? 100.0 * (double)p.positions / cap : 0.0, cap > 0 ? 100.0 * (double)p.trained / cap : 0.0);
    if (p.truncated || p.skipped) {
        size_t n = strlen(buf);
        snprintf(buf + n, len - n, "; %llu longer than seq_len + 1 tokens cut, %llu of one token skipped",
                 (unsigned long long)p.truncated, (unsigned long long)p.skipped);
    }
    size_t n = strlen(buf);
    snprintf(buf + n, len - n, "; validation: %llu sequences", (unsigned long long)dt_data_val_samples(data));
}
