/*
 * tokenize_out.c - shard files of one tokenize run: temporaries beside the final
 * names, fsync'ed, renamed all together at the end (tokenize_out.h).
 */
#include "runtime/tokenize/tokenize_out.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "common/mem.h"
#include "runtime/tokenize/shard.h"

#define OUT_BUF_BYTES (4u << 20)

void dt_shard_out_init(dt_shard_out *w, const char *prefix, int token_bytes, uint64_t shard_tokens,
                       uint64_t val_tokens) {
    memset(w, 0, sizeof *w);
    w->prefix = dt_xstrdup(prefix);
    w->token_bytes = token_bytes;
    w->shard_tokens = shard_tokens;
    w->val_tokens = val_tokens;
    w->fd = -1;
    w->mfd = -1;
    w->buf_cap = OUT_BUF_BYTES;
    w->buf = dt_xmalloc(w->buf_cap);
}

static dt_status_t write_all(int fd, const char *path, const void *p, size_t n, off_t at) {
    const char *c = p;
    while (n > 0) {
        ssize_t k = at >= 0 ? pwrite(fd, c, n, at) : write(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return dt_error(DT_STATUS_IO, "%s: write failed: %s", path, strerror(errno));
        c += k;
        n -= (size_t)k;
        if (at >= 0) at += k;
    }
    return DT_STATUS_OK;
}

/* The temporary of the open shard's mask: TMP of the shard with ".mask" before ".tmp.PID". */
static void mask_tmp_name(const dt_shard_out *w, char *out, size_t len) {
    snprintf(out, len, "%s%s.tmp.%ld", w->final[w->n - 1], DT_MASK_SUFFIX, (long)getpid());
}

static dt_status_t flush_buf(dt_shard_out *w) {
    if (w->buf_len) DT_CHECK(write_all(w->fd, w->tmp[w->n - 1], w->buf, w->buf_len, -1));
    w->buf_len = 0;
    if (w->mbuf_len) {
        char mt[4300];
        mask_tmp_name(w, mt, sizeof mt);
        DT_CHECK(write_all(w->mfd, mt, w->mbuf, w->mbuf_len, -1));
    }
    w->mbuf_len = 0;
    return DT_STATUS_OK;
}

/* Opens the next shard's temporary, with a placeholder header. */
static dt_status_t open_shard(dt_shard_out *w, int is_val) {
    int index = 0;
    for (int i = 0; i < w->n; i++)
        if (strstr(w->final[i] + strlen(w->prefix), is_val ? "_val_" : "_train_") == w->final[i] + strlen(w->prefix))
            index++;
    char final[4096], tmp[4200];
    if ((size_t)snprintf(final, sizeof final, "%s_%s_%06d.bin", w->prefix, is_val ? "val" : "train", index) >=
        sizeof final)
        return dt_error(DT_STATUS_INVALID, "output prefix too long: %s", w->prefix);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", final, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644); /* never through a link */
    if (fd < 0) return dt_error(DT_STATUS_IO, "%s: cannot create: %s", tmp, strerror(errno));
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 8;
        w->tmp = dt_xrealloc(w->tmp, (size_t)w->cap * sizeof *w->tmp);
        w->final = dt_xrealloc(w->final, (size_t)w->cap * sizeof *w->final);
    }
    w->tmp[w->n] = dt_xstrdup(tmp);
    w->final[w->n] = dt_xstrdup(final);
    w->n++;
    w->fd = fd;
    w->fd_is_val = is_val;
    w->in_shard = 0;
    static const char zeros[DT_SHARD_HEADER_BYTES];
    DT_CHECK(write_all(fd, tmp, zeros, sizeof zeros, -1));
    if (!w->masked) return DT_STATUS_OK;
    char mt[4300];
    mask_tmp_name(w, mt, sizeof mt);
    w->mfd = open(mt, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (w->mfd < 0) return dt_error(DT_STATUS_IO, "%s: cannot create: %s", mt, strerror(errno));
    return write_all(w->mfd, mt, zeros, sizeof zeros, -1);
}

/* Writes the real header, fsyncs and closes the open shard. */
static dt_status_t close_shard(dt_shard_out *w) {
    if (w->fd < 0) return DT_STATUS_OK;
    const char *path = w->tmp[w->n - 1];
    int32_t header[256];
    dt_status_t st;
    DT_CHECK_GOTO(flush_buf(w), st, out_close);
    DT_CHECK_GOTO(dt_shard_header(w->token_bytes, w->in_shard, header), st, out_close);
    header[DT_SHARD_HEADER_VOCAB] = (int32_t)w->vocab;
    DT_CHECK_GOTO(write_all(w->fd, path, header, sizeof header, 0), st, out_close);
    if (fsync(w->fd) != 0) st = dt_error(DT_STATUS_IO, "%s: fsync failed: %s", path, strerror(errno));
    if (st == DT_STATUS_OK && w->mfd >= 0) {
        char mt[4300];
        mask_tmp_name(w, mt, sizeof mt);
        DT_CHECK_GOTO(dt_mask_header(w->in_shard, header), st, out_close);
        DT_CHECK_GOTO(write_all(w->mfd, mt, header, sizeof header, 0), st, out_close);
        if (fsync(w->mfd) != 0) st = dt_error(DT_STATUS_IO, "%s: fsync failed: %s", mt, strerror(errno));
    }
out_close:
    if (close(w->fd) != 0 && st == DT_STATUS_OK)
        st = dt_error(DT_STATUS_IO, "%s: close failed: %s", path, strerror(errno));
    w->fd = -1;
    if (w->mfd >= 0) close(w->mfd);
    w->mfd = -1;
    return st;
}

/* Appends k ids (and their mask bytes when mask) to the open shard's buffers. */
static dt_status_t append(dt_shard_out *w, const uint32_t *ids, const uint8_t *mask, size_t k) {
    for (size_t i = 0; i < k; i++) {
        if (w->buf_len + 4 > w->buf_cap || (mask && w->mbuf_len + 1 > w->buf_cap)) DT_CHECK(flush_buf(w));
        if (w->token_bytes == 2) {
            uint16_t v = (uint16_t)ids[i];
            memcpy(w->buf + w->buf_len, &v, 2);
        } else {
            memcpy(w->buf + w->buf_len, &ids[i], 4);
        }
        w->buf_len += (size_t)w->token_bytes;
        if (mask) w->mbuf[w->mbuf_len++] = mask[i];
    }
    w->in_shard += k;
    w->total += k;
    return DT_STATUS_OK;
}

dt_status_t dt_shard_out_write_masked(dt_shard_out *w, const uint32_t *ids, const uint8_t *mask, size_t n) {
    if (n == 0) return DT_STATUS_OK;
    if (!w->masked && w->total > 0)
        return dt_error(DT_STATUS_INVALID, "a tokenize run writes masked and unmasked documents");
    if (!w->masked) {
        w->masked = 1;
        w->mbuf = dt_xmalloc(w->buf_cap);
    }
    if (!(mask[0] & DT_MASK_DOC)) return dt_error(DT_STATUS_INVALID, "masked ids must begin with a document start");
    size_t a = 0;
    while (a < n) {
        size_t b = a + 1;
        while (b < n && !(mask[b] & DT_MASK_DOC)) b++;
        uint64_t len = b - a;
        int want_val = w->val_written < w->val_tokens;
        uint64_t cap = want_val ? w->val_tokens : w->shard_tokens;
        if (w->fd >= 0 && (w->fd_is_val != want_val || (!want_val && w->in_shard > 0 && w->in_shard + len > cap)))
            DT_CHECK(close_shard(w));
        if (w->fd < 0) DT_CHECK(open_shard(w, want_val));
        DT_CHECK(append(w, ids + a, mask + a, (size_t)len));
        if (want_val) w->val_written += len;
        a = b;
    }
    return DT_STATUS_OK;
}

dt_status_t dt_shard_out_write(dt_shard_out *w, const uint32_t *ids, size_t n) {
    if (w->masked && n) return dt_error(DT_STATUS_INVALID, "a tokenize run writes masked and unmasked documents");
    while (n > 0) {
        int want_val = w->val_written < w->val_tokens;
        uint64_t cap = want_val ? w->val_tokens : w->shard_tokens;
        if (w->fd >= 0 && (w->fd_is_val != want_val || w->in_shard == cap)) DT_CHECK(close_shard(w));
        if (w->fd < 0) DT_CHECK(open_shard(w, want_val));
        size_t k = n;
        if ((uint64_t)k > cap - w->in_shard) k = (size_t)(cap - w->in_shard);
        DT_CHECK(append(w, ids, NULL, k));
        if (want_val) w->val_written += k;
        ids += k;
        n -= k;
    }
    return DT_STATUS_OK;
}

static void free_lists(dt_shard_out *w) {
    for (int i = 0; i < w->n; i++) {
        free(w->tmp[i]);
        free(w->final[i]);
    }
    free(w->tmp);
    free(w->final);
    w->tmp = w->final = NULL;
    w->n = w->cap = 0;
}

void dt_shard_out_abort(dt_shard_out *w) {
    if (w->fd >= 0) close(w->fd);
    if (w->mfd >= 0) close(w->mfd);
    w->fd = w->mfd = -1;
    for (int i = 0; i < w->n; i++)
        if (w->tmp[i]) {
            unlink(w->tmp[i]);
            if (w->masked) {
                char mt[4300];
                snprintf(mt, sizeof mt, "%s%s.tmp.%ld", w->final[i], DT_MASK_SUFFIX, (long)getpid());
                unlink(mt);
            }
        }
    free_lists(w);
    free(w->mbuf);
    w->mbuf = NULL;
    free(w->buf);
    free(w->prefix);
    w->buf = NULL;
    w->prefix = NULL;
}

/* Splits prefix into its folder ("." when none) and its file-name part. */
static void split_prefix(const char *prefix, char *dir, size_t dlen, const char **base) {
    const char *slash = strrchr(prefix, '/');
    if (!slash) {
        snprintf(dir, dlen, ".");
        *base = prefix;
    } else if (slash == prefix) {
        snprintf(dir, dlen, "/");
        *base = slash + 1;
    } else {
        snprintf(dir, dlen, "%.*s", (int)(slash - prefix), prefix);
        *base = slash + 1;
    }
}

/* The end of BASE_val_NNNNNN.bin or BASE_train_NNNNNN.bin in name (after ".bin"),
 * or NULL when name does not start so. */
static const char *shard_name_end(const char *name, const char *base) {
    size_t bl = strlen(base);
    if (strncmp(name, base, bl) != 0) return NULL;
    const char *p = name + bl;
    if (!strncmp(p, "_val_", 5)) p += 5;
    else if (!strncmp(p, "_train_", 7)) p += 7;
    else return NULL;
    int digits = 0;
    while (*p >= '0' && *p <= '9') p++, digits++;
    return digits >= 6 && !strncmp(p, ".bin", 4) ? p + 4 : NULL;
}

/* 1 when name is BASE_val_NNNNNN.bin or BASE_train_NNNNNN.bin. */
static int is_shard_name(const char *name, const char *base) {
    const char *end = shard_name_end(name, base);
    return end && !*end;
}

int dt_shard_out_clean_stale(const char *prefix) {
    char dir[4096];
    const char *base;
    split_prefix(prefix, dir, sizeof dir, &base);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *end = shard_name_end(e->d_name, base);
        if (end && !strncmp(end, DT_MASK_SUFFIX, strlen(DT_MASK_SUFFIX))) end += strlen(DT_MASK_SUFFIX);
        if (!end || strncmp(end, ".tmp.", 5) != 0) continue;
        char *stop;
        long pid = strtol(end + 5, &stop, 10);
        if (*stop || pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) == 0) removed++;
    }
    closedir(d);
    return removed;
}

dt_status_t dt_shard_out_existing(const char *prefix, char ***paths, int *n) {
    char dir[4096];
    const char *base;
    split_prefix(prefix, dir, sizeof dir, &base);
    *paths = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return dt_error(DT_STATUS_IO, "output folder %s: %s", dir, strerror(errno));
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_shard_name(e->d_name, base)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            *paths = dt_xrealloc(*paths, (size_t)cap * sizeof **paths);
        }
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        (*paths)[(*n)++] = dt_xstrdup(p);
    }
    closedir(d);
    return DT_STATUS_OK;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* fsync the folder so that the renames are durable. */
static void sync_dir(const char *prefix) {
    char dir[4096];
    const char *base;
    split_prefix(prefix, dir, sizeof dir, &base);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

dt_status_t dt_shard_out_commit(dt_shard_out *w, int force) {
    dt_status_t st = close_shard(w);
    if (st != DT_STATUS_OK) return st;
    if (w->total <= w->val_tokens) {
        w->no_train = 1;
        return dt_error(DT_STATUS_INVALID,
                        "the input gave %llu tokens, not more than the %llu validation tokens: no tokens left for "
                        "training", (unsigned long long)w->total, (unsigned long long)w->val_tokens);
    }
    char **old = NULL;
    int n_old = 0;
    if (force) DT_CHECK(dt_shard_out_existing(w->prefix, &old, &n_old));
    for (int i = 0; i < w->n; i++) {
        char mt[4300], mf[4200];
        snprintf(mt, sizeof mt, "%s%s.tmp.%ld", w->final[i], DT_MASK_SUFFIX, (long)getpid());
        snprintf(mf, sizeof mf, "%s%s", w->final[i], DT_MASK_SUFFIX);
        /* the mask first: a shard under its final name always has its own mask (or,
         * unmasked, none: an older run's is removed) */
        int mrc = w->masked ? rename(mt, mf) : (unlink(mf) != 0 && errno != ENOENT ? -1 : 0);
        if (mrc != 0 || rename(w->tmp[i], w->final[i]) != 0) {
            st = dt_error(DT_STATUS_IO, "rename %s -> %s: %s", mrc ? mt : w->tmp[i], mrc ? mf : w->final[i],
                          strerror(errno));
            /* Take back the shards already renamed: no partial set under final names. */
            for (int j = 0; j < i; j++) {
                unlink(w->final[j]);
                snprintf(mf, sizeof mf, "%s%s", w->final[j], DT_MASK_SUFFIX);
                if (w->masked) unlink(mf);
            }
            goto out_free_old;
        }
        free(w->tmp[i]);
        w->tmp[i] = NULL;
    }
    /* An older run's shards that this one did not replace (it had more of them). */
    for (int i = 0; i < n_old; i++) {
        int ours = 0;
        for (int j = 0; j < w->n && !ours; j++) ours = !strcmp(base_name(w->final[j]), base_name(old[i]));
        if (!ours && unlink(old[i]) != 0 && errno != ENOENT)
            st = dt_error(DT_STATUS_IO, "cannot remove the older shard %s: %s", old[i], strerror(errno));
        char mf[8300];
        snprintf(mf, sizeof mf, "%s%s", old[i], DT_MASK_SUFFIX);
        if (!ours) unlink(mf);
    }
    sync_dir(w->prefix);
out_free_old:
    for (int i = 0; i < n_old; i++) free(old[i]);
    free(old);
    return st;
}
