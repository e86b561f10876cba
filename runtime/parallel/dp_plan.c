/*
 * dp_plan.c - the bucket plan of a data-parallel strategy (dp.h): the flat
 * parameter buffer cut into buckets of whole units, each padded to a multiple of
 * the shard count and sliced evenly, and the runs (contiguous ranges with one
 * weight-decay setting) the optimizer walks. Pure arithmetic: no device, no comm.
 */
#include "runtime/parallel/dp.h"

#include <stdlib.h>
#include <string.h>

#include "common/mem.h"

/* ---- plan ------------------------------------------------------------------- */

void dt_dp_plan_free(dt_dp_plan *p) {
    free(p->buckets);
    free(p->unit_bucket);
    free(p->runs);
    memset(p, 0, sizeof *p);
}

static void add_run(dt_dp_plan *p, int *cap, size_t off, size_t n, size_t pad_off, size_t sh_off,
                    int decay) {
    if (p->n_runs > 0) { /* merge with the previous run when contiguous everywhere */
        dt_dp_run *r = &p->runs[p->n_runs - 1];
        if (r->decay == decay && r->offset + r->count == off && r->padded_offset + r->count == pad_off &&
            r->shard_offset + r->count == sh_off) {
            r->count += n;
            return;
        }
    }
    if (p->n_runs == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        p->runs = dt_xrealloc(p->runs, (size_t)*cap * sizeof *p->runs);
    }
    p->runs[p->n_runs++] = (dt_dp_run){off, n, pad_off, sh_off, decay};
}

dt_status_t dt_dp_plan_init(const dt_model_layout *l, int n_shards, int shard_rank, size_t first_cap,
                            size_t cap, dt_dp_plan *p) {
    memset(p, 0, sizeof *p);
    if (n_shards < 1 || shard_rank < 0 || shard_rank >= n_shards || l->n_units < 1)
        return dt_error(DT_STATUS_INVALID, "dp plan: bad shard rank %d of %d (or no units)", shard_rank,
                        n_shards);
    p->n_shards = n_shards;
    p->shard_rank = shard_rank;
    p->buckets = dt_xcalloc((size_t)l->n_units, sizeof *p->buckets);
    p->unit_bucket = dt_xcalloc((size_t)l->n_units, sizeof *p->unit_bucket);
    /* Reverse order: gather units from the last until the bucket reaches its cap, or
     * the next unit is not the whole model's previous one (a pipeline rank's chunks
     * are apart in the model: a bucket never spans two, so each chunk's backward
     * completes its buckets). */
    int hi = l->n_units - 1;
    while (hi >= 0) {
        size_t limit = p->n_buckets == 0 ? first_cap : cap, n = 0;
        int lo = hi;
        for (;;) {
            n += l->units[lo].numel;
            if (n >= limit || lo == 0 || l->units[lo - 1].gunit + 1 != l->units[lo].gunit) break;
            lo--;
        }
        dt_dp_bucket *b = &p->buckets[p->n_buckets];
        b->unit_lo = lo;
        b->unit_hi = hi;
        b->offset = l->units[lo].offset;
        b->count = n;
        b->slice = (n + (size_t)n_shards - 1) / (size_t)n_shards;
        for (int u = lo; u <= hi; u++) p->unit_bucket[u] = p->n_buckets;
        p->n_buckets++;
        hi = lo - 1;
    }
    /* Offsets in address order (the last bucket starts the buffer). */
    size_t pad = 0, sh = 0;
    int run_cap = 0;
    for (int k = p->n_buckets - 1; k >= 0; k--) {
        dt_dp_bucket *b = &p->buckets[k];
        b->padded_offset = pad;
        b->shard_offset = sh;
        pad += b->slice * (size_t)n_shards;
        sh += b->slice;
        size_t a = (size_t)shard_rank * b->slice, e = a + b->slice;
        if (e > b->count) e = b->count;
        if (a >= e) continue;
        /* Split [offset + a, offset + e) at tensor decay changes. */
        for (int t = 0; t < l->n_tensors; t++) {
            const dt_tensor_info *ti = &l->tensors[t];
            size_t t0 = ti->offset, t1 = ti->offset + ti->numel;
            size_t s0 = b->offset + a, s1 = b->offset + e;
            size_t x0 = t0 > s0 ? t0 : s0, x1 = t1 < s1 ? t1 : s1;
            if (x0 >= x1) continue;
            size_t rel = x0 - b->offset;
            add_run(p, &run_cap, x0, x1 - x0, b->padded_offset + rel, b->shard_offset + (rel - a),
                    ti->decay);
        }
    }
    p->padded_total = pad;
    p->shard_total = sh;
    return DT_STATUS_OK;
}
