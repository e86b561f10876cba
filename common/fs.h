/*
 * fs.h - the few filesystem operations several modules need: create a directory
 * with its parents, remove a tree, read a whole file, find this binary.
 *
 * Errors are dt_status_t with the path and the system's reason in the detail
 * (errno translated where it enters: ENOSPC/EDQUOT/EROFS are DT_STATUS_IO).
 */
#ifndef DT_COMMON_FS_H
#define DT_COMMON_FS_H

#include <stddef.h>

#include "common/status.h"

/* `mkdir -p path` (mode 0755): every missing parent, then path; an existing
 * directory is fine. Any failure to create one is DT_STATUS_IO naming the
 * directory (a full, read-only or missing filesystem alike: what was to be
 * written cannot be); DT_STATUS_INVALID for an empty path or one longer than PATH_MAX. */
dt_status_t dt_fs_mkdir_p(const char *path);

/* `rm -rf path`: the tree under path (not following symbolic links), then path.
 * A path that does not exist is fine. Returns the first failure, after trying
 * to remove everything else. */
dt_status_t dt_fs_rm_rf(const char *path);

/* The one reader of a whole file a user named (configs, HF config.json, tokenizer
 * files, safetensors indexes, metrics, meta.json, ...): at most max bytes of the
 * file at path into a malloc'ed, NUL-terminated buffer (*out; *len its length
 * without the NUL when len is not NULL). Opened with dt_fs_open_regular, so a
 * directory, FIFO, device or socket is DT_STATUS_INVALID naming the path and what
 * it is (never a block or a huge allocation); a file larger than max is
 * DT_STATUS_LIMIT naming the path and its size, before anything is read; a missing
 * one DT_STATUS_NOT_FOUND. */
dt_status_t dt_fs_read_file(const char *path, size_t max, char **out, size_t *len);

/* The absolute path of the running binary (/proc/self/exe) into buf. */
dt_status_t dt_fs_self_exe(char *buf, size_t len);

/* path as it may be printed: control characters (below 0x20, and 0x7f) as \xNN, a
 * backslash as \\, so that a name cannot move the cursor or forge a line of a
 * message; cut with "..." when it does not fit. Returns buf. */
const char *dt_fs_printable(const char *path, char *buf, size_t len);

/* "a FIFO", "a directory", "a socket", ... for st_mode (messages refusing a file). */
const char *dt_fs_kind_name(unsigned mode);

#endif /* DT_COMMON_FS_H */
