/*
 * ckpt_impl.h - what the checkpoint's files share, private to runtime/ckpt: the
 * shard format's constants (checkpoint.c's purpose block describes the layout) and
 * the small file helpers of ckpt_io.c, whose errors name the path.
 */
#ifndef DT_RUNTIME_CKPT_CKPT_IMPL_H
#define DT_RUNTIME_CKPT_CKPT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/ckpt/checkpoint.h"

#define SHARD_MAGIC "DTCKSHD1"
#define SHARD_VERSION 1u
#define FORMAT_NAME "dtrun-checkpoint"
#define FORMAT_VERSION 1
#define BLOCK_ELEMS ((uint64_t)DT_CKPT_BLOCK_BYTES / sizeof(float))

static inline uint32_t n_blocks_of(uint64_t count) { return (uint32_t)((count + BLOCK_ELEMS - 1) / BLOCK_ELEMS); }

/* ckpt_io.c: errno -> dt_status_t naming what and path; whole writes and reads;
 * fsync of a file or folder; small text files; rm -rf; "step_00000012[.tmp]" -> 12
 * (-1 when the name is not a step folder). */
dt_status_t dt_ckpt_sys_error_(int err, const char *what, const char *path);
dt_status_t dt_ckpt_write_all_(int fd, const void *data, size_t len, const char *path);
dt_status_t dt_ckpt_pread_all_(int fd, void *out, size_t len, uint64_t off, const char *path);
dt_status_t dt_ckpt_fsync_path_(const char *path, int dir);
dt_status_t dt_ckpt_write_text_file_(const char *path, const char *text);
char *dt_ckpt_read_text_file_(const char *path, size_t max);
void dt_ckpt_remove_tree_(const char *path);
int64_t dt_ckpt_parse_step_name_(const char *name, int *tmp);

#endif /* DT_RUNTIME_CKPT_CKPT_IMPL_H */
