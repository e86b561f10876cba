/*
 * fs.c - mkdir -p, rm -rf, read a whole file, this binary's path (see fs.h).
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include "common/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs_safe.h" /* defines: dt_fs_open_regular */
#include "common/mem.h"

/* A disk that is full or read-only is an I/O failure of what we were writing. */
static dt_status_t fs_error(int err, const char *what, const char *path) {
    dt_status_t st = dt_status_from_errno(err);
    if (st == DT_STATUS_SYS || st == DT_STATUS_INVALID) st = DT_STATUS_IO;
    return dt_error(st, "%s %s: %s", what, path, strerror(err));
}

/* An existing entry is fine for a parent (a file there makes the next mkdir fail
 * with ENOTDIR, naming the deeper path); the last component must be a directory. */
static dt_status_t mkdir_one(const char *path, int last) {
    if (mkdir(path, 0755) == 0) return DT_STATUS_OK;
    int err = errno;
    struct stat sb;
    if (err == EEXIST && (!last || (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)))) return DT_STATUS_OK;
    if (err == EEXIST) err = ENOTDIR;
    return dt_error(DT_STATUS_IO, "cannot create directory %s: %s", path, strerror(err));
}

dt_status_t dt_fs_mkdir_p(const char *path) {
    char buf[PATH_MAX];
    if (!path || !*path) return dt_error(DT_STATUS_INVALID, "cannot create a directory with an empty path");
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return dt_error(DT_STATUS_INVALID, "path too long: %s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/' || p[-1] == '/') continue;
        *p = '\0';
        DT_CHECK(mkdir_one(buf, 0));
        *p = '/';
    }
    return mkdir_one(buf, 1);
}

/* nftw's callback has no user pointer: the first failure of this thread's walk. */
static _Thread_local int rm_first_errno;
static _Thread_local char rm_first_path[PATH_MAX];

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    if (remove(path) != 0 && errno != ENOENT && rm_first_errno == 0) {
        rm_first_errno = errno;
        snprintf(rm_first_path, sizeof rm_first_path, "%s", path);
    }
    return 0; /* keep going: remove what can be removed */
}

dt_status_t dt_fs_rm_rf(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? DT_STATUS_OK : fs_error(errno, "cannot remove", path);
    rm_first_errno = 0;
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && rm_first_errno == 0) {
        rm_first_errno = errno;
        snprintf(rm_first_path, sizeof rm_first_path, "%s", path);
    }
    return rm_first_errno ? fs_error(rm_first_errno, "cannot remove", rm_first_path) : DT_STATUS_OK;
}

dt_status_t dt_fs_read_file(const char *path, size_t max, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    int fd;
    struct stat sb;
    /* A directory, FIFO, device or socket is refused before a byte is read: a FIFO
     * would block for ever, a directory's "size" is no file's. */
    DT_CHECK(dt_fs_open_regular(path, O_RDONLY, 0, &fd, &sb));
    char shown[512];
    dt_fs_printable(path, shown, sizeof shown);
    dt_status_t st = DT_STATUS_OK;
    if ((unsigned long long)sb.st_size > max) {
        close(fd);
        return dt_error(DT_STATUS_LIMIT, "%s is %llu bytes, more than the %zu this file may be", shown,
                        (unsigned long long)sb.st_size, max);
    }
    /* The size is only a hint (a file may grow while read): the buffer still grows
     * as needed, and max still bounds it. */
    size_t cap = (size_t)sb.st_size + 2, n = 0;
    char *buf = dt_xmalloc(cap);
    for (;;) {
        if (cap - n < 2) buf = dt_xrealloc(buf, cap *= 2);
        ssize_t got = read(fd, buf + n, cap - n - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            st = dt_error(dt_status_from_errno(errno), "cannot read %s: %s", shown, strerror(errno));
            goto out_close;
        }
        n += (size_t)got;
        if (n > max) {
            st = dt_error(DT_STATUS_LIMIT, "%s is more than the %zu bytes this file may be", shown, max);
            goto out_close;
        }
        if (got == 0) break;
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    buf = NULL;
out_close:
    close(fd);
    free(buf);
    return st;
}

dt_status_t dt_fs_self_exe(char *buf, size_t len) {
    if (len < 2) return dt_error(DT_STATUS_INVALID, "no room for the binary's path");
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    if (n < 0) return dt_error(dt_status_from_errno(errno), "cannot find its own binary (/proc/self/exe): %s",
                               strerror(errno));
    if ((size_t)n >= len - 1) return dt_error(DT_STATUS_LIMIT, "the binary's path is longer than %zu bytes", len - 2);
    buf[n] = '\0';
    return DT_STATUS_OK;
}

const char *dt_fs_printable(const char *path, char *buf, size_t len) {
    size_t o = 0;
    if (len == 0) return buf;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        char esc[8];
        int n;
        if (*p < 0x20 || *p == 0x7f) n = snprintf(esc, sizeof esc, "\\x%02x", *p);
        else if (*p == '\\') n = snprintf(esc, sizeof esc, "\\\\");
        else esc[0] = (char)*p, esc[1] = '\0', n = 1;
        if (o + (size_t)n + 4 > len) { /* room for "..." and the NUL */
            snprintf(buf + o, len - o, "...");
            return buf;
        }
        memcpy(buf + o, esc, (size_t)n);
        o += (size_t)n;
    }
    buf[o] = '\0';
    return buf;
}

const char *dt_fs_kind_name(unsigned mode) {
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFLNK: return "a symbolic link";
    default: return "a special file";
    }
}
