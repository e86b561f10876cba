/*
 * ckpt_io.c - the checkpoint's plumbing (ckpt_impl.h): CRC32C (SSE4.2 where the
 * CPU has it, a table otherwise) and small file helpers whose errors name the path.
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

#include "common/fs.h"
#include "common/log.h"
#include "common/mem.h"

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

/* ---- small file helpers ----------------------------------------------------- */

dt_status_t dt_ckpt_sys_error_(int err, const char *what, const char *path) {
    dt_status_t st = err == ENOSPC || err == EDQUOT ? DT_STATUS_IO : dt_status_from_errno(err);
    if (st == DT_STATUS_SYS || st == DT_STATUS_INVALID) st = DT_STATUS_IO;
    return dt_error(st, "%s %s: %s", what, path, strerror(err));
}

dt_status_t dt_ckpt_write_all_(int fd, const void *data, size_t len, const char *path) {
    const char *p = data;
    while (len) {
        size_t chunk = len < (1u << 30) ? len : (1u << 30);
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return dt_ckpt_sys_error_(errno, "cannot write", path);
        }
        p += w, len -= (size_t)w;
    }
    return DT_STATUS_OK;
}

dt_status_t dt_ckpt_pread_all_(int fd, void *out, size_t len, uint64_t off, const char *path) {
    char *p = out;
    while (len) {
        ssize_t r = pread(fd, p, len, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return dt_ckpt_sys_error_(errno, "cannot read", path);
        }
        if (r == 0) return dt_error(DT_STATUS_FORMAT, "%s is truncated (wanted %zu more bytes at offset %llu)", path, len,
                                    (unsigned long long)off);
        p += r, len -= (size_t)r, off += (uint64_t)r;
    }
    return DT_STATUS_OK;
}

dt_status_t dt_ckpt_fsync_fd_(int fd, const char *path) {
    if (fsync(fd) != 0 && errno != EINVAL) return dt_ckpt_sys_error_(errno, "cannot fsync", path);
    return DT_STATUS_OK;
}

dt_status_t dt_ckpt_open_root_(const char *path, int create, int *fd) {
    *fd = -1;
    if (create) DT_CHECK(dt_fs_mkdir_p(path));
    *fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*fd < 0) return dt_ckpt_sys_error_(errno, "cannot open checkpoint directory", path);
    return DT_STATUS_OK;
}

dt_status_t dt_ckpt_open_subdir_(int dirfd, const char *dir, const char *name, int create, int *fd) {
    *fd = -1;
    if (create && mkdirat(dirfd, name, 0755) != 0 && errno != EEXIST)
        return dt_error(DT_STATUS_IO, "cannot create directory %s/%s: %s", dir, name, strerror(errno));
    *fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (*fd >= 0) return DT_STATUS_OK;
    if (errno == ELOOP || errno == ENOTDIR)
        return dt_error(DT_STATUS_IO,
                        "%s/%s is a symbolic link or not a directory: dtrun writes only into folders it made "
                        "(remove it)",
                        dir, name);
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return dt_ckpt_sys_error_(errno, "cannot open", path);
}

dt_status_t dt_ckpt_create_at_(int dirfd, const char *dir, const char *name, int *fd) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    /* A leftover of an interrupted save, or a trap: unlinking removes a link, never
     * its target; a directory there is refused. */
    if (unlinkat(dirfd, name, 0) != 0 && errno != ENOENT) return dt_ckpt_sys_error_(errno, "cannot replace", path);
    *fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (*fd < 0) return dt_ckpt_sys_error_(errno, "cannot create", path);
    return DT_STATUS_OK;
}

dt_status_t dt_ckpt_write_text_at_(int dirfd, const char *dir, const char *name, const char *text) {
    int fd;
    DT_CHECK(dt_ckpt_create_at_(dirfd, dir, name, &fd));
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    dt_status_t st = dt_ckpt_write_all_(fd, text, strlen(text), path);
    if (st == DT_STATUS_OK && fsync(fd) != 0) st = dt_ckpt_sys_error_(errno, "cannot fsync", path);
    if (close(fd) != 0 && st == DT_STATUS_OK) st = dt_ckpt_sys_error_(errno, "cannot close", path);
    return st;
}

dt_status_t dt_ckpt_open_file_at_(int dirfd, const char *dir, const char *name, int *fd, uint64_t *size) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    /* O_NONBLOCK: a FIFO would block open() until a writer came; O_NOFOLLOW: a link
     * may point anywhere outside the checkpoint. */
    *fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (*fd < 0 && errno == ELOOP)
        return dt_error(DT_STATUS_FORMAT, "%s is not a regular file (a symbolic link): refusing to read it", path);
    if (*fd < 0) return dt_ckpt_sys_error_(errno, "cannot open", path);
    struct stat sb;
    if (fstat(*fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(*fd);
        *fd = -1;
        return dt_error(DT_STATUS_FORMAT, "%s is not a regular file: refusing to read it", path);
    }
    int flags = fcntl(*fd, F_GETFL);
    if (flags >= 0) fcntl(*fd, F_SETFL, flags & ~O_NONBLOCK);
    if (size) *size = (uint64_t)sb.st_size;
    return DT_STATUS_OK;
}

dt_status_t dt_ckpt_read_text_at_(int dirfd, const char *dir, const char *name, size_t max, char **out) {
    *out = NULL;
    int fd;
    uint64_t size;
    DT_CHECK(dt_ckpt_open_file_at_(dirfd, dir, name, &fd, &size));
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (size > max) { /* refused before a byte is read: a 6 GB meta.json is not one */
        close(fd);
        return dt_error(DT_STATUS_FORMAT, "%s is %llu bytes, more than the %zu a %s may be", path,
                        (unsigned long long)size, max, name);
    }
    size_t n = (size_t)size;
    char *buf = dt_xmalloc(n + 1);
    dt_status_t st = dt_ckpt_pread_all_(fd, buf, n, 0, path);
    close(fd);
    if (st != DT_STATUS_OK) {
        free(buf);
        return st;
    }
    buf[n] = 0;
    *out = buf;
    return DT_STATUS_OK;
}

/* dtrun's files in a step folder: meta.json and shard_NNNNN.bin. */
static int is_ckpt_file(const char *name) {
    if (!strcmp(name, "meta.json")) return 1;
    if (strncmp(name, "shard_", 6) != 0) return 0;
    const char *p = name + 6;
    while (*p >= '0' && *p <= '9') p++;
    return p > name + 6 && !strcmp(p, ".bin");
}

int dt_ckpt_remove_step_at_(int dirfd, const char *dir, const char *name) {
    struct stat sb;
    if (fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT;
    if (!S_ISDIR(sb.st_mode)) {
        DT_LOG_WARN("checkpoint: not removing %s/%s: not a directory (a symbolic link?)", dir, name);
        return 0;
    }
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return 0;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d)))
        if (is_ckpt_file(e->d_name) && fstatat(fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(sb.st_mode))
            unlinkat(fd, e->d_name, 0); /* a file or a link (the link goes, never its target) */
    closedir(d);
    if (unlinkat(dirfd, name, AT_REMOVEDIR) == 0) return 1;
    DT_LOG_WARN("checkpoint: kept %s/%s: %s (it holds files dtrun did not write)", dir, name, strerror(errno));
    return 0;
}

/* "step_00000042" -> 42; -1 when the name is not a step directory. `tmp` gets 1
 * for "step_00000042.tmp". */
int64_t dt_ckpt_parse_step_name_(const char *name, int *tmp) {
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
