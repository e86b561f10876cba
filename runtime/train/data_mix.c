/*
 * data_mix.c - the order of the training samples (data.h): which source job-wide
 * sample k comes from (a hash of (seed, k) against the sources' cumulative
 * weights), each source's per-epoch permutation, and the positions that advance
 * over the whole job's micro-step.
 */
#include <string.h>
#include <time.h>

#include "common/rng.h"
#include "runtime/train/data_impl.h"

/* splitmix64's finaliser: a stateless, well-mixed 64-bit hash. */
static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int dt_data_pick_source(const dt_data_t *d, uint64_t k) {
    if (d->n_src == 1) return 0;
    double u = (double)(mix64(mix64(d->o.seed ^ 0x6d6978ull) ^ k) >> 11) * 0x1.0p-53; /* [0, 1) */
    int s = 0;
    while (u >= d->src[s].cum) s++;
    return s;
}

/* Source s's permutation of epoch e, drawn with Fisher-Yates from (seed, s, e).
 * Source 0's stream is the one a single source always used. */
static const uint32_t *epoch_perm(data_src *src, uint64_t seed, int s, uint64_t epoch) {
    if (src->perm_valid && src->perm_epoch == epoch) return src->perm;
    dt_rng rng;
    dt_rng_seed(&rng, seed, 0x64617461ull + epoch + ((uint64_t)s << 48)); /* "data" stream */
    for (uint64_t i = 0; i < src->train_n; i++) src->perm[i] = (uint32_t)i;
    for (uint64_t i = src->train_n - 1; i > 0; i--) {
        uint64_t j = dt_rng_below(&rng, i + 1);
        uint32_t t = src->perm[i];
        src->perm[i] = src->perm[j];
        src->perm[j] = t;
    }
    src->perm_epoch = epoch;
    src->perm_valid = 1;
    return src->perm;
}

void dt_data_pos_norm_(const dt_data_t *d, dt_data_pos *pos) {
    pos->n_sources = d->n_src;
    for (int s = 0; s < d->n_src; s++) {
        dt_data_src_pos *p = &pos->src[s];
        p->epoch += p->cursor / d->src[s].train_n;
        p->cursor %= d->src[s].train_n;
    }
    pos->epoch = pos->src[0].epoch;
    pos->cursor = pos->src[0].cursor;
}

uint64_t dt_data_sample_id(dt_data_t *d, dt_data_pos pos, uint64_t offset) {
    data_src *src = &d->src[0];
    uint64_t k = pos.cursor + offset;
    uint64_t e = pos.epoch + k / src->train_n;
    return epoch_perm(src, d->o.seed, 0, e)[k % src->train_n];
}

/* Sleeps the benchmark's per-sample delay (DTRUN_DATA_DELAY_US). */
static void slow_reader(const dt_data_t *d) {
    if (!d->delay_us) return;
    struct timespec ts = {(time_t)(d->delay_us / 1000000), (long)(d->delay_us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Advances *pos over the job's micro-step, noting this rank's samples; then starts
 * their reads together (lazy sets) and copies them. On a bad sample *pos is left
 * where it was. */
dt_status_t dt_data_produce_(dt_data_t *d, dt_data_pos *pos, int32_t *inputs, int32_t *targets, int32_t *positions) {
    uint64_t B = (uint64_t)d->o.micro_batch, W = (uint64_t)d->o.world_size, T = (uint64_t)d->o.seq_len;
    uint64_t first = (uint64_t)d->o.rank * B;
    dt_data_pos next = *pos;
    for (uint64_t j = 0; j < W * B; j++) {
        int s = dt_data_pick_source(d, next.samples + j);
        data_src *src = &d->src[s];
        dt_data_src_pos *p = &next.src[s];
        if (j >= first && j < first + B)
            d->mine[j - first] = (struct mine){s, epoch_perm(src, d->o.seed, s, p->epoch)[p->cursor]};
        if (++p->cursor == src->train_n) p->cursor = 0, p->epoch++;
    }
    for (uint64_t b = 0; b < B; b++) dt_data_set_advise_(&d->src[d->mine[b].src].set, d->mine[b].id, (int)T);
    for (uint64_t b = 0; b < B; b++) {
        slow_reader(d);
        DT_CHECK(dt_data_set_sample_(&d->src[d->mine[b].src].set, d->mine[b].id, (int)T, inputs + b * T,
                                     targets + b * T, positions ? positions + b * T : NULL));
    }
    next.samples += W * B;
    next.epoch = next.src[0].epoch;
    next.cursor = next.src[0].cursor;
    *pos = next;
    return DT_STATUS_OK;
}

dt_status_t dt_data_next_pos(dt_data_t *d, int32_t *inputs, int32_t *targets, int32_t *positions) {
    if (d->o.prefetch > 0) return dt_data_ahead_take_(d, inputs, targets, positions);
    return dt_data_produce_(d, &d->pos, inputs, targets, positions);
}

dt_status_t dt_data_next(dt_data_t *d, int32_t *inputs, int32_t *targets) {
    return dt_data_next_pos(d, inputs, targets, NULL);
}

dt_data_pos dt_data_get_pos(const dt_data_t *d) { return d->pos; }

dt_status_t dt_data_set_pos(dt_data_t *d, dt_data_pos pos) {
    if (pos.n_sources == 0) { /* an old checkpoint: one source's epoch and cursor */
        if (d->n_src != 1)
            return dt_error(DT_STATUS_INVALID,
                            "the data position has one source's epoch and cursor, but data.train has %d sources",
                            d->n_src);
        pos.src[0].epoch = pos.epoch;
        pos.src[0].cursor = pos.cursor;
        pos.samples = 0; /* unused with one source */
    } else if (pos.n_sources != d->n_src) {
        return dt_error(DT_STATUS_INVALID, "the data position has %d sources, but data.train has %d",
                        pos.n_sources, d->n_src);
    }
    dt_data_ahead_stop_(d);
    dt_data_pos_norm_(d, &pos);
    d->pos = pos;
    return DT_STATUS_OK;
}
