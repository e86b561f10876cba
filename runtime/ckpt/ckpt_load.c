/*
 * ckpt_load.c - opening a checkpoint (checkpoint.h): meta.json parsed and checked
 * (ranges plain and strided, tiling each buffer, filling each shard file), the model
 * it holds, and the resume candidates of a checkpoint folder, newest first.
 * Reading a global range whatever world size and strategy wrote it (the resharding
 * loader) is ckpt_read.c's.
 */
#include "runtime/ckpt/ckpt_impl.h"

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

#include "common/fs.h" /* defines: dt_fs_printable */
#include "common/log.h"
#include "common/mem.h"

/* ---- load ------------------------------------------------------------------- */

int64_t dt_ckpt_step(const dt_ckpt_t *c) { return c->step; }
int dt_ckpt_world_size(const dt_ckpt_t *c) { return c->world_size; }
const char *dt_ckpt_strategy(const dt_ckpt_t *c) { return c->strategy; }
const char *dt_ckpt_path(const dt_ckpt_t *c) { return c->path; }
uint64_t dt_ckpt_n_params(const dt_ckpt_t *c) { return c->n_params; }
const void *dt_ckpt_meta(const dt_ckpt_t *c) { return c->meta; }
int64_t dt_ckpt_meta_config_int(const dt_ckpt_t *c, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->meta, "config"), key);
    return cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble < 9e15 ? (int64_t)v->valuedouble : 0;
}
const char *dt_ckpt_run_id(const dt_ckpt_t *c) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->meta, "run_id");
    return cJSON_IsString(v) ? v->valuestring : "";
}

void dt_ckpt_close(dt_ckpt_t *c) {
    if (!c) return;
    for (int i = 0; i < c->n_shards; i++)
        if (c->shards[i].fd >= 0) close(c->shards[i].fd);
    for (int i = 0; i < c->n_ranges; i++) free(c->ranges[i].crcs);
    free(c->shards);
    free(c->ranges);
    dt_ckpt_drop_kept_(c);
    cJSON_Delete(c->meta);
    free(c);
}

/* Member key of o as an integer in [min, max] (ckpt_meta.c); `field` names it in
 * errors: "world_size", "shards[0].ranges[2].offset". */
static dt_status_t meta_u64(const cJSON *o, const char *key, uint64_t min, uint64_t max, const char *mpath,
                            const char *field, uint64_t *out) {
    return dt_ckpt_meta_uint(cJSON_GetObjectItemCaseSensitive(o, key), min, max, mpath, field ? field : key, out);
}
#define META_MAX DT_CKPT_META_INT_MAX

/* The step folder `latest` in root dirfd names: `latest` a regular file (never a
 * link, which could point anywhere), its line a step name, that name a real
 * directory of the root. *step gets its step. Errors escape what the file holds. */
static dt_status_t read_latest(int dirfd, const char *dir, int64_t *step) {
    char *name;
    DT_CHECK(dt_ckpt_read_text_at_(dirfd, dir, "latest", 256, &name));
    name[strcspn(name, "\r\n")] = 0;
    int tmp;
    *step = dt_ckpt_parse_step_name_(name, &tmp);
    char shown[128];
    dt_fs_printable(name, shown, sizeof shown);
    dt_status_t st = DT_STATUS_OK;
    struct stat sb;
    if (*step < 0 || tmp || strchr(name, '/'))
        st = dt_error(DT_STATUS_FORMAT, "%s/latest names '%s', not a step directory", dir, shown);
    else if (fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode))
        st = dt_error(DT_STATUS_FORMAT,
                      "%s/latest names %s, which is not a directory of this checkpoint folder (missing, or a "
                      "symbolic link): refusing to follow it",
                      dir, shown);
    free(name);
    return st;
}

/* Resolves a root (with `latest`) to its step directory. */
static dt_status_t resolve_dir(const char *path, char *out, size_t len) {
    struct stat sb;
    if (stat(path, &sb) != 0) return dt_ckpt_sys_error_(errno, "checkpoint not found:", path);
    if (!S_ISDIR(sb.st_mode)) return dt_error(DT_STATUS_INVALID, "checkpoint %s is not a directory", path);
    int fd;
    DT_CHECK(dt_ckpt_open_root_(path, 0, &fd));
    dt_status_t st = DT_STATUS_OK;
    int64_t step;
    if (fstatat(fd, "meta.json", &sb, AT_SYMLINK_NOFOLLOW) != 0 && fstatat(fd, "latest", &sb, AT_SYMLINK_NOFOLLOW) == 0) {
        st = read_latest(fd, path, &step);
        if (st == DT_STATUS_OK) snprintf(out, len, "%s/step_%08lld", path, (long long)step);
    } else {
        snprintf(out, len, "%s", path);
    }
    close(fd);
    return st;
}

static dt_status_t parse_meta(dt_ckpt_t *c, const char *mpath) {
    const cJSON *m = c->meta, *v;
    v = cJSON_GetObjectItemCaseSensitive(m, "format");
    if (!cJSON_IsString(v) || strcmp(v->valuestring, FORMAT_NAME) != 0)
        return dt_error(DT_STATUS_FORMAT, "%s: not a dtrun checkpoint (format is not \"%s\")", mpath, FORMAT_NAME);
    uint64_t u;
    char field[96];
    DT_CHECK(meta_u64(m, "version", FORMAT_VERSION, FORMAT_VERSION_STRIDED, mpath, NULL, &u));
    DT_CHECK(meta_u64(m, "step", 0, META_MAX, mpath, NULL, &u));
    c->step = (int64_t)u;
    { /* a step folder's name and its meta.json agree: a resume from a disagreeing one
       * would start at the wrong step (train nothing, or repeat steps) */
        char name[PATH_MAX];
        snprintf(name, sizeof name, "%s", c->path);
        for (size_t n = strlen(name); n > 1 && name[n - 1] == '/'; n--) name[n - 1] = '\0';
        const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
        int tmp = 0;
        int64_t named = dt_ckpt_parse_step_name_(base, &tmp);
        if (named >= 0 && !tmp && named != c->step)
            return dt_error(DT_STATUS_FORMAT, "%s: step is %lld but its folder %s is step %lld: refusing a checkpoint "
                            "that disagrees with itself", mpath, (long long)c->step, base, (long long)named);
    }
    DT_CHECK(meta_u64(m, "world_size", 1, INT_MAX, mpath, NULL, &u)); /* an int from here on */
    c->world_size = (int)u;
    DT_CHECK(meta_u64(m, "n_params", 0, META_MAX, mpath, NULL, &c->n_params));
    v = cJSON_GetObjectItemCaseSensitive(m, "strategy");
    c->strategy = cJSON_IsString(v) ? v->valuestring : "ddp";
    DT_CHECK(meta_u64(m, "block_bytes", DT_CKPT_BLOCK_BYTES, DT_CKPT_BLOCK_BYTES, mpath, NULL, &u));
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
        if (!cJSON_IsString(v) || strchr(v->valuestring, '/'))
            return dt_error(DT_STATUS_FORMAT, "%s: shard entry %d has no 'file' name (a file of its folder)", mpath, si);
        snprintf(field, sizeof field, "shards[%d].bytes", si);
        DT_CHECK(meta_u64(s, "bytes", 0, META_MAX, mpath, field, &sh->bytes));
        snprintf(sh->path, sizeof sh->path, "%s/%s", c->path, v->valuestring);
        const cJSON *ranges = cJSON_GetObjectItemCaseSensitive(s, "ranges"), *r;
        if (!cJSON_IsArray(ranges)) return dt_error(DT_STATUS_FORMAT, "%s: shard %s has no 'ranges'", mpath, sh->path);
        uint64_t file_end = 0;
        int n_in_shard = 0;
        cJSON_ArrayForEach(r, ranges) {
            if (c->n_ranges == cap) c->ranges = dt_xrealloc(c->ranges, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *c->ranges);
            ck_range *cr = &c->ranges[c->n_ranges];
            memset(cr, 0, sizeof *cr);
            cr->shard = si;
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(r, "buffer");
            const cJSON *crcs = cJSON_GetObjectItemCaseSensitive(r, "crc32c");
            if (!cJSON_IsString(b) || strlen(b->valuestring) >= DT_CKPT_MAX_BUFFER_NAME || !cJSON_IsArray(crcs))
                return dt_error(DT_STATUS_FORMAT, "%s: a range of %s is malformed", mpath, sh->path);
            static const char *const keys[] = {"offset", "count", "file_offset"};
            uint64_t *dst[] = {&cr->offset, &cr->count, &cr->file_offset};
            for (int q = 0; q < 3; q++) {
                snprintf(field, sizeof field, "shards[%d].ranges[%d].%s", si, n_in_shard, keys[q]);
                DT_CHECK(meta_u64(r, keys[q], 0, META_MAX, mpath, field, dst[q]));
            }
            snprintf(cr->buffer, sizeof cr->buffer, "%s", b->valuestring);
            cr->reps = 1; /* plain unless "stride" says otherwise */
            if (cJSON_GetObjectItemCaseSensitive(r, "stride")) {
                snprintf(field, sizeof field, "shards[%d].ranges[%d].stride", si, n_in_shard);
                DT_CHECK(meta_u64(r, "stride", 1, META_MAX, mpath, field, &cr->stride));
                snprintf(field, sizeof field, "shards[%d].ranges[%d].reps", si, n_in_shard);
                DT_CHECK(meta_u64(r, "reps", 1, META_MAX, mpath, field, &cr->reps));
            }
            if (cr->count && cr->reps > UINT64_MAX / cr->count)
                return dt_error(DT_STATUS_FORMAT, "%s: a strided range of '%s' in %s has a bad 'stride' or 'reps'", mpath,
                                cr->buffer, sh->path);
            uint64_t elems = ck_range_elems(cr);
            if (elems > UINT64_MAX / 4 - BLOCK_ELEMS)
                return dt_error(DT_STATUS_FORMAT, "%s: a range of '%s' in %s is implausibly large", mpath, cr->buffer,
                                sh->path);
            cr->n_blocks = n_blocks_of(elems);
            c->n_ranges++;
            if ((uint32_t)cJSON_GetArraySize(crcs) != cr->n_blocks)
                return dt_error(DT_STATUS_FORMAT, "%s: range of '%s' in %s has %d checksums, expected %u", mpath,
                                cr->buffer, sh->path, cJSON_GetArraySize(crcs), cr->n_blocks);
            cr->crcs = dt_xcalloc(cr->n_blocks ? cr->n_blocks : 1, sizeof(uint32_t));
            int k = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, crcs) {
                snprintf(field, sizeof field, "shards[%d].ranges[%d].crc32c[%d]", si, n_in_shard, k);
                DT_CHECK(dt_ckpt_meta_uint(x, 0, UINT32_MAX, mpath, field, &u));
                cr->crcs[k++] = (uint32_t)u;
            }
            /* The shard's data is its ranges one after another up to its end. */
            if (n_in_shard && cr->file_offset != file_end)
                return dt_error(DT_STATUS_FORMAT, "%s: range %d of '%s' in %s starts at file byte %llu, the one before ends at %llu",
                                mpath, n_in_shard, cr->buffer, sh->path, (unsigned long long)cr->file_offset,
                                (unsigned long long)file_end);
            if (cr->file_offset + elems * 4 > sh->bytes)
                return dt_error(DT_STATUS_FORMAT, "%s: range %d of '%s' in %s lies outside the file (%llu bytes)", mpath,
                                n_in_shard, cr->buffer, sh->path, (unsigned long long)sh->bytes);
            file_end = cr->file_offset + elems * 4;
            n_in_shard++;
        }
        if (n_in_shard && file_end != sh->bytes)
            return dt_error(DT_STATUS_FORMAT, "%s: the ranges of %s end at byte %llu, the file has %llu", mpath, sh->path,
                            (unsigned long long)file_end, (unsigned long long)sh->bytes);
        si++;
    }
    /* Every buffer must be tiled exactly: inside it, no overlap, no gap. */
    DT_CHECK(dt_ckpt_check_ranges_(c->ranges, c->n_ranges, c->n_params, 1, mpath, c->shards));
    /* Shard files: present and of the recorded size (a truncated one is named). */
    for (int i = 0; i < c->n_shards; i++) {
        struct stat sb;
        if (lstat(c->shards[i].path, &sb) != 0) return dt_ckpt_sys_error_(errno, "checkpoint shard missing:", c->shards[i].path);
        if (!S_ISREG(sb.st_mode))
            return dt_error(DT_STATUS_FORMAT, "%s is not a regular file: refusing to read it", c->shards[i].path);
        if ((uint64_t)sb.st_size != c->shards[i].bytes)
            return dt_error(DT_STATUS_FORMAT, "%s is truncated: %lld bytes, meta.json says %llu", c->shards[i].path,
                            (long long)sb.st_size, (unsigned long long)c->shards[i].bytes);
    }
    return DT_STATUS_OK;
}

dt_status_t dt_ckpt_open(const char *path, dt_ckpt_t **out) {
    *out = NULL;
    dt_ckpt_t *c = dt_xcalloc(1, sizeof *c);
    for (int i = 0; i < CK_KEPT_BLOCKS; i++) c->kept[i].range = -1;
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
    if (lstat(mpath, &sb) != 0) {
        st = errno == ENOENT
                 ? dt_error(DT_STATUS_FORMAT, "checkpoint %s is incomplete or not a checkpoint: no meta.json", c->path)
                 : dt_ckpt_sys_error_(errno, "cannot read", mpath);
        goto out_fail;
    }
    int dirfd;
    DT_CHECK_GOTO(dt_ckpt_open_root_(c->path, 0, &dirfd), st, out_fail);
    st = dt_ckpt_read_text_at_(dirfd, c->path, "meta.json", DT_CKPT_META_MAX, &text);
    close(dirfd);
    if (st != DT_STATUS_OK) goto out_fail;
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
    char mpath[PATH_MAX + 16];
    snprintf(mpath, sizeof mpath, "%s/meta.json", c->path);
    for (int i = 0; i < spec->ops->n_keys; i++) {
        const dt_model_key *k = &spec->ops->keys[i];
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, k->path + 6);
        uint64_t u;
        double x;
        if (k->kind == DT_MODEL_KEY_BOOL) {
            if (!cJSON_IsBool(v))
                return dt_error(DT_STATUS_FORMAT, "%s/meta.json: %s missing or not true/false", c->path, k->path);
            dt_model_key_set(spec, k, cJSON_IsTrue(v));
        } else if (k->kind == DT_MODEL_KEY_FLOAT) {
            DT_CHECK(dt_ckpt_meta_number(v, k->min, k->max, mpath, k->path, &x));
            dt_model_key_set(spec, k, x);
        } else { /* the key's own bounds (all within int): no truncation when set */
            DT_CHECK(dt_ckpt_meta_uint(v, k->min > 0 ? (uint64_t)k->min : 0, (uint64_t)k->max, mpath, k->path, &u));
            dt_model_key_set(spec, k, (double)u);
        }
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
    char a[128], b[128], field[64], mpath[PATH_MAX + 16];
    snprintf(mpath, sizeof mpath, "%s/meta.json", c->path);
    cJSON_ArrayForEach(t, ts) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
        uint64_t off, dim;
        if (!cJSON_IsString(name) || !cJSON_IsArray(shape))
            return dt_error(DT_STATUS_FORMAT, "%s/meta.json: tensor entry %d is malformed", c->path, i);
        snprintf(field, sizeof field, "tensors[%d].offset", i);
        DT_CHECK(meta_u64(t, "offset", 0, META_MAX, mpath, field, &off));
        const cJSON *d;
        int nd = 0;
        cJSON_ArrayForEach(d, shape) {
            snprintf(field, sizeof field, "tensors[%d].shape[%d]", i, nd++);
            DT_CHECK(dt_ckpt_meta_uint(d, 0, META_MAX, mpath, field, &dim));
        }
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
        return dt_ckpt_sys_error_(errno, "cannot list checkpoint directory", dir);
    }
    int64_t *steps = NULL;
    int cnt = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int tmp;
        int64_t s = dt_ckpt_parse_step_name_(e->d_name, &tmp);
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
    int64_t lstep = -1;
    int fd;
    struct stat sb;
    if (dt_ckpt_open_root_(dir, 0, &fd) == DT_STATUS_OK) {
        if (fstatat(fd, "latest", &sb, AT_SYMLINK_NOFOLLOW) == 0 && read_latest(fd, dir, &lstep) != DT_STATUS_OK) {
            DT_LOG_WARN("checkpoint: %s; ignoring it", dt_error_detail());
            lstep = -1;
        }
        /* Only real step directories are candidates (a link could point anywhere). */
        int k = 0;
        char name[64];
        for (int i = 0; i < cnt; i++) {
            snprintf(name, sizeof name, "step_%08lld", (long long)steps[i]);
            if (fstatat(fd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(sb.st_mode)) steps[k++] = steps[i];
        }
        cnt = k;
        close(fd);
    }
    char **out = dt_xcalloc((size_t)cnt + 1, sizeof *out);
    int k = 0;
    char p[PATH_MAX + 32];
    if (lstep >= 0) {
        snprintf(p, sizeof p, "%s/step_%08lld", dir, (long long)lstep);
        out[k++] = dt_xstrdup(p);
    }
    for (int i = 0; i < cnt; i++) {
        if (steps[i] == lstep) continue;
        snprintf(p, sizeof p, "%s/step_%08lld", dir, (long long)steps[i]);
        out[k++] = dt_xstrdup(p);
    }
    free(steps);
    *paths = out;
    *n = k;
    return DT_STATUS_OK;
}
