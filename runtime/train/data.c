/*
 * data.c - mapped text files and llm.c token shards, cut into fixed windows and
 * visited in a seeded per-epoch permutation (see data.h for the sample order).
 */
#include "runtime/train/data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/mem.h"
#include "common/rng.h"

typedef struct data_file {
    char *path;
    void *map;
    size_t map_len;
    const uint8_t *bytes;   /* DT_DATA_TEXT */
    const uint16_t *tokens; /* DT_DATA_TOKENS */
    uint64_t ntok;
    uint64_t nsamples;
    uint64_t first_sample; /* global id of this file's first sample in its set */
} data_file;

typedef struct data_set {
    data_file *files;
    int nfiles;
    uint64_t nsamples;
    uint64_t ntokens;
    dt_data_kind_t kind;
} data_set;

struct dt_data {
    dt_data_opts o;
    data_set train;
    data_set val;        /* empty when validation comes from the train tail */
    uint64_t train_n;    /* samples used for training */
    const data_set *val_set;
    uint64_t val_first;  /* first sample id of validation in val_set */
    uint64_t val_n;
    uint32_t *perm;      /* permutation of [0, train_n) for perm_epoch */
    uint64_t perm_epoch;
    int perm_valid;
    dt_data_pos pos;
};

int dt_data_default_vocab(dt_data_kind_t kind) {
    return kind == DT_DATA_TEXT ? 256 : DT_DATA_GPT2_VOCAB;
}

static dt_status_t expand_glob(const char *key, const char *pattern, glob_t *g) {
    int rc = glob(pattern, GLOB_ERR | GLOB_BRACE | GLOB_TILDE, NULL, g);
    if (rc == GLOB_NOMATCH)
        return dt_error(DT_STATUS_NOT_FOUND, "%s: no file matches '%s'", key, pattern);
    if (rc != 0)
        return dt_error(DT_STATUS_IO, "%s: cannot read the files of '%s' (%s)", key, pattern,
                        rc == GLOB_NOSPACE ? "out of memory" : "read error");
    return DT_STATUS_OK;
}

/* Reads the first 4 bytes of a file: shard magic or not. */
static dt_status_t sniff_kind(const char *path, dt_data_kind_t *kind) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dt_error(dt_status_from_errno(errno), "%s: %s", path, strerror(errno));
    int32_t magic = 0;
    ssize_t n = read(fd, &magic, sizeof magic);
    close(fd);
    size_t len = strlen(path);
    int is_bin = len > 4 && strcmp(path + len - 4, ".bin") == 0;
    if (n == (ssize_t)sizeof magic && magic == DT_DATA_SHARD_MAGIC) {
        *kind = DT_DATA_TOKENS;
    } else if (is_bin) {
        return dt_error(DT_STATUS_FORMAT,
                        "%s: not a token shard: magic is %d, expected %d (llm.c format)", path,
                        n == (ssize_t)sizeof magic ? magic : -1, DT_DATA_SHARD_MAGIC);
    } else {
        *kind = DT_DATA_TEXT;
    }
    return DT_STATUS_OK;
}

dt_status_t dt_data_detect(const char *pattern, dt_data_kind_t *kind) {
    glob_t g;
    DT_CHECK(expand_glob("data", pattern, &g));
    dt_status_t st = sniff_kind(g.gl_pathv[0], kind);
    globfree(&g);
    return st;
}

static void file_unmap(data_file *f) {
    if (f->map && f->map_len) munmap(f->map, f->map_len);
    free(f->path);
    memset(f, 0, sizeof *f);
}

static dt_status_t file_map(data_file *f, const char *path, dt_data_kind_t kind, int seq_len,
                            int vocab) {
    dt_status_t st = DT_STATUS_OK;
    f->path = dt_xstrdup(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dt_error(dt_status_from_errno(errno), "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = dt_error(DT_STATUS_IO, "%s: %s", path, strerror(errno));
        goto out_close_fd;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = dt_error(DT_STATUS_FORMAT, "%s: not a regular file", path);
        goto out_close_fd;
    }
    f->map_len = (size_t)sb.st_size;
    if (f->map_len > 0) {
        f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            st = dt_error(DT_STATUS_IO, "%s: cannot map %zu bytes: %s", path, f->map_len,
                          strerror(errno));
            goto out_close_fd;
        }
        madvise(f->map, f->map_len, MADV_WILLNEED);
    }
    if (kind == DT_DATA_TEXT) {
        f->bytes = f->map;
        f->ntok = f->map_len;
        if (vocab > 0 && vocab < 256) {
            for (uint64_t i = 0; i < f->ntok; i++)
                if (f->bytes[i] >= vocab) {
                    st = dt_error(DT_STATUS_FORMAT,
                                  "%s: byte %u at offset %llu is not below the model's vocab "
                                  "size %d (text data needs model.vocab_size >= 256)",
                                  path, f->bytes[i], (unsigned long long)i, vocab);
                    goto out_close_fd;
                }
        }
    } else {
        if (f->map_len < DT_DATA_SHARD_HEADER_BYTES) {
            st = dt_error(DT_STATUS_FORMAT, "%s: truncated: %zu bytes, shorter than the %d-byte header",
                          path, f->map_len, DT_DATA_SHARD_HEADER_BYTES);
            goto out_close_fd;
        }
        const int32_t *hdr = f->map;
        if (hdr[0] != DT_DATA_SHARD_MAGIC) {
            st = dt_error(DT_STATUS_FORMAT, "%s: not a token shard: magic is %d, expected %d",
                          path, hdr[0], DT_DATA_SHARD_MAGIC);
            goto out_close_fd;
        }
        if (hdr[1] != DT_DATA_SHARD_VERSION) {
            st = dt_error(DT_STATUS_FORMAT, "%s: unsupported shard version %d (expected %d)", path,
                          hdr[1], DT_DATA_SHARD_VERSION);
            goto out_close_fd;
        }
        if (hdr[2] < 0) {
            st = dt_error(DT_STATUS_FORMAT, "%s: negative token count %d in the header", path, hdr[2]);
            goto out_close_fd;
        }
        uint64_t want = DT_DATA_SHARD_HEADER_BYTES + 2ull * (uint64_t)hdr[2];
        if ((uint64_t)f->map_len != want) {
            st = dt_error(DT_STATUS_FORMAT,
                          "%s: %s: the header says %d tokens (%llu bytes) but the file has %zu bytes",
                          path, f->map_len < want ? "truncated" : "trailing bytes", hdr[2],
                          (unsigned long long)want, f->map_len);
            goto out_close_fd;
        }
        f->ntok = (uint64_t)hdr[2];
        f->tokens = (const uint16_t *)((const uint8_t *)f->map + DT_DATA_SHARD_HEADER_BYTES);
        if (vocab > 0) {
            uint16_t maxtok = 0;
            for (uint64_t i = 0; i < f->ntok; i++) maxtok = f->tokens[i] > maxtok ? f->tokens[i] : maxtok;
            if (maxtok >= vocab) {
                uint64_t at = 0;
                while (f->tokens[at] != maxtok) at++;
                st = dt_error(DT_STATUS_FORMAT,
                              "%s: token id %u at index %llu is not below the model's vocab size %d",
                              path, maxtok, (unsigned long long)at, vocab);
                goto out_close_fd;
            }
        }
    }
    f->nsamples = f->ntok > (uint64_t)seq_len ? (f->ntok - 1) / (uint64_t)seq_len : 0;
out_close_fd:
    close(fd);
    return st;
}

static void set_free(data_set *s) {
    for (int i = 0; i < s->nfiles; i++) file_unmap(&s->files[i]);
    free(s->files);
    memset(s, 0, sizeof *s);
}

static dt_status_t set_open(data_set *s, const char *key, const char *pattern,
                            const dt_data_opts *o) {
    glob_t g;
    DT_CHECK(expand_glob(key, pattern, &g));
    dt_status_t st = DT_STATUS_OK;
    s->files = dt_xcalloc(g.gl_pathc, sizeof *s->files);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        dt_data_kind_t kind;
        DT_CHECK_GOTO(sniff_kind(g.gl_pathv[i], &kind), st, out_free_glob);
        if (i == 0) {
            s->kind = kind;
        } else if (kind != s->kind) {
            st = dt_error(DT_STATUS_FORMAT, "%s: '%s' mixes text files and token shards (%s is %s)",
                          key, pattern, g.gl_pathv[i], kind == DT_DATA_TEXT ? "text" : "a shard");
            goto out_free_glob;
        }
        data_file *f = &s->files[s->nfiles++];
        DT_CHECK_GOTO(file_map(f, g.gl_pathv[i], kind, o->seq_len, o->vocab_size), st, out_free_glob);
        f->first_sample = s->nsamples;
        s->nsamples += f->nsamples;
        s->ntokens += f->ntok;
    }
out_free_glob:
    globfree(&g);
    return st;
}

/* Copies sample `id` of set s: T+1 tokens -> inputs[0..T), targets[0..T). */
static void set_sample(const data_set *s, uint64_t id, int T, int32_t *inp, int32_t *tgt) {
    int lo = 0, hi = s->nfiles - 1;
    while (lo < hi) { /* last file whose first_sample <= id */
        int mid = (lo + hi + 1) / 2;
        if (s->files[mid].first_sample <= id) lo = mid;
        else hi = mid - 1;
    }
    const data_file *f = &s->files[lo];
    uint64_t off = (id - f->first_sample) * (uint64_t)T;
    if (s->kind == DT_DATA_TEXT) {
        const uint8_t *p = f->bytes + off;
        for (int t = 0; t < T; t++) {
            inp[t] = p[t];
            tgt[t] = p[t + 1];
        }
    } else {
        const uint16_t *p = f->tokens + off;
        for (int t = 0; t < T; t++) {
            inp[t] = p[t];
            tgt[t] = p[t + 1];
        }
    }
}

dt_status_t dt_data_open(const dt_data_opts *opts, dt_data_t **out) {
    *out = NULL;
    if (!opts->train || !opts->train[0])
        return dt_error(DT_STATUS_CONFIG, "data.train: expected a path or glob, found nothing");
    if (opts->seq_len <= 0 || opts->micro_batch <= 0 || opts->world_size <= 0 || opts->rank < 0 ||
        opts->rank >= opts->world_size)
        return dt_error(DT_STATUS_INVALID, "data: bad seq_len %d, micro_batch %d or rank %d/%d",
                        opts->seq_len, opts->micro_batch, opts->rank, opts->world_size);
    if (opts->val_fraction < 0 || opts->val_fraction >= 1)
        return dt_error(DT_STATUS_CONFIG, "data.val_fraction: expected a number in [0, 1), found %g",
                        opts->val_fraction);
    dt_status_t st = DT_STATUS_OK;
    dt_data_t *d = dt_xcalloc(1, sizeof *d);
    d->o = *opts;
    d->o.train = d->o.val = NULL; /* not kept: the caller owns the strings */
    DT_CHECK_GOTO(set_open(&d->train, "data.train", opts->train, opts), st, out_free);
    int T = opts->seq_len;
    if (opts->val && opts->val[0]) {
        DT_CHECK_GOTO(set_open(&d->val, "data.val", opts->val, opts), st, out_free);
        if (d->val.kind != d->train.kind) {
            st = dt_error(DT_STATUS_FORMAT, "data.val is %s but data.train is %s",
                          d->val.kind == DT_DATA_TEXT ? "text" : "token shards",
                          d->train.kind == DT_DATA_TEXT ? "text" : "token shards");
            goto out_free;
        }
        d->val_set = &d->val;
        d->val_first = 0;
        d->val_n = d->val.nsamples;
        d->train_n = d->train.nsamples;
    } else {
        uint64_t held = (uint64_t)((double)d->train.nsamples * opts->val_fraction + 0.5);
        if (opts->val_fraction > 0 && held == 0 && d->train.nsamples > 1) held = 1;
        d->train_n = d->train.nsamples - held;
        d->val_set = &d->train;
        d->val_first = d->train_n;
        d->val_n = held;
    }
    if (d->train_n == 0) {
        st = dt_error(DT_STATUS_FORMAT,
                      "data.train: %llu tokens in %d file(s) give no training sample of seq_len %d "
                      "(each sample needs %d tokens%s)",
                      (unsigned long long)d->train.ntokens, d->train.nfiles, T, T + 1,
                      d->val_n ? ", after holding out validation" : "");
        goto out_free;
    }
    if (d->train_n > UINT32_MAX) {
        st = dt_error(DT_STATUS_LIMIT, "data.train: %llu samples exceed the 2^32 sample limit",
                      (unsigned long long)d->train_n);
        goto out_free;
    }
    d->perm = dt_mem_alloc(DT_MEM_DATA, d->train_n * sizeof *d->perm);
    if (!d->perm) {
        st = DT_STATUS_NOMEM;
        goto out_free;
    }
    *out = d;
    return DT_STATUS_OK;
out_free:
    dt_data_close(d);
    return st;
}

void dt_data_close(dt_data_t *d) {
    if (!d) return;
    set_free(&d->train);
    set_free(&d->val);
    dt_mem_free(d->perm);
    free(d);
}

dt_data_kind_t dt_data_kind(const dt_data_t *d) { return d->train.kind; }
uint64_t dt_data_train_samples(const dt_data_t *d) { return d->train_n; }
uint64_t dt_data_val_samples(const dt_data_t *d) { return d->val_n; }
uint64_t dt_data_train_tokens(const dt_data_t *d) { return d->train.ntokens; }

/* The permutation of epoch e, drawn with Fisher-Yates from (seed, e). */
static const uint32_t *epoch_perm(dt_data_t *d, uint64_t epoch) {
    if (d->perm_valid && d->perm_epoch == epoch) return d->perm;
    dt_rng rng;
    dt_rng_seed(&rng, d->o.seed, 0x64617461ull + epoch); /* "data" stream per epoch */
    for (uint64_t i = 0; i < d->train_n; i++) d->perm[i] = (uint32_t)i;
    for (uint64_t i = d->train_n - 1; i > 0; i--) {
        uint64_t j = dt_rng_below(&rng, i + 1);
        uint32_t t = d->perm[i];
        d->perm[i] = d->perm[j];
        d->perm[j] = t;
    }
    d->perm_epoch = epoch;
    d->perm_valid = 1;
    return d->perm;
}

uint64_t dt_data_sample_id(dt_data_t *d, dt_data_pos pos, uint64_t offset) {
    uint64_t k = pos.cursor + offset;
    uint64_t e = pos.epoch + k / d->train_n;
    k %= d->train_n;
    return epoch_perm(d, e)[k];
}

void dt_data_next(dt_data_t *d, int32_t *inputs, int32_t *targets) {
    int B = d->o.micro_batch, T = d->o.seq_len;
    uint64_t base = (uint64_t)d->o.rank * (uint64_t)B;
    for (int b = 0; b < B; b++) {
        uint64_t id = dt_data_sample_id(d, d->pos, base + (uint64_t)b);
        set_sample(&d->train, id, T, inputs + (size_t)b * T, targets + (size_t)b * T);
    }
    d->pos.cursor += (uint64_t)d->o.world_size * (uint64_t)B;
    d->pos.epoch += d->pos.cursor / d->train_n;
    d->pos.cursor %= d->train_n;
}

dt_status_t dt_data_val_batch(dt_data_t *d, uint64_t index, int32_t *inputs, int32_t *targets) {
    if (d->val_n == 0) return dt_error(DT_STATUS_NOT_FOUND, "no validation samples");
    int B = d->o.micro_batch, T = d->o.seq_len;
    uint64_t first = (index * (uint64_t)d->o.world_size + (uint64_t)d->o.rank) * (uint64_t)B;
    for (int b = 0; b < B; b++) {
        uint64_t id = d->val_first + (first + (uint64_t)b) % d->val_n;
        set_sample(d->val_set, id, T, inputs + (size_t)b * T, targets + (size_t)b * T);
    }
    return DT_STATUS_OK;
}

dt_data_pos dt_data_get_pos(const dt_data_t *d) { return d->pos; }

void dt_data_set_pos(dt_data_t *d, dt_data_pos pos) {
    d->pos.epoch = pos.epoch + pos.cursor / d->train_n;
    d->pos.cursor = pos.cursor % d->train_n;
}
