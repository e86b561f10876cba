/*
 * test_dp.c - data-parallel arithmetic: buckets in reverse unit order with the
 * first and later caps, padded slices that cover every element exactly once
 * whatever the shard count, weight-decay runs that match the tensor table, and
 * the one-rank object (state bytes by strategy, gathered parameters, checkpoint
 * ranges and loading them back). Multi-rank training: tests/integration/test_dp.sh.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "kernels/kernels.h"
#include "runtime/parallel/dp.h"
#include "runtime/model/model.h"
#include "runtime/model/net.h"

static dt_model_layout gpt_layout(void) {
    dt_model_spec s = {.ops = &dt_model_gpt, .n_layer = 3, .n_head = 2, .n_embd = 8,
                       .seq_len = 16, .vocab_size = 61, .vocab_pad_multiple = 64};
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    return l;
}

static dt_model_layout mlp_layout(void) { /* 16-33-33-4: 1,819 parameters */
    dt_model_spec s = {.ops = &dt_model_mlp, .in_dim = 16, .hidden_dim = 33, .n_hidden_layers = 2, .n_classes = 4};
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    cr_assert_eq(l.n_params, 1819u);
    return l;
}

static int decay_at(const dt_model_layout *l, size_t e) {
    for (int t = 0; t < l->n_tensors; t++)
        if (e >= l->tensors[t].offset && e < l->tensors[t].offset + l->tensors[t].numel) return l->tensors[t].decay;
    return -1;
}

/* Every element owned by exactly one shard rank, with its decay flag, at
 * consistent padded and shard offsets. */
static void check_cover(const dt_model_layout *l, int n, size_t first, size_t cap) {
    int *owner = calloc(l->n_params, sizeof *owner);
    size_t shard_total = 0;
    for (int r = 0; r < n; r++) {
        dt_dp_plan p;
        cr_assert_eq(dt_dp_plan_init(l, n, r, first, cap, &p), DT_STATUS_OK);
        if (r == 0) shard_total = p.shard_total;
        cr_assert_eq(p.shard_total, shard_total, "every rank's shard has the same length");
        cr_assert_eq(p.padded_total, shard_total * (size_t)n);
        cr_assert_geq(p.padded_total, l->n_params);
        cr_assert_lt(p.padded_total - l->n_params, (size_t)p.n_buckets * (size_t)n, "padding under n per bucket");
        for (int i = 0; i < p.n_runs; i++) {
            const dt_dp_run *run = &p.runs[i];
            /* A run may span buckets when it is contiguous in all three
             * layouts; check every element against its own bucket. */
            for (size_t j = 0; j < run->count; j++) {
                size_t e = run->offset + j;
                const dt_dp_bucket *b = NULL;
                for (int k = 0; k < p.n_buckets; k++)
                    if (e >= p.buckets[k].offset && e < p.buckets[k].offset + p.buckets[k].count) b = &p.buckets[k];
                cr_assert_not_null(b);
                size_t rel = e - b->offset;
                cr_assert(rel >= (size_t)r * b->slice && rel < (size_t)(r + 1) * b->slice,
                          "element %zu in rank %d's slice", e, r);
                cr_assert_eq(run->padded_offset + j, b->padded_offset + rel);
                cr_assert_eq(run->shard_offset + j, b->shard_offset + rel - (size_t)r * b->slice);
                cr_assert_eq(decay_at(l, e), run->decay, "element %zu decay", e);
                owner[e]++;
            }
        }
        dt_dp_plan_free(&p);
    }
    for (size_t e = 0; e < l->n_params; e++)
        cr_assert_eq(owner[e], 1, "n=%d cap=%zu: element %zu owned %d times", n, cap, e, owner[e]);
    free(owner);
}

Test(dp, slices_cover_every_element_once_for_any_shard_count) {
    dt_model_layout g = gpt_layout(), m = mlp_layout();
    size_t caps[] = {0, 50, 700, 1000000};
    for (int n = 1; n <= 5; n++)
        for (size_t c = 0; c < sizeof caps / sizeof *caps; c++) {
            check_cover(&g, n, caps[c] / 2, caps[c]);
            check_cover(&m, n, caps[c], caps[c]);
        }
    dt_model_layout_free(&g);
    dt_model_layout_free(&m);
}

Test(dp, buckets_run_backwards_over_whole_units_with_caps) {
    dt_model_layout l = gpt_layout(); /* units: 0 emb, 1..3 blocks, 4 ln_f */
    size_t block = l.units[1].numel;
    dt_dp_plan p;
    /* first cap small (ln_f alone reaches it), later caps two blocks */
    cr_assert_eq(dt_dp_plan_init(&l, 2, 0, 10, 2 * block, &p), DT_STATUS_OK);
    cr_assert_eq(p.n_buckets, 3);
    cr_assert_eq(p.buckets[0].unit_lo, 4);
    cr_assert_eq(p.buckets[0].unit_hi, 4);
    cr_assert_eq(p.buckets[1].unit_lo, 2);
    cr_assert_eq(p.buckets[1].unit_hi, 3);
    cr_assert_eq(p.buckets[2].unit_lo, 0, "the rest, below the cap, closes at unit 0");
    cr_assert_eq(p.buckets[2].unit_hi, 1);
    cr_assert_eq(p.buckets[2].offset, 0u);
    cr_assert_eq(p.buckets[2].padded_offset, 0u, "address order: the last bucket starts the buffer");
    cr_assert_eq(p.buckets[1].padded_offset, p.buckets[2].slice * 2);
    for (int u = 0; u < l.n_units; u++)
        cr_assert_eq(p.unit_bucket[u], u == 4 ? 0 : u >= 2 ? 1 : 2);
    dt_dp_plan_free(&p);
    /* cap 0: one bucket per unit (FSDP) */
    cr_assert_eq(dt_dp_plan_init(&l, 3, 1, 0, 0, &p), DT_STATUS_OK);
    cr_assert_eq(p.n_buckets, l.n_units);
    for (int k = 0; k < p.n_buckets; k++) {
        cr_assert_eq(p.buckets[k].unit_lo, l.n_units - 1 - k);
        cr_assert_eq(p.buckets[k].slice, (l.units[l.n_units - 1 - k].numel + 2) / 3);
    }
    dt_dp_plan_free(&p);
    /* a huge cap: one bucket, ddp layout (n = 1) has no padding */
    cr_assert_eq(dt_dp_plan_init(&l, 1, 0, 1u << 30, 1u << 30, &p), DT_STATUS_OK);
    cr_assert_eq(p.n_buckets, 1);
    cr_assert_eq(p.padded_total, l.n_params);
    int changes = 0;
    for (int t = 1; t < l.n_tensors; t++) changes += l.tensors[t].decay != l.tensors[t - 1].decay;
    cr_assert_eq(p.n_runs, 1 + changes, "one run per stretch of equal decay flags");
    cr_assert_eq(changes, 3 * 8, "per block: 4 decayed matrices between undecayed tensors");
    dt_dp_plan_free(&p);
    dt_model_layout_free(&l);
}

/* An interleaved pipeline rank holds chunks apart in the model (P 2, V 2 of 4 blocks:
 * rank 0 holds blocks 0 and 2): a bucket never spans two chunks, whatever the cap, so
 * each chunk's backward completes its own buckets. */
Test(dp, buckets_never_span_two_chunks_of_a_pipeline_rank) {
    dt_model_spec s = {.ops = &dt_model_gpt, .n_layer = 4, .n_head = 2, .n_embd = 8,
                       .seq_len = 16, .vocab_size = 61, .vocab_pad_multiple = 64};
    int bounds[5] = {0, 1, 2, 3, 4};
    for (int rank = 0; rank < 2; rank++) {
        dt_model_layout l;
        cr_assert_eq(dt_model_layout_init_stage(&s, 1, 0, 0, 2, rank, 2, bounds, &l), DT_STATUS_OK, "%s",
                     dt_error_detail());
        dt_dp_plan p;
        cr_assert_eq(dt_dp_plan_init(&l, 2, 0, 1u << 30, 1u << 30, &p), DT_STATUS_OK);
        cr_assert_eq(p.n_buckets, 2, "rank %d: one bucket per chunk under a cap as large as the model", rank);
        for (int b = 0; b < p.n_buckets; b++)
            for (int u = p.buckets[b].unit_lo; u < p.buckets[b].unit_hi; u++)
                cr_assert_eq(l.units[u].gunit + 1, l.units[u + 1].gunit, "rank %d bucket %d spans a gap", rank, b);
        dt_dp_plan_free(&p);
        dt_model_layout_free(&l);
    }
}

Test(dp, uneven_counts_give_padded_slices) {
    /* 10 elements on 4 shards: slices of 3, rank 3 owns the last 1 (padding 2) */
    dt_model_spec s = {.ops = &dt_model_mlp, .in_dim = 1, .hidden_dim = 1, .n_hidden_layers = 0, .n_classes = 5};
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    cr_assert_eq(l.n_params, 10u);
    size_t want[] = {3, 3, 3, 1};
    for (int r = 0; r < 4; r++) {
        dt_dp_plan p;
        cr_assert_eq(dt_dp_plan_init(&l, 4, r, 100, 100, &p), DT_STATUS_OK);
        cr_assert_eq(p.buckets[0].slice, 3u);
        cr_assert_eq(p.padded_total, 12u);
        size_t n = 0;
        for (int i = 0; i < p.n_runs; i++) n += p.runs[i].count;
        cr_assert_eq(n, want[r], "rank %d owns %zu", r, n);
        dt_dp_plan_free(&p);
    }
    dt_model_layout_free(&l);
}

Test(dp, bad_plan_arguments_are_refused) {
    dt_model_layout l = mlp_layout();
    dt_dp_plan p;
    cr_assert_eq(dt_dp_plan_init(&l, 0, 0, 1, 1, &p), DT_STATUS_INVALID);
    cr_assert_eq(dt_dp_plan_init(&l, 2, 2, 1, 1, &p), DT_STATUS_INVALID);
    cr_assert_eq(dt_dp_plan_init(&l, 2, -1, 1, 1, &p), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "shard rank") != NULL);
    dt_model_layout_free(&l);
}

static dt_status_t fill_range(void *ctx, const dt_dp_range *r) {
    (void)ctx;
    for (size_t i = 0; i < r->count; i++) {
        r->param[i] = (float)(r->offset + i) * 0.5f;
        r->m[i] = 1.0f;
        r->v[i] = 2.0f;
    }
    return DT_STATUS_OK;
}

/* One rank, no communicator: state bytes by strategy, parameters from the seed,
 * checkpoint ranges and loading them back. */
Test(dp, one_rank_state_params_and_ranges) {
    dt_model_layout l = gpt_layout();
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 1), DT_STATUS_OK);
    float *want = calloc(l.n_params, sizeof(float)), *got = calloc(l.n_params, sizeof(float));
    dt_model_init_params(&l, 7, want);
    dt_strategy_t all[] = {DT_STRATEGY_DDP, DT_STRATEGY_ZERO1, DT_STRATEGY_ZERO2, DT_STRATEGY_FSDP};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) {
        dt_net_t net;
        cr_assert_eq(dt_net_init(&net, dev, &l, 1), DT_STATUS_OK);
        int64_t base = dt_mem_current(DT_MEM_PARAMS) + dt_mem_current(DT_MEM_GRADS) + dt_mem_current(DT_MEM_OPTIM);
        dt_dp_opts o = {.strategy = all[k], .overlap_comm = 1, .bucket_elems = 500, .seed = 7};
        dt_dp_t *dp;
        cr_assert_eq(dt_dp_init(&dp, &o, dev, &l, &net, NULL), DT_STATUS_OK, "%s", dt_error_detail());
        int64_t state = dt_mem_current(DT_MEM_PARAMS) + dt_mem_current(DT_MEM_GRADS) +
                        dt_mem_current(DT_MEM_OPTIM) - base;
        cr_assert_eq(state, (int64_t)(16 * l.n_params), "one rank: 16 bytes per parameter (strategy %zu)", k);
        dt_dp_mem e;
        dt_dp_expected_mem(dp, &e);
        cr_assert_eq((int64_t)(e.params + e.grads + e.master + e.optim), state);
        cr_assert(net.hook != NULL);
        cr_assert_eq(dt_dp_gather_params(dp, got), DT_STATUS_OK);
        cr_assert_eq(memcmp(got, want, l.n_params * sizeof(float)), 0, "parameters from the seed");
        dt_dp_range r[64];
        int n = dt_dp_owned_ranges(dp, r, 64);
        size_t covered = 0;
        for (int i = 0; i < n; i++) {
            cr_assert_eq(r[i].offset, covered, "ranges in address order, no gap");
            cr_assert_eq(memcmp(r[i].param, want + r[i].offset, r[i].count * sizeof(float)), 0);
            covered += r[i].count;
        }
        cr_assert_eq(covered, l.n_params);
        cr_assert_eq(dt_dp_load_ranges(dp, fill_range, NULL), DT_STATUS_OK);
        cr_assert_eq(dt_dp_gather_params(dp, got), DT_STATUS_OK);
        for (size_t i = 0; i < l.n_params; i++) cr_assert_eq(got[i], (float)i * 0.5f, "loaded element %zu", i);
        dt_dp_free(dp);
        cr_assert(net.hook == NULL, "free removes the hook");
        dt_net_free(&net);
    }
    free(want);
    free(got);
    dt_device_free(dev);
    dt_model_layout_free(&l);
}
