/*
 * metrics.c - metrics.jsonl lines, atomic summary files, MFU peaks.
 */
#include "runtime/train/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/fs_safe.h"
#include "common/mem.h"
#include "common/gpuinfo.h" /* defines: dt_gpuinfo_peak_flops */
#include "runtime/tools/tfevents.h"

struct dt_metrics {
    char *dir;
    FILE *jsonl;
    dt_tfevents_writer_t *tb; /* NULL: no TensorBoard */
};

dt_status_t dt_metrics_open(const char *log_dir, int fresh, dt_metrics_t **out) {
    *out = NULL;
    DT_CHECK(dt_fs_mkdir_p(log_dir));
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", log_dir);
    /* Not a FIFO (open would block for a reader), a device nor a planted link:
     * refused at once. */
    int fd;
    if (dt_fs_open_regular(path, O_WRONLY | O_CREAT | O_NOFOLLOW | (fresh ? O_TRUNC : O_APPEND), 0644, &fd, NULL) != DT_STATUS_OK) {
        char detail[1024];
        snprintf(detail, sizeof detail, "%s", dt_error_detail());
        return dt_error(DT_STATUS_IO, "log.dir: %s", detail);
    }
    FILE *f = fdopen(fd, fresh ? "w" : "a");
    if (!f) {
        close(fd);
        return dt_error(DT_STATUS_IO, "cannot open %s: %s", path, strerror(errno));
    }
    dt_metrics_t *m = dt_xcalloc(1, sizeof *m);
    m->dir = dt_xstrdup(log_dir);
    m->jsonl = f;
    *out = m;
    return DT_STATUS_OK;
}

void dt_metrics_close(dt_metrics_t *m) {
    if (!m) return;
    if (m->jsonl) fclose(m->jsonl);
    dt_tfevents_close(m->tb);
    free(m->dir);
    free(m);
}

/* TensorBoard's group (the part of a tag before '/') of each metrics.jsonl key. */
static const struct {
    const char *key, *group;
} tb_groups[] = {
    {"loss", "train"},          {"lr", "train"},           {"grad_norm", "train"},
    {"world_size", "train"},    {"val_loss", "val"},       {"val_ppl", "val"},
    {"tokens_per_s", "speed"},  {"mfu", "speed"},          {"step_ms", "time"},
    {"compute_ms", "time"},     {"comm_ms", "time"},       {"data_ms", "time"},
    {"tp_comm_ms", "time"},     {"pp_bubble", "pipeline"}, {"pp_bubble_ideal", "pipeline"},
    {"pp_wait_ms", "pipeline"}, {"p2p_bytes", "pipeline"}, {"slowest_rank", "stragglers"},
    {"slowest_ms", "stragglers"}, {"median_ms", "stragglers"}, {"mem_peak_mb", "memory"},
};

static const char *tb_group(const char *key) {
    for (size_t i = 0; i < sizeof tb_groups / sizeof *tb_groups; i++)
        if (!strcmp(tb_groups[i].key, key)) return tb_groups[i].group;
    return "other";
}

dt_status_t dt_metrics_tensorboard(dt_metrics_t *m, const char *dir, int64_t start_step, const char *config_text) {
    DT_CHECK(dt_tfevents_open(dir, start_step + 1, &m->tb));
    if (!config_text) return DT_STATUS_OK;
    /* Markdown (the text plugin's): an indented code block keeps the JSON as it is */
    size_t n = strlen(config_text), lines = 1;
    for (size_t i = 0; i < n; i++) lines += config_text[i] == '\n';
    char *md = dt_xmalloc(n + 4 * lines + 1), *o = md;
    for (const char *p = config_text; *p;) {
        memcpy(o, "    ", 4), o += 4;
        while (*p && *p != '\n') *o++ = *p++;
        if (*p) *o++ = *p++;
    }
    *o = 0;
    dt_tfevents_begin(m->tb, start_step + 1);
    dt_tfevents_text(m->tb, "config", md);
    free(md);
    return dt_tfevents_end(m->tb);
}

/* The line's figures as the step's TensorBoard scalars: the same numbers, by construction. */
static dt_status_t tb_log(dt_metrics_t *m, int64_t step, const cJSON *o) {
    dt_tfevents_begin(m->tb, step);
    char tag[128];
    for (const cJSON *c = o->child; c; c = c->next) {
        if (!strcmp(c->string, "step")) continue;
        if (cJSON_IsNumber(c)) {
            snprintf(tag, sizeof tag, "%s/%s", tb_group(c->string), c->string);
            dt_tfevents_scalar(m->tb, tag, c->valuedouble);
        } else if (cJSON_IsArray(c)) { /* per-rank figures: one tag per rank */
            int r = 0;
            for (const cJSON *e = c->child; e; e = e->next, r++) {
                snprintf(tag, sizeof tag, "%s/rank_%d", c->string, r);
                if (cJSON_IsNumber(e)) dt_tfevents_scalar(m->tb, tag, e->valuedouble);
            }
        }
    }
    return dt_tfevents_end(m->tb);
}

/* cJSON prints NaN as null, which is what a reader of the file wants. */
dt_status_t dt_metrics_log(dt_metrics_t *m, const dt_step_metrics *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", (double)s->step);
    if (s->world_size > 0) cJSON_AddNumberToObject(o, "world_size", s->world_size);
    cJSON_AddNumberToObject(o, "loss", s->loss);
    cJSON_AddNumberToObject(o, "lr", s->lr);
    cJSON_AddNumberToObject(o, "tokens_per_s", s->tokens_per_s);
    cJSON_AddNumberToObject(o, "mfu", s->mfu);
    cJSON_AddNumberToObject(o, "step_ms", s->step_ms);
    cJSON_AddNumberToObject(o, "compute_ms", s->compute_ms);
    cJSON_AddNumberToObject(o, "comm_ms", s->comm_ms);
    if (!isnan(s->tp_comm_ms)) cJSON_AddNumberToObject(o, "tp_comm_ms", s->tp_comm_ms);
    if (!isnan(s->pp_bubble) && s->pp_bubble_ideal > 0) {
        cJSON_AddNumberToObject(o, "pp_bubble", s->pp_bubble);
        cJSON_AddNumberToObject(o, "pp_bubble_ideal", s->pp_bubble_ideal);
        cJSON_AddNumberToObject(o, "pp_wait_ms", s->pp_wait_ms);
        cJSON_AddNumberToObject(o, "p2p_bytes", s->p2p_bytes);
    }
    cJSON_AddNumberToObject(o, "data_ms", s->data_ms);
    if (s->have_ranks) {
        cJSON_AddNumberToObject(o, "slowest_rank", s->slowest_rank);
        cJSON_AddNumberToObject(o, "slowest_ms", s->slowest_ms);
        cJSON_AddNumberToObject(o, "median_ms", s->median_ms);
        if (s->rank_compute_ms && s->n_ranks > 1 && s->n_ranks <= DT_METRICS_MAX_RANK_COLUMNS)
            cJSON_AddItemToObject(o, "rank_compute_ms", cJSON_CreateDoubleArray(s->rank_compute_ms, s->n_ranks));
    }
    cJSON_AddNumberToObject(o, "grad_norm", s->grad_norm);
    if (s->mem_peak_mb > 0) cJSON_AddNumberToObject(o, "mem_peak_mb", s->mem_peak_mb);
    if (!isnan(s->val_loss)) {
        cJSON_AddNumberToObject(o, "val_loss", s->val_loss);
        cJSON_AddNumberToObject(o, "val_ppl", exp(s->val_loss));
    }
    char *text = cJSON_PrintUnformatted(o);
    dt_status_t st = DT_STATUS_OK;
    if (!text) st = dt_error(DT_STATUS_NOMEM, "metrics: cannot format a line");
    else if (fprintf(m->jsonl, "%s\n", text) < 0 || fflush(m->jsonl) != 0)
        st = dt_error(DT_STATUS_IO, "%s/metrics.jsonl: %s", m->dir, strerror(errno));
    if (st == DT_STATUS_OK && m->tb) st = tb_log(m, s->step, o);
    free(text);
    cJSON_Delete(o);
    return st;
}

dt_status_t dt_metrics_write_file(const char *log_dir, const char *name, const char *text) {
    DT_CHECK(dt_fs_mkdir_p(log_dir));
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", log_dir, name);
    return dt_fs_write_atomic(path, text, strlen(text), NULL, 0); /* never a planted name or link */
}

static void format_duration(double s, char *buf, size_t len) {
    if (s < 0) snprintf(buf, len, "?");
    else if (s < 60) snprintf(buf, len, "%.0fs", s);
    else if (s < 3600) snprintf(buf, len, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, len, "%dh%02dm", (int)s / 3600, (int)s / 60 % 60);
}

void dt_metrics_format(const dt_step_metrics *s, char *buf, size_t len) {
    char eta[32], mfu[64];
    format_duration(s->eta_s, eta, sizeof eta);
    /* over 100% can only mean the peak is wrong: never shown as if it were a measure */
    if (s->mfu > 1.0) snprintf(mfu, sizeof mfu, "MFU >100%% (the peak is an estimate)");
    else snprintf(mfu, sizeof mfu, "MFU %.1f%%", 100.0 * s->mfu);
    int n = snprintf(buf, len,
                     "step %lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %s | "
                     "%.1f ms (compute %.1f, comm %.1f, data %.1f) | ETA %s",
                     (long long)s->step, (long long)s->total_steps, s->loss, s->lr, s->grad_norm,
                     s->tokens_per_s, mfu, s->step_ms, s->compute_ms, s->comm_ms,
                     s->data_ms, eta);
    if (!isnan(s->val_loss) && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, " | val %.4f", s->val_loss);
}

/* The one GPU table is in common/gpuinfo.c, below the trainer and `dtrun plan`. */
double dt_peak_flops_gpu(const char *device_name) { return dt_gpuinfo_peak_flops(device_name); }
