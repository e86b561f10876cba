/*
 * train_mask.h - the trainer's part for masked data (data.h: shards with loss masks,
 * packed documents; `dtrun tokenize --chat`).
 *
 * The loss of a step is the mean over the trained targets of the whole global batch,
 * as transformers computes it with labels -100 over one batch: sum of the trained
 * tokens' losses / N, N the trained targets of every micro-batch of every data
 * replica. A micro-batch's mean over its own rows would weigh a short answer like a
 * long one and change with the layout; this does not. So a step first reads all its
 * micro-batches (they are small: ids), counts its trained targets, and one all-gather
 * of that count over the ranks gives N before any backward; every backward then
 * scales its rows by dp_size / N (the data-parallel reduction averages over the
 * dp_size replicas), and the loss reported is the same sum over N on every layout.
 */
#ifndef DT_RUNTIME_TRAIN_MASK_H
#define DT_RUNTIME_TRAIN_MASK_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/model/net.h"   /* defines: dt_batch */
#include "runtime/parallel/dp.h" /* defines: dt_dp_t */
#include "runtime/train/data.h"  /* defines: dt_data_t */

typedef struct dt_train_mask {
    int on;          /* the data is masked */
    int accum;       /* micro-batches per step */
    size_t rows;     /* B x T */
    int dp_size;     /* data replicas: ranks the gradient reduction averages over (DP x CP) */
    /* context parallelism: each rank's loss rows are its own cp_rank's of every
     * sequence (B x seq_len / cp_size of them, loss_rows), counted as such */
    int B, seq_len, cp_size, cp_rank;
    size_t loss_rows;
    int32_t *tok, *tgt, *pos; /* (accum, rows) each: one step's micro-batches */
    dt_batch *batches;        /* (accum) */
    double trained;  /* N: trained targets of the step over every replica */
    float dscale;    /* dp_size / N (0 when N is 0) */
} dt_train_mask;

/* Off (nothing allocated) unless data is masked. rows = B x seq_len (whole sequences);
 * cp_size > 1: the rank computes its cp_rank's rows of them (model.h:
 * dt_model_cp_row), and dp_size counts DP x CP. */
void dt_train_mask_init_(dt_train_mask *m, dt_data_t *data, int accum, int B, int seq_len, int dp_size, int cp_size,
                         int cp_rank);
/* The trained targets among this rank's rows of a batch of whole sequences (tgt:
 * B x seq_len). */
double dt_train_mask_count_(const dt_train_mask *m, const int32_t *tgt);
void dt_train_mask_free_(dt_train_mask *m);
/* Reads the step's micro-batches into m->batches and sets N and dscale (one
 * all-gather over dp). */
dt_status_t dt_train_mask_step_(dt_train_mask *m, dt_data_t *data, dt_dp_t *dp);
/* The rank's value for the trainer's mean over ranks, from the sum of its
 * micro-batches' mean row losses (rows each): sum of token losses x dp_size / N, whose
 * mean over the ranks (each replica counted equally often) is the step's loss. */
double dt_train_mask_loss_(const dt_train_mask *m, double sum_of_means);
/* The validation loss of masked data: the sum of the trained targets' losses over
 * the trained targets of every rank's batches (sum and trained: this rank's; only
 * the ranks that hold the loss, holds, count: the last pipeline stage's). One
 * all-gather over dp. */
dt_status_t dt_train_mask_val_loss_(dt_dp_t *dp, int holds, double sum, double trained, double *val_loss);
/* One line for people: how the documents were packed. */
void dt_train_mask_describe_(dt_data_t *data, int seq_len, char *buf, size_t len);

#endif /* DT_RUNTIME_TRAIN_MASK_H */
