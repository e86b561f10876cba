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

dt_status_t dt_ckpt_fsync_path_(const char *path, int dir) {
    int fd = open(path, (dir ? O_DIRECTORY : 0) | O_RDONLY);
    if (fd < 0) return dt_ckpt_sys_error_(errno, "cannot open", path);
    int rc = fsync(fd), err = errno;
    close(fd);
    if (rc != 0 && err != EINVAL) return dt_ckpt_sys_error_(err, "cannot fsync", path);
    return DT_STATUS_OK;
}

/* Writes text to path (created or truncated) and fsyncs it. */
dt_status_t dt_ckpt_write_text_file_(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return dt_ckpt_sys_error_(errno, "cannot create", path);
    dt_status_t st = dt_ckpt_write_all_(fd, text, strlen(text), path);
    if (st == DT_STATUS_OK && fsync(fd) != 0) st = dt_ckpt_sys_error_(errno, "cannot fsync", path);
    if (close(fd) != 0 && st == DT_STATUS_OK) st = dt_ckpt_sys_error_(errno, "cannot close", path);
    return st;
}

char *dt_ckpt_read_text_file_(const char *path, size_t max) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = dt_xmalloc(max + 1);
    size_t n = fread(buf, 1, max, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

void dt_ckpt_remove_tree_(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char p[PATH_MAX];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            if (unlink(p) != 0 && errno == EISDIR) dt_ckpt_remove_tree_(p);
        }
        closedir(d);
    }
    rmdir(path);
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
