/*
 * hf_export.c - a model as a Hugging Face directory (hf_export.h).
 */
#include "runtime/ckpt/hf_export.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs_safe.h"
#include "common/mem.h" /* defines: dt_xcalloc */
#include "runtime/ckpt/safetensors.h"
#include "runtime/model/hf_config.h" /* defines: dt_hf_config_json */

/* Writes text and a newline to dir/name atomically, through a fresh temporary name
 * (never an existing file or a planted link); only a regular file or nothing is
 * replaced. */
static dt_status_t write_text(const char *dir, const char *name, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    DT_CHECK(dt_fs_check_target(path, 0, "Hugging Face output"));
    return dt_fs_write_atomic(path, text, strlen(text), "\n", 1);
}

/* Bytes tensor i takes in the file. */
static uint64_t tensor_bytes(const dt_model_layout *l, int i, int bf16) {
    int64_t shape[2] = {0, 0};
    int nd;
    l->spec.ops->export_shape(l, i, shape, &nd);
    uint64_t n = 1;
    for (int d = 0; d < nd; d++) n *= (uint64_t)shape[d];
    return n * (bf16 ? 2 : 4);
}

dt_status_t dt_hf_export(const dt_model_layout *l, const float *params, const char *dir, const dt_hf_export_opts *o,
                         int *n_files, uint64_t *bytes) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return dt_error(DT_STATUS_IO, "cannot create %s: %s", dir, strerror(errno));
    DT_CHECK(dt_fs_check_target(dir, 1, "Hugging Face output")); /* a real directory, not a link to one */
    char *cfg = dt_hf_config_json(l, o->bf16 ? "bfloat16" : "float32");
    if (!cfg) return DT_STATUS_UNSUPPORTED; /* the detail is the config's */
    dt_status_t st = write_text(dir, "config.json", cfg);
    free(cfg);
    DT_CHECK(st);
    DT_CHECK(write_text(dir, "generation_config.json", "{\n  \"_from_model_config\": true\n}"));

    /* Shards: whole tensors in order; a new one when the next would pass the limit. */
    uint64_t max = o->max_shard_bytes ? o->max_shard_bytes : 5000000000ull, total = 0, cur = 0;
    int *start = dt_xcalloc((size_t)l->n_tensors + 1, sizeof *start), n = 0;
    for (int i = 0; i < l->n_tensors; i++) {
        uint64_t b = tensor_bytes(l, i, o->bf16);
        if (n == 0 || (cur > 0 && cur + b > max)) start[n++] = i, cur = 0;
        cur += b;
        total += b;
    }
    start[n] = l->n_tensors;
    char single[4200], index[4200], name[64], path[4200];
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(root, "metadata"), "total_size", (double)total);
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    for (int s = 0; s < n && st == DT_STATUS_OK; s++) {
        if (n == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        st = dt_safetensors_write_tensors(l, params, path, start[s], start[s + 1], o->bf16, NULL);
        for (int i = start[s]; i < start[s + 1]; i++) cJSON_AddStringToObject(map, l->tensors[i].name, name);
    }
    if (st == DT_STATUS_OK && n > 1) {
        char *text = cJSON_Print(root);
        st = write_text(dir, "model.safetensors.index.json", text);
        free(text);
        unlink(single); /* a file from an earlier export would win over the index */
    } else if (st == DT_STATUS_OK) {
        unlink(index);
    }
    cJSON_Delete(root);
    free(start);
    if (st == DT_STATUS_OK && n_files) *n_files = n;
    if (st == DT_STATUS_OK && bytes) *bytes = total;
    return st;
}
