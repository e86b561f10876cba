/*
 * train_spec.c - the config read as the workers will read it (train_spec.h): data.train's
 * sources and the model spec, its vocabulary taken from the data when the config has none.
 */
#include "runtime/train/train_spec.h"
#include <stdio.h>
#include <string.h>

int dt_trainer_sources_(const dt_config_t *cfg, dt_data_source *out) {
    if (cfg->data.n_sources == 0) {
        out[0] = (dt_data_source){.path = cfg->data.train, .weight = 1.0};
        return 1;
    }
    for (int i = 0; i < cfg->data.n_sources && i < DT_DATA_MAX_SOURCES; i++)
        out[i] = (dt_data_source){.path = cfg->data.sources[i].path, .weight = cfg->data.sources[i].weight};
    return cfg->data.n_sources;
}

/* model.vocab_size 0: the largest vocabulary the shards' headers record (dtrun
 * tokenize writes its tokenizer's), else the kind's default; uint32 shards without
 * one have none: dt_data_open asks for model.vocab_size. */
dt_status_t dt_trainer_spec_(const dt_config_t *cfg, dt_model_spec *spec) {
    dt_model_spec_copy(&cfg->model, spec);
    if (spec->ops->data == DT_MODEL_DATA_TOKENS && spec->vocab_size == 0) {
        dt_data_source src[DT_DATA_MAX_SOURCES] = {{0}};
        int n = dt_trainer_sources_(cfg, src);
        dt_data_kind_t kind;
        int width, recorded = 0;
        DT_CHECK(dt_data_detect_width(src[0].path, &kind, &width));
        for (int i = 0; i < n; i++) {
            int v;
            DT_CHECK(dt_data_header_vocab(src[i].path, &v, NULL, 0));
            if (v > recorded) recorded = v;
        }
        if (recorded > 0) spec->vocab_size = recorded;
        else if (width != 4) spec->vocab_size = dt_data_default_vocab(kind);
    }
    return DT_STATUS_OK;
}

dt_status_t dt_trainer_tb_dir_(const dt_config_t *cfg, char *out, size_t len) {
    const char *job = cfg->tensorboard.job_name ? cfg->tensorboard.job_name : "tensorboard";
    if (!*job || !strcmp(job, ".") || !strcmp(job, "..") || strchr(job, '/'))
        return dt_error(DT_STATUS_CONFIG, "tensorboard.job_name: \"%s\" is not one folder name", job);
    const char *base = cfg->tensorboard.output_path && *cfg->tensorboard.output_path ? cfg->tensorboard.output_path
                       : cfg->log.dir                                                 ? cfg->log.dir
                                                                                      : "runs/latest";
    if ((size_t)snprintf(out, len, "%s/%s", base, job) >= len)
        return dt_error(DT_STATUS_CONFIG, "tensorboard.output_path: the folder name is too long");
    return DT_STATUS_OK;
}
