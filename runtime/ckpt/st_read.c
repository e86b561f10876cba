/*
 * st_read.c - the safetensors reader (safetensors.h): one mapped file with its
 * header checked at open, element ranges of a tensor converted to fp32, and Hugging
 * Face weight sets (one file, or shards listed by model.safetensors.index.json).
 * Names are found through hash tables (a file's header, a set's weight map): an
 * index of hundreds of thousands of tensors opens in well under a second.
 */
#include "runtime/ckpt/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"      /* defines: dt_fs_read_file, dt_fs_printable */
#include "common/fs_safe.h" /* defines: dt_fs_open_regular */
#include "common/log.h"     /* defines: DT_LOG_WARN */
#include "common/mem.h"     /* defines: dt_xcalloc, dt_xstrdup */

/* A header this big is not a weights header (safetensors itself caps it at 100 MB). */
#define ST_MAX_HEADER ((uint64_t)100 << 20)
/* An index this big is not a weight map (a 200,000-tensor one is about 15 MB). */
#define ST_MAX_INDEX ((size_t)256 << 20)
#define ST_MAX_ELEMS ((uint64_t)1 << 53) /* elements of one tensor: far past any model, and exact in a double */

/* Names to small integers: open addressing over a power-of-two table of
 * (index + 1), 0 empty; the names are the caller's and outlive it. */
typedef struct name_table {
    uint32_t *slot;
    size_t mask;
} name_table;

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static void table_init(name_table *t, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    t->slot = dt_xcalloc(cap, sizeof *t->slot);
    t->mask = cap - 1;
}

/* The slot holding name, or the empty one where it would go; name_of(i) gives the
 * name of entry i. */
static uint32_t *table_slot(const name_table *t, const char *name, const char *(*name_of)(const void *, uint32_t),
                            const void *ctx) {
    for (size_t i = name_hash(name) & t->mask;; i = (i + 1) & t->mask)
        if (!t->slot[i] || !strcmp(name_of(ctx, t->slot[i] - 1), name)) return &t->slot[i];
}

struct dt_st_file {
    char *path;
    int fd;
    unsigned char *map; /* the whole file, read-only */
    size_t size;
    size_t data; /* offset of the data area: 8 + header length */
    dt_st_tensor *t;
    int n;
    uint64_t hash;
    name_table names; /* t's names */
};

static const char *file_name_of(const void *f, uint32_t i) { return ((const dt_st_file_t *)f)->t[i].name; }

const char *dt_st_dtype_name(dt_st_dtype_t d) { return d == DT_ST_F32 ? "F32" : d == DT_ST_BF16 ? "BF16" : "F16"; }
size_t dt_st_dtype_size(dt_st_dtype_t d) { return d == DT_ST_F32 ? 4 : 2; }

float dt_st_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float dt_st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) { /* inf / nan */
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: renormalise */
        int e = 113;
        while (!(man & 0x400)) man <<= 1, e--;
        u = sign | ((uint32_t)e << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

static int by_begin(const void *a, const void *b) {
    const dt_st_tensor *x = *(const dt_st_tensor *const *)a, *y = *(const dt_st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* A JSON number that is an exact integer in [0, 2^53). */
static int json_u64(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740991.0 ||
        (double)(uint64_t)v->valuedouble != v->valuedouble)
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

/* One header entry into t; FORMAT naming the file and tensor otherwise. */
static dt_status_t parse_entry(const dt_st_file_t *f, const cJSON *e, dt_st_tensor *t) {
    const char *p = f->path, *name = e->string;
    size_t data_bytes = f->size - f->data;
    if (!cJSON_IsObject(e)) return dt_error(DT_STATUS_FORMAT, "%s: tensor %s: expected an object in the header", p, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt)) return dt_error(DT_STATUS_FORMAT, "%s: tensor %s: no dtype string", p, name);
    if (!strcmp(dt->valuestring, "F32")) t->dtype = DT_ST_F32;
    else if (!strcmp(dt->valuestring, "BF16")) t->dtype = DT_ST_BF16;
    else if (!strcmp(dt->valuestring, "F16")) t->dtype = DT_ST_F16;
    else
        return dt_error(DT_STATUS_UNSUPPORTED, "%s: tensor %s: dtype %s is not one dtrun reads (F32, BF16, F16)", p,
                        name, dt->valuestring);
    if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > DT_ST_MAX_DIMS)
        return dt_error(DT_STATUS_FORMAT, "%s: tensor %s: expected a shape of at most %d dimensions", p, name,
                        DT_ST_MAX_DIMS);
    t->ndim = cJSON_GetArraySize(sh);
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t v;
        if (!json_u64(cJSON_GetArrayItem(sh, d), &v) || v > ((uint64_t)1 << 40))
            return dt_error(DT_STATUS_FORMAT, "%s: tensor %s: shape[%d] is not a size", p, name, d);
        t->shape[d] = (int64_t)v;
        /* each dimension is at most 2^40, but their product wraps past 2^64 (to 0
         * for [2^40, 2^40]): a shape of no bytes that claims 2^80 elements */
        if (v && t->numel > ST_MAX_ELEMS / v)
            return dt_error(DT_STATUS_FORMAT, "%s: tensor %s: shape holds more than 2^53 elements", p, name);
        t->numel *= (size_t)v;
    }
    uint64_t b, en;
    if (cJSON_GetArraySize(of) != 2 || !json_u64(cJSON_GetArrayItem(of, 0), &b) ||
        !json_u64(cJSON_GetArrayItem(of, 1), &en) || b > en)
        return dt_error(DT_STATUS_FORMAT, "%s: tensor %s: expected data_offsets [begin, end] with begin <= end", p,
                        name);
    if (en > data_bytes)
        return dt_error(DT_STATUS_FORMAT,
                        "%s: tensor %s: its data ends at byte %llu of the data area, which holds only %zu bytes "
                        "(a truncated file, or a header that lies about offsets)",
                        p, name, (unsigned long long)en, data_bytes);
    if ((uint64_t)t->numel * dt_st_dtype_size(t->dtype) != en - b)
        return dt_error(DT_STATUS_FORMAT,
                        "%s: tensor %s: shape holds %zu elements of %s (%zu bytes) but data_offsets span %llu bytes", p,
                        name, t->numel, dt->valuestring, t->numel * dt_st_dtype_size(t->dtype),
                        (unsigned long long)(en - b));
    t->begin = b, t->end = en;
    t->name = e->string;
    return DT_STATUS_OK;
}

static dt_status_t parse_header(dt_st_file_t *f, cJSON **root_out) {
    const char *p = f->path;
    if (f->size < 8) return dt_error(DT_STATUS_FORMAT, "%s: %zu bytes: too short for a safetensors file", p, f->size);
    uint64_t hlen = 0;
    for (int b = 0; b < 8; b++) hlen |= (uint64_t)f->map[b] << (8 * b);
    if (hlen > ST_MAX_HEADER || hlen > f->size - 8)
        return dt_error(DT_STATUS_FORMAT, "%s: header length %llu does not fit the file's %zu bytes (truncated?)", p,
                        (unsigned long long)hlen, f->size);
    f->data = 8 + (size_t)hlen;
    f->hash = fnv1a(0xcbf29ce484222325ull, f->map + 8, (size_t)hlen);
    cJSON *root = cJSON_ParseWithLength((const char *)f->map + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dt_error(DT_STATUS_FORMAT, "%s: the header is not a JSON object", p);
    }
    *root_out = root;
    int n = 0;
    for (const cJSON *e = root->child; e; e = e->next) n += strcmp(e->string, "__metadata__") != 0;
    f->t = dt_xcalloc((size_t)n + 1, sizeof *f->t);
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) continue;
        DT_CHECK(parse_entry(f, e, &f->t[f->n]));
        f->n++;
    }
    dt_st_tensor **order = dt_xcalloc((size_t)n + 1, sizeof *order);
    for (int i = 0; i < n; i++) order[i] = &f->t[i];
    qsort(order, (size_t)n, sizeof *order, by_begin);
    dt_status_t st = DT_STATUS_OK;
    const dt_st_tensor *last = NULL; /* the non-empty tensor ending furthest so far */
    for (int i = 0; i < n && st == DT_STATUS_OK; i++) {
        const dt_st_tensor *t = order[i];
        if (t->begin == t->end) continue;
        if (last && t->begin < last->end)
            st = dt_error(DT_STATUS_FORMAT, "%s: tensors %s [%llu, %llu) and %s [%llu, %llu) overlap in the data area", p,
                          last->name, (unsigned long long)last->begin, (unsigned long long)last->end, t->name,
                          (unsigned long long)t->begin, (unsigned long long)t->end);
        if (!last || t->end > last->end) last = t;
    }
    free(order);
    return st;
}

/* The header's names point into the parsed JSON: copy them so it can go, and hash
 * them. A name twice in the header (JSON allows it) is refused. */
static dt_status_t own_names(dt_st_file_t *f) {
    for (int i = 0; i < f->n; i++) f->t[i].name = dt_xstrdup(f->t[i].name);
    table_init(&f->names, (size_t)f->n);
    for (int i = 0; i < f->n; i++) {
        uint32_t *sl = table_slot(&f->names, f->t[i].name, file_name_of, f);
        if (*sl) return dt_error(DT_STATUS_FORMAT, "%s: tensor %s appears twice in the header", f->path, f->t[i].name);
        *sl = (uint32_t)i + 1;
    }
    return DT_STATUS_OK;
}

dt_status_t dt_st_open(const char *path, dt_st_file_t **out) {
    *out = NULL;
    dt_st_file_t *f = dt_xcalloc(1, sizeof *f);
    f->path = dt_xstrdup(path);
    f->fd = -1;
    dt_status_t st = DT_STATUS_OK;
    cJSON *root = NULL;
    struct stat sb;
    /* a directory, FIFO or device is refused (not mapped, never blocked on) */
    st = dt_fs_open_regular(path, O_RDONLY, 0, &f->fd, &sb);
    if (st != DT_STATUS_OK) {
        st = dt_error(st == DT_STATUS_NOT_FOUND ? st : DT_STATUS_IO, "cannot open %s", dt_error_detail());
        goto out_free;
    }
    f->size = (size_t)sb.st_size;
    if (f->size > 0) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, f->fd, 0);
        if (m == MAP_FAILED) {
            st = dt_error(DT_STATUS_IO, "cannot map %s: %s", path, strerror(errno));
            goto out_free;
        }
        f->map = m;
    }
    st = parse_header(f, &root);
    if (st == DT_STATUS_OK) st = own_names(f);
    else f->n = 0; /* names still point into root */
    cJSON_Delete(root);
    if (st != DT_STATUS_OK) goto out_free;
    *out = f;
    return DT_STATUS_OK;
out_free:
    dt_st_close(f);
    return st;
}

void dt_st_close(dt_st_file_t *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free((char *)f->t[i].name);
    free(f->t);
    free(f->names.slot);
    if (f->map) munmap(f->map, f->size);
    if (f->fd >= 0) close(f->fd);
    free(f->path);
    free(f);
}

const char *dt_st_path(const dt_st_file_t *f) { return f->path; }
int dt_st_count(const dt_st_file_t *f) { return f->n; }
const dt_st_tensor *dt_st_at(const dt_st_file_t *f, int i) { return i >= 0 && i < f->n ? &f->t[i] : NULL; }
uint64_t dt_st_header_hash(const dt_st_file_t *f) { return f->hash; }

const dt_st_tensor *dt_st_find(const dt_st_file_t *f, const char *name) {
    if (!f->names.slot) return NULL;
    uint32_t i = *table_slot(&f->names, name, file_name_of, f);
    return i ? &f->t[i - 1] : NULL;
}

dt_status_t dt_st_copy_f32(dt_st_file_t *f, const dt_st_tensor *t, size_t first, size_t count, float *dst) {
    if (first > t->numel || count > t->numel - first)
        return dt_error(DT_STATUS_INVALID, "%s: tensor %s: elements [%zu, %zu) outside its %zu", f->path, t->name, first,
                        first + count, t->numel);
    if (count == 0) return DT_STATUS_OK;
    size_t es = dt_st_dtype_size(t->dtype);
    const unsigned char *src = f->map + f->data + t->begin + first * es;
    if (t->dtype == DT_ST_F32) {
        memcpy(dst, src, count * 4);
    } else {
        int bf = t->dtype == DT_ST_BF16;
        for (size_t i = 0; i < count; i++) {
            uint16_t h = (uint16_t)(src[2 * i] | (src[2 * i + 1] << 8));
            dst[i] = bf ? dt_st_bf16_to_f32(h) : dt_st_f16_to_f32(h);
        }
    }
    return DT_STATUS_OK;
}

void dt_st_drop(dt_st_file_t *f, const dt_st_tensor *t, size_t first, size_t count) {
    if (first >= t->numel || count == 0) return;
    if (count > t->numel - first) count = t->numel - first;
    size_t es = dt_st_dtype_size(t->dtype), pg = (size_t)sysconf(_SC_PAGESIZE);
    const unsigned char *src = f->map + f->data + t->begin + first * es;
    /* The pages stay in the page cache; the reader's memory does not keep them. */
    uintptr_t a = (uintptr_t)src & ~(uintptr_t)(pg - 1), e = (uintptr_t)(src + count * es);
    madvise((void *)a, e - a, MADV_DONTNEED);
}

dt_status_t dt_st_read_f32(dt_st_file_t *f, const dt_st_tensor *t, size_t first, size_t count, float *dst) {
    DT_CHECK(dt_st_copy_f32(f, t, first, count, dst));
    dt_st_drop(f, t, first, count);
    return DT_STATUS_OK;
}

/* ---- weight sets ------------------------------------------------------------------------ */

struct dt_st_set {
    dt_st_file_t **files;
    int n;
    /* Every tensor of the set: its file and entry, found by name. */
    struct set_entry {
        const char *name; /* the file's copy */
        int file;
        const dt_st_tensor *t;
    } *e;
    size_t ne, cap;
    name_table names;
};

static const char *set_name_of(const void *s, uint32_t i) { return ((const dt_st_set_t *)s)->e[i].name; }

static void set_add(dt_st_set_t *s, dt_st_file_t *f) {
    s->files = dt_xrealloc(s->files, (size_t)(s->n + 1) * sizeof *s->files);
    s->files[s->n++] = f;
}

/* The file of the set at path, opened and added when new. A weight map names a few
 * shards over and over: the last one found is tried first. */
static dt_status_t set_file(dt_st_set_t *s, const char *path, int *which) {
    if (*which >= 0 && !strcmp(s->files[*which]->path, path)) return DT_STATUS_OK;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->files[i]->path, path)) return *which = i, DT_STATUS_OK;
    dt_st_file_t *f;
    DT_CHECK(dt_st_open(path, &f));
    set_add(s, f);
    *which = s->n - 1;
    return DT_STATUS_OK;
}

/* The shards of DIR/model.safetensors.index.json, each opened once. Each name of
 * the weight map is taken from the shard the map names for it, as transformers
 * does; a tensor that a shard holds but the map puts elsewhere (or nowhere) would
 * make "which copy?" a guess, and is refused naming both files. */
static dt_status_t open_index(const char *dir, const char *ipath, dt_st_set_t *s) {
    char *text;
    size_t len;
    DT_CHECK(dt_fs_read_file(ipath, ST_MAX_INDEX, &text, &len));
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    dt_status_t st = DT_STATUS_OK;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        st = dt_error(DT_STATUS_FORMAT, "%s: expected a JSON object with a \"weight_map\" object", ipath);
        goto out_free;
    }
    size_t n = 0;
    for (const cJSON *e = map->child; e; e = e->next) n++;
    s->e = dt_xcalloc(n + 1, sizeof *s->e);
    table_init(&s->names, n);
    int which = -1;
    for (const cJSON *e = map->child; e && st == DT_STATUS_OK; e = e->next) {
        if (!cJSON_IsString(e) || !*e->valuestring || strchr(e->valuestring, '/')) {
            st = dt_error(DT_STATUS_FORMAT, "%s: weight_map[\"%s\"]: expected a file name in %s", ipath, e->string, dir);
            break;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->valuestring);
        st = set_file(s, path, &which);
        if (st != DT_STATUS_OK) break;
        const dt_st_tensor *t = dt_st_find(s->files[which], e->string);
        if (!t) {
            st = dt_error(DT_STATUS_FORMAT, "%s: tensor %s: the index names this file but it has no such tensor", path,
                          e->string);
            break;
        }
        uint32_t *sl = table_slot(&s->names, t->name, set_name_of, s);
        if (*sl) {
            st = dt_error(DT_STATUS_FORMAT, "%s: weight_map names tensor %s twice", ipath, e->string);
            break;
        }
        s->e[s->ne] = (struct set_entry){t->name, which, t};
        *sl = (uint32_t)++s->ne;
    }
    /* every tensor of every shard is where the map says */
    for (int i = 0; i < s->n && st == DT_STATUS_OK; i++)
        for (int k = 0; k < s->files[i]->n && st == DT_STATUS_OK; k++) {
            const char *name = s->files[i]->t[k].name;
            uint32_t at = *table_slot(&s->names, name, set_name_of, s);
            if (!at)
                st = dt_error(DT_STATUS_FORMAT, "%s: tensor %s is in %s but the index's weight_map does not list it",
                              ipath, name, s->files[i]->path);
            else if (s->e[at - 1].file != i)
                st = dt_error(DT_STATUS_FORMAT,
                              "tensor %s is in two shards, %s and %s (%s names %s): refusing to guess which copy", name,
                              s->files[s->e[at - 1].file]->path, s->files[i]->path, ipath,
                              s->files[s->e[at - 1].file]->path);
        }
out_free:
    cJSON_Delete(root);
    return st;
}

/* A lone file: its tensors are the set's. */
static void index_file(dt_st_set_t *s) {
    dt_st_file_t *f = s->files[0];
    s->e = dt_xcalloc((size_t)f->n + 1, sizeof *s->e);
    table_init(&s->names, (size_t)f->n);
    for (int k = 0; k < f->n; k++) {
        *table_slot(&s->names, f->t[k].name, set_name_of, s) = (uint32_t)(s->ne + 1);
        s->e[s->ne++] = (struct set_entry){f->t[k].name, 0, &f->t[k]};
    }
}

dt_status_t dt_st_set_open(const char *dir, dt_st_set_t **out) {
    *out = NULL;
    dt_st_set_t *s = dt_xcalloc(1, sizeof *s);
    char ipath[4096], spath[4096];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    snprintf(spath, sizeof spath, "%s/model.safetensors", dir);
    dt_status_t st;
    struct stat sb;
    int have_index = lstat(ipath, &sb) == 0, have_single = lstat(spath, &sb) == 0;
    if (have_single) { /* transformers tries model.safetensors first too */
        if (have_index)
            DT_LOG_WARN("%s holds both model.safetensors and model.safetensors.index.json: reading model.safetensors "
                        "(as transformers does)",
                        dir);
        dt_st_file_t *f;
        st = dt_st_open(spath, &f);
        if (st == DT_STATUS_OK) set_add(s, f), index_file(s);
    } else if (have_index) {
        st = open_index(dir, ipath, s);
    } else {
        st = dt_error(DT_STATUS_NOT_FOUND, "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    if (st != DT_STATUS_OK) {
        dt_st_set_close(s);
        return st;
    }
    *out = s;
    return DT_STATUS_OK;
}

void dt_st_set_close(dt_st_set_t *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) dt_st_close(s->files[i]);
    free(s->files);
    free(s->e);
    free(s->names.slot);
    free(s);
}

const dt_st_tensor *dt_st_set_find(const dt_st_set_t *s, const char *name, dt_st_file_t **file) {
    if (!s->names.slot) return NULL;
    uint32_t i = *table_slot(&s->names, name, set_name_of, s);
    if (!i) return NULL;
    if (file) *file = s->files[s->e[i - 1].file];
    return s->e[i - 1].t;
}

int dt_st_set_files(const dt_st_set_t *s) { return s->n; }
dt_st_file_t *dt_st_set_file(const dt_st_set_t *s, int i) { return s->files[i]; }

uint64_t dt_st_set_bytes(const dt_st_set_t *s) {
    uint64_t b = 0;
    for (int i = 0; i < s->n; i++)
        for (int k = 0; k < s->files[i]->n; k++) b += s->files[i]->t[k].end - s->files[i]->t[k].begin;
    return b;
}

uint64_t dt_st_set_hash(const dt_st_set_t *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < s->n; i++) h = fnv1a(h, &s->files[i]->hash, sizeof s->files[i]->hash);
    return h;
}
