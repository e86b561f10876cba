/*
 * fs_safe.h - opening and replacing files whose names a user (or someone else on a
 * shared machine) chose, without being led elsewhere: a FIFO that would block
 * open() forever, a device or a directory where a file was expected, a symbolic
 * link planted where a temporary was about to be written.
 *
 * Errors are dt_status_t naming the path and what it is instead.
 */
#ifndef DT_COMMON_FS_SAFE_H
#define DT_COMMON_FS_SAFE_H

#include <stddef.h>
#include <sys/stat.h>

#include "common/status.h"

/* open(path, flags | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, mode), refused unless it is
 * a regular file (with O_NOFOLLOW in flags, a symbolic link is refused saying so): never blocks on a FIFO (a FIFO opened for writing without a reader
 * fails, one opened for reading is refused after the open). O_NONBLOCK is cleared
 * again on success; *sb (may be NULL) gets the file's stat. Errors name the path
 * (control characters escaped): "PATH: not a regular file (a FIFO)" is
 * DT_STATUS_INVALID, "PATH: <strerror>" has the errno's status. */
dt_status_t dt_fs_open_regular(const char *path, int flags, int mode, int *fd, struct stat *sb);

/* A path about to be replaced by a rename: fine when it does not exist, or is a
 * regular file (want_dir 0) / a real directory (want_dir 1); a symbolic link, a
 * device, a FIFO, a socket or the other kind is DT_STATUS_INVALID saying so; an
 * empty path too. `what` starts the message ("-o"). */
dt_status_t dt_fs_check_target(const char *path, int want_dir, const char *what);

/* Creates a new file beside `path` for writing it atomically: "<path>.tmp.XXXXXX"
 * (mkstemp: a fresh name, O_EXCL, so no existing file or link is ever opened),
 * mode 0666 less the umask, as open(2) would make it. tmp (len bytes) gets its name. */
dt_status_t dt_fs_create_temp_beside(const char *path, char *tmp, size_t len, int *fd);

/* Writes a (na bytes) then b (nb bytes; NULL or 0: nothing) to path atomically: into
 * a fresh temporary beside it (dt_fs_create_temp_beside), fsync'd, renamed over
 * path. On failure nothing is left behind and path is untouched; DT_STATUS_IO names
 * the file. */
dt_status_t dt_fs_write_atomic(const char *path, const void *a, size_t na, const void *b, size_t nb);

#endif /* DT_COMMON_FS_SAFE_H */
