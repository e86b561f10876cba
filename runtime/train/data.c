/*
 * data.c - the data loader's files: mapped text files and llm.c token shards
 * (uint16 and uint32, parsed by runtime/tokenize/shard.h), grouped into sources,
 * checked at open; validation batches. The training order lives in data_mix.c, the
 * read-ahead in data_ahead.c (see data.h for both) and the copy of a sample out of
 * the maps in data_read.c. The loader's files call one way: data.c -> data_mix.c ->
 * data_ahead.c (which gets its producer as a function) and data_read.c.
 */
#include "runtime/train/data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h" /* defines: dt_fs_printable, dt_fs_kind_name */
#include "common/fs_safe.h" /* defines: dt_fs_open_regular */
#include "common/log.h"
#include "common/mem.h"
#include "runtime/tokenize/shard.h" /* defines: dt_shard_parse, dt_shard_is_magic */
#include "runtime/train/data_impl.h"

int dt_data_default_vocab(dt_data_kind_t kind) {
    return kind == DT_DATA_TEXT ? 256 : DT_DATA_GPT2_VOCAB;
}

/* glob's error callback: a folder of the pattern that does not exist is no match
 * (reported as such), any other error stops the expansion and is kept to be named. */
static __thread char glob_err_path[256];
static __thread int glob_err_errno;
static int glob_error(const char *epath, int eerrno) {
    if (eerrno == ENOENT || eerrno == ENOTDIR) return 0;
    snprintf(glob_err_path, sizeof glob_err_path, "%s", epath);
    glob_err_errno = eerrno;
    return 1;
}

/* key: the config key for messages, or NULL (the caller names it). */
static dt_status_t expand_glob(const char *key, const char *pattern_raw, glob_t *g) {
    glob_err_errno = 0;
    int rc = glob(pattern_raw, GLOB_BRACE | GLOB_TILDE, glob_error, g);
    char pattern[512];
    dt_fs_printable(pattern_raw, pattern, sizeof pattern);
    if (rc == GLOB_NOMATCH)
        return dt_error(DT_STATUS_NOT_FOUND, "%s%sno file matches '%s'", key ? key : "", key ? ": " : "", pattern);
    if (rc != 0) {
        char where[512];
        dt_fs_printable(glob_err_path, where, sizeof where);
        return dt_error(DT_STATUS_IO, "%s%scannot read the files of '%s' (%s%s%s)", key ? key : "", key ? ": " : "",
                        pattern, rc == GLOB_NOSPACE ? "out of memory" : where, rc == GLOB_NOSPACE ? "" : ": ",
                        rc == GLOB_NOSPACE ? "" : strerror(glob_err_errno ? glob_err_errno : EIO));
    }
    return DT_STATUS_OK;
}

/* Opens a data file for reading when it is a regular file: O_NONBLOCK so that a
 * FIFO (or a device) given as data fails here instead of blocking open() for
 * ever, and fstat on what was opened, not on the name. sb: its stat, or NULL. */
/* Reads a file's first 8 bytes: a shard (and its width) or text. */
static dt_status_t sniff_kind(const char *path, dt_data_kind_t *kind, int *token_bytes) {
    int fd;
    DT_CHECK(dt_fs_open_regular(path, O_RDONLY, 0, &fd, NULL));
    int32_t hdr[2] = {0, 0};
    ssize_t n = read(fd, hdr, sizeof hdr);
    close(fd);
    size_t len = strlen(path);
    int is_bin = len > 4 && strcmp(path + len - 4, ".bin") == 0;
    if (n >= 4 && dt_shard_is_magic(hdr[0])) {
        *kind = DT_DATA_TOKENS;
        *token_bytes = hdr[0] == DT_SHARD_MAGIC_U32 ? 4 : 2;
    } else if (is_bin) {
        return dt_error(DT_STATUS_FORMAT,
                        "%s: not a token shard: magic is %d, expected %d (uint16) or %d (uint32), "
                        "llm.c's format",
                        path, n >= 4 ? hdr[0] : -1, DT_SHARD_MAGIC_U16, DT_SHARD_MAGIC_U32);
    } else {
        *kind = DT_DATA_TEXT;
        *token_bytes = 1;
    }
    return DT_STATUS_OK;
}

dt_status_t dt_data_detect_width(const char *pattern, dt_data_kind_t *kind, int *token_bytes) {
    glob_t g;
    int tb;
    DT_CHECK(expand_glob(NULL, pattern, &g));
    dt_status_t st = sniff_kind(g.gl_pathv[0], kind, &tb);
    globfree(&g);
    if (token_bytes) *token_bytes = tb;
    return st;
}

dt_status_t dt_data_header_vocab(const char *pattern, int *vocab, char *file, size_t file_len) {
    glob_t g;
    *vocab = 0;
    if (file && file_len) file[0] = '\0';
    DT_CHECK(expand_glob(NULL, pattern, &g));
    for (size_t i = 0; i < g.gl_pathc; i++) {
        int fd;
        if (dt_fs_open_regular(g.gl_pathv[i], O_RDONLY, 0, &fd, NULL) != DT_STATUS_OK) {
            dt_error_clear(); /* the loader's own check names it */
            continue;
        }
        int32_t hdr[DT_SHARD_HEADER_VOCAB + 1] = {0};
        ssize_t n = read(fd, hdr, sizeof hdr);
        close(fd);
        if (n == (ssize_t)sizeof hdr && dt_shard_is_magic(hdr[0]) && hdr[DT_SHARD_HEADER_VOCAB] > *vocab) {
            *vocab = hdr[DT_SHARD_HEADER_VOCAB];
            if (file && file_len) snprintf(file, file_len, "%s", g.gl_pathv[i]);
        }
    }
    globfree(&g);
    return DT_STATUS_OK;
}

dt_status_t dt_data_detect(const char *pattern, dt_data_kind_t *kind) {
    return dt_data_detect_width(pattern, kind, NULL);
}

static void file_unmap(data_file *f) {
    if (f->map && f->map_len) munmap(f->map, f->map_len);
    if (f->mask_map && f->mask_len) munmap(f->mask_map, f->mask_len);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* The largest token of a shard when it is >= vocab: 1, its id and its first index;
 * else 0. */
static int max_over_vocab(const data_file *f, int vocab, uint64_t *at, uint32_t *id) {
    uint32_t max = 0;
    if (f->token_bytes == 2) {
        const uint16_t *p = f->tokens;
        for (uint64_t i = 0; i < f->ntok; i++) max = p[i] > max ? p[i] : max;
    } else {
        const uint32_t *p = f->tokens;
        for (uint64_t i = 0; i < f->ntok; i++) max = p[i] > max ? p[i] : max;
    }
    if (max < (uint32_t)vocab) return 0;
    uint64_t i = 0;
    if (f->token_bytes == 2)
        while (((const uint16_t *)f->tokens)[i] != max) i++;
    else
        while (((const uint32_t *)f->tokens)[i] != max) i++;
    *at = i;
    *id = max;
    return 1;
}

/* The loss mask beside a shard (PATH.mask), when there is one: mapped and checked
 * against the shard. */
static dt_status_t mask_map(data_file *f) {
    char mpath[4096];
    if (snprintf(mpath, sizeof mpath, "%s%s", f->path, DT_MASK_SUFFIX) >= (int)sizeof mpath) return DT_STATUS_OK;
    if (access(mpath, F_OK) != 0) return DT_STATUS_OK;
    int fd;
    struct stat sb;
    DT_CHECK(dt_fs_open_regular(mpath, O_RDONLY, 0, &fd, &sb));
    f->mask_len = (size_t)sb.st_size;
    f->mask_map = f->mask_len ? mmap(NULL, f->mask_len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (f->mask_map == MAP_FAILED) {
        f->mask_map = NULL;
        f->mask_len = 0;
        return dt_error(DT_STATUS_IO, "%s: cannot map it: %s", mpath, strerror(errno));
    }
    DT_CHECK(dt_mask_parse(mpath, f->mask_map, f->mask_len, f->ntok));
    f->mask = (const uint8_t *)f->mask_map + DT_SHARD_HEADER_BYTES;
    return DT_STATUS_OK;
}

static dt_status_t file_map(data_file *f, const char *path, dt_data_kind_t kind, int seq_len,
                            int vocab) {
    dt_status_t st = DT_STATUS_OK;
    f->path = dt_xstrdup(path);
    int fd;
    struct stat sb;
    DT_CHECK(dt_fs_open_regular(path, O_RDONLY, 0, &fd, &sb));
    f->map_len = (size_t)sb.st_size;
    if (f->map_len > 0) {
        f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            st = dt_error(DT_STATUS_IO, "%s: cannot map %zu bytes: %s", path, f->map_len,
                          strerror(errno));
            goto out_close_fd;
        }
    }
    if (kind == DT_DATA_TEXT) {
        f->bytes = f->map;
        f->token_bytes = 1;
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
        DT_CHECK_GOTO(dt_shard_parse(path, f->map, f->map_len, &f->token_bytes, &f->ntok), st,
                      out_close_fd);
        f->tokens = (const uint8_t *)f->map + DT_SHARD_HEADER_BYTES;
        DT_CHECK_GOTO(mask_map(f), st, out_close_fd);
    }
    f->nsamples = f->ntok > (uint64_t)seq_len ? (f->ntok - 1) / (uint64_t)seq_len : 0;
out_close_fd:
    close(fd);
    return st;
}

/* Shard sets up to this many bytes are read through at open (ids checked before
 * the first step, pages cached); larger ones are lazy (data_impl.h), so that a run
 * over many GB of shards on network storage neither reads them all at start nor
 * asks the kernel to (MADV_WILLNEED over every file would). DTRUN_DATA_SCAN_MB
 * overrides it (tests, the slow-storage benchmark). */
#define DATA_SCAN_BYTES (256ull << 20)

static dt_status_t set_check(data_set *s, int vocab) {
    uint64_t bytes = 0, limit = DATA_SCAN_BYTES;
    for (int i = 0; i < s->nfiles; i++) bytes += s->files[i].map_len;
    const char *mb = getenv("DTRUN_DATA_SCAN_MB");
    if (mb && *mb) limit = strtoull(mb, NULL, 10) << 20;
    s->vocab = vocab;
    s->lazy = s->kind == DT_DATA_TOKENS && vocab > 0 && bytes > limit;
    for (int i = 0; i < s->nfiles; i++) {
        data_file *f = &s->files[i];
        if (!f->map_len) continue;
        madvise(f->map, f->map_len, s->lazy ? MADV_RANDOM : MADV_WILLNEED);
        uint64_t at;
        uint32_t id;
        if (!s->lazy && f->tokens && vocab > 0 && max_over_vocab(f, vocab, &at, &id))
            return dt_error(DT_STATUS_FORMAT, "%s: token id %u at index %llu is not below the model's vocab size %d",
                            f->path, id, (unsigned long long)at, vocab);
    }
    return DT_STATUS_OK;
}

static void set_free(data_set *s) {
    for (int i = 0; i < s->nfiles; i++) file_unmap(&s->files[i]);
    free(s->files);
    free(s->seq);
    free(s->segs);
    memset(s, 0, sizeof *s);
}

static const char *kind_name(dt_data_kind_t k) { return k == DT_DATA_TEXT ? "text" : "token shards"; }

static dt_status_t set_open(data_set *s, const char *key, const char *pattern,
                            const dt_data_opts *o) {
    glob_t g;
    DT_CHECK(expand_glob(key, pattern, &g));
    dt_status_t st = DT_STATUS_OK;
    s->files = dt_xcalloc(g.gl_pathc, sizeof *s->files);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        dt_data_kind_t kind;
        int tb;
        size_t plen = strlen(g.gl_pathv[i]), slen = strlen(DT_MASK_SUFFIX);
        if (plen > slen && strcmp(g.gl_pathv[i] + plen - slen, DT_MASK_SUFFIX) == 0)
            continue; /* a shard's loss mask, read with its shard */
        DT_CHECK_GOTO(sniff_kind(g.gl_pathv[i], &kind, &tb), st, out_free_glob);
        if (i == 0) {
            s->kind = kind;
        } else if (kind != s->kind) {
            st = dt_error(DT_STATUS_FORMAT, "%s: '%s' mixes text files and token shards (%s is %s)",
                          key, pattern, g.gl_pathv[i], kind == DT_DATA_TEXT ? "text" : "a shard");
            goto out_free_glob;
        }
        if (kind == DT_DATA_TOKENS && tb == 4 && o->vocab_size <= 0) {
            st = dt_error(DT_STATUS_CONFIG,
                          "%s: %s holds uint32 token shards (llm.c version 7): set model.vocab_size "
                          "to the tokenizer's vocabulary size (it cannot be guessed from the data)",
                          key, g.gl_pathv[i]);
            goto out_free_glob;
        }
        data_file *f = &s->files[s->nfiles++];
        DT_CHECK_GOTO(file_map(f, g.gl_pathv[i], kind, o->seq_len, o->vocab_size), st, out_free_glob);
        f->first_sample = s->nsamples;
        s->nsamples += f->nsamples;
        s->ntokens += f->ntok;
        if (s->nfiles > 1 && !f->mask != !s->files[0].mask) {
            const data_file *with = f->mask ? f : &s->files[0], *without = f->mask ? &s->files[0] : f;
            st = dt_error(DT_STATUS_FORMAT,
                          "%s: '%s' mixes shards with a loss mask and without: %s has %s%s but %s has none (masked "
                          "data needs every shard's mask: tokenize them all with --chat)",
                          key, pattern, with->path, with->path, DT_MASK_SUFFIX, without->path);
            goto out_free_glob;
        }
    }
    if (s->nfiles == 0) {
        st = dt_error(DT_STATUS_NOT_FOUND, "%s: '%s' matches only loss masks (%s), no shard", key, pattern,
                      DT_MASK_SUFFIX);
        goto out_free_glob;
    }
    s->masked = s->files[0].mask != NULL;
    if (s->masked) DT_CHECK_GOTO(dt_data_pack_build_(s, o->seq_len, !o->no_packing), st, out_free_glob);
    DT_CHECK_GOTO(set_check(s, o->vocab_size), st, out_free_glob);
out_free_glob:
    globfree(&g);
    return st;
}

/* Samples of n held out for validation: val_fraction of them, at least one when
 * there is a fraction and more than one sample. */
static uint64_t held_out(uint64_t n, double val_fraction) {
    uint64_t held = (uint64_t)((double)n * val_fraction + 0.5);
    if (val_fraction > 0 && held == 0 && n > 1) held = 1;
    return held;
}

/* A source that leaves no training sample: the key, the files and the numbers. */
static dt_status_t no_sample_error(const char *key, const char *pattern, const data_set *s, int seq_len, uint64_t held) {
    char shown[512];
    dt_fs_printable(pattern, shown, sizeof shown);
    return dt_error(DT_STATUS_FORMAT,
                    "%s: %s: %llu tokens in %d file(s) give no training sample of seq_len %d "
                    "(each sample needs %d tokens%s)",
                    key, shown, (unsigned long long)s->ntokens, s->nfiles, seq_len, seq_len + 1,
                    held ? ", after holding out validation" : "");
}

dt_status_t dt_data_check_files(const char *key, const char *pattern, int seq_len, int vocab_size,
                                double val_fraction) {
    dt_data_opts o = {.seq_len = seq_len, .vocab_size = vocab_size};
    data_set s = {0};
    dt_status_t st = set_open(&s, key, pattern, &o);
    if (st == DT_STATUS_OK && val_fraction >= 0) {
        uint64_t held = held_out(s.nsamples, val_fraction);
        if (s.nsamples - held == 0) st = no_sample_error(key, pattern, &s, seq_len, held);
    }
    set_free(&s);
    if (st != DT_STATUS_OK && strncmp(dt_error_detail(), key, strlen(key)) != 0) {
        char why[1024]; /* every message of this check names the key */
        snprintf(why, sizeof why, "%s", dt_error_detail());
        dt_error(st, "%s: %s", key, why);
    }
    return st;
}

/* Opens source i of the mixture: its files, and its held-out tail. */
static dt_status_t src_open(dt_data_t *d, int i, const dt_data_source *s, const dt_data_opts *o) {
    char key[64];
    if (o->sources) snprintf(key, sizeof key, "data.train[%d]", i);
    else snprintf(key, sizeof key, "data.train");
    if (!s->path || !s->path[0])
        return dt_error(DT_STATUS_CONFIG, "%s: expected a path or glob, found nothing", key);
    if (!(s->weight > 0) || !isfinite(s->weight))
        return dt_error(DT_STATUS_CONFIG, "%s.weight: expected a number > 0, found %g", key, s->weight);
    data_src *src = &d->src[i];
    src->path = dt_xstrdup(s->path);
    DT_CHECK(set_open(&src->set, key, s->path, o));
    if (i > 0 && src->set.kind != d->src[0].set.kind)
        return dt_error(DT_STATUS_FORMAT, "data.train: the sources must be the same kind: '%s' is %s but '%s' is %s",
                        d->src[0].path, kind_name(d->src[0].set.kind), src->path, kind_name(src->set.kind));
    uint64_t n = src->set.nsamples, held = o->val && o->val[0] ? 0 : held_out(n, o->val_fraction);
    src->held = held;
    src->train_n = n - held;
    if (src->train_n == 0) return no_sample_error(key, s->path, &src->set, o->seq_len, held);
    if (src->train_n > UINT32_MAX)
        return dt_error(DT_STATUS_LIMIT, "%s: %llu samples exceed the 2^32 sample limit", key,
                        (unsigned long long)src->train_n);
    src->perm = dt_mem_alloc(DT_MEM_DATA, src->train_n * sizeof *src->perm);
    return src->perm ? DT_STATUS_OK : DT_STATUS_NOMEM;
}

dt_status_t dt_data_open(const dt_data_opts *opts, dt_data_t **out) {
    *out = NULL;
    dt_data_source one = {.path = opts->train, .weight = 1.0};
    const dt_data_source *srcs = opts->sources ? opts->sources : &one;
    int n = opts->sources ? opts->n_sources : 1;
    if (!opts->sources && (!opts->train || !opts->train[0]))
        return dt_error(DT_STATUS_CONFIG, "data.train: expected a path or glob, found nothing");
    if (n < 1 || n > DT_DATA_MAX_SOURCES)
        return dt_error(DT_STATUS_CONFIG, "data.train: expected 1 to %d sources, found %d", DT_DATA_MAX_SOURCES, n);
    if (opts->seq_len <= 0 || opts->micro_batch <= 0 || opts->world_size <= 0 || opts->rank < 0 ||
        opts->rank >= opts->world_size || opts->prefetch < 0)
        return dt_error(DT_STATUS_INVALID, "data: bad seq_len %d, micro_batch %d, prefetch %d or rank %d/%d",
                        opts->seq_len, opts->micro_batch, opts->prefetch, opts->rank, opts->world_size);
    if (opts->val_fraction < 0 || opts->val_fraction >= 1)
        return dt_error(DT_STATUS_CONFIG, "data.val_fraction: expected a number in [0, 1), found %g",
                        opts->val_fraction);
    dt_status_t st = DT_STATUS_OK;
    dt_data_t *d = dt_xcalloc(1, sizeof *d);
    d->o = *opts;
    d->o.train = d->o.val = NULL; /* not kept: the caller owns the strings */
    d->o.sources = NULL;
    for (int i = 0; i < n; i++) {
        d->n_src = i + 1;
        DT_CHECK_GOTO(src_open(d, i, &srcs[i], opts), st, out_free);
    }
    /* Shares: each weight scaled by the largest first (in (0, 1]), so that a sum of
     * weights near DBL_MAX cannot overflow to inf and make every share 0. */
    double wmax = 0, wsum = 0, cum = 0;
    for (int i = 0; i < n; i++) wmax = srcs[i].weight > wmax ? srcs[i].weight : wmax;
    for (int i = 0; i < n; i++) wsum += srcs[i].weight / wmax;
    for (int i = 0; i < n; i++) d->src[i].cum = (cum += srcs[i].weight / wmax / wsum);
    d->src[n - 1].cum = 2.0; /* every u in [0, 1) picks some source */
    if (opts->val && opts->val[0]) {
        DT_CHECK_GOTO(set_open(&d->val, "data.val", opts->val, opts), st, out_free);
        if (d->val.kind != d->src[0].set.kind) {
            st = dt_error(DT_STATUS_FORMAT, "data.val is %s but data.train is %s", kind_name(d->val.kind),
                          kind_name(d->src[0].set.kind));
            goto out_free;
        }
        d->val_n = d->val.nsamples;
    } else {
        for (int i = 0; i < n; i++) d->val_n += d->src[i].held;
    }
    const char *delay = getenv("DTRUN_DATA_DELAY_US");
    if (delay && *delay) d->delay_us = strtoull(delay, NULL, 10);
    d->pos.n_sources = n;
    d->mine = dt_xcalloc((size_t)opts->micro_batch, sizeof *d->mine);
    DT_CHECK_GOTO(dt_data_ahead_init_(d, dt_data_produce_), st, out_free);
    *out = d;
    return DT_STATUS_OK;
out_free:
    dt_data_close(d);
    return st;
}

void dt_data_close(dt_data_t *d) {
    if (!d) return;
    dt_data_ahead_free_(d);
    for (int i = 0; i < d->n_src; i++) {
        set_free(&d->src[i].set);
        dt_mem_free(d->src[i].perm);
        free(d->src[i].path);
    }
    set_free(&d->val);
    free(d->mine);
    free(d);
}

dt_data_kind_t dt_data_kind(const dt_data_t *d) { return d->src[0].set.kind; }
int dt_data_n_sources(const dt_data_t *d) { return d->n_src; }
const char *dt_data_source_path(const dt_data_t *d, int i) { return d->src[i].path; }
uint64_t dt_data_val_samples(const dt_data_t *d) { return d->val_n; }

uint64_t dt_data_train_samples(const dt_data_t *d) {
    uint64_t n = 0;
    for (int i = 0; i < d->n_src; i++) n += d->src[i].train_n;
    return n;
}

uint64_t dt_data_train_tokens(const dt_data_t *d) {
    uint64_t n = 0;
    for (int i = 0; i < d->n_src; i++) n += d->src[i].set.ntokens;
    return n;
}

/* Validation sample j: of data.val, or of the sources' tails one after another. */
static dt_status_t val_sample(const dt_data_t *d, uint64_t j, int T, int32_t *inp, int32_t *tgt, int32_t *pos) {
    if (d->val.nfiles) return dt_data_set_sample_(&d->val, j, T, inp, tgt, pos);
    for (int i = 0; i < d->n_src; i++) {
        if (j < d->src[i].held)
            return dt_data_set_sample_(&d->src[i].set, d->src[i].train_n + j, T, inp, tgt, pos);
        j -= d->src[i].held;
    }
    return dt_error(DT_STATUS_INVALID, "validation sample %llu is out of range", (unsigned long long)j);
}

dt_status_t dt_data_val_batch_pos(dt_data_t *d, uint64_t index, int32_t *inputs, int32_t *targets,
                                  int32_t *positions) {
    if (d->val_n == 0) return dt_error(DT_STATUS_NOT_FOUND, "no validation samples");
    int B = d->o.micro_batch, T = d->o.seq_len;
    uint64_t first = (index * (uint64_t)d->o.world_size + (uint64_t)d->o.rank) * (uint64_t)B;
    for (int b = 0; b < B; b++)
        DT_CHECK(val_sample(d, (first + (uint64_t)b) % d->val_n, T, inputs + (size_t)b * T, targets + (size_t)b * T,
                            positions ? positions + (size_t)b * T : NULL));
    return DT_STATUS_OK;
}

dt_status_t dt_data_val_batch(dt_data_t *d, uint64_t index, int32_t *inputs, int32_t *targets) {
    return dt_data_val_batch_pos(d, index, inputs, targets, NULL);
}

int dt_data_masked(const dt_data_t *d, dt_data_pack_info *info) {
    if (info) {
        memset(info, 0, sizeof *info);
        for (int i = 0; i < d->n_src; i++) {
            const dt_data_pack_info *p = &d->src[i].set.pack;
            info->documents += p->documents, info->skipped += p->skipped, info->truncated += p->truncated;
            info->sequences += p->sequences, info->positions += p->positions, info->trained += p->trained;
        }
    }
    return d->src[0].set.masked;
}
