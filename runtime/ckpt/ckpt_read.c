/*
 * ckpt_read.c - the geometry of a checkpoint's ranges and reading through it
 * (ckpt_impl.h): the check that the plain and strided ranges of each buffer lie
 * inside it, never overlap and (when loading) cover it, which commit and open both
 * run; and dt_ckpt_read, which assembles any global range of a buffer from the
 * pieces of the shard ranges it touches, keeping the last few verified 4 MiB blocks
 * so that a strided range read piece by piece is read and checksummed once.
 *
 * A strided range is `reps` pieces of `count` elements at offset + k*stride; its
 * data in the shard file is the pieces one after another, so piece k's element j is
 * data element k*count + j. A plain range is one piece (reps 1).
 */
#include "runtime/ckpt/ckpt_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mem.h"

/* ---- range checks ---------------------------------------------------------- */

static int cmp_range(const void *x, const void *y) {
    const ck_range *a = x, *b = y;
    int c = strcmp(a->buffer, b->buffer);
    if (c) return c;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* "'params' [10, 20)" or "'params' 4096 pieces of 256 at 10 + k*1024". */
static const char *range_str(const ck_range *r, char *buf, size_t len) {
    if (r->stride == 0)
        snprintf(buf, len, "'%s' [%llu, %llu)", r->buffer, (unsigned long long)r->offset,
                 (unsigned long long)(r->offset + r->count));
    else
        snprintf(buf, len, "'%s' %llu pieces of %llu at %llu + k*%llu", r->buffer, (unsigned long long)r->reps,
                 (unsigned long long)r->count, (unsigned long long)r->offset, (unsigned long long)r->stride);
    return buf;
}

static const char *file_of(const ck_shard *shards, const ck_range *r) {
    const char *p = shards[r->shard].path, *base = strrchr(p, '/');
    return base ? base + 1 : p;
}

/* Does [x, x+n) meet a piece of b? Pieces of b are ordered and disjoint (stride >=
 * count), so only the last one starting before x+n can reach past x. */
static int meets(uint64_t x, uint64_t n, const ck_range *b, uint64_t *at) {
    if (n == 0 || b->count == 0 || x + n <= b->offset) return 0;
    uint64_t k = b->reps == 1 ? 0 : (x + n - 1 - b->offset) / b->stride;
    if (k >= b->reps) k = b->reps - 1;
    uint64_t ps = b->offset + k * b->stride;
    if (ps + b->count <= x) return 0;
    *at = ps > x ? ps : x;
    return 1;
}

/* First global element where pieces of a and b overlap; walks the pieces of the
 * one with fewer (a TP cut: one per row, a few thousand). */
static int pieces_overlap(const ck_range *a, const ck_range *b, uint64_t *at) {
    if (a->reps > b->reps) {
        const ck_range *t = a;
        a = b, b = t;
    }
    for (uint64_t k = 0; k < a->reps; k++)
        if (meets(a->offset + k * a->stride, a->count, b, at)) return 1;
    return 0;
}

dt_status_t dt_ckpt_check_ranges_(ck_range *r, int n, uint64_t n_params, int need_cover, const char *where,
                                  const ck_shard *shards) {
    char x[160], y[160];
    for (int i = 0; i < n; i++) {
        const ck_range *a = &r[i];
        if (a->stride != 0 && (a->stride < a->count || a->reps < 1))
            return dt_error(DT_STATUS_FORMAT, "%s: range %s of %s has stride %llu < count %llu or no pieces", where,
                            range_str(a, x, sizeof x), file_of(shards, a), (unsigned long long)a->stride,
                            (unsigned long long)a->count);
        /* The span, computed without overflow: offsets are below 2^53 (meta.json). */
        unsigned __int128 end = (unsigned __int128)(a->reps ? a->reps - 1 : 0) * a->stride + a->offset + a->count;
        if (end > n_params)
            return dt_error(DT_STATUS_FORMAT, "%s: range %s of %s lies outside the buffer's %llu elements", where,
                            range_str(a, x, sizeof x), file_of(shards, a), (unsigned long long)n_params);
    }
    if (n > 0) qsort(r, (size_t)n, sizeof *r, cmp_range); /* (r is NULL when n is 0) */
    for (int i = 0; i < n;) {
        int j = i;
        uint64_t total = 0;
        for (; j < n && !strcmp(r[j].buffer, r[i].buffer); j++) {
            total += ck_range_elems(&r[j]);
            if (r[j].count == 0) continue;
            /* Sorted by first element: only later ranges starting inside this one's
             * span can overlap it. */
            uint64_t end = ck_range_end(&r[j]), at;
            for (int k = j + 1; k < n && !strcmp(r[k].buffer, r[j].buffer) && r[k].offset < end; k++)
                if (pieces_overlap(&r[j], &r[k], &at))
                    return dt_error(DT_STATUS_FORMAT, "%s: range %s of %s overlaps range %s of %s at element %llu",
                                    where, range_str(&r[j], x, sizeof x), file_of(shards, &r[j]),
                                    range_str(&r[k], y, sizeof y), file_of(shards, &r[k]), (unsigned long long)at);
        }
        /* Disjoint and inside the buffer: they cover it iff their sizes add up to it. */
        if (need_cover && total != n_params)
            return dt_error(DT_STATUS_FORMAT, "%s: buffer '%s' covers %llu of %llu elements (a gap)", where, r[i].buffer,
                            (unsigned long long)total, (unsigned long long)n_params);
        i = j;
    }
    return DT_STATUS_OK;
}

/* ---- reading --------------------------------------------------------------- */

uint64_t dt_ckpt_bytes_read(const dt_ckpt_t *c) { return c->bytes_read; }
uint64_t dt_ckpt_blocks_verified(const dt_ckpt_t *c) { return c->blocks_verified; }

void dt_ckpt_drop_kept_(dt_ckpt_t *c) {
    for (int i = 0; i < CK_KEPT_BLOCKS; i++) {
        free(c->kept[i].data);
        c->kept[i].data = NULL;
        c->kept[i].range = -1;
    }
}

static dt_status_t shard_fd(dt_ckpt_t *c, int i, int *fd) {
    ck_shard *s = &c->shards[i];
    if (s->fd < 0) {
        s->fd = open(s->path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC); /* a link or FIFO: refused */
        if (s->fd < 0) return dt_ckpt_sys_error_(errno, "cannot open checkpoint shard", s->path);
    }
    *fd = s->fd;
    return DT_STATUS_OK;
}

/* Reads block b of range ri into dst (its n elements) and checks its CRC. */
static dt_status_t read_block(dt_ckpt_t *c, int ri, uint64_t b, uint64_t n, float *dst) {
    const ck_range *r = &c->ranges[ri];
    const char *spath = c->shards[r->shard].path;
    uint64_t at = r->file_offset + b * BLOCK_ELEMS * sizeof(float);
    int fd = -1;
    DT_CHECK(shard_fd(c, r->shard, &fd));
    DT_CHECK(dt_ckpt_pread_all_(fd, dst, n * sizeof(float), at, spath));
    c->bytes_read += n * sizeof(float);
    c->blocks_verified++;
    if (dt_crc32c(0, dst, n * sizeof(float)) != r->crcs[b]) {
        char x[160];
        return dt_error(DT_STATUS_CHECKSUM,
                        "%s: checksum mismatch in range %s, its data elements [%llu, %llu) (file bytes from %llu): the "
                        "file is corrupt",
                        spath, range_str(r, x, sizeof x), (unsigned long long)(b * BLOCK_ELEMS),
                        (unsigned long long)(b * BLOCK_ELEMS + n), (unsigned long long)at);
    }
    return DT_STATUS_OK;
}

/* The kept copy of block b of range ri, or NULL. */
static const float *find_kept(dt_ckpt_t *c, int ri, uint64_t b) {
    for (int i = 0; i < CK_KEPT_BLOCKS; i++) {
        ck_block *k = &c->kept[i];
        if (k->range == ri && k->index == b) {
            k->last_use = ++c->uses;
            return k->data;
        }
    }
    return NULL;
}

/* Reads and verifies block b of range ri into an empty or the least recently used
 * slot. A block that fails its check is not kept. */
static dt_status_t keep_block(dt_ckpt_t *c, int ri, uint64_t b, uint64_t n, const float **out) {
    ck_block *slot = NULL;
    for (int i = 0; i < CK_KEPT_BLOCKS; i++) {
        ck_block *k = &c->kept[i];
        if (k->range < 0) {
            if (!slot || slot->range >= 0) slot = k;
        } else if (!slot || (slot->range >= 0 && k->last_use < slot->last_use)) slot = k;
    }
    if (!slot->data) slot->data = dt_xmalloc(DT_CKPT_BLOCK_BYTES);
    slot->range = -1;
    DT_CHECK(read_block(c, ri, b, n, slot->data));
    slot->range = ri;
    slot->index = b;
    slot->last_use = ++c->uses;
    *out = slot->data;
    return DT_STATUS_OK;
}

/* Copies data elements [e0, e1) of range ri to dst, each block from the kept ones
 * when there, else read: straight into dst when wholly wanted, else kept. */
static dt_status_t read_elems(dt_ckpt_t *c, int ri, uint64_t e0, uint64_t e1, float *dst) {
    uint64_t total = ck_range_elems(&c->ranges[ri]);
    for (uint64_t b = e0 / BLOCK_ELEMS; b * BLOCK_ELEMS < e1; b++) {
        uint64_t bs = b * BLOCK_ELEMS, bn = total - bs < BLOCK_ELEMS ? total - bs : BLOCK_ELEMS;
        uint64_t lo = e0 > bs ? e0 : bs, hi = e1 < bs + bn ? e1 : bs + bn;
        const float *blk = find_kept(c, ri, b);
        if (!blk && lo == bs && hi == bs + bn) {
            DT_CHECK(read_block(c, ri, b, bn, dst + (bs - e0)));
            continue;
        }
        if (!blk) DT_CHECK(keep_block(c, ri, b, bn, &blk));
        memcpy(dst + (lo - e0), blk + (lo - bs), (hi - lo) * sizeof(float));
    }
    return DT_STATUS_OK;
}

dt_status_t dt_ckpt_read(dt_ckpt_t *c, const char *buffer, uint64_t offset, uint64_t count, float *out) {
    if (offset + count > c->n_params || offset + count < offset)
        return dt_error(DT_STATUS_INVALID, "checkpoint read of '%s' [%llu, +%llu) beyond its %llu elements", buffer,
                        (unsigned long long)offset, (unsigned long long)count, (unsigned long long)c->n_params);
    uint64_t end = offset + count, done = 0;
    for (int i = 0; i < c->n_ranges && done < count; i++) {
        const ck_range *r = &c->ranges[i];
        int cmp = strcmp(r->buffer, buffer);
        if (cmp < 0 || r->count == 0) continue;
        if (cmp > 0 || r->offset >= end) break; /* sorted: no later range starts inside */
        if (ck_range_end(r) <= offset) continue;
        /* Pieces k_lo..k_hi-1 meet [offset, end): piece k spans
         * [r->offset + k*stride, +count). */
        uint64_t k_lo = 0, k_hi = 1;
        if (r->reps > 1) {
            k_lo = offset < r->offset + r->count ? 0 : (offset - r->offset - r->count) / r->stride + 1;
            k_hi = (end - 1 - r->offset) / r->stride + 1;
            if (k_hi > r->reps) k_hi = r->reps;
        }
        for (uint64_t k = k_lo; k < k_hi; k++) {
            uint64_t ps = r->offset + k * r->stride;
            uint64_t lo = offset > ps ? offset : ps, hi = end < ps + r->count ? end : ps + r->count;
            if (lo >= hi) continue;
            DT_CHECK(read_elems(c, i, k * r->count + (lo - ps), k * r->count + (hi - ps), out + (lo - offset)));
            done += hi - lo;
        }
    }
    if (done != count)
        return dt_error(DT_STATUS_NOT_FOUND, "checkpoint %s has no buffer '%s' (or not all of [%llu, +%llu))", c->path,
                        buffer, (unsigned long long)offset, (unsigned long long)count);
    return DT_STATUS_OK;
}
