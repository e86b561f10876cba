/*
 * train_check.c - what the launcher checks before any worker starts, with the
 * functions the workers themselves will use (the data loader's, the checkpoint
 * reader's, the weight reader's), so that a wrong path, an unusable file or a
 * vocabulary the data cannot have is exit 2 at once instead of a failed rank.
 * Paths are printed with their control characters escaped (dt_fs_printable).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h" /* defines: dt_fs_printable, dt_fs_kind_name */
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/hf_weights.h"
#include "runtime/train/train_lora.h" /* defines: dt_train_lora_check_, dt_train_lora_spec_ */
#include "runtime/train/train_spec.h" /* defines: dt_trainer_sources_, dt_trainer_spec_ */
#include "runtime/train/trainer.h"

/* A check's failure as a config error (exit 2), keeping the detail. */
static dt_status_t config_error(dt_status_t st) {
    if (st == DT_STATUS_OK) return st;
    char why[1024];
    snprintf(why, sizeof why, "%s", dt_error_detail());
    return dt_error(DT_STATUS_CONFIG, "%s", why);
}

/* Shards whose header records a larger vocabulary (the tokenizer's) than the model's:
 * refused before any id is read, naming both numbers and the file. */
static dt_status_t check_header_vocab(const char *key, const char *pattern, int model_vocab) {
    int recorded;
    char file[1024], shown[1024];
    if (dt_data_header_vocab(pattern, &recorded, file, sizeof file) != DT_STATUS_OK) return config_error(DT_STATUS_CONFIG);
    if (recorded <= model_vocab) return DT_STATUS_OK;
    return dt_error(DT_STATUS_CONFIG,
                    "%s: '%s' was tokenized with a vocabulary of %d ids (its header) but model.vocab_size is %d: "
                    "set model.vocab_size=%d, or 0 to take it from the data",
                    key, dt_fs_printable(file, shown, sizeof shown), recorded, model_vocab, recorded);
}

dt_status_t dt_trainer_check_data(const dt_config_t *cfg) {
    DT_CHECK(dt_train_lora_check_(cfg));
    if (cfg->model.ops->data != DT_MODEL_DATA_TOKENS) return DT_STATUS_OK;
    dt_data_source src[DT_DATA_MAX_SOURCES];
    int n = dt_trainer_sources_(cfg, src);
    dt_data_kind_t first = DT_DATA_TEXT;
    for (int i = 0; i < n; i++) {
        char key[48];
        if (cfg->data.n_sources) snprintf(key, sizeof key, "data.train[%d]", i);
        else snprintf(key, sizeof key, "data.train");
        dt_data_kind_t kind;
        int width;
        if (dt_data_detect_width(src[i].path, &kind, &width) != DT_STATUS_OK) {
            char why[1024];
            snprintf(why, sizeof why, "%s", dt_error_detail());
            return dt_error(DT_STATUS_CONFIG, "%s: %s", key, why);
        }
        if (i == 0) first = kind;
        else if (kind != first)
            return dt_error(DT_STATUS_CONFIG, "data.train: the sources must be the same kind: '%s' is %s but '%s' is %s",
                            src[0].path, first == DT_DATA_TEXT ? "text" : "token shards", src[i].path,
                            kind == DT_DATA_TEXT ? "text" : "token shards");
        int recorded = 0;
        if (width == 4 && cfg->model.vocab_size == 0 && !cfg->model_pretrained &&
            dt_data_header_vocab(src[i].path, &recorded, NULL, 0) == DT_STATUS_OK && recorded == 0)
            return dt_error(DT_STATUS_CONFIG,
                            "%s: '%s' holds uint32 token shards (llm.c version 7): set model.vocab_size to the "
                            "tokenizer's vocabulary size (it cannot be guessed from the data)",
                            key, src[i].path);
    }
    if (cfg->data.val) {
        dt_data_kind_t kind;
        if (dt_data_detect(cfg->data.val, &kind) != DT_STATUS_OK) {
            char why[1024];
            snprintf(why, sizeof why, "%s", dt_error_detail());
            return dt_error(DT_STATUS_CONFIG, "data.val: %s", why);
        }
    }
    { /* the loader's own checks of every file, with the vocabulary the workers will use */
        dt_model_spec spec;
        DT_CHECK(dt_trainer_spec_(cfg, &spec));
        for (int i = 0; i < n; i++) {
            char key[48];
            if (cfg->data.n_sources) snprintf(key, sizeof key, "data.train[%d]", i);
            else snprintf(key, sizeof key, "data.train");
            DT_CHECK(check_header_vocab(key, src[i].path, spec.vocab_size));
            double vf = cfg->data.val && *cfg->data.val ? 0 : cfg->data.val_fraction;
            DT_CHECK(config_error(dt_data_check_files(key, src[i].path, spec.seq_len, spec.vocab_size, vf)));
        }
        if (cfg->data.val) DT_CHECK(check_header_vocab("data.val", cfg->data.val, spec.vocab_size));
        if (cfg->data.val)
            DT_CHECK(config_error(dt_data_check_files("data.val", cfg->data.val, spec.seq_len, spec.vocab_size, -1)));
    }
    if (cfg->tp.size > 1 && cfg->model.vocab_size == 0) {
        /* the vocabulary the workers will take from the data (dt_trainer_spec_) must divide
         * among the TP ranks once padded (the config's load checked a given one) */
        dt_model_spec spec;
        char msg[512];
        DT_CHECK(dt_trainer_spec_(cfg, &spec));
        if (dt_config_tp_check_vocab(cfg, spec.vocab_size, msg, sizeof msg))
            return dt_error(DT_STATUS_CONFIG, "%s (model.vocab_size is %d, from the %s in '%s')", msg, spec.vocab_size,
                            first == DT_DATA_TEXT ? "text (bytes)" : "token shards", src[0].path);
    }
    if (cfg->pp.stages > 1) { /* the blocks cut into pipeline.stages x virtual_stages chunks of at least one */
        dt_model_spec spec;
        dt_model_layout whole;
        DT_CHECK(dt_trainer_spec_(cfg, &spec));
        DT_CHECK(config_error(dt_model_layout_init(&spec, &whole)));
        int n = (int)(cfg->pp.stages * cfg->pp.virtual_stages);
        int *bounds = calloc((size_t)n + 1, sizeof *bounds);
        dt_status_t st = bounds ? dt_model_pp_partition(&whole, (int)cfg->pp.stages, (int)cfg->pp.virtual_stages,
                                                        cfg->pp.partition, bounds)
                                : DT_STATUS_NOMEM;
        free(bounds);
        dt_model_layout_free(&whole);
        DT_CHECK(config_error(st));
    }
    return DT_STATUS_OK;
}

dt_status_t dt_trainer_check_pretrained(const dt_config_t *cfg) {
    if (!cfg->model_pretrained) return DT_STATUS_OK;
    dt_model_spec spec;
    dt_model_layout l;
    dt_hf_weights_t *w;
    DT_CHECK(dt_trainer_spec_(cfg, &spec));
    DT_CHECK(dt_model_layout_init(&spec, &l));
    dt_status_t st = dt_hf_weights_open(cfg->model_pretrained, &l, &w);
    dt_hf_weights_close(w);
    dt_model_layout_free(&l);
    return st;
}

/* dir will be creatable and writable: its nearest existing ancestor (itself when it
 * exists) is a directory this process can create a directory in (one is made and
 * removed at once). dir itself is not created (the check also runs for --print_config). */
static dt_status_t check_writable_dir(const char *key, const char *dir) {
    char p[PATH_MAX], shown[512];
    dt_fs_printable(dir, shown, sizeof shown);
    if (!*dir) return dt_error(DT_STATUS_CONFIG, "%s: expected a directory, found an empty path", key);
    if (strlen(dir) >= sizeof p) return dt_error(DT_STATUS_CONFIG, "%s: the path is too long", key);
    snprintf(p, sizeof p, "%s", dir);
    for (;;) {
        struct stat sb;
        if (stat(p, &sb) == 0) {
            char at[512];
            dt_fs_printable(p, at, sizeof at);
            if (!S_ISDIR(sb.st_mode))
                return dt_error(DT_STATUS_CONFIG, "%s: %s cannot be created: %s is %s, not a directory", key, shown,
                                at, dt_fs_kind_name(sb.st_mode));
            /* what the workers will do there, tried: access() says yes to root even
             * on a read-only filesystem or /proc */
            char probe[PATH_MAX + 32];
            snprintf(probe, sizeof probe, "%s/.dtrun-check-XXXXXX", p);
            if (!mkdtemp(probe))
                return dt_error(DT_STATUS_CONFIG, "%s: %s cannot be written%s%s%s: %s", key, shown,
                                strcmp(p, dir) ? " (in " : "", strcmp(p, dir) ? at : "", strcmp(p, dir) ? ")" : "",
                                strerror(errno));
            rmdir(probe);
            return DT_STATUS_OK;
        }
        if (errno != ENOENT)
            return dt_error(DT_STATUS_CONFIG, "%s: %s: %s", key, shown, strerror(errno));
        char *slash = strrchr(p, '/');
        while (slash && slash > p && slash[1] == '\0') { /* "a/b/" -> "a/b" */
            *slash = '\0';
            slash = strrchr(p, '/');
        }
        if (!slash) snprintf(p, sizeof p, ".");
        else if (slash == p) p[1] = '\0'; /* "/x" -> "/" */
        else *slash = '\0';
    }
}

dt_status_t dt_trainer_check_paths(const dt_config_t *cfg) {
    DT_CHECK(check_writable_dir("log.dir", cfg->log.dir ? cfg->log.dir : "runs/latest"));
    if (cfg->tensorboard.enabled) {
        char tb[4096];
        DT_CHECK(dt_trainer_tb_dir_(cfg, tb, sizeof tb));
        DT_CHECK(check_writable_dir(cfg->tensorboard.output_path && *cfg->tensorboard.output_path
                                        ? "tensorboard.output_path"
                                        : "tensorboard (in log.dir)",
                                    tb));
    }
    /* the first save comes after training has run for every_steps: an unwritable
     * folder found then costs the whole run */
    if (cfg->checkpoint.every_steps > 0 && cfg->checkpoint.dir && *cfg->checkpoint.dir)
        DT_CHECK(check_writable_dir("checkpoint.dir", cfg->checkpoint.dir));
    const char *mode = cfg->checkpoint.resume;
    if (!mode || !strcmp(mode, "auto") || !strcmp(mode, "never")) return DT_STATUS_OK;
    /* a checkpoint named by path: the one the workers' reader will open, for this model */
    dt_ckpt_t *c = NULL;
    dt_model_spec spec;
    dt_model_layout l;
    dt_status_t st = dt_ckpt_open(mode, &c);
    if (st == DT_STATUS_OK) st = dt_trainer_spec_(cfg, &spec);
    if (st == DT_STATUS_OK && (st = dt_model_layout_init(&spec, &l)) == DT_STATUS_OK) {
        if (cfg->lora.r > 0) { /* a LoRA run's checkpoint holds the adapters */
            dt_lora_spec ls;
            dt_lora_t lora;
            dt_model_layout adapters;
            dt_dtype_t compute = dt_config_compute_dtype(cfg, cfg->device != DT_CONFIG_DEVICE_CPU);
            st = dt_train_lora_spec_(cfg, compute, &ls);
            if (st == DT_STATUS_OK) st = dt_lora_init(&l, &ls, compute, &lora, &adapters);
            if (st == DT_STATUS_OK) {
                st = dt_ckpt_check_layout(c, &adapters);
                dt_lora_free(&lora);
                dt_model_layout_free(&adapters);
            }
        } else {
            st = dt_ckpt_check_layout(c, &l);
        }
        dt_model_layout_free(&l);
    }
    dt_ckpt_close(c);
    if (st != DT_STATUS_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dt_error_detail());
        return dt_error(DT_STATUS_CONFIG, "checkpoint.resume: %s", why);
    }
    return DT_STATUS_OK;
}
