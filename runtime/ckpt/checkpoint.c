/*
 * checkpoint.c - sharded, atomic, reshardable checkpoints (see checkpoint.h).
 *
 * Shard file layout (little-endian):
 *
 *   header   "DTCKSHD1", u32 version, u32 n_ranges, u32 rank, u32 world_size,
 *            i64 step, u64 data_offset, u64 file_bytes
 *   ranges   n_ranges x { char buffer[16]; u64 offset, count, file_offset;
 *                         u32 n_blocks, u32 pad }
 *   crcs     for each range, n_blocks x u32 (CRC32C of each 4 MiB block)
 *   u32      CRC32C of everything above
 *   padding  to data_offset (4 KiB aligned)
 *   data     the ranges' fp32 elements, one after the other
 *
 * The data goes first (checksummed as it is written), the header last, then the
 * file is fsynced: a shard whose header checks out is complete. Rank 0 builds
 * meta.json from the headers, so ranks need no communication besides a barrier.
 */
#include "runtime/ckpt/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

#define SHARD_MAGIC "DTCKSHD1"
#define SHARD_VERSION 1u
#define FORMAT_NAME "dtrun-checkpoint"
#define FORMAT_VERSION 1
#define BLOCK_ELEMS ((uint64_t)DT_CKPT_BLOCK_BYTES / sizeof(float))

/* ---- CRC32C ------------------------------------------------------------ */

static uint32_t crc_table[8][256];
static int crc_table_ready;

static void crc_init_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
    __atomic_store_n(&crc_table_ready, 1, __ATOMIC_RELEASE);
}

uint32_t dt_crc32c_portable(uint32_t crc, const void *data, size_t len) {
    const unsigned char *p = data;
    uint32_t c = ~crc;
    if (!__atomic_load_n(&crc_table_ready, __ATOMIC_ACQUIRE)) crc_init_table();
    while (len >= 8) { /* slicing-by-8 */
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff] ^
            crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
            crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8, len -= 8;
    }
    while (len--) c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
    return ~c;
}

uint32_t dt_crc32c(uint32_t crc, const void *data, size_t len) {
#if defined(__SSE4_2__) && defined(__x86_64__)
    const unsigned char *p = data;
    uint32_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) c = __builtin_ia32_crc32qi(c, *p++), len--;
    uint64_t c64 = c;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = __builtin_ia32_crc32di(c64, w);
        p += 8, len -= 8;
    }
    c = (uint32_t)c64;
    while (len) c = __builtin_ia32_crc32qi(c, *p++), len--;
    return ~c;
#else
    return dt_crc32c_portable(crc, data, len);
#endif
}

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

/* ---- small file helpers ----------------------------------------------------- */

static dt_status_t sys_error(int err, const char *what, const char *path) {
    dt_status_t st = err == ENOSPC || err == EDQUOT ? DT_STATUS_IO : dt_status_from_errno(err);
    if (st == DT_STATUS_SYS || st == DT_STATUS_INVALID) st = DT_STATUS_IO;
    return dt_error(st, "%s %s: %s", what, path, strerror(err));
}

static dt_status_t write_all(int fd, const void *data, size_t len, const char *path) {
    const char *p = data;
    while (len) {
        size_t chunk = len < (1u << 30) ? len : (1u << 30);
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return sys_error(errno, "cannot write", path);
        }
        p += w, len -= (size_t)w;
    }
    return DT_STATUS_OK;
}

static dt_status_t pread_all(int fd, void *out, size_t len, uint64_t off, const char *path) {
    char *p = out;
    while (len) {
        ssize_t r = pread(fd, p, len, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return sys_error(errno, "cannot read", path);
        }
        if (r == 0) return dt_error(DT_STATUS_FORMAT, "%s is truncated (wanted %zu more bytes at offset %llu)", path, len,
                                    (unsigned long long)off);
        p += r, len -= (size_t)r, off += (uint64_t)r;
    }
    return DT_STATUS_OK;
}

static dt_status_t fsync_path(const char *path, int dir) {
    int fd = open(path, (dir ? O_DIRECTORY : 0) | O_RDONLY);
    if (fd < 0) return sys_error(errno, "cannot open", path);
    int rc = fsync(fd), err = errno;
    close(fd);
    if (rc != 0 && err != EINVAL) return sys_error(err, "cannot fsync", path);
    return DT_STATUS_OK;
}

/* Writes text to path (created or truncated) and fsyncs it. */
static dt_status_t write_text_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return sys_error(errno, "cannot create", path);
    dt_status_t st = write_all(fd, text, strlen(text), path);
    if (st == DT_STATUS_OK && fsync(fd) != 0) st = sys_error(errno, "cannot fsync", path);
    if (close(fd) != 0 && st == DT_STATUS_OK) st = sys_error(errno, "cannot close", path);
    return st;
}

static char *read_text_file(const char *path, size_t max) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = dt_xmalloc(max + 1);
    size_t n = fread(buf, 1, max, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char p[PATH_MAX];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            if (unlink(p) != 0 && errno == EISDIR) remove_tree(p);
        }
        closedir(d);
    }
    rmdir(path);
}

/* "step_00000042" -> 42; -1 when the name is not a step directory. `tmp` gets 1
 * for "step_00000042.tmp". */
static int64_t parse_step_name(const char *name, int *tmp) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    const char *p = name + 5;
    if (*p < '0' || *p > '9') return -1;
    char *end;
    long long s = strtoll(p, &end, 10);
    *tmp = 0;
    if (!strcmp(end, ".tmp")) *tmp = 1;
    else if (*end) return -1;
    return s;
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
    uint64_t offset, count, file_offset;
    uint32_t n_blocks, pad;
} shard_range;

static uint32_t n_blocks_of(uint64_t count) { return (uint32_t)((count + BLOCK_ELEMS - 1) / BLOCK_ELEMS); }

static void step_paths(const dt_ckpt_save_args *a, char *final, char *tmp, size_t len) {
    snprintf(final, len, "%s/step_%08lld", a->dir, (long long)a->step);
    snprintf(tmp, len, "%s/step_%08lld.tmp", a->dir, (long long)a->step);
}

dt_status_t dt_ckpt_write_shard(const dt_ckpt_save_args *a, dt_ckpt_save_stats *stats) {
    double t0 = dt_now_s();
    if (!a->dir || !*a->dir) return dt_error(DT_STATUS_INVALID, "checkpoint.dir is not set");
    if (a->step < 0 || a->rank < 0 || a->rank >= a->world_size || a->n_ranges < 0)
        return dt_error(DT_STATUS_INVALID, "checkpoint save: bad step %lld / rank %d / world %d", (long long)a->step,
                        a->rank, a->world_size);
    char final[PATH_MAX], tmpdir[PATH_MAX], path[PATH_MAX + 32];
    step_paths(a, final, tmpdir, sizeof final);
    DT_CHECK(dt_fs_mkdir_p(tmpdir));
    snprintf(path, sizeof path, "%s/shard_%05d.bin", tmpdir, a->rank);

    /* Header size: fixed part, ranges, crcs, header crc; data 4 KiB aligned. */
    uint64_t total_blocks = 0;
    for (int i = 0; i < a->n_ranges; i++) {
        if (strlen(a->ranges[i].buffer) >= DT_CKPT_MAX_BUFFER_NAME)
            return dt_error(DT_STATUS_INVALID, "checkpoint buffer name too long: %s", a->ranges[i].buffer);
        total_blocks += n_blocks_of(a->ranges[i].count);
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
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = sys_error(errno, "cannot create checkpoint shard", path);
        goto out_free_head;
    }
    if (lseek(fd, (off_t)data_offset, SEEK_SET) < 0) {
        st = sys_error(errno, "cannot seek in", path);
        goto out_close;
    }
    uint32_t *crc = crcs;
    for (int i = 0; i < a->n_ranges; i++) {
        const dt_ckpt_range *r = &a->ranges[i];
        snprintf(rr[i].buffer, sizeof rr[i].buffer, "%s", r->buffer);
        rr[i].offset = r->offset;
        rr[i].count = r->count;
        rr[i].file_offset = pos;
        rr[i].n_blocks = n_blocks_of(r->count);
        for (uint64_t e = 0; e < r->count; e += BLOCK_ELEMS) {
            uint64_t n = r->count - e < BLOCK_ELEMS ? r->count - e : BLOCK_ELEMS;
            *crc++ = dt_crc32c(0, r->data + e, n * sizeof(float));
            DT_CHECK_GOTO(write_all(fd, r->data + e, n * sizeof(float), path), st, out_close);
        }
        pos += r->count * sizeof(float);
        hook("shard_range", a->step);
    }
    h->file_bytes = pos;
    if (ftruncate(fd, (off_t)pos) != 0) { /* a shard with no data still spans its header */
        st = sys_error(errno, "cannot size", path);
        goto out_close;
    }
    uint32_t hcrc = dt_crc32c(0, head, head_bytes - 4);
    memcpy(head + head_bytes - 4, &hcrc, 4);
    if (pwrite(fd, head, head_bytes, 0) != (ssize_t)head_bytes) {
        st = sys_error(errno ? errno : EIO, "cannot write the header of", path);
        goto out_close;
    }
    if (fsync(fd) != 0) st = sys_error(errno, "cannot fsync", path);
out_close:
    if (close(fd) != 0 && st == DT_STATUS_OK) st = sys_error(errno, "cannot close", path);
out_free_head:
    free(head);
    if (st == DT_STATUS_OK) hook("shard_written", a->step);
    if (stats) {
        stats->shard_bytes = st == DT_STATUS_OK ? pos : 0;
        stats->write_s = dt_now_s() - t0;
        snprintf(stats->path, sizeof stats->path, "%s", final);
    }
    return st;
}

/* Reads and checks one shard's header; adds its entry to the meta.json array. */
static dt_status_t index_shard(const char *path, const dt_ckpt_save_args *a, int rank, cJSON *shards) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sys_error(errno, "checkpoint shard missing: cannot open", path);
    dt_status_t st = DT_STATUS_OK;
    unsigned char *head = NULL;
    shard_head h;
    struct stat sb;
    DT_CHECK_GOTO(pread_all(fd, &h, sizeof h, 0, path), st, out_close);
    if (memcmp(h.magic, SHARD_MAGIC, 8) != 0 || h.version != SHARD_VERSION) {
        st = dt_error(DT_STATUS_FORMAT, "%s: not a dtrun shard (bad magic or version): an incomplete write?", path);
        goto out_close;
    }
    if (h.n_ranges > (1u << 20) || h.data_offset > (1u << 30)) {
        st = dt_error(DT_STATUS_FORMAT, "%s: implausible header", path);
        goto out_close;
    }
    head = dt_xmalloc(h.data_offset);
    DT_CHECK_GOTO(pread_all(fd, head, h.data_offset, 0, path), st, out_close);
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
        cJSON_AddStringToObject(r, "buffer", name);
        cJSON_AddNumberToObject(r, "offset", (double)rr[i].offset);
        cJSON_AddNumberToObject(r, "count", (double)rr[i].count);
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

static void add_model(cJSON *meta, const dt_model_layout *l) {
    const dt_model_spec *s = &l->spec;
    cJSON *m = cJSON_AddObjectToObject(meta, "model");
    cJSON_AddStringToObject(m, "type", s->ops->name);
    for (int i = 0; i < s->ops->n_keys; i++) { /* the model's keys, without "model." */
        const dt_model_key *k = &s->ops->keys[i];
        cJSON_AddNumberToObject(m, k->path + 6, *(const int *)((const char *)s + k->offset));
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

/* Removes complete checkpoints beyond keep_last (oldest first) and stale .tmp
 * directories of older steps. Only called once the new one is complete. */
static void prune(const char *dir, int64_t keep_last, int64_t newest) {
    DIR *d = opendir(dir);
    if (!d) return;
    int64_t *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    char p[PATH_MAX];
    while ((e = readdir(d))) {
        int tmp;
        int64_t s = parse_step_name(e->d_name, &tmp);
        if (s < 0) continue;
        if (tmp) {
            if (s < newest) {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                remove_tree(p);
            }
            continue;
        }
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
            snprintf(p, sizeof p, "%s/step_%08lld", dir, (long long)steps[i]);
            DT_LOG_DEBUG("checkpoint: pruning %s (keep_last %lld)", p, (long long)keep_last);
            remove_tree(p);
        }
    }
    free(steps);
}

dt_status_t dt_ckpt_commit(const dt_ckpt_save_args *a, dt_ckpt_save_stats *stats) {
    char final[PATH_MAX], tmpdir[PATH_MAX], path[PATH_MAX + 32];
    step_paths(a, final, tmpdir, sizeof final);
    hook("before_meta", a->step);
    cJSON *meta = cJSON_CreateObject();
    dt_status_t st = DT_STATUS_OK;
    char *text = NULL;
    cJSON_AddStringToObject(meta, "format", FORMAT_NAME);
    cJSON_AddNumberToObject(meta, "version", FORMAT_VERSION);
    cJSON_AddNumberToObject(meta, "step", (double)a->step);
    cJSON_AddNumberToObject(meta, "world_size", a->world_size);
    cJSON_AddStringToObject(meta, "strategy", a->strategy ? a->strategy : "ddp");
    cJSON_AddStringToObject(meta, "dtype", "float32");
    cJSON_AddNumberToObject(meta, "block_bytes", DT_CKPT_BLOCK_BYTES);
    char when[64];
    cJSON_AddStringToObject(meta, "saved_at", dt_wall_str(dt_wall_s(), when, sizeof when));
    add_model(meta, a->layout);
    cJSON *shards = cJSON_AddArrayToObject(meta, "shards");
    for (int r = 0; r < a->world_size; r++) {
        snprintf(path, sizeof path, "%s/shard_%05d.bin", tmpdir, r);
        DT_CHECK_GOTO(index_shard(path, a, r, shards), st, out_free);
    }
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
        snprintf(path, sizeof path, "%s/shard_%05d.bin", tmpdir, r);
        if (unlink(path) != 0) break;
    }
    text = cJSON_Print(meta);
    snprintf(path, sizeof path, "%s/meta.json", tmpdir);
    DT_CHECK_GOTO(write_text_file(path, text), st, out_free);
    DT_CHECK_GOTO(fsync_path(tmpdir, 1), st, out_free);
    hook("before_rename", a->step);
    /* A complete checkpoint of this step already there (saved again after a
     * resume): move it aside, put the new one in place, then drop the old. */
    char old[PATH_MAX + 32];
    snprintf(old, sizeof old, "%s.old", final);
    int had_old = 0;
    if (rename(final, old) == 0) had_old = 1;
    else if (errno != ENOENT) {
        st = sys_error(errno, "cannot move aside", final);
        goto out_free;
    }
    if (rename(tmpdir, final) != 0) {
        st = sys_error(errno, "cannot rename to its final name:", tmpdir);
        goto out_free;
    }
    if (had_old) remove_tree(old);
    DT_CHECK_GOTO(fsync_path(a->dir, 1), st, out_free);
    hook("before_latest", a->step);
    char latest[PATH_MAX], latest_tmp[PATH_MAX + 8], name[64];
    snprintf(latest, sizeof latest, "%s/latest", a->dir);
    snprintf(latest_tmp, sizeof latest_tmp, "%s.tmp", latest);
    snprintf(name, sizeof name, "step_%08lld\n", (long long)a->step);
    DT_CHECK_GOTO(write_text_file(latest_tmp, name), st, out_free);
    if (rename(latest_tmp, latest) != 0) {
        st = sys_error(errno, "cannot rename", latest_tmp);
        goto out_free;
    }
    DT_CHECK_GOTO(fsync_path(a->dir, 1), st, out_free);
    prune(a->dir, a->keep_last, a->step);
    if (stats) snprintf(stats->path, sizeof stats->path, "%s", final);
out_free:
    free(text);
    cJSON_Delete(meta);
    return st;
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
    if (st != DT_STATUS_OK) return dt_error(st, "%s", detail);
    if (a->rank == 0) DT_CHECK(dt_ckpt_commit(a, stats));
    stats->total_s = dt_now_s() - t0;
    return DT_STATUS_OK;
}

/* ---- load ------------------------------------------------------------------- */

typedef struct ck_range {
    int shard;
    uint64_t offset, count, file_offset;
    uint32_t *crcs;
    uint32_t n_blocks;
    char buffer[DT_CKPT_MAX_BUFFER_NAME];
} ck_range;

typedef struct ck_shard {
    char path[PATH_MAX + 32];
    uint64_t bytes;
    int fd;
} ck_shard;

struct dt_ckpt {
    char path[PATH_MAX];
    cJSON *meta;
    int64_t step;
    int world_size;
    uint64_t n_params;
    const char *strategy;
    ck_shard *shards;
    int n_shards;
    ck_range *ranges;
    int n_ranges;
    float *block; /* scratch for partially read blocks */
    uint64_t bytes_read;
};

int64_t dt_ckpt_step(const dt_ckpt_t *c) { return c->step; }
int dt_ckpt_world_size(const dt_ckpt_t *c) { return c->world_size; }
const char *dt_ckpt_strategy(const dt_ckpt_t *c) { return c->strategy; }
const char *dt_ckpt_path(const dt_ckpt_t *c) { return c->path; }
uint64_t dt_ckpt_n_params(const dt_ckpt_t *c) { return c->n_params; }
const void *dt_ckpt_meta(const dt_ckpt_t *c) { return c->meta; }
uint64_t dt_ckpt_bytes_read(const dt_ckpt_t *c) { return c->bytes_read; }

void dt_ckpt_close(dt_ckpt_t *c) {
    if (!c) return;
    for (int i = 0; i < c->n_shards; i++)
        if (c->shards[i].fd >= 0) close(c->shards[i].fd);
    for (int i = 0; i < c->n_ranges; i++) free(c->ranges[i].crcs);
    free(c->shards);
    free(c->ranges);
    free(c->block);
    cJSON_Delete(c->meta);
    free(c);
}

static int json_u64(const cJSON *o, const char *key, uint64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9.007199254740992e15) return 0;
    *out = (uint64_t)v->valuedouble;
    return (double)*out == v->valuedouble;
}

static int cmp_range(const void *x, const void *y) {
    const ck_range *a = x, *b = y;
    int c = strcmp(a->buffer, b->buffer);
    if (c) return c;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Resolves a root (with `latest`) to its step directory. */
static dt_status_t resolve_dir(const char *path, char *out, size_t len) {
    char meta[PATH_MAX + 16], latest[PATH_MAX + 16];
    struct stat sb;
    if (stat(path, &sb) != 0) return sys_error(errno, "checkpoint not found:", path);
    if (!S_ISDIR(sb.st_mode)) return dt_error(DT_STATUS_INVALID, "checkpoint %s is not a directory", path);
    snprintf(meta, sizeof meta, "%s/meta.json", path);
    snprintf(latest, sizeof latest, "%s/latest", path);
    if (access(meta, F_OK) != 0 && access(latest, F_OK) == 0) {
        char *name = read_text_file(latest, 256);
        if (!name) return sys_error(errno, "cannot read", latest);
        name[strcspn(name, "\r\n")] = 0;
        int tmp;
        if (parse_step_name(name, &tmp) < 0 || tmp) {
            dt_status_t st = dt_error(DT_STATUS_FORMAT, "%s names '%s', not a step directory", latest, name);
            free(name);
            return st;
        }
        snprintf(out, len, "%s/%s", path, name);
        free(name);
        return DT_STATUS_OK;
    }
    snprintf(out, len, "%s", path);
    return DT_STATUS_OK;
}

static dt_status_t parse_meta(dt_ckpt_t *c, const char *mpath) {
    const cJSON *m = c->meta, *v;
    v = cJSON_GetObjectItemCaseSensitive(m, "format");
    if (!cJSON_IsString(v) || strcmp(v->valuestring, FORMAT_NAME) != 0)
        return dt_error(DT_STATUS_FORMAT, "%s: not a dtrun checkpoint (format is not \"%s\")", mpath, FORMAT_NAME);
    uint64_t u;
    if (!json_u64(m, "version", &u) || u != FORMAT_VERSION)
        return dt_error(DT_STATUS_FORMAT, "%s: unsupported format version", mpath);
    if (!json_u64(m, "step", &u)) return dt_error(DT_STATUS_FORMAT, "%s: 'step' missing or not a count", mpath);
    c->step = (int64_t)u;
    if (!json_u64(m, "world_size", &u) || u < 1) return dt_error(DT_STATUS_FORMAT, "%s: bad 'world_size'", mpath);
    c->world_size = (int)u;
    if (!json_u64(m, "n_params", &c->n_params)) return dt_error(DT_STATUS_FORMAT, "%s: bad 'n_params'", mpath);
    v = cJSON_GetObjectItemCaseSensitive(m, "strategy");
    c->strategy = cJSON_IsString(v) ? v->valuestring : "ddp";
    if (!json_u64(m, "block_bytes", &u) || u != DT_CKPT_BLOCK_BYTES)
        return dt_error(DT_STATUS_FORMAT, "%s: unsupported checksum block size", mpath);
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(m, "shards"), *s;
    if (!cJSON_IsArray(shards) || cJSON_GetArraySize(shards) < 1)
        return dt_error(DT_STATUS_FORMAT, "%s: 'shards' missing or empty", mpath);
    c->n_shards = cJSON_GetArraySize(shards);
    c->shards = dt_xcalloc((size_t)c->n_shards, sizeof *c->shards);
    for (int i = 0; i < c->n_shards; i++) c->shards[i].fd = -1;
    int cap = 0, si = 0;
    cJSON_ArrayForEach(s, shards) {
        ck_shard *sh = &c->shards[si];
        v = cJSON_GetObjectItemCaseSensitive(s, "file");
        if (!cJSON_IsString(v) || strchr(v->valuestring, '/') || !json_u64(s, "bytes", &sh->bytes))
            return dt_error(DT_STATUS_FORMAT, "%s: shard entry %d lacks 'file' or 'bytes'", mpath, si);
        snprintf(sh->path, sizeof sh->path, "%s/%s", c->path, v->valuestring);
        const cJSON *ranges = cJSON_GetObjectItemCaseSensitive(s, "ranges"), *r;
        if (!cJSON_IsArray(ranges)) return dt_error(DT_STATUS_FORMAT, "%s: shard %s has no 'ranges'", mpath, sh->path);
        cJSON_ArrayForEach(r, ranges) {
            if (c->n_ranges == cap) c->ranges = dt_xrealloc(c->ranges, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *c->ranges);
            ck_range *cr = &c->ranges[c->n_ranges];
            memset(cr, 0, sizeof *cr);
            cr->shard = si;
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(r, "buffer");
            const cJSON *crcs = cJSON_GetObjectItemCaseSensitive(r, "crc32c");
            if (!cJSON_IsString(b) || strlen(b->valuestring) >= DT_CKPT_MAX_BUFFER_NAME || !json_u64(r, "offset", &cr->offset) ||
                !json_u64(r, "count", &cr->count) || !json_u64(r, "file_offset", &cr->file_offset) || !cJSON_IsArray(crcs))
                return dt_error(DT_STATUS_FORMAT, "%s: a range of %s is malformed", mpath, sh->path);
            snprintf(cr->buffer, sizeof cr->buffer, "%s", b->valuestring);
            cr->n_blocks = n_blocks_of(cr->count);
            c->n_ranges++;
            if ((uint32_t)cJSON_GetArraySize(crcs) != cr->n_blocks)
                return dt_error(DT_STATUS_FORMAT, "%s: range of '%s' in %s has %d checksums, expected %u", mpath,
                                cr->buffer, sh->path, cJSON_GetArraySize(crcs), cr->n_blocks);
            cr->crcs = dt_xcalloc(cr->n_blocks ? cr->n_blocks : 1, sizeof(uint32_t));
            int k = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, crcs) cr->crcs[k++] = (uint32_t)x->valuedouble;
            if (cr->offset + cr->count > c->n_params || cr->file_offset + cr->count * 4 > sh->bytes)
                return dt_error(DT_STATUS_FORMAT, "%s: range of '%s' in %s lies outside the buffer or the file", mpath,
                                cr->buffer, sh->path);
        }
        si++;
    }
    /* Every buffer must be tiled exactly: no gap, no overlap. */
    qsort(c->ranges, (size_t)c->n_ranges, sizeof *c->ranges, cmp_range);
    for (int i = 0; i < c->n_ranges;) {
        int j = i;
        uint64_t end = 0;
        for (; j < c->n_ranges && !strcmp(c->ranges[j].buffer, c->ranges[i].buffer); j++) {
            if (c->ranges[j].count == 0) continue;
            if (c->ranges[j].offset != end)
                return dt_error(DT_STATUS_FORMAT, "%s: buffer '%s' has a %s at element %llu", mpath, c->ranges[i].buffer,
                                c->ranges[j].offset > end ? "gap" : "overlap", (unsigned long long)end);
            end += c->ranges[j].count;
        }
        if (end != c->n_params)
            return dt_error(DT_STATUS_FORMAT, "%s: buffer '%s' covers %llu of %llu elements", mpath, c->ranges[i].buffer,
                            (unsigned long long)end, (unsigned long long)c->n_params);
        i = j;
    }
    /* Shard files: present and of the recorded size (a truncated one is named). */
    for (int i = 0; i < c->n_shards; i++) {
        struct stat sb;
        if (stat(c->shards[i].path, &sb) != 0) return sys_error(errno, "checkpoint shard missing:", c->shards[i].path);
        if ((uint64_t)sb.st_size != c->shards[i].bytes)
            return dt_error(DT_STATUS_FORMAT, "%s is truncated: %lld bytes, meta.json says %llu", c->shards[i].path,
                            (long long)sb.st_size, (unsigned long long)c->shards[i].bytes);
    }
    return DT_STATUS_OK;
}

dt_status_t dt_ckpt_open(const char *path, dt_ckpt_t **out) {
    *out = NULL;
    dt_ckpt_t *c = dt_xcalloc(1, sizeof *c);
    dt_status_t st = DT_STATUS_OK;
    char *text = NULL, mpath[PATH_MAX + 16];
    DT_CHECK_GOTO(resolve_dir(path, c->path, sizeof c->path), st, out_fail);
    size_t len = strlen(c->path);
    while (len > 1 && c->path[len - 1] == '/') c->path[--len] = 0;
    if (len > 4 && !strcmp(c->path + len - 4, ".tmp")) {
        st = dt_error(DT_STATUS_FORMAT, "checkpoint %s is incomplete (a .tmp directory: its save did not finish)",
                      c->path);
        goto out_fail;
    }
    snprintf(mpath, sizeof mpath, "%s/meta.json", c->path);
    struct stat sb;
    if (stat(mpath, &sb) != 0) {
        st = errno == ENOENT
                 ? dt_error(DT_STATUS_FORMAT, "checkpoint %s is incomplete or not a checkpoint: no meta.json", c->path)
                 : sys_error(errno, "cannot read", mpath);
        goto out_fail;
    }
    text = read_text_file(mpath, (size_t)sb.st_size);
    if (!text) {
        st = sys_error(errno, "cannot read", mpath);
        goto out_fail;
    }
    c->meta = cJSON_Parse(text);
    if (!c->meta) {
        st = dt_error(DT_STATUS_FORMAT, "%s: not valid JSON", mpath);
        goto out_fail;
    }
    DT_CHECK_GOTO(parse_meta(c, mpath), st, out_fail);
    free(text);
    *out = c;
    return DT_STATUS_OK;
out_fail:
    free(text);
    dt_ckpt_close(c);
    return st;
}

dt_status_t dt_ckpt_model_spec(const dt_ckpt_t *c, dt_model_spec *spec) {
    memset(spec, 0, sizeof *spec);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(c->meta, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(m, "type");
    if (!cJSON_IsString(type)) return dt_error(DT_STATUS_FORMAT, "%s/meta.json: no model type", c->path);
    spec->ops = dt_model_lookup(type->valuestring);
    if (!spec->ops) {
        char names[256];
        dt_model_names(names, sizeof names);
        return dt_error(DT_STATUS_FORMAT, "%s/meta.json: model type \"%s\" is none of %s", c->path,
                        type->valuestring, names);
    }
    for (int i = 0; i < spec->ops->n_keys; i++) {
        const dt_model_key *k = &spec->ops->keys[i];
        uint64_t u;
        if (!json_u64(m, k->path + 6, &u))
            return dt_error(DT_STATUS_FORMAT, "%s/meta.json: %s missing", c->path, k->path);
        *(int *)((char *)spec + k->offset) = (int)u;
    }
    return DT_STATUS_OK;
}

static void shape_str(const cJSON *shape, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "(");
    const cJSON *d;
    cJSON_ArrayForEach(d, shape) n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%.0f", n > 1 ? ", " : "", d->valuedouble);
    if (n < len) snprintf(buf + n, len - n, ")");
}

dt_status_t dt_ckpt_check_layout(const dt_ckpt_t *c, const dt_model_layout *l) {
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(c->meta, "tensors"), *t;
    if (!cJSON_IsArray(ts)) return dt_error(DT_STATUS_FORMAT, "%s/meta.json: no tensor table", c->path);
    int i = 0;
    char a[128], b[128];
    cJSON_ArrayForEach(t, ts) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
        uint64_t off;
        if (!cJSON_IsString(name) || !cJSON_IsArray(shape) || !json_u64(t, "offset", &off))
            return dt_error(DT_STATUS_FORMAT, "%s/meta.json: tensor entry %d is malformed", c->path, i);
        if (i >= l->n_tensors)
            return dt_error(DT_STATUS_MISMATCH, "checkpoint %s does not match the model: it has tensor %s, the model has only %d tensors",
                            c->path, name->valuestring, l->n_tensors);
        const dt_tensor_info *ti = &l->tensors[i];
        if (strcmp(ti->name, name->valuestring) != 0)
            return dt_error(DT_STATUS_MISMATCH, "checkpoint %s does not match the model: tensor %d is %s there, %s in the model",
                            c->path, i, name->valuestring, ti->name);
        int same = cJSON_GetArraySize(shape) == ti->ndim && off == ti->offset;
        for (int d = 0; same && d < ti->ndim; d++) same = cJSON_GetArrayItem(shape, d)->valuedouble == (double)ti->shape[d];
        if (!same) {
            shape_str(shape, a, sizeof a);
            size_t n = (size_t)snprintf(b, sizeof b, "(");
            for (int d = 0; d < ti->ndim; d++) n += (size_t)snprintf(b + n, sizeof b - n, "%s%lld", d ? ", " : "", (long long)ti->shape[d]);
            snprintf(b + n, sizeof b - n, ")");
            return dt_error(DT_STATUS_MISMATCH,
                            "checkpoint %s does not match the model: tensor %s is %s at offset %llu there, %s at offset %zu in the model",
                            c->path, ti->name, a, (unsigned long long)off, b, ti->offset);
        }
        i++;
    }
    if (i != l->n_tensors)
        return dt_error(DT_STATUS_MISMATCH, "checkpoint %s does not match the model: %d tensors there, %d in the model (%s missing)",
                        c->path, i, l->n_tensors, l->tensors[i].name);
    if (c->n_params != l->n_params)
        return dt_error(DT_STATUS_MISMATCH, "checkpoint %s does not match the model: %llu parameters there, %zu in the model", c->path,
                        (unsigned long long)c->n_params, l->n_params);
    return DT_STATUS_OK;
}

static dt_status_t shard_fd(dt_ckpt_t *c, int i, int *fd) {
    ck_shard *s = &c->shards[i];
    if (s->fd < 0) {
        s->fd = open(s->path, O_RDONLY | O_CLOEXEC);
        if (s->fd < 0) return sys_error(errno, "cannot open checkpoint shard", s->path);
    }
    *fd = s->fd;
    return DT_STATUS_OK;
}

dt_status_t dt_ckpt_read(dt_ckpt_t *c, const char *buffer, uint64_t offset, uint64_t count, float *out) {
    if (offset + count > c->n_params || offset + count < offset)
        return dt_error(DT_STATUS_INVALID, "checkpoint read of '%s' [%llu, +%llu) beyond its %llu elements", buffer,
                        (unsigned long long)offset, (unsigned long long)count, (unsigned long long)c->n_params);
    uint64_t end = offset + count, done = 0;
    for (int i = 0; i < c->n_ranges && done < count; i++) {
        ck_range *r = &c->ranges[i];
        if (strcmp(r->buffer, buffer) != 0) continue;
        uint64_t lo = offset > r->offset ? offset : r->offset;
        uint64_t hi = end < r->offset + r->count ? end : r->offset + r->count;
        if (lo >= hi) continue;
        int fd = -1;
        DT_CHECK(shard_fd(c, r->shard, &fd));
        const char *spath = c->shards[r->shard].path;
        for (uint64_t b = (lo - r->offset) / BLOCK_ELEMS; b * BLOCK_ELEMS + r->offset < hi; b++) {
            uint64_t bs = r->offset + b * BLOCK_ELEMS; /* global element where the block starts */
            uint64_t bn = r->count - b * BLOCK_ELEMS < BLOCK_ELEMS ? r->count - b * BLOCK_ELEMS : BLOCK_ELEMS;
            uint64_t clo = lo > bs ? lo : bs, chi = hi < bs + bn ? hi : bs + bn;
            float *dst;
            int whole = clo == bs && chi == bs + bn;
            if (whole) dst = out + (bs - offset);
            else {
                if (!c->block) c->block = dt_xmalloc(DT_CKPT_BLOCK_BYTES);
                dst = c->block;
            }
            DT_CHECK(pread_all(fd, dst, bn * sizeof(float), r->file_offset + b * BLOCK_ELEMS * sizeof(float), spath));
            c->bytes_read += bn * sizeof(float);
            if (dt_crc32c(0, dst, bn * sizeof(float)) != r->crcs[b])
                return dt_error(DT_STATUS_CHECKSUM,
                                "%s: checksum mismatch in '%s' elements [%llu, %llu) (file bytes from %llu): the file is corrupt",
                                spath, buffer, (unsigned long long)bs, (unsigned long long)(bs + bn),
                                (unsigned long long)(r->file_offset + b * BLOCK_ELEMS * sizeof(float)));
            if (!whole) memcpy(out + (clo - offset), dst + (clo - bs), (chi - clo) * sizeof(float));
            done += chi - clo;
        }
    }
    if (done != count)
        return dt_error(DT_STATUS_NOT_FOUND, "checkpoint %s has no buffer '%s' (or not all of [%llu, +%llu))", c->path,
                        buffer, (unsigned long long)offset, (unsigned long long)count);
    return DT_STATUS_OK;
}

dt_status_t dt_ckpt_load_params(const char *path, dt_ckpt_t **ck, dt_model_layout *layout, float **params) {
    *ck = NULL;
    *params = NULL;
    memset(layout, 0, sizeof *layout);
    dt_ckpt_t *c;
    DT_CHECK(dt_ckpt_open(path, &c));
    dt_model_spec spec;
    dt_status_t st;
    DT_CHECK_GOTO(dt_ckpt_model_spec(c, &spec), st, out_close);
    DT_CHECK_GOTO(dt_model_layout_init(&spec, layout), st, out_close);
    DT_CHECK_GOTO(dt_ckpt_check_layout(c, layout), st, out_free_layout);
    *params = dt_mem_alloc(DT_MEM_PARAMS, layout->n_params * sizeof(float));
    if (!*params) {
        st = DT_STATUS_NOMEM;
        goto out_free_layout;
    }
    DT_CHECK_GOTO(dt_ckpt_read(c, "params", 0, layout->n_params, *params), st, out_free_params);
    *ck = c;
    return DT_STATUS_OK;
out_free_params:
    dt_mem_free(*params);
    *params = NULL;
out_free_layout:
    dt_model_layout_free(layout);
out_close:
    dt_ckpt_close(c);
    return st;
}

/* ---- resume candidates ----------------------------------------------------- */

void dt_ckpt_free_list(char **paths, int n) {
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

dt_status_t dt_ckpt_candidates(const char *dir, char ***paths, int *n) {
    *paths = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return DT_STATUS_OK;
        return sys_error(errno, "cannot list checkpoint directory", dir);
    }
    int64_t *steps = NULL;
    int cnt = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int tmp;
        int64_t s = parse_step_name(e->d_name, &tmp);
        if (s < 0 || tmp) continue;
        if (cnt == cap) steps = dt_xrealloc(steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *steps);
        steps[cnt++] = s;
    }
    closedir(d);
    for (int i = 1; i < cnt; i++)
        for (int j = i; j > 0 && steps[j - 1] < steps[j]; j--) {
            int64_t t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    char lpath[PATH_MAX + 16], *latest = NULL;
    snprintf(lpath, sizeof lpath, "%s/latest", dir);
    char *name = read_text_file(lpath, 256);
    int64_t lstep = -1;
    if (name) {
        name[strcspn(name, "\r\n")] = 0;
        int tmp;
        lstep = parse_step_name(name, &tmp);
        if (tmp) lstep = -1;
        if (lstep < 0) DT_LOG_WARN("checkpoint: %s names '%s', not a step directory; ignoring it", lpath, name);
        free(name);
    }
    char **out = dt_xcalloc((size_t)cnt + 1, sizeof *out);
    int k = 0;
    char p[PATH_MAX + 32];
    if (lstep >= 0) {
        snprintf(p, sizeof p, "%s/step_%08lld", dir, (long long)lstep);
        out[k++] = latest = dt_xstrdup(p);
    }
    for (int i = 0; i < cnt; i++) {
        if (steps[i] == lstep) continue;
        snprintf(p, sizeof p, "%s/step_%08lld", dir, (long long)steps[i]);
        out[k++] = dt_xstrdup(p);
    }
    (void)latest;
    free(steps);
    *paths = out;
    *n = k;
    return DT_STATUS_OK;
}
