/*
 * train_elastic.c - the trainer's side of an elastic run (rules in
 * train_elastic.h): the global batch kept across world sizes, the resize
 * request agreed at a checkpoint boundary, and the resize records.
 */
#include "runtime/train/train_elastic.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs_safe.h" /* defines: dt_fs_open_regular */
#include "common/fs.h"      /* defines: dt_fs_read_file */
#include "common/log.h"
#include "common/mem.h"
#include "runtime/ckpt/checkpoint.h" /* defines: dt_ckpt_candidates, dt_ckpt_open, dt_ckpt_meta */
#include "runtime/layout/layout.h"   /* defines: dt_layout_of */
#include "runtime/parallel/dp.h"     /* defines: dt_dp_all_gather_f64 */
#include "runtime/train/train_ckpt.h" /* defines: dt_train_resume */

static int resizing;

int dt_train_elastic_on(void) {
    const char *e = getenv("DTRUN_ELASTIC");
    return e && *e;
}

int dt_train_elastic_resizing(void) { return resizing; }

/* The checkpoint a resume would start from (checkpoint.resume auto: the best
 * candidate of checkpoint.dir; a path: that one), opened; NULL when none. */
static dt_ckpt_t *resume_source(const dt_config_t *cfg) {
    const char *mode = cfg->checkpoint.resume ? cfg->checkpoint.resume : "auto";
    if (!strcmp(mode, "never")) return NULL;
    dt_ckpt_t *c = NULL;
    if (strcmp(mode, "auto") != 0) {
        if (dt_ckpt_open(mode, &c) != DT_STATUS_OK) c = NULL;
    } else if (cfg->checkpoint.dir && *cfg->checkpoint.dir) {
        char **paths = NULL;
        int n = 0;
        if (dt_ckpt_candidates(cfg->checkpoint.dir, &paths, &n) == DT_STATUS_OK)
            for (int i = 0; i < n && !c; i++)
                if (dt_ckpt_open(paths[i], &c) != DT_STATUS_OK) c = NULL;
        dt_ckpt_free_list(paths, n);
    }
    dt_error_clear(); /* a missing or broken checkpoint is the resume's to report */
    return c;
}

/* The layout's DP size for world_size; 0 when the sizes do not divide it. */
static int64_t dp_of(const dt_config_t *cfg, int world_size) {
    dt_layout_dims dims = dt_layout_dims_of(cfg->tp.size, cfg->cp.size, cfg->pp.stages);
    dt_layout l;
    return dt_layout_of(&dims, world_size, 0, &l) == DT_STATUS_OK ? dt_layout_dp_size(&l) : 0;
}

dt_status_t dt_train_elastic_batch(dt_config_t *cfg, int world_size) {
    if (!dt_train_elastic_on()) return DT_STATUS_OK;
    int64_t dp = dp_of(cfg, world_size);
    if (dp < 1) return DT_STATUS_OK; /* dt_config_resolve names the bad split */
    int tb_given = dt_config_given(cfg, "train_batch_size"), mb_given = dt_config_given(cfg, "train_micro_batch_size_per_gpu");
    int64_t tb = tb_given ? cfg->train_batch_size : 0, mb = mb_given ? cfg->train_micro_batch_size_per_gpu : 0;
    const char *tb_from = "the config's train_batch_size";
    dt_ckpt_t *c = (!tb_given || !mb_given) ? resume_source(cfg) : NULL;
    if (!tb_given && c && dt_ckpt_meta_config_int(c, "train_batch_size")) {
        tb = dt_ckpt_meta_config_int(c, "train_batch_size");
        tb_from = "the run's train_batch_size (from the checkpoint's meta.json)";
    }
    if (!mb_given && c && dt_ckpt_meta_config_int(c, "train_micro_batch_size_per_gpu"))
        mb = dt_ckpt_meta_config_int(c, "train_micro_batch_size_per_gpu");
    if (c) dt_ckpt_close(c);
    /* A fresh run, or no micro-batch to keep: this round's identity sets the batch. */
    if (tb <= 0 || mb <= 0) return DT_STATUS_OK;
    if (tb % (mb * dp)) goto no_accum;
    int64_t ga = tb / (mb * dp);
    return dt_config_set_batch(cfg, tb, mb, ga);
no_accum:
    return dt_error(DT_STATUS_UNSUPPORTED,
                    "elastic resize to world size %d (%lld data-parallel ranks): no integer "
                    "gradient_accumulation_steps keeps the global batch: %s %lld is not a multiple of "
                    "train_micro_batch_size_per_gpu %lld x %lld data-parallel ranks = %lld (choose a "
                    "train_batch_size that every world size in --nnodes MIN:MAX divides)",
                    world_size, (long long)dp, tb_from, (long long)tb, (long long)mb, (long long)dp,
                    (long long)(mb * dp));
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

dt_status_t dt_train_elastic_check(const dt_config_t *cfg, int nnodes_min, int nnodes_max, int nproc_per_node,
                                   int64_t *pick) {
    *pick = 0;
    if (nnodes_min == nnodes_max) return DT_STATUS_OK;
    int64_t tb = dt_config_given(cfg, "train_batch_size") ? cfg->train_batch_size : 0;
    int64_t mb = dt_config_given(cfg, "train_micro_batch_size_per_gpu") ? cfg->train_micro_batch_size_per_gpu : 0;
    const char *tb_from = "train_batch_size";
    if (tb <= 0) { /* a resumed run keeps its own batch */
        dt_ckpt_t *c = resume_source(cfg);
        if (c && dt_ckpt_meta_config_int(c, "train_batch_size") > 0) {
            tb = dt_ckpt_meta_config_int(c, "train_batch_size");
            tb_from = "the run's train_batch_size (from the checkpoint a resume starts from)";
            if (mb <= 0) mb = dt_ckpt_meta_config_int(c, "train_micro_batch_size_per_gpu");
        }
        if (c) dt_ckpt_close(c);
    }
    if (tb <= 0) { /* a fresh run: the smallest batch every size keeps */
        int64_t m = cfg->train_micro_batch_size_per_gpu > 0 ? cfg->train_micro_batch_size_per_gpu : 1;
        int64_t ga = cfg->gradient_accumulation_steps > 0 ? cfg->gradient_accumulation_steps : 1;
        int64_t lcm = 1, dp_min = 0;
        for (int n = nnodes_min; n <= nnodes_max; n++) {
            int64_t dp = dp_of(cfg, n * nproc_per_node);
            if (dp < 1) continue; /* the split's own error comes at resolve */
            if (!dp_min || dp < dp_min) dp_min = dp;
            lcm = lcm / gcd64(lcm, dp) * dp;
            if (lcm > (int64_t)1 << 30)
                return dt_error(DT_STATUS_CONFIG, "--nnodes %d:%d: the data-parallel sizes of %d to %d nodes have no "
                                "common batch under 2^30 samples: give train_batch_size", nnodes_min, nnodes_max,
                                nnodes_min, nnodes_max);
        }
        if (!dp_min) return DT_STATUS_OK;
        int64_t unit = m * lcm, want = m * ga * dp_min;
        *pick = (want + unit - 1) / unit * unit;
        return DT_STATUS_OK;
    }
    char bad[512] = "";
    size_t o = 0;
    for (int n = nnodes_min; n <= nnodes_max; n++) {
        int64_t dp = dp_of(cfg, n * nproc_per_node);
        if (dp < 1) continue; /* the split's own error comes at resolve */
        int64_t m = mb > 0 ? mb : 0;
        int ok = m > 0 ? tb % (m * dp) == 0 : tb % dp == 0;
        if (!ok && o < sizeof bad - 64)
            o += (size_t)snprintf(bad + o, sizeof bad - o, "%s%d node(s) = world size %d (%lld x %lld)", o ? ", " : "",
                                  n, n * nproc_per_node, (long long)(m > 0 ? m : 1), (long long)dp);
    }
    if (!o) return DT_STATUS_OK;
    return dt_error(DT_STATUS_CONFIG,
                    "%s %lld with --nnodes %d:%d: an elastic run keeps the global batch at every size, "
                    "but no integer gradient_accumulation_steps gives it at %s (micro-batch x data-parallel ranks "
                    "must divide train_batch_size)",
                    tb_from, (long long)tb, nnodes_min, nnodes_max, bad);
}

dt_status_t dt_train_elastic_poll(const dt_config_t *cfg, int rank, dt_dp_t *dp, const dt_train_resume *r,
                                  int64_t step, int *resize) {
    *resize = 0;
    int64_t every = cfg->checkpoint.every_steps;
    /* Every rank enters the gather at every boundary (whether its own save worked
     * or not: a failed periodic save is only logged), so the collectives stay in
     * step; the group resizes when a node waits and every rank saved this step. */
    if (!dt_train_elastic_on() || every <= 0 || step % every != 0 || step >= cfg->train_steps)
        return DT_STATUS_OK;
    const char *flag = getenv("DTRUN_RESIZE_FILE");
    double mine[2] = {flag && *flag && access(flag, F_OK) == 0, r->saved_step == step};
    int n = dt_dp_world_size(dp), want = mine[0] > 0, saved = mine[1] > 0;
    if (n > 1) { /* the same decision on every rank: any rank's flag, every rank's save */
        double *all = dt_xcalloc((size_t)n * 2, sizeof *all);
        dt_status_t st = dt_dp_all_gather_f64(dp, mine, 2, all);
        for (int r = 0; r < n; r++) {
            if (all[2 * r] > 0) want = 1;
            if (!(all[2 * r + 1] > 0)) saved = 0;
        }
        free(all);
        DT_CHECK(st);
    }
    if (want && !saved && rank == 0)
        DT_LOG_WARN("elastic: a node waits to join, but the checkpoint of step %lld is not complete on every rank: "
                    "the resize waits for the next one", (long long)step);
    *resize = resizing = want && saved;
    if (*resize && rank == 0) {
        printf("dtrun: elastic resize: a node waits to join; stopped after step %lld (checkpoint saved), "
               "the group re-rendezvous\n", (long long)step);
        fflush(stdout);
    }
    return DT_STATUS_OK;
}

/* ---- progress: the last step done, for the steps a resize lost ---------------- */

static int progress_fd = -2; /* -2: not opened yet; -1: none */

static void progress_path(char *out, size_t len) {
    const char *d = getenv("DTRUN_RUN_DIR"); /* the agent's, kept across its rounds */
    snprintf(out, len, "%s/progress", d && *d ? d : "");
}

void dt_train_elastic_progress(int local_rank, int64_t step) {
    if (progress_fd == -2) {
        progress_fd = -1;
        const char *d = getenv("DTRUN_RUN_DIR");
        char path[4200];
        progress_path(path, sizeof path);
        if (local_rank == 0 && dt_train_elastic_on() && d && *d &&
            dt_fs_open_regular(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600, &progress_fd, NULL) !=
                DT_STATUS_OK) {
            DT_LOG_WARN("elastic: cannot record the steps done (the steps a resize loses are counted from the "
                        "logged ones): %s", dt_error_detail());
            progress_fd = -1;
        }
    }
    if (progress_fd < 0) return;
    char b[32];
    int n = snprintf(b, sizeof b, "%020lld\n", (long long)step);
    if (pwrite(progress_fd, b, (size_t)n, 0) != n) { /* a full disk: the logged steps count instead */
        close(progress_fd);
        progress_fd = -1;
    }
}

/* The last step the previous round of this agent's workers finished (0: unknown). */
static int64_t last_done(void) {
    char path[4200], *text = NULL;
    progress_path(path, sizeof path);
    int64_t v = 0;
    if (path[0] != '/' || dt_fs_read_file(path, 64, &text, NULL) != DT_STATUS_OK) {
        dt_error_clear();
        return 0;
    }
    v = strtoll(text, NULL, 10);
    free(text);
    return v > 0 ? v : 0;
}

void dt_train_elastic_note_resume(const dt_train_resume *r, const dt_config_t *cfg, int rank, int world_size,
                                  int restart_count, int accum, const char *log_dir, int64_t last_logged) {
    if (rank != 0) return;
    char path[4200];
    snprintf(path, sizeof path, "%s/resizes.jsonl", log_dir);
    if (r->start_step == 0) {
        if (unlink(path) != 0 && errno != ENOENT) DT_LOG_WARN("cannot remove %s: %s", path, strerror(errno));
        return;
    }
    if (!dt_train_elastic_on()) return;
    int old_ws = r->resumed_world_size;
    int64_t old_accum = r->resumed_accumulation;
    if (!old_ws || old_ws == world_size) return;
    /* the last step done before the resize: this node's record of it (every step, not
     * only the logged ones), else the newest one metrics.jsonl held */
    int64_t done = last_done(), last = done > last_logged ? done : last_logged;
    int64_t lost = last > r->start_step ? last - r->start_step : 0;
    printf("dtrun: elastic resize: world size %d -> %d, gradient accumulation %lld -> %d (global batch %lld kept), "
           "resumed from the checkpoint of step %lld, %lld step(s) lost\n",
           old_ws, world_size, (long long)old_accum, accum, (long long)cfg->train_batch_size,
           (long long)r->start_step, (long long)lost);
    fflush(stdout);
    int fd; /* never through a planted link, nor blocked on a FIFO */
    if (dt_fs_open_regular(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0644, &fd, NULL) != DT_STATUS_OK) {
        DT_LOG_WARN("cannot record the resize: %s", dt_error_detail());
        return;
    }
    FILE *f = fdopen(fd, "a");
    if (!f) {
        DT_LOG_WARN("cannot record the resize in %s: %s", path, strerror(errno));
        close(fd);
        return;
    }
    fprintf(f,
            "{\"from_world_size\": %d, \"to_world_size\": %d, \"from_accumulation\": %lld, \"to_accumulation\": %d, "
            "\"train_batch_size\": %lld, \"resumed_step\": %lld, \"steps_lost\": %lld, \"restart_count\": %d}\n",
            old_ws, world_size, (long long)old_accum, accum, (long long)cfg->train_batch_size,
            (long long)r->start_step, (long long)lost, restart_count);
    if (fclose(f) != 0) DT_LOG_WARN("cannot record the resize in %s: %s", path, strerror(errno));
}

void dt_train_elastic_summary(const char *log_dir, cJSON *summary) {
    cJSON *list = cJSON_AddArrayToObject(summary, "resizes");
    char path[4200];
    snprintf(path, sizeof path, "%s/resizes.jsonl", log_dir);
    int fd;
    if (dt_fs_open_regular(path, O_RDONLY, 0, &fd, NULL) != DT_STATUS_OK) return;
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return;
    }
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        cJSON *o = cJSON_Parse(line);
        if (o) cJSON_AddItemToArray(list, o);
    }
    free(line);
    fclose(f);
}

/* ---- preemption: what a stop by signal left, for the batch script ------------- */

void dt_train_preempt_record(int64_t step, int saved) {
    const char *d = getenv("DTRUN_RUN_DIR");
    if (!d || !*d) return;
    char path[4200], b[96];
    snprintf(path, sizeof path, "%s/preempted", d);
    int n = snprintf(b, sizeof b, "step %lld checkpoint %s\n", (long long)step, saved ? "saved" : "none");
    if (dt_fs_write_atomic(path, b, (size_t)n, NULL, 0) != DT_STATUS_OK)
        DT_LOG_WARN("cannot record the preemption in %s: %s", path, dt_error_detail());
}
