/*
 * checkpoint.c - sharded, atomic, reshardable checkpoints (see checkpoint.h).
 *
 * Shard file layout (little-endian):
 *
 *   header   "DTCKSHD1", u32 version, u32 n_ranges, u32 rank, u32 world_size,
 *            i64 step, u64 data_offset, u64 file_bytes
 *   ranges   n_ranges x { char buffer[16]; u64 offset, count, file_offset,
 *                         stride, reps; u32 n_blocks, u32 pad }
 *            (stride 0, reps 1: a plain range; else reps pieces of count
 *            elements at offset + k*stride, stored one after another)
 *   crcs     for each range, n_blocks x u32 (CRC32C of each 4 MiB block of its
 *            data: count elements, reps*count when strided)
 *   u32      CRC32C of everything above
 *   padding  to data_offset (4 KiB aligned)
 *   data     the ranges' fp32 elements, one after the other
 *
 * The data goes first (checksummed as it is written), the header last, then the
 * file is fsynced: a shard whose header checks out is complete. Rank 0 builds
 * meta.json from the headers, so ranks need no communication besides a barrier;
 * it refuses ranges that overlap (a strided one is listed once, with its stride
 * and reps, and makes meta.json format version 2; plain ones read as ever).
 *
 * This file saves; ckpt_load.c opens, ckpt_read.c checks ranges and reads (any
 * world size); ckpt_io.c holds CRC32C and the file helpers (ckpt_impl.h).
 */
#include "runtime/ckpt/ckpt_impl.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/mem.h"

/* ---- test hook ----------------------------------------------------------- */

static dt_ckpt_hook_fn test_hook;
static void *test_hook_ctx;

void dt_ckpt_set_test_hook(dt_ckpt_hook_fn fn, void *ctx) {
    test_hook = fn;
    test_hook_ctx = ctx;
}

static void hook(const char *point, int64_t step) {
    if (test_hook) test_hook(point, test_hook_ctx);
    const char *env = getenv("DTRUN_CKPT_KILL_AT");
    if (!env || !*env) return;
    size_t n = strcspn(env, ":");
    if (strlen(point) != n || strncmp(env, point, n) != 0) return;
    if (env[n] == ':' && strtoll(env + n + 1, NULL, 10) != step) return;
    DT_LOG_WARN("checkpoint: DTRUN_CKPT_KILL_AT=%s: killing this process at '%s'", env, point);
    raise(SIGKILL);
}

/* ---- save ------------------------------------------------------------------- */

typedef struct __attribute__((packed)) shard_head {
    char magic[8];
    uint32_t version, n_ranges, rank, world_size;
    int64_t step;
    uint64_t data_offset, file_bytes;
} shard_head;

typedef struct __attribute__((packed)) shard_range {
    char buffer[DT_CKPT_MAX_BUFFER_NAME];
    uint64_t offset, count, file_offset, stride, reps;
    uint32_t n_blocks, pad;
} shard_range;

/* Elements of r's data (its pieces one after another). */
static uint64_t range_elems(const dt_ckpt_range *r) { return r->stride ? r->count * r->reps : r->count; }

/* A strided range: stride >= count, at least one piece, no overflow. */
static dt_status_t check_range(const dt_ckpt_range *r) {
    if (strlen(r->buffer) >= DT_CKPT_MAX_BUFFER_NAME)
        return dt_error(DT_STATUS_INVALID, "checkpoint buffer name too long: %s", r->buffer);
    if (r->stride == 0) {
        if (r->reps > 1)
            return dt_error(DT_STATUS_INVALID, "checkpoint range of '%s' at %llu: reps %llu without a stride", r->buffer,
                            (unsigned long long)r->offset, (unsigned long long)r->reps);
        return DT_STATUS_OK;
    }
    if (r->stride < r->count || r->reps < 1)
        return dt_error(DT_STATUS_INVALID,
                        "checkpoint range of '%s' at %llu: stride %llu must be >= count %llu, reps %llu >= 1", r->buffer,
                        (unsigned long long)r->offset, (unsigned long long)r->stride, (unsigned long long)r->count,
                        (unsigned long long)r->reps);
    const uint64_t max = UINT64_C(1) << 53; /* what meta.json's numbers hold exactly */
    if (r->offset > max || (r->count && r->reps > max / r->count) || r->reps - 1 > (max - r->offset) / r->stride)
        return dt_error(DT_STATUS_INVALID, "checkpoint range of '%s' at %llu: %llu pieces every %llu is too large",
                        r->buffer, (unsigned long long)r->offset, (unsigned long long)r->reps,
                        (unsigned long long)r->stride);
    return DT_STATUS_OK;
}


/* "step_N" and "step_N.tmp" (names inside the root) and the final path. */
static void step_names(const dt_ckpt_save_args *a, char *name, char *tmp, size_t len) {
    snprintf(name, len, "step_%08lld", (long long)a->step);
    snprintf(tmp, len, "step_%08lld.tmp", (long long)a->step);
}

dt_status_t dt_ckpt_write_shard(const dt_ckpt_save_args *a, dt_ckpt_save_stats *stats) {
    double t0 = dt_now_s();
    if (!a->dir || !*a->dir) return dt_error(DT_STATUS_INVALID, "checkpoint.dir is not set");
    if (a->step < 0 || a->rank < 0 || a->rank >= a->world_size || a->n_ranges < 0)
        return dt_error(DT_STATUS_INVALID, "checkpoint save: bad step %lld / rank %d / world %d", (long long)a->step,
                        a->rank, a->world_size);
    char name[64], tmpname[64], file[32], path[PATH_MAX + 128];
    step_names(a, name, tmpname, sizeof name);
    snprintf(file, sizeof file, "shard_%05d.bin", a->rank);
    snprintf(path, sizeof path, "%s/%s/%s", a->dir, tmpname, file);

    /* Header size: fixed part, ranges, crcs, header crc; data 4 KiB aligned. */
    uint64_t total_blocks = 0;
    for (int i = 0; i < a->n_ranges; i++) {
        DT_CHECK(check_range(&a->ranges[i]));
        total_blocks += n_blocks_of(range_elems(&a->ranges[i]));
    }
    size_t head_bytes = sizeof(shard_head) + (size_t)a->n_ranges * sizeof(shard_range) + total_blocks * 4 + 4;
    uint64_t data_offset = (head_bytes + 4095) & ~(uint64_t)4095;
    unsigned char *head = dt_xcalloc(1, head_bytes);
    shard_head *h = (shard_head *)head;
    shard_range *rr = (shard_range *)(head + sizeof *h);
    uint32_t *crcs = (uint32_t *)(void *)(rr + a->n_ranges);
    memcpy(h->magic, SHARD_MAGIC, 8);
    h->version = SHARD_VERSION;
    h->n_ranges = (uint32_t)a->n_ranges;
    h->rank = (uint32_t)a->rank;
    h->world_size = (uint32_t)a->world_size;
    h->step = a->step;
    h->data_offset = data_offset;

    dt_status_t st = DT_STATUS_OK;
    uint64_t pos = data_offset;
    int rootfd = -1, tmpfd = -1, fd = -1;
    char tmpdir[PATH_MAX + 64];
    snprintf(tmpdir, sizeof tmpdir, "%s/%s", a->dir, tmpname);
    DT_CHECK_GOTO(dt_ckpt_open_root_(a->dir, 1, &rootfd), st, out_free_head);
    DT_CHECK_GOTO(dt_ckpt_open_subdir_(rootfd, a->dir, tmpname, 1, &tmpfd), st, out_free_head);
    DT_CHECK_GOTO(dt_ckpt_create_at_(tmpfd, tmpdir, file, &fd), st, out_free_head);
    if (lseek(fd, (off_t)data_offset, SEEK_SET) < 0) {
        st = dt_ckpt_sys_error_(errno, "cannot seek in", path);
        goto out_close;
    }
    uint32_t *crc = crcs;
    for (int i = 0; i < a->n_ranges; i++) {
        const dt_ckpt_range *r = &a->ranges[i];
        snprintf(rr[i].buffer, sizeof rr[i].buffer, "%s", r->buffer);
        rr[i].offset = r->offset;
        rr[i].count = r->count;
        rr[i].file_offset = pos;
        rr[i].stride = r->stride;
        rr[i].reps = r->stride ? r->reps : 1;
        uint64_t elems = range_elems(r);
        rr[i].n_blocks = n_blocks_of(elems);
        for (uint64_t e = 0; e < elems; e += BLOCK_ELEMS) {
            uint64_t n = elems - e < BLOCK_ELEMS ? elems - e : BLOCK_ELEMS;
            *crc++ = dt_crc32c(0, r->data + e, n * sizeof(float));
            DT_CHECK_GOTO(dt_ckpt_write_all_(fd, r->data + e, n * sizeof(float), path), st, out_close);
        }
        pos += elems * sizeof(float);
        hook("shard_range", a->step);
    }
    h->file_bytes = pos;
    if (ftruncate(fd, (off_t)pos) != 0) { /* a shard with no data still spans its header */
        st = dt_ckpt_sys_error_(errno, "cannot size", path);
        goto out_close;
    }
    uint32_t hcrc = dt_crc32c(0, head, head_bytes - 4);
    memcpy(head + head_bytes - 4, &hcrc, 4);
    if (pwrite(fd, head, head_bytes, 0) != (ssize_t)head_bytes) {
        st = dt_ckpt_sys_error_(errno ? errno : EIO, "cannot write the header of", path);
        goto out_close;
    }
    if (fsync(fd) != 0) st = dt_ckpt_sys_error_(errno, "cannot fsync", path);
out_close:
    if (close(fd) != 0 && st == DT_STATUS_OK) st = dt_ckpt_sys_error_(errno, "cannot close", path);
    if (st != DT_STATUS_OK) unlinkat(tmpfd, file, 0); /* a partial shard would hold the space the next save needs */
out_free_head:
    free(head);
    if (tmpfd >= 0) close(tmpfd);
    if (rootfd >= 0) close(rootfd);
    if (st == DT_STATUS_OK) hook("shard_written", a->step);
    if (stats) {
        stats->shard_bytes = st == DT_STATUS_OK ? pos : 0;
        stats->write_s = dt_now_s() - t0;
        snprintf(stats->path, sizeof stats->path, "%s/%s", a->dir, name);
    }
    return st;
}

/* The ranges of all shards, gathered at commit for the overlap check. */
typedef struct range_list {
    ck_range *r;
    int n, cap;
    int strided; /* any: meta.json is format version 2 */
} range_list;

/* Reads and checks one shard's header; adds its entry to the meta.json array and
 * its ranges to `all`. */
static dt_status_t index_shard(int tmpfd, const char *tmpdir, const char *path, const dt_ckpt_save_args *a, int rank,
                               cJSON *shards, range_list *all) {
    int fd;
    const char *file = strrchr(path, '/') + 1;
    if (dt_ckpt_open_file_at_(tmpfd, tmpdir, file, &fd, NULL) != DT_STATUS_OK) {
        char detail[1024];
        snprintf(detail, sizeof detail, "%s", dt_error_detail());
        return dt_error(DT_STATUS_IO, "checkpoint shard missing: %s", detail);
    }
    dt_status_t st = DT_STATUS_OK;
    unsigned char *head = NULL;
    shard_head h;
    struct stat sb;
    DT_CHECK_GOTO(dt_ckpt_pread_all_(fd, &h, sizeof h, 0, path), st, out_close);
    if (memcmp(h.magic, SHARD_MAGIC, 8) != 0 || h.version != SHARD_VERSION) {
        st = dt_error(DT_STATUS_FORMAT, "%s: not a dtrun shard (bad magic or version): an incomplete write?", path);
        goto out_close;
    }
    if (h.n_ranges > (1u << 20) || h.data_offset > (1u << 30)) {
        st = dt_error(DT_STATUS_FORMAT, "%s: implausible header", path);
        goto out_close;
    }
    head = dt_xmalloc(h.data_offset);
    DT_CHECK_GOTO(dt_ckpt_pread_all_(fd, head, h.data_offset, 0, path), st, out_close);
    shard_range *rr = (shard_range *)(head + sizeof h);
    uint64_t total_blocks = 0;
    for (uint32_t i = 0; i < h.n_ranges; i++) total_blocks += rr[i].n_blocks;
    size_t head_bytes = sizeof h + h.n_ranges * sizeof(shard_range) + total_blocks * 4 + 4;
    uint32_t want;
    if (head_bytes > h.data_offset) {
        st = dt_error(DT_STATUS_FORMAT, "%s: header larger than its data offset", path);
        goto out_close;
    }
    memcpy(&want, head + head_bytes - 4, 4);
    if (dt_crc32c(0, head, head_bytes - 4) != want) {
        st = dt_error(DT_STATUS_CHECKSUM, "%s: header checksum mismatch", path);
        goto out_close;
    }
    if (h.step != a->step || (int)h.rank != rank || (int)h.world_size != a->world_size) {
        st = dt_error(DT_STATUS_MISMATCH, "%s: written for step %lld rank %u of %u, expected step %lld rank %d of %d",
                      path, (long long)h.step, h.rank, h.world_size, (long long)a->step, rank, a->world_size);
        goto out_close;
    }
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != h.file_bytes) {
        st = dt_error(DT_STATUS_FORMAT, "%s: %lld bytes, its header says %llu: truncated", path,
                      (long long)sb.st_size, (unsigned long long)h.file_bytes);
        goto out_close;
    }
    cJSON *s = cJSON_CreateObject();
    const char *base = strrchr(path, '/');
    cJSON_AddStringToObject(s, "file", base ? base + 1 : path);
    cJSON_AddNumberToObject(s, "rank", rank);
    cJSON_AddNumberToObject(s, "bytes", (double)h.file_bytes);
    cJSON *ranges = cJSON_AddArrayToObject(s, "ranges");
    uint32_t *crc = (uint32_t *)(void *)(rr + h.n_ranges);
    for (uint32_t i = 0; i < h.n_ranges; i++) {
        cJSON *r = cJSON_CreateObject();
        char name[DT_CKPT_MAX_BUFFER_NAME + 1] = {0};
        memcpy(name, rr[i].buffer, DT_CKPT_MAX_BUFFER_NAME);
        if (rr[i].n_blocks != n_blocks_of(rr[i].count * rr[i].reps) || rr[i].reps == 0 ||
            (rr[i].stride == 0 && rr[i].reps != 1)) {
            cJSON_Delete(r);
            st = dt_error(DT_STATUS_FORMAT, "%s: range %u of '%s' has inconsistent counts", path, i, name);
            goto out_close;
        }
        if (all->n == all->cap) all->r = dt_xrealloc(all->r, (size_t)(all->cap = all->cap ? 2 * all->cap : 64) * sizeof *all->r);
        all->r[all->n++] = (ck_range){.shard = rank, .offset = rr[i].offset, .count = rr[i].count,
                                      .stride = rr[i].stride, .reps = rr[i].reps, .file_offset = rr[i].file_offset};
        memcpy(all->r[all->n - 1].buffer, name, DT_CKPT_MAX_BUFFER_NAME - 1); /* names are shorter (write_shard) */
        cJSON_AddStringToObject(r, "buffer", name);
        cJSON_AddNumberToObject(r, "offset", (double)rr[i].offset);
        cJSON_AddNumberToObject(r, "count", (double)rr[i].count);
        if (rr[i].stride) { /* strided: one entry for all its pieces */
            cJSON_AddNumberToObject(r, "stride", (double)rr[i].stride);
            cJSON_AddNumberToObject(r, "reps", (double)rr[i].reps);
            all->strided = 1;
        }
        cJSON_AddNumberToObject(r, "file_offset", (double)rr[i].file_offset);
        cJSON *c = cJSON_AddArrayToObject(r, "crc32c");
        for (uint32_t b = 0; b < rr[i].n_blocks; b++) cJSON_AddItemToArray(c, cJSON_CreateNumber(*crc++));
        cJSON_AddItemToArray(ranges, r);
    }
    cJSON_AddItemToArray(shards, s);
out_close:
    free(head);
    close(fd);
    return st;
}

/* Adds number v under name written so that it reads back as the same double: the
 * shortest of %.15g..%.17g that does (cJSON's own printing may be one ulp off, and
 * a resumed or exported model must get the very rope_theta and rms_norm_eps). */
static void add_exact_number(cJSON *obj, const char *name, double v) {
    char buf[40];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (isfinite(v)) cJSON_AddRawToObject(obj, name, buf);
    else cJSON_AddNullToObject(obj, name);
}

static void add_model(cJSON *meta, const dt_model_layout *l) {
    const dt_model_spec *s = &l->spec;
    cJSON *m = cJSON_AddObjectToObject(meta, "model");
    cJSON_AddStringToObject(m, "type", s->ops->name);
    for (int i = 0; i < s->ops->n_keys; i++) { /* the model's keys, without "model." */
        const dt_model_key *k = &s->ops->keys[i];
        double v = dt_model_key_get(s, k);
        if (k->kind == DT_MODEL_KEY_BOOL) cJSON_AddBoolToObject(m, k->path + 6, v != 0);
        else add_exact_number(m, k->path + 6, v);
    }
    cJSON_AddNumberToObject(meta, "n_params", (double)l->n_params);
    cJSON *ts = cJSON_AddArrayToObject(meta, "tensors");
    for (int i = 0; i < l->n_tensors; i++) {
        const dt_tensor_info *t = &l->tensors[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", t->name);
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddNumberToObject(o, "offset", (double)t->offset);
        cJSON_AddNumberToObject(o, "numel", (double)t->numel);
        cJSON_AddNumberToObject(o, "unit", t->unit);
        cJSON_AddItemToArray(ts, o);
    }
}

/* Is step folder `name` of run run_id (NULL: none)? Its meta.json says; one that
 * cannot be read is nobody's to delete. */
static int same_run(int rootfd, const char *dir, const char *name, const char *run_id) {
    int fd;
    char *text = NULL;
    if (dt_ckpt_open_subdir_(rootfd, dir, name, 0, &fd) != DT_STATUS_OK) return 0;
    dt_status_t st = dt_ckpt_read_text_at_(fd, dir, "meta.json", DT_CKPT_META_MAX, &text);
    close(fd);
    if (st != DT_STATUS_OK) return 0;
    cJSON *meta = cJSON_Parse(text);
    free(text);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, "run_id");
    const char *theirs = cJSON_IsString(v) ? v->valuestring : "";
    int same = !strcmp(theirs, run_id ? run_id : "");
    cJSON_Delete(meta);
    return same;
}

/* Removes this run's complete checkpoints beyond keep_last (oldest first) and
 * stale .tmp folders of older steps; only real step directories, only dtrun's
 * files in them (dt_ckpt_remove_step_at_), never another run's checkpoints. Only
 * called once the new one is complete. */
static void prune(int rootfd, const char *dir, int64_t keep_last, int64_t newest, const char *run_id) {
    int dfd = dup(rootfd);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0) close(dfd);
        return;
    }
    int64_t *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    char name[64];
    while ((e = readdir(d))) {
        int tmp;
        int64_t s = dt_ckpt_parse_step_name_(e->d_name, &tmp);
        struct stat sb;
        if (s < 0 || fstatat(rootfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (tmp) {
            if (s < newest) dt_ckpt_remove_step_at_(rootfd, dir, e->d_name);
            continue;
        }
        snprintf(name, sizeof name, "step_%08lld", (long long)s);
        if (strcmp(name, e->d_name) != 0 || !same_run(rootfd, dir, name, run_id)) continue;
        if (n == cap) steps = dt_xrealloc(steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *steps);
        steps[n++] = s;
    }
    closedir(d);
    if (keep_last > 0 && n > keep_last) {
        for (int i = 1; i < n; i++) /* insertion sort: a few entries */
            for (int j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
                int64_t t = steps[j];
                steps[j] = steps[j - 1];
                steps[j - 1] = t;
            }
        for (int i = 0; i < n - keep_last; i++) {
            if (steps[i] == newest) continue;
            snprintf(name, sizeof name, "step_%08lld", (long long)steps[i]);
            DT_LOG_DEBUG("checkpoint: pruning %s/%s (keep_last %lld)", dir, name, (long long)keep_last);
            dt_ckpt_remove_step_at_(rootfd, dir, name);
        }
    }
    free(steps);
}

dt_status_t dt_ckpt_commit(const dt_ckpt_save_args *a, dt_ckpt_save_stats *stats) {
    char name[64], tmpname[64], tmpdir[PATH_MAX + 64], path[PATH_MAX + 128];
    step_names(a, name, tmpname, sizeof name);
    snprintf(tmpdir, sizeof tmpdir, "%s/%s", a->dir, tmpname);
    hook("before_meta", a->step);
    cJSON *meta = cJSON_CreateObject();
    dt_status_t st = DT_STATUS_OK;
    char *text = NULL;
    range_list all = {0};
    ck_shard *files = dt_xcalloc((size_t)a->world_size, sizeof *files);
    int rootfd = -1, tmpfd = -1;
    DT_CHECK_GOTO(dt_ckpt_open_root_(a->dir, 0, &rootfd), st, out_free);
    DT_CHECK_GOTO(dt_ckpt_open_subdir_(rootfd, a->dir, tmpname, 0, &tmpfd), st, out_free);
    cJSON_AddStringToObject(meta, "format", FORMAT_NAME);
    cJSON *version = cJSON_AddNumberToObject(meta, "version", FORMAT_VERSION);
    cJSON_AddNumberToObject(meta, "step", (double)a->step);
    cJSON_AddNumberToObject(meta, "world_size", a->world_size);
    cJSON_AddStringToObject(meta, "strategy", a->strategy ? a->strategy : "ddp");
    if (a->run_id && *a->run_id) cJSON_AddStringToObject(meta, "run_id", a->run_id);
    cJSON_AddStringToObject(meta, "dtype", "float32");
    cJSON_AddNumberToObject(meta, "block_bytes", DT_CKPT_BLOCK_BYTES);
    char when[64];
    cJSON_AddStringToObject(meta, "saved_at", dt_wall_str(dt_wall_s(), when, sizeof when));
    add_model(meta, a->layout);
    cJSON *shards = cJSON_AddArrayToObject(meta, "shards");
    for (int r = 0; r < a->world_size; r++) {
        snprintf(path, sizeof path, "%s/shard_%05d.bin", tmpdir, r);
        snprintf(files[r].path, sizeof files[r].path, "%s", path);
        DT_CHECK_GOTO(index_shard(tmpfd, tmpdir, path, a, r, shards, &all), st, out_free);
    }
    /* Overlapping ranges would make the checkpoint unloadable: refuse it now, while
     * the previous one is still `latest`. Gaps are the loader's to find. */
    DT_CHECK_GOTO(dt_ckpt_check_ranges_(all.r, all.n, a->layout->n_params, 0, tmpdir, files), st, out_free);
    if (all.strided) cJSON_SetNumberValue(version, FORMAT_VERSION_STRIDED);
    if (a->extra_json) {
        cJSON *extra = cJSON_Parse(a->extra_json);
        if (!extra || !cJSON_IsObject(extra)) {
            cJSON_Delete(extra);
            st = dt_error(DT_STATUS_INVALID, "checkpoint: extra metadata is not a JSON object");
            goto out_free;
        }
        while (extra->child) {
            cJSON *item = cJSON_DetachItemViaPointer(extra, extra->child);
            cJSON_DeleteItemFromObject(meta, item->string);
            cJSON_AddItemToObject(meta, item->string, item);
        }
        cJSON_Delete(extra);
    }
    /* Shards left in this .tmp by an interrupted save at a larger world size. */
    for (int r = a->world_size;; r++) {
        char file[32];
        snprintf(file, sizeof file, "shard_%05d.bin", r);
        if (unlinkat(tmpfd, file, 0) != 0) break;
    }
    text = cJSON_Print(meta);
    DT_CHECK_GOTO(dt_ckpt_write_text_at_(tmpfd, tmpdir, "meta.json", text), st, out_free);
    DT_CHECK_GOTO(dt_ckpt_fsync_fd_(tmpfd, tmpdir), st, out_free);
    hook("before_rename", a->step);
    /* A complete checkpoint of this step already there (saved again after a
     * resume): move it aside, put the new one in place, then drop the old. Only a
     * real directory is replaced: a link or a file of that name is an error. */
    char old[80];
    snprintf(old, sizeof old, "%s.old", name);
    struct stat sb;
    int had_old = 0;
    if (fstatat(rootfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
        if (!S_ISDIR(sb.st_mode)) {
            st = dt_error(DT_STATUS_IO, "%s/%s is a symbolic link or not a directory: not replacing it (remove it)",
                          a->dir, name);
            goto out_free;
        }
        dt_ckpt_remove_step_at_(rootfd, a->dir, old); /* a stale one from an interrupted save */
        if (renameat(rootfd, name, rootfd, old) != 0) {
            snprintf(path, sizeof path, "%s/%s", a->dir, name);
            st = dt_ckpt_sys_error_(errno, "cannot move aside", path);
            goto out_free;
        }
        had_old = 1;
    }
    if (renameat(rootfd, tmpname, rootfd, name) != 0) {
        st = dt_ckpt_sys_error_(errno, "cannot rename to its final name:", tmpdir);
        goto out_free;
    }
    if (had_old) dt_ckpt_remove_step_at_(rootfd, a->dir, old);
    DT_CHECK_GOTO(dt_ckpt_fsync_fd_(rootfd, a->dir), st, out_free);
    hook("before_latest", a->step);
    char line[80];
    snprintf(line, sizeof line, "%s\n", name);
    DT_CHECK_GOTO(dt_ckpt_write_text_at_(rootfd, a->dir, "latest.tmp", line), st, out_free);
    if (renameat(rootfd, "latest.tmp", rootfd, "latest") != 0) {
        snprintf(path, sizeof path, "%s/latest.tmp", a->dir);
        st = dt_ckpt_sys_error_(errno, "cannot rename", path);
        goto out_free;
    }
    DT_CHECK_GOTO(dt_ckpt_fsync_fd_(rootfd, a->dir), st, out_free);
    prune(rootfd, a->dir, a->keep_last, a->step, a->run_id);
    if (stats) snprintf(stats->path, sizeof stats->path, "%s/%s", a->dir, name);
out_free:
    if (tmpfd >= 0) close(tmpfd);
    if (rootfd >= 0) close(rootfd);
    free(text);
    free(all.r);
    free(files);
    cJSON_Delete(meta);
    return st;
}

/* After a failed save: its step_N.tmp folder (dtrun's files only) goes, so that a
 * full disk does not stay full for the next save. */
static void remove_failed_tmp(const dt_ckpt_save_args *a) {
    char name[64], tmpname[64];
    step_names(a, name, tmpname, sizeof name);
    int rootfd;
    if (dt_ckpt_open_root_(a->dir, 0, &rootfd) != DT_STATUS_OK) return;
    dt_ckpt_remove_step_at_(rootfd, a->dir, tmpname);
    close(rootfd);
}

dt_status_t dt_ckpt_save(const dt_ckpt_save_args *a, dt_ckpt_save_stats *stats) {
    dt_ckpt_save_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    double t0 = dt_now_s();
    dt_status_t st = dt_ckpt_write_shard(a, stats);
    char detail[1024];
    if (st != DT_STATUS_OK) snprintf(detail, sizeof detail, "%s", dt_error_detail());
    if (a->barrier) {
        dt_status_t bs = a->barrier(a->barrier_ctx);
        if (st == DT_STATUS_OK && bs != DT_STATUS_OK) return bs;
    }
    if (st != DT_STATUS_OK) { /* every rank is past its write (the barrier): rank 0 cleans up */
        if (a->rank == 0 && (a->barrier || a->world_size == 1)) remove_failed_tmp(a);
        return dt_error(st, "%s", detail);
    }
    if (a->rank == 0) {
        st = dt_ckpt_commit(a, stats);
        if (st != DT_STATUS_OK) {
            snprintf(detail, sizeof detail, "%s", dt_error_detail());
            remove_failed_tmp(a);
            return dt_error(st, "%s", detail);
        }
    }
    stats->total_s = dt_now_s() - t0;
    return DT_STATUS_OK;
}
