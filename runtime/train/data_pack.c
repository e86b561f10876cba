/*
 * data_pack.c - masked data (data.h): the documents of a set's shards, marked by
 * their loss masks (shard.h: DT_MASK_DOC at each start), made into sequences of
 * seq_len positions at open, and one such sequence copied out.
 *
 * A document of n tokens gives n - 1 positions (inputs its tokens [0, n - 1),
 * targets [1, n)), exactly what it gives as a batch row of its own, so a packed
 * sequence computes each document as if it were alone (positions restart at 0,
 * and the attention of a position stops at its document's start). A document
 * longer than seq_len + 1 tokens is cut to seq_len + 1 (counted: truncated); one
 * of a single token has nothing to predict (skipped).
 *
 * Packing: documents in order, each into the first of at most PACK_OPEN open
 * sequences with room for it, else into a new one (the oldest open sequence is
 * closed when there are already PACK_OPEN); sequences are numbered as they close.
 * Deterministic, O(documents), and within a few percent of first-fit over all
 * sequences on chat data (short and long turns mixed). With packing off every
 * document closes its own sequence. The tail of a sequence is padding: inputs 0,
 * targets -1, positions 0, 1, ... (a document of its own that no real one sees).
 */
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "runtime/tokenize/shard.h" /* defines: DT_MASK_* */
#include "runtime/train/data_impl.h"

#define PACK_OPEN 8

typedef struct open_seq {
    pack_seg *segs;
    int n, cap;
    int used; /* positions */
} open_seq;

typedef struct packer {
    data_set *s;
    int T;
    open_seq open[PACK_OPEN];
    int n_open;
    pack_seg *segs;
    size_t n_segs, cap_segs;
    uint64_t *seq;
    size_t n_seq, cap_seq;
} packer;

static void close_seq(packer *p, int i) {
    open_seq *o = &p->open[i];
    if (p->n_segs + (size_t)o->n > p->cap_segs) {
        p->cap_segs = (p->n_segs + (size_t)o->n) * 2 + 64;
        p->segs = dt_xrealloc(p->segs, p->cap_segs * sizeof *p->segs);
    }
    memcpy(p->segs + p->n_segs, o->segs, (size_t)o->n * sizeof *o->segs);
    p->n_segs += (size_t)o->n;
    if (p->n_seq + 2 > p->cap_seq) {
        p->cap_seq = p->cap_seq * 2 + 64;
        p->seq = dt_xrealloc(p->seq, p->cap_seq * sizeof *p->seq);
    }
    p->seq[++p->n_seq] = p->n_segs;
    p->s->pack.positions += (uint64_t)o->used;
    free(o->segs);
    memmove(&p->open[i], &p->open[i + 1], (size_t)(p->n_open - i - 1) * sizeof *o);
    p->n_open--;
}

static void seq_add(open_seq *o, pack_seg g) {
    if (o->n == o->cap) {
        o->cap = o->cap * 2 + 4;
        o->segs = dt_xrealloc(o->segs, (size_t)o->cap * sizeof *o->segs);
    }
    o->segs[o->n++] = g;
    o->used += (int)g.n;
}

/* Places document [off, off + ntok) of file f. */
static void place(packer *p, uint32_t f, uint64_t off, uint64_t ntok, int packing) {
    data_set *s = p->s;
    if (ntok < 2) {
        s->pack.skipped++;
        return;
    }
    uint64_t n = ntok - 1;
    if (n > (uint64_t)p->T) {
        n = (uint64_t)p->T;
        s->pack.truncated++;
    }
    s->pack.documents++;
    const uint8_t *m = s->files[f].mask + off;
    for (uint64_t k = 1; k <= n; k++) s->pack.trained += m[k] & DT_MASK_TRAIN;
    pack_seg g = {.off = off, .file = f, .n = (uint32_t)n};
    if (packing)
        for (int i = 0; i < p->n_open; i++)
            if (p->open[i].used + (int)n <= p->T) {
                seq_add(&p->open[i], g);
                if (p->open[i].used == p->T) close_seq(p, i);
                return;
            }
    if (p->n_open == PACK_OPEN) close_seq(p, 0);
    open_seq *o = &p->open[p->n_open++];
    memset(o, 0, sizeof *o);
    seq_add(o, g);
    if (!packing || o->used == p->T) close_seq(p, p->n_open - 1);
}

dt_status_t dt_data_pack_build_(data_set *s, int T, int packing) {
    packer p = {.s = s, .T = T};
    memset(&s->pack, 0, sizeof s->pack);
    p.cap_seq = 64;
    p.seq = dt_xcalloc(p.cap_seq, sizeof *p.seq);
    for (int fi = 0; fi < s->nfiles; fi++) {
        const data_file *f = &s->files[fi];
        uint64_t start = 0;
        for (uint64_t i = 1; i <= f->ntok; i++)
            if (i == f->ntok || (f->mask[i] & DT_MASK_DOC)) {
                place(&p, (uint32_t)fi, start, i - start, packing);
                start = i;
            }
    }
    while (p.n_open) close_seq(&p, 0);
    s->seq = p.seq;
    s->segs = p.segs;
    s->nsamples = p.n_seq;
    s->pack.sequences = p.n_seq;
    return DT_STATUS_OK;
}

static uint32_t token_at(const data_file *f, uint64_t i) {
    return f->token_bytes == 2 ? ((const uint16_t *)f->tokens)[i] : ((const uint32_t *)f->tokens)[i];
}

dt_status_t dt_data_pack_sample_(const data_set *s, uint64_t id, int T, int32_t *inp, int32_t *tgt, int32_t *pos) {
    int t = 0;
    for (uint64_t g = s->seq[id]; g < s->seq[id + 1]; g++) {
        const pack_seg *sg = &s->segs[g];
        const data_file *f = &s->files[sg->file];
        for (uint32_t k = 0; k <= sg->n; k++) {
            uint32_t v = token_at(f, sg->off + k);
            if (s->lazy && v >= (uint32_t)s->vocab)
                return dt_error(DT_STATUS_FORMAT, "%s: token id %u at index %llu is not below the model's vocab size %d",
                                f->path, v, (unsigned long long)(sg->off + k), s->vocab);
            if (k < sg->n) {
                inp[t + (int)k] = (int32_t)v;
                if (pos) pos[t + (int)k] = (int32_t)k;
            }
            if (k > 0) tgt[t + (int)k - 1] = (f->mask[sg->off + k] & DT_MASK_TRAIN) ? (int32_t)v : -1;
        }
        t += (int)sg->n;
    }
    for (int k = 0; t < T; t++, k++) {
        inp[t] = 0;
        tgt[t] = -1;
        if (pos) pos[t] = k;
    }
    return DT_STATUS_OK;
}
