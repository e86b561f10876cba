/*
 * fs_safe.c - opening and replacing user-named files without following traps
 * (see fs_safe.h).
 */
#include "common/fs_safe.h"

#include "common/fs.h" /* defines: dt_fs_kind_name */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

dt_status_t dt_fs_open_regular(const char *path, int flags, int mode, int *fd, struct stat *sb_out) {
    char shown[512];
    dt_fs_printable(path, shown, sizeof shown);
    struct stat sb;
    *fd = open(path, flags | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, mode);
    if (*fd < 0) {
        int err = errno;
        if (err == ENXIO && stat(path, &sb) == 0) /* a FIFO opened for writing without a reader */
            return dt_error(DT_STATUS_INVALID, "%s: not a regular file (%s)", shown, dt_fs_kind_name(sb.st_mode));
        if (err == ELOOP && (flags & O_NOFOLLOW) && lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode))
            return dt_error(DT_STATUS_INVALID, "%s: a symbolic link: refusing to write through it", shown);
        return dt_error(dt_status_from_errno(err), "%s: %s", shown, strerror(err));
    }
    if (fstat(*fd, &sb) != 0) {
        int err = errno;
        close(*fd);
        *fd = -1;
        return dt_error(dt_status_from_errno(err), "%s: %s", shown, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(*fd);
        *fd = -1;
        return dt_error(DT_STATUS_INVALID, "%s: not a regular file (%s)", shown, dt_fs_kind_name(sb.st_mode));
    }
    int fl = fcntl(*fd, F_GETFL);
    if (fl >= 0) fcntl(*fd, F_SETFL, fl & ~O_NONBLOCK);
    if (sb_out) *sb_out = sb;
    return DT_STATUS_OK;
}

dt_status_t dt_fs_check_target(const char *path, int want_dir, const char *what) {
    if (!path || !*path) return dt_error(DT_STATUS_INVALID, "%s: an empty path", what);
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return DT_STATUS_OK;
        return dt_error(DT_STATUS_INVALID, "%s %s: %s", what, path, strerror(errno));
    }
    if (want_dir ? S_ISDIR(sb.st_mode) : S_ISREG(sb.st_mode)) return DT_STATUS_OK;
    return dt_error(DT_STATUS_INVALID, "%s %s exists and is %s, not %s: refusing to replace it", what, path,
                    dt_fs_kind_name(sb.st_mode), want_dir ? "a directory" : "a regular file");
}

/* The process's umask, read without changing it (umask(2) would, for every thread). */
static mode_t current_umask(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[128];
    unsigned mask = 022;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Umask: %o", &mask) == 1) break;
    if (f) fclose(f);
    return (mode_t)mask;
}

dt_status_t dt_fs_create_temp_beside(const char *path, char *tmp, size_t len, int *fd) {
    *fd = -1;
    if ((size_t)snprintf(tmp, len, "%s.tmp.XXXXXX", path) >= len)
        return dt_error(DT_STATUS_INVALID, "path too long: %s", path);
    *fd = mkstemp(tmp);
    if (*fd >= 0) fcntl(*fd, F_SETFD, FD_CLOEXEC);
    if (*fd < 0) {
        int err = errno;
        snprintf(tmp, len, "%s.tmp.XXXXXX", path);
        return dt_error(DT_STATUS_IO, "cannot create %s: %s", tmp, strerror(err));
    }
    if (fchmod(*fd, 0666 & ~current_umask()) != 0) { /* mkstemp makes 0600: the mode open(2) would give */
        int err = errno;
        close(*fd);
        unlink(tmp);
        *fd = -1;
        return dt_error(DT_STATUS_IO, "cannot set the mode of %s: %s", tmp, strerror(err));
    }
    return DT_STATUS_OK;
}

/* Writes all n bytes of buf to fd (retrying short writes and EINTR): 0, or -1 with errno. */
static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

dt_status_t dt_fs_write_atomic(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    char tmp[4352];
    int fd;
    DT_CHECK(dt_fs_create_temp_beside(path, tmp, sizeof tmp, &fd));
    int bad = write_all(fd, a, na) != 0 || (b && nb && write_all(fd, b, nb) != 0) || fsync(fd) != 0;
    int err = errno;
    if (close(fd) != 0 && !bad) bad = 1, err = errno;
    if (!bad && rename(tmp, path) != 0) bad = 1, err = errno;
    if (bad) {
        unlink(tmp);
        return dt_error(DT_STATUS_IO, "cannot write %s: %s", path, strerror(err));
    }
    return DT_STATUS_OK;
}
