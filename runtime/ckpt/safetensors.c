/*
 * safetensors.c - the safetensors writer (see safetensors.h; the reader is st_read.c).
 */
#include "runtime/ckpt/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs_safe.h"
#include "common/mem.h"

static dt_status_t write_all(int fd, const void *p, size_t n, const char *path) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return dt_error(DT_STATUS_IO, "cannot write %s: %s", path, strerror(errno));
        c += w, n -= (size_t)w;
    }
    return DT_STATUS_OK;
}

/* fp32 to bf16, rounding to nearest even (NaN stays NaN). */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* n values of src as the file's dtype, through scratch. */
static dt_status_t write_values(int fd, const float *src, size_t n, int bf16, uint16_t **scratch, const char *path) {
    if (!bf16) return write_all(fd, src, n * 4, path);
    *scratch = dt_xrealloc(*scratch, (n ? n : 1) * sizeof **scratch);
    for (size_t i = 0; i < n; i++) (*scratch)[i] = to_bf16(src[i]);
    return write_all(fd, *scratch, n * 2, path);
}

dt_status_t dt_safetensors_write(const dt_model_layout *l, const float *params, const char *path, size_t *bytes) {
    return dt_safetensors_write_tensors(l, params, path, 0, l->n_tensors, 0, bytes);
}

dt_status_t dt_safetensors_write_tensors(const dt_model_layout *l, const float *params, const char *path, int first,
                                         int end, int bf16, size_t *bytes) {
    size_t es = bf16 ? 2 : 4;
    cJSON *h = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    cJSON_AddStringToObject(meta, "producer", "dtrun export");
    cJSON_AddStringToObject(meta, "conv1d_layout", "in_out (Hugging Face GPT-2)");
    size_t off = 0;
    for (int i = first; i < end; i++) {
        const dt_tensor_info *t = &l->tensors[i];
        int64_t shape[2] = {0, 0};
        int nd;
        l->spec.ops->export_shape(l, i, shape, &nd);
        size_t numel = 1;
        cJSON *o = cJSON_AddObjectToObject(h, t->name);
        cJSON_AddStringToObject(o, "dtype", bf16 ? "BF16" : "F32");
        cJSON *s = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < nd; d++) {
            cJSON_AddItemToArray(s, cJSON_CreateNumber((double)shape[d]));
            numel *= (size_t)shape[d];
        }
        cJSON *dof = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(dof, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(dof, cJSON_CreateNumber((double)(off + numel * es)));
        off += numel * es;
    }
    char *text = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t hlen = strlen(text), padded = (hlen + 7) & ~(size_t)7; /* data 8-byte aligned: pad with spaces */
    char *hdr = dt_xmalloc(padded);
    memcpy(hdr, text, hlen);
    memset(hdr + hlen, ' ', padded - hlen);
    free(text);

    char tmp[4200];
    dt_status_t st = DT_STATUS_OK;
    float *scratch = NULL;
    uint16_t *half = NULL;
    int fd;
    /* The rename replaces path: only nothing or a regular file; the temporary is a
     * fresh name (never an existing file or a planted link). */
    DT_CHECK_GOTO(dt_fs_check_target(path, 0, "safetensors output"), st, out_free);
    DT_CHECK_GOTO(dt_fs_create_temp_beside(path, tmp, sizeof tmp, &fd), st, out_free);
    unsigned char len8[8];
    for (int b = 0; b < 8; b++) len8[b] = (unsigned char)((uint64_t)padded >> (8 * b));
    DT_CHECK_GOTO(write_all(fd, len8, 8, tmp), st, out_close);
    DT_CHECK_GOTO(write_all(fd, hdr, padded, tmp), st, out_close);
    for (int i = first; i < end; i++) {
        const dt_tensor_info *t = &l->tensors[i];
        const float *src = params + t->offset;
        int64_t shape[2] = {0, 0};
        int nd;
        if (l->spec.ops->export_shape(l, i, shape, &nd)) {
            int64_t rows = t->shape[0], cols = t->shape[1]; /* ours (out, in) -> (in, out) */
            scratch = dt_xrealloc(scratch, (size_t)(rows * cols) * sizeof(float));
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++) scratch[c * rows + r] = src[r * cols + c];
            DT_CHECK_GOTO(write_values(fd, scratch, (size_t)(rows * cols), bf16, &half, tmp), st, out_close);
        } else {
            size_t numel = 1;
            for (int d = 0; d < nd; d++) numel *= (size_t)shape[d];
            DT_CHECK_GOTO(write_values(fd, src, numel, bf16, &half, tmp), st, out_close);
        }
    }
    if (fsync(fd) != 0) st = dt_error(DT_STATUS_IO, "cannot fsync %s: %s", tmp, strerror(errno));
out_close:
    if (close(fd) != 0 && st == DT_STATUS_OK) st = dt_error(DT_STATUS_IO, "cannot close %s: %s", tmp, strerror(errno));
    if (st == DT_STATUS_OK && rename(tmp, path) != 0)
        st = dt_error(DT_STATUS_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st != DT_STATUS_OK) unlink(tmp);
    else if (bytes) *bytes = 8 + padded + off;
out_free:
    free(half);
    free(scratch);
    free(hdr);
    return st;
}
