/*
 * checkpoint.h - sharded, atomic, reshardable checkpoints (docs/interface.md).
 *
 * A checkpoint of step N is the directory <dir>/step_NNNNNNNN/ holding one
 * shard_RRRRR.bin per saving rank and meta.json. A shard holds the byte ranges of
 * the flat fp32 buffers ("params", "m", "v") that its rank owns, each range
 * followed by nothing but data; every 4 MiB block of a range has a CRC32C. A range
 * is plain or strided (a tensor-parallel rank's columns of every row of a weight:
 * one range, listed once, however many rows). Saving:
 *
 *   every rank   dt_ckpt_write_shard()   -> <dir>/step_N.tmp/shard_R.bin, fsynced
 *   all ranks    barrier (caller's callback: the communicator's or the store's)
 *   rank 0       dt_ckpt_commit()        -> reads every shard's header, writes
 *                meta.json (step, world size and strategy at save, tensor table with
 *                global shapes, which file holds which range of which buffer with its
 *                checksums, plus the caller's extra JSON: config, data position, RNG,
 *                scheduler), fsyncs, renames step_N.tmp -> step_N, switches `latest`
 *                (latest.tmp + rename), prunes beyond keep_last.
 *
 * dt_ckpt_save() does all three. A crash at any moment leaves the previous complete
 * checkpoint and `latest` as they were. Loading opens a step directory (or a
 * checkpoint root through its `latest`), validates meta.json and the shard sizes,
 * and reads any global range of a buffer from whichever shards hold it, checking
 * the checksums of the blocks it touches: a rank at any world size and strategy reads
 * only what it owns. Every error names the file and the problem.
 */
#ifndef DT_RUNTIME_CHECKPOINT_H
#define DT_RUNTIME_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/model/model.h" /* defines: dt_model_layout */

#define DT_CKPT_BLOCK_BYTES (4u << 20) /* checksum granularity */
#define DT_CKPT_MAX_BUFFER_NAME 16

/* A range of a named flat fp32 buffer that this rank owns, in elements. Plain
 * (stride 0): [offset, offset+count). Strided: `reps` pieces of `count` elements at
 * offset + k*stride (k < reps), as a tensor-parallel rank owns its columns of every
 * row of a row-parallel weight (offset: tensor offset + first column, count: columns
 * per rank, stride: row length, reps: rows); data holds the pieces one after
 * another (reps*count elements) and meta.json lists the range once. */
typedef struct dt_ckpt_range {
    const char *buffer; /* "params", "m", "v", ... */
    uint64_t offset;    /* global element offset (of the first piece) */
    uint64_t count;     /* elements (of each piece) */
    const float *data;  /* host fp32, count elements (reps*count when strided) */
    uint64_t stride;    /* 0: a plain range; else >= count, elements between pieces */
    uint64_t reps;      /* pieces when strided (>= 1); 0 or 1 when plain */
} dt_ckpt_range;

/* Waits until every rank has returned from dt_ckpt_write_shard (0 on success). */
typedef dt_status_t (*dt_ckpt_barrier_fn)(void *ctx);

typedef struct dt_ckpt_save_args {
    const char *dir; /* checkpoint root (created when missing) */
    int64_t step;
    int rank, world_size;
    const char *strategy; /* "ddp", "zero1", ... as saved in meta.json */
    const dt_model_layout *layout;
    const dt_ckpt_range *ranges; /* this rank's */
    int n_ranges;
    /* Rank 0: a JSON object whose members are added to meta.json (config, data,
     * rng, scheduler, optimizer, ...). NULL for none. */
    const char *extra_json;
    int64_t keep_last; /* 0 = keep all; counts (and deletes) only this run_id's */
    /* The run saving (meta.json "run_id"): keep_last prunes only checkpoints of the
     * same run, never another run's in the same directory. NULL: none (matches
     * checkpoints saved without one). */
    const char *run_id;
    dt_ckpt_barrier_fn barrier; /* NULL: a single rank */
    void *barrier_ctx;
} dt_ckpt_save_args;

typedef struct dt_ckpt_save_stats {
    uint64_t shard_bytes; /* this rank's shard file */
    double write_s;       /* this rank's shard write and fsync */
    double total_s;       /* write + barrier + commit (rank 0) */
    char path[4096];      /* the step directory (complete once committed) */
} dt_ckpt_save_stats;

/* Every rank: writes its shard into step_N.tmp. */
dt_status_t dt_ckpt_write_shard(const dt_ckpt_save_args *a, dt_ckpt_save_stats *stats);
/* Rank 0, after every rank wrote its shard: meta.json, rename, latest, prune. */
dt_status_t dt_ckpt_commit(const dt_ckpt_save_args *a, dt_ckpt_save_stats *stats);
/* write_shard, barrier (always reached, even after a failed write, so no rank
 * hangs), commit on rank 0. stats may be NULL. */
dt_status_t dt_ckpt_save(const dt_ckpt_save_args *a, dt_ckpt_save_stats *stats);

/* Test hook: called at named points of a save ("shard_range" after each range,
 * "shard_written", "before_meta", "before_rename", "before_latest") so tests can
 * kill the process there. NULL to clear. DTRUN_CKPT_KILL_AT=<point>[:step] in the
 * environment does the same with SIGKILL (integration tests). */
typedef void (*dt_ckpt_hook_fn)(const char *point, void *ctx);
void dt_ckpt_set_test_hook(dt_ckpt_hook_fn fn, void *ctx);

/* ---- loading ---- */

typedef struct dt_ckpt dt_ckpt_t;

/* path: a step directory, or a checkpoint root (its `latest` is followed). */
dt_status_t dt_ckpt_open(const char *path, dt_ckpt_t **out);
void dt_ckpt_close(dt_ckpt_t *c);

int64_t dt_ckpt_step(const dt_ckpt_t *c);
int dt_ckpt_world_size(const dt_ckpt_t *c);
const char *dt_ckpt_strategy(const dt_ckpt_t *c);
const char *dt_ckpt_path(const dt_ckpt_t *c);
uint64_t dt_ckpt_n_params(const dt_ckpt_t *c);
/* The run that saved it (meta.json "run_id"), "" when it has none. */
const char *dt_ckpt_run_id(const dt_ckpt_t *c);
/* meta.json as parsed (a cJSON *; the caller reads its extra members). */
const void *dt_ckpt_meta(const dt_ckpt_t *c);
/* meta.json's config.<key> (the config the run was saved with) as a positive
 * integer; 0 when absent or not a positive whole number below 9e15. */
int64_t dt_ckpt_meta_config_int(const dt_ckpt_t *c, const char *key);
/* An integer of meta.json: v (a member or list item, NULL when absent) must be a
 * finite whole JSON number in [min, max] (max at most DT_CKPT_META_INT_MAX, 2^53,
 * where doubles stop being exact); else an error "MPATH: 'FIELD' is VALUE,
 * expected an integer from MIN to MAX". Every loader of meta.json reads its
 * integers through this, never by casting valuedouble. */
#define DT_CKPT_META_INT_MAX 9007199254740992ull
struct cJSON;
dt_status_t dt_ckpt_meta_uint(const struct cJSON *v, uint64_t min, uint64_t max, const char *mpath,
                              const char *field, uint64_t *out);
/* The same for a real number: finite and in [min, max]. */
dt_status_t dt_ckpt_meta_number(const struct cJSON *v, double min, double max, const char *mpath,
                                const char *field, double *out);
/* The model spec saved in meta.json (for sample and export). */
dt_status_t dt_ckpt_model_spec(const dt_ckpt_t *c, dt_model_spec *spec);
/* Checks the saved tensor table against a model's: names, shapes, offsets. */
dt_status_t dt_ckpt_check_layout(const dt_ckpt_t *c, const dt_model_layout *layout);
/* Reads elements [offset, offset+count) of a buffer into out, assembling them
 * from the plain and strided ranges of the shards that hold them and verifying the
 * checksum of every block read. The last few verified blocks are kept (a handful
 * of 4 MiB buffers, freed by dt_ckpt_close), so reading a strided range piece by
 * piece, in one call or in many, reads and checks each of its blocks once. */
dt_status_t dt_ckpt_read(dt_ckpt_t *c, const char *buffer, uint64_t offset, uint64_t count, float *out);
/* Bytes read by dt_ckpt_read so far (for throughput figures). */
uint64_t dt_ckpt_bytes_read(const dt_ckpt_t *c);
/* Checksum blocks read and verified by dt_ckpt_read so far (for tests: a block
 * served from the kept ones does not count again). */
uint64_t dt_ckpt_blocks_verified(const dt_ckpt_t *c);

/* For sample and export: opens a checkpoint (as dt_ckpt_open), builds the model
 * layout saved in it and reads the whole "params" buffer into *params (host fp32,
 * dt_mem_alloc'd; free with dt_mem_free). The caller frees layout and closes. */
dt_status_t dt_ckpt_load_params(const char *path, dt_ckpt_t **ck, dt_model_layout *layout, float **params);

/* The complete-looking step directories of a checkpoint root to try when
 * resuming, best first: the one `latest` names, then the others by descending
 * step (".tmp" ones never). *paths is a malloc'd array of malloc'd strings;
 * free with dt_ckpt_free_list. *n = 0 when there is none. */
dt_status_t dt_ckpt_candidates(const char *dir, char ***paths, int *n);
void dt_ckpt_free_list(char **paths, int n);

/* CRC32C (Castagnoli), hardware instruction where the build has SSE4.2. */
uint32_t dt_crc32c(uint32_t crc, const void *data, size_t len);
/* The same without the instruction (slicing-by-8 tables); for tests and builds
 * without SSE4.2. */
uint32_t dt_crc32c_portable(uint32_t crc, const void *data, size_t len);

#endif /* DT_RUNTIME_CHECKPOINT_H */
