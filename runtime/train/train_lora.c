/*
 * train_lora.c - the trainer's LoRA (train_lora.h; runtime/model/lora.h): the config's
 * lora section as a spec, its checks before workers start, and the set-up that makes
 * the trained layout the adapters' (the base frozen in its own buffers, read from
 * model.pretrained), with the adapters' initial values from PEFT's initialisation
 * or from a PEFT adapter (lora.init); its bytes in summary.json.
 */
#include "runtime/train/train_lora.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h" /* defines: DT_LOG_INFO */
#include "runtime/ckpt/safetensors.h" /* defines: dt_st_open, dt_st_find, dt_st_read_f32 */
#include "runtime/model/lora_config.h" /* defines: dt_lora_peft_config_read */
#include "runtime/train/train_spec.h"

/* The PEFT adapter file lora.init names: the path, or DIR/adapter_model.safetensors. */
static void adapter_file(const char *path, char *out, size_t len) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(out, len, "%s/adapter_model.safetensors", path);
    else snprintf(out, len, "%s", path);
}

dt_status_t dt_train_lora_spec_(const dt_config_t *cfg, dt_dtype_t compute, dt_lora_spec *out) {
    memset(out, 0, sizeof *out);
    out->r = (int)cfg->lora.r;
    out->alpha = cfg->lora.alpha;
    DT_CHECK(dt_lora_parse_targets(out, cfg->lora.target_modules));
    switch (cfg->lora.base_dtype) {
    case DT_CONFIG_LORA_BASE_INT8: out->base = DT_LORA_BASE_INT8; break;
    case DT_CONFIG_LORA_BASE_FP32:
    case DT_CONFIG_LORA_BASE_BF16: {
        dt_dtype_t want = cfg->lora.base_dtype == DT_CONFIG_LORA_BASE_FP32 ? DT_DTYPE_F32 : DT_DTYPE_BF16;
        if (want != compute)
            return dt_error(DT_STATUS_CONFIG, "lora.base_dtype: %s is not the compute dtype (%s): use int8, auto or %s",
                            dt_dtype_name(want), dt_dtype_name(compute), compute == DT_DTYPE_F32 ? "fp32" : "bf16");
    } /* fall through */
    default: out->base = DT_LORA_BASE_COMPUTE; break;
    }
    return DT_STATUS_OK;
}

dt_status_t dt_train_lora_check_(const dt_config_t *cfg) {
    if (cfg->lora.r == 0) return DT_STATUS_OK;
    if (!cfg->model_pretrained)
        return dt_error(DT_STATUS_CONFIG, "lora.r: LoRA fine-tunes a pretrained model: set model.pretrained (a Hugging "
                        "Face directory, the frozen base)");
    if (cfg->lora.dropout != 0)
        return dt_error(DT_STATUS_CONFIG, "lora.dropout: only 0 is implemented, found %g", cfg->lora.dropout);
    if (cfg->tp.size > 1 || cfg->pp.stages > 1)
        return dt_error(DT_STATUS_CONFIG, "lora.r: LoRA runs with data parallelism only (tensor_parallel.size and "
                        "pipeline.stages must be 1)");
    dt_lora_spec ls;
    /* the compute dtype the worker will use: bf16 only on cuda with bf16.enabled */
    dt_dtype_t compute = dt_config_compute_dtype(cfg, cfg->device != DT_CONFIG_DEVICE_CPU);
    DT_CHECK(dt_train_lora_spec_(cfg, compute, &ls));
    dt_model_spec spec;
    dt_model_layout base, adapters;
    dt_lora_t lora;
    DT_CHECK(dt_trainer_spec_(cfg, &spec));
    DT_CHECK(dt_model_layout_init(&spec, &base));
    dt_status_t st0 = dt_lora_init(&base, &ls, compute, &lora, &adapters);
    if (st0 != DT_STATUS_OK) {
        dt_model_layout_free(&base);
        return st0;
    }
    dt_status_t st = DT_STATUS_OK;
    if (cfg->lora.init) { /* every adapter tensor is in the file, in its shape */
        char path[4096];
        adapter_file(cfg->lora.init, path, sizeof path);
        dt_st_file_t *f = NULL;
        st = dt_st_open(path, &f);
        if (st != DT_STATUS_OK) st = dt_error_prefix(DT_STATUS_CONFIG, "lora.init");
        for (int i = 0; st == DT_STATUS_OK && i < adapters.n_tensors; i++) {
            char name[128];
            snprintf(name, sizeof name, "%s%s", dt_lora_peft_prefix(&adapters), adapters.tensors[i].name);
            const dt_st_tensor *x = dt_st_find(f, name);
            if (!x || x->numel != adapters.tensors[i].numel)
                st = dt_error(DT_STATUS_CONFIG, "lora.init: %s has %s %s (expected %lld x %lld)", path,
                              x ? "a wrong shape for" : "no", name, (long long)adapters.tensors[i].shape[0],
                              (long long)adapters.tensors[i].shape[1]);
        }
        dt_st_close(f);
        char cpath[4096]; /* PEFT's adapter_config.json beside it, when there is one */
        if (st == DT_STATUS_OK && dt_lora_peft_config_path(cfg->lora.init, cpath, sizeof cpath)) {
            dt_lora_peft_config pc;
            st = dt_lora_peft_config_read(cpath, &pc);
            if (st == DT_STATUS_OK) st = dt_lora_peft_config_check(&pc, &lora.spec, spec.ops->name);
            if (st != DT_STATUS_OK) st = dt_error(DT_STATUS_CONFIG, "lora.init: %s", dt_error_detail());
        }
    }
    dt_lora_free(&lora);
    dt_model_layout_free(&adapters);
    dt_model_layout_free(&base);
    return st;
}

/* Elements [offset, offset + count) of the adapters from lora.init's file. */
static dt_status_t fill_from_file(const dt_train_lora *l, const dt_model_layout *a, size_t offset, size_t count,
                                  float *dst) {
    for (int i = 0; i < a->n_tensors; i++) {
        const dt_tensor_info *ti = &a->tensors[i];
        size_t lo = ti->offset > offset ? ti->offset : offset;
        size_t hi = ti->offset + ti->numel < offset + count ? ti->offset + ti->numel : offset + count;
        if (lo >= hi) continue;
        char name[128];
        snprintf(name, sizeof name, "%s%s", dt_lora_peft_prefix(a), ti->name);
        const dt_st_tensor *x = dt_st_find(l->init, name);
        if (!x || x->numel != ti->numel)
            return dt_error(DT_STATUS_CONFIG, "lora.init: no %s of %zu elements", name, ti->numel);
        DT_CHECK(dt_st_read_f32(l->init, x, lo - ti->offset, hi - lo, dst + (lo - offset)));
    }
    return DT_STATUS_OK;
}

dt_status_t dt_train_lora_fill_(const dt_train_lora *l, const dt_model_layout *adapters, size_t offset, size_t count,
                                float *dst) {
    if (l->init) return fill_from_file(l, adapters, offset, count, dst);
    dt_lora_init_range(&l->lora, l->seed, offset, count, dst);
    return DT_STATUS_OK;
}

static dt_status_t read_base(void *ctx, size_t goffset, size_t n, float *dst) {
    return dt_hf_weights_fill(ctx, goffset, n, dst);
}

dt_status_t dt_train_lora_setup_(dt_train_lora *l, const dt_config_t *cfg, dt_device_t *dev, int rank,
                                 dt_model_layout *layout, dt_hf_weights_t **hf) {
    dt_lora_spec ls;
    DT_CHECK(dt_train_lora_spec_(cfg, dev->ops->dtype, &ls));
    l->seed = (uint64_t)cfg->seed;
    l->base_layout = *layout; /* the model becomes the frozen base; the trained layout the adapters */
    memset(layout, 0, sizeof *layout);
    DT_CHECK(dt_lora_init(&l->base_layout, &ls, dev->ops->dtype, &l->lora, layout));
    DT_CHECK(dt_hf_weights_open(cfg->model_pretrained, &l->base_layout, hf));
    DT_CHECK(dt_lora_load(&l->lora, dev, read_base, *hf));
    if (cfg->lora.init) {
        char path[4096];
        adapter_file(cfg->lora.init, path, sizeof path);
        dt_status_t st = dt_st_open(path, &l->init);
        if (st != DT_STATUS_OK) return dt_error_prefix(DT_STATUS_CONFIG, "lora.init");
    }
    if (rank == 0)
        DT_LOG_INFO("lora: r %d, alpha %g, %d adapter tensors, %zu trainable parameters; frozen base %zu parameters "
                    "in %.1f MB (%s)",
                    ls.r, ls.alpha, layout->n_tensors, layout->n_params, l->base_layout.n_params,
                    (double)dt_lora_base_state_bytes(&l->lora) / 1e6,
                    ls.base == DT_LORA_BASE_INT8 ? "int8 linears" : dt_dtype_name(dev->ops->dtype));
    return DT_STATUS_OK;
}

int dt_train_lora_on_(const dt_train_lora *l) { return l->lora.adapter != NULL; }

void dt_train_lora_free_(dt_train_lora *l) {
    if (l->init) dt_st_close(l->init);
    l->init = NULL;
    if (l->lora.adapter) {
        dt_lora_free(&l->lora);
        dt_model_layout_free(&l->base_layout);
    }
}

double dt_train_lora_base_bytes_(const dt_train_lora *l) {
    return l->lora.adapter ? (double)dt_lora_base_state_bytes(&l->lora) : 0;
}

void dt_train_lora_write_rank_summary_(const dt_train_lora *l, double base_bytes, cJSON *ms) {
    if (l->lora.adapter) /* in params: the frozen base (lora.h: dt_lora_base_state_bytes) */
        cJSON_AddNumberToObject(ms, "lora_base", base_bytes);
}
