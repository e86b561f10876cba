/*
 * hf_export.c - a model as a Hugging Face directory (hf_export.h). The folder is
 * written whole into a sibling staging folder and then swapped in by a rename, so
 * an earlier export stays loadable until the new one is complete.
 */
#define _GNU_SOURCE /* renameat2 */
#include "runtime/ckpt/hf_export.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h" /* defines: dt_fs_rm_rf */
#include "common/fs_safe.h"
#include "common/log.h" /* defines: DT_LOG_WARN */
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

/* Every file of the export, into the empty folder dir. */
static dt_status_t write_export(const dt_model_layout *l, const float *params, const char *dir,
                                const dt_hf_export_opts *o, int *n_files, uint64_t *bytes) {
    char *cfg = dt_hf_config_json(l, o->bf16 ? "bfloat16" : "float32");
    if (!cfg) return DT_STATUS_UNSUPPORTED; /* the detail is the config's */
    dt_status_t st = write_text(dir, "config.json", cfg);
    free(cfg);
    DT_CHECK(st);
    DT_CHECK(write_text(dir, "generation_config.json", "{\n  \"_from_model_config\": true\n}"));
    const char *pause = getenv("DTRUN_TEST_EXPORT_PAUSE"); /* a test facility: inert unless set */
    if (pause && atoi(pause) > 0) sleep((unsigned)atoi(pause)); /* a kill mid-export, in a test */

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
    char name[64], path[4200];
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
    }
    cJSON_Delete(root);
    free(start);
    if (st == DT_STATUS_OK && n_files) *n_files = n;
    if (st == DT_STATUS_OK && bytes) *bytes = total;
    return st;
}

/* The files an export writes: a new export replaces them all (an old shard or index
 * left beside new weights would be read instead of them). */
static int is_export_file(const char *name) {
    if (!strcmp(name, "config.json") || !strcmp(name, "generation_config.json") ||
        !strcmp(name, "model.safetensors") || !strcmp(name, "model.safetensors.index.json"))
        return 1;
    int a, b, n = 0;
    return sscanf(name, "model-%5d-of-%5d.safetensors%n", &a, &b, &n) == 2 && name[n] == '\0';
}

/* The user's own files of the old export (a tokenizer, a README): hard-linked into
 * the new one, so the old folder stays whole until the swap; a subfolder is moved. */
static dt_status_t carry_over(const char *old, const char *stage) {
    DIR *d = opendir(old);
    if (!d) return dt_error(DT_STATUS_IO, "cannot read %s: %s", old, strerror(errno));
    dt_status_t st = DT_STATUS_OK;
    for (struct dirent *e; st == DT_STATUS_OK && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || is_export_file(e->d_name)) continue;
        char from[PATH_MAX + 300], to[PATH_MAX + 300];
        snprintf(from, sizeof from, "%s/%s", old, e->d_name);
        snprintf(to, sizeof to, "%s/%s", stage, e->d_name);
        struct stat sb;
        if (lstat(from, &sb) != 0) continue;
        int bad = S_ISDIR(sb.st_mode) ? rename(from, to) : linkat(AT_FDCWD, from, AT_FDCWD, to, 0);
        if (bad) st = dt_error(DT_STATUS_IO, "cannot carry %s into the new export: %s", from, strerror(errno));
    }
    closedir(d);
    return st;
}

dt_status_t dt_hf_export(const dt_model_layout *l, const float *params, const char *dir, const dt_hf_export_opts *o,
                         int *n_files, uint64_t *bytes) {
    DT_CHECK(dt_fs_check_target(dir, 1, "Hugging Face output")); /* a real directory or nothing, never a link */
    char target[PATH_MAX], stage[PATH_MAX + 32];
    struct stat sb;
    int existed = lstat(dir, &sb) == 0;
    if (existed && !realpath(dir, target)) /* "out/", ".": the folder itself, by its full name */
        return dt_error(DT_STATUS_IO, "cannot resolve %s: %s", dir, strerror(errno));
    if (!existed && snprintf(target, sizeof target, "%s", dir) >= (int)sizeof target)
        return dt_error(DT_STATUS_INVALID, "path too long: %s", dir);
    for (size_t n = strlen(target); n > 1 && target[n - 1] == '/'; n--) target[n - 1] = '\0';
    if (!strcmp(target, "/")) return dt_error(DT_STATUS_INVALID, "Hugging Face output: refusing to replace /");
    snprintf(stage, sizeof stage, "%s.tmp.XXXXXX", target);
    if (!mkdtemp(stage)) return dt_error(DT_STATUS_IO, "cannot create a staging folder beside %s: %s", target, strerror(errno));
    chmod(stage, 0755); /* mkdtemp makes 0700; an export is for others to read */
    dt_status_t st = write_export(l, params, stage, o, n_files, bytes);
    if (st == DT_STATUS_OK && existed) st = carry_over(target, stage);
    if (st == DT_STATUS_OK && existed) {
        /* One atomic exchange where the filesystem has it; else two renames, with
         * the old folder gone only for that instant. */
        if (renameat2(AT_FDCWD, stage, AT_FDCWD, target, RENAME_EXCHANGE) != 0) {
            char old[PATH_MAX + 32];
            snprintf(old, sizeof old, "%s.old.XXXXXX", target);
            if (!mkdtemp(old) || rmdir(old) != 0 || rename(target, old) != 0)
                st = dt_error(DT_STATUS_IO, "cannot move %s aside: %s", target, strerror(errno));
            else if (rename(stage, target) != 0) {
                st = dt_error(DT_STATUS_IO, "cannot move the new export to %s: %s", target, strerror(errno));
                rename(old, target); /* the old one back */
            } else {
                snprintf(stage, sizeof stage, "%s", old);
            }
        }
    } else if (st == DT_STATUS_OK && rename(stage, target) != 0) {
        st = dt_error(DT_STATUS_IO, "cannot move the new export to %s: %s", target, strerror(errno));
    } else if (st == DT_STATUS_OK) {
        return st;
    }
    /* stage now holds the old export (after a swap) or the failed new one */
    char detail[2048];
    snprintf(detail, sizeof detail, "%s", st == DT_STATUS_OK ? "" : dt_error_detail());
    if (dt_fs_rm_rf(stage) != DT_STATUS_OK) DT_LOG_WARN("could not remove %s: %s", stage, dt_error_detail());
    if (st != DT_STATUS_OK) dt_error(st, "%s (%s is unchanged)", detail, target);
    return st;
}
