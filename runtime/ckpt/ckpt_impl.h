/*
 * ckpt_impl.h - what the checkpoint's files share, private to runtime/ckpt: the
 * shard format's constants (checkpoint.c's purpose block describes the layout), the
 * open checkpoint (ckpt_load.c fills it, ckpt_read.c reads from it), the range check
 * that commit and open both run, and the small file helpers of ckpt_io.c, whose
 * errors name the path.
 */
#ifndef DT_RUNTIME_CKPT_CKPT_IMPL_H
#define DT_RUNTIME_CKPT_CKPT_IMPL_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "runtime/ckpt/checkpoint.h"

#define SHARD_MAGIC "DTCKSHD1"
#define SHARD_VERSION 2u /* 2: range records carry stride and reps */
#define FORMAT_NAME "dtrun-checkpoint"
#define FORMAT_VERSION 1         /* meta.json of plain ranges only, as ever */
#define FORMAT_VERSION_STRIDED 2 /* meta.json with strided ranges (older loaders refuse it) */
#define BLOCK_ELEMS ((uint64_t)DT_CKPT_BLOCK_BYTES / sizeof(float))

static inline uint32_t n_blocks_of(uint64_t count) { return (uint32_t)((count + BLOCK_ELEMS - 1) / BLOCK_ELEMS); }

/* A range of a shard as meta.json lists it; plain ones have stride 0, reps 1.
 * Its data (reps*count elements) lies at file_offset, n_blocks CRCs over it. */
typedef struct ck_range {
    int shard;
    uint64_t offset, count, stride, reps, file_offset;
    uint32_t *crcs;
    uint32_t n_blocks;
    char buffer[DT_CKPT_MAX_BUFFER_NAME];
} ck_range;

static inline uint64_t ck_range_elems(const ck_range *r) { return r->count * r->reps; }
/* One past the last global element of the range's last piece. */
static inline uint64_t ck_range_end(const ck_range *r) {
    return r->reps ? r->offset + (r->reps - 1) * r->stride + r->count : r->offset;
}

typedef struct ck_shard {
    char path[PATH_MAX + 160];
    uint64_t bytes;
    int fd;
} ck_shard;

/* A verified checksum block kept between reads (range < 0: empty slot). */
#define CK_KEPT_BLOCKS 8
typedef struct ck_block {
    int range;
    uint64_t index, last_use;
    float *data; /* DT_CKPT_BLOCK_BYTES, allocated on first use */
} ck_block;

struct dt_ckpt {
    char path[PATH_MAX];
    cJSON *meta;
    int64_t step;
    int world_size;
    uint64_t n_params;
    const char *strategy;
    ck_shard *shards;
    int n_shards;
    ck_range *ranges; /* sorted by buffer, then offset */
    int n_ranges;
    ck_block kept[CK_KEPT_BLOCKS];
    uint64_t uses; /* clock for the least recently used kept block */
    uint64_t bytes_read, blocks_verified;
};

/* ckpt_read.c: sorts r by (buffer, offset) and checks that the ranges of each
 * buffer lie inside [0, n_params), that strided ones have stride >= count, and that
 * no two overlap (plain or strided, any shards); with need_cover, also that they
 * cover every buffer whole. Errors start with `where` and name the range and its
 * shard file (shards[r->shard].path). */
dt_status_t dt_ckpt_check_ranges_(ck_range *r, int n, uint64_t n_params, int need_cover, const char *where,
                                  const ck_shard *shards);
/* Frees the kept blocks (dt_ckpt_close). */
void dt_ckpt_drop_kept_(dt_ckpt_t *c);

/* ckpt_io.c: errno -> dt_status_t naming what and path; whole writes and reads;
 * "step_00000012[.tmp]" -> 12 (-1 when the name is not a step folder).
 *
 * Everything inside a checkpoint root goes through its directory fd (openat,
 * unlinkat, renameat) and never follows a symbolic link: a link named step_N,
 * step_N.tmp, latest, latest.tmp, meta.json or shard_R.bin, or a FIFO there, cannot
 * make a save write, a prune delete or a load read anything outside the root.
 * `dir` in these helpers is the root's path for error messages only. */
dt_status_t dt_ckpt_sys_error_(int err, const char *what, const char *path);
dt_status_t dt_ckpt_write_all_(int fd, const void *data, size_t len, const char *path);
dt_status_t dt_ckpt_pread_all_(int fd, void *out, size_t len, uint64_t off, const char *path);
dt_status_t dt_ckpt_fsync_fd_(int fd, const char *path);
/* The root itself may be a link (the user named it); created when create. */
dt_status_t dt_ckpt_open_root_(const char *path, int create, int *fd);
/* dirfd/name as a real directory (created first when create); a link or a file
 * there is an error saying so. */
dt_status_t dt_ckpt_open_subdir_(int dirfd, const char *dir, const char *name, int create, int *fd);
/* A new file dirfd/name for writing: whatever was there unlinked (a link goes, its
 * target stays), then created O_EXCL|O_NOFOLLOW. */
dt_status_t dt_ckpt_create_at_(int dirfd, const char *dir, const char *name, int *fd);
/* create_at, text written and fsynced. */
dt_status_t dt_ckpt_write_text_at_(int dirfd, const char *dir, const char *name, const char *text);
/* dirfd/name for reading, only when it is a regular file (not a link, FIFO or
 * device: refused before reading, without blocking); *size its size. */
dt_status_t dt_ckpt_open_file_at_(int dirfd, const char *dir, const char *name, int *fd, uint64_t *size);
/* open_file_at, then the file into a malloc'd NUL-terminated *out; a file larger
 * than max is DT_STATUS_FORMAT naming it and its size, before anything is read. */
#define DT_CKPT_META_MAX ((size_t)256 << 20) /* a meta.json's bound (a few MB at 1000 ranks) */
dt_status_t dt_ckpt_read_text_at_(int dirfd, const char *dir, const char *name, size_t max, char **out);
/* Removes step folder dirfd/name: only a real directory, only dtrun's files in it
 * (meta.json, shard_*.bin), then the folder when that empties it; a link or a
 * folder holding anything else is left (logged). 1 when it is gone. */
int dt_ckpt_remove_step_at_(int dirfd, const char *dir, const char *name);
int64_t dt_ckpt_parse_step_name_(const char *name, int *tmp);

#endif /* DT_RUNTIME_CKPT_CKPT_IMPL_H */
