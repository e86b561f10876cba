/*
 * lora_export.c - a LoRA checkpoint (its tensors are the adapters: lora.h) out of
 * dtrun (lora_export.h): as a PEFT adapter directory (adapter_config.json +
 * adapter_model.safetensors, PEFT's names "base_model.model.<module>.lora_A.weight"),
 * which peft.PeftModel.from_pretrained loads onto the base; or merged into the base
 * (W + alpha/r B A, the base as training saw it: an int8 base dequantized) as a
 * Hugging Face directory (hf_export.h). The base is the checkpoint config's
 * model.pretrained, read again.
 */
#include "runtime/ckpt/lora_export.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"       /* defines: dt_fs_mkdir_p */
#include "common/fs_safe.h"  /* defines: dt_fs_write_atomic */
#include "common/mem.h" /* defines: dt_mem_alloc, dt_xcalloc */
#include "runtime/ckpt/hf_export.h"  /* defines: dt_hf_export */
#include "runtime/ckpt/hf_weights.h" /* defines: dt_hf_weights_open, dt_hf_weights_fill */
#include "runtime/ckpt/safetensors.h" /* defines: dt_safetensors_write_tensors */

static const cJSON *meta_lora(const dt_ckpt_t *c) {
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive((const cJSON *)dt_ckpt_meta(c), "config");
    return cJSON_GetObjectItemCaseSensitive(cfg, "lora");
}

int dt_ckpt_is_lora(const dt_ckpt_t *c) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(meta_lora(c), "r");
    return cJSON_IsNumber(r) && r->valuedouble >= 1;
}

/* The saved lora section as a spec, and model.pretrained. */
static dt_status_t saved_spec(const dt_ckpt_t *c, dt_lora_spec *ls, const char **pretrained) {
    const cJSON *l = meta_lora(c), *cfg = cJSON_GetObjectItemCaseSensitive((const cJSON *)dt_ckpt_meta(c), "config");
    memset(ls, 0, sizeof *ls);
    uint64_t r;
    DT_CHECK(dt_ckpt_meta_uint(cJSON_GetObjectItemCaseSensitive(l, "r"), 1, 65536, "config.lora", "r", &r));
    ls->r = (int)r;
    DT_CHECK(dt_ckpt_meta_number(cJSON_GetObjectItemCaseSensitive(l, "alpha"), 0, 1e9, "config.lora", "alpha",
                                 &ls->alpha));
    const cJSON *t, *tm = cJSON_GetObjectItemCaseSensitive(l, "target_modules");
    if (cJSON_IsArray(tm)) {
        cJSON_ArrayForEach(t, tm) {
            if (!cJSON_IsString(t) || ls->n_targets == DT_LORA_MAX_TARGETS || strlen(t->valuestring) >= DT_LORA_NAME_LEN)
                return dt_error(DT_STATUS_INVALID, "%s: config.lora.target_modules is not a list of names",
                                dt_ckpt_path(c));
            snprintf(ls->targets[ls->n_targets++], DT_LORA_NAME_LEN, "%s", t->valuestring);
        }
    } else if (cJSON_IsString(tm)) {
        DT_CHECK(dt_lora_parse_targets(ls, tm->valuestring));
    }
    const cJSON *bd = cJSON_GetObjectItemCaseSensitive(l, "base_dtype");
    ls->base = cJSON_IsString(bd) && !strcmp(bd->valuestring, "int8") ? DT_LORA_BASE_INT8 : DT_LORA_BASE_COMPUTE;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cfg, "model"), "pretrained");
    *pretrained = cJSON_IsString(p) ? p->valuestring : NULL;
    return DT_STATUS_OK;
}

/* Writes a then b to dir/name atomically (a regular file or nothing is replaced). */
static dt_status_t write_file(const char *dir, const char *name, const void *a, size_t na, const void *b, size_t nb) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    DT_CHECK(dt_fs_check_target(path, 0, "adapter output"));
    return dt_fs_write_atomic(path, a, na, b, nb);
}

/* adapter_model.safetensors: the adapters in fp32 under PEFT's names. */
static dt_status_t write_adapter(const dt_model_layout *a, const float *params, const char *dir, uint64_t *bytes) {
    cJSON *h = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(md, "format", "pt");
    size_t off = 0;
    for (int i = 0; i < a->n_tensors; i++) {
        const dt_tensor_info *t = &a->tensors[i];
        char name[128];
        snprintf(name, sizeof name, "%s%s", dt_lora_peft_prefix(a), t->name);
        cJSON *e = cJSON_AddObjectToObject(h, name);
        cJSON_AddStringToObject(e, "dtype", "F32");
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *rng = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(rng, cJSON_CreateNumber((double)off));
        off += t->numel * sizeof(float);
        cJSON_AddItemToArray(rng, cJSON_CreateNumber((double)off));
    }
    char *text = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t n = strlen(text), padded = (n + 8 + 7) / 8 * 8 - 8; /* data 8-byte aligned */
    unsigned char *head = dt_xcalloc(8 + padded, 1);
    uint64_t len = padded;
    memcpy(head, &len, 8); /* little-endian hosts only, as the rest of the checkpoint code */
    memcpy(head + 8, text, n);
    memset(head + 8 + n, ' ', padded - n);
    free(text);
    /* the tensors are contiguous in layout order in params */
    dt_status_t st = write_file(dir, "adapter_model.safetensors", head, 8 + padded, params, off);
    free(head);
    *bytes = off;
    return st;
}

static dt_status_t write_config(const dt_lora_t *lo, const char *pretrained, const char *dir) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "peft_type", "LORA");
    cJSON_AddStringToObject(c, "task_type", "CAUSAL_LM");
    if (pretrained) cJSON_AddStringToObject(c, "base_model_name_or_path", pretrained);
    else cJSON_AddNullToObject(c, "base_model_name_or_path");
    cJSON_AddNumberToObject(c, "r", lo->spec.r);
    cJSON_AddNumberToObject(c, "lora_alpha", lo->spec.alpha);
    cJSON_AddNumberToObject(c, "lora_dropout", 0.0);
    cJSON *tm = cJSON_AddArrayToObject(c, "target_modules");
    for (int i = 0; i < lo->spec.n_targets; i++) cJSON_AddItemToArray(tm, cJSON_CreateString(lo->spec.targets[i]));
    cJSON_AddStringToObject(c, "bias", "none");
    /* GPT-2's Conv1D stores (in, out): PEFT's flag for it (the adapters keep (r, in), (out, r)) */
    cJSON_AddBoolToObject(c, "fan_in_fan_out", !strcmp(lo->base->spec.ops->name, "gpt"));
    cJSON_AddBoolToObject(c, "inference_mode", 1);
    cJSON_AddBoolToObject(c, "init_lora_weights", 1);
    cJSON_AddBoolToObject(c, "use_rslora", 0);
    cJSON_AddBoolToObject(c, "use_dora", 0);
    cJSON_AddNullToObject(c, "modules_to_save");
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    dt_status_t st = write_file(dir, "adapter_config.json", text, strlen(text), "\n", 1);
    free(text);
    return st;
}

/* The merged model: the base (an int8 base as quantized) + scale * B A per adapter. */
static dt_status_t merge(const dt_lora_t *lo, const char *pretrained, const float *adapters, float *w) {
    const dt_model_layout *b = lo->base;
    dt_hf_weights_t *hf;
    DT_CHECK(dt_hf_weights_open(pretrained, b, &hf));
    dt_status_t st = dt_hf_weights_fill(hf, 0, b->n_params, w);
    dt_hf_weights_close(hf);
    DT_CHECK(st);
    for (int t = 0; t < b->n_tensors; t++) {
        const dt_tensor_info *ti = &b->tensors[t];
        size_t rows = (size_t)ti->shape[0], cols = ti->numel / rows;
        float *W = w + ti->offset;
        if (lo->linear[t] && lo->spec.base == DT_LORA_BASE_INT8) { /* what training computed with */
            int8_t *q = dt_xcalloc(ti->numel, 1);
            float *s = dt_xcalloc(rows, sizeof *s);
            dt_lora_quantize_rows(W, rows, cols, q, s);
            for (size_t i = 0; i < ti->numel; i++) W[i] = (float)q[i] * s[i / cols];
            free(q);
            free(s);
        }
        int a = lo->adapter[t];
        if (a < 0) continue;
        const float *A = adapters + lo->adapters->tensors[a].offset, *B = adapters + lo->adapters->tensors[a + 1].offset;
        int r = lo->spec.r;
        for (size_t o = 0; o < rows; o++)
            for (int k = 0; k < r; k++) {
                float s = lo->scale * B[o * (size_t)r + (size_t)k];
                const float *Ak = A + (size_t)k * cols;
                for (size_t i = 0; i < cols; i++) W[o * cols + i] += s * Ak[i];
            }
    }
    return DT_STATUS_OK;
}

dt_status_t dt_lora_export(dt_ckpt_t *c, const char *out, dt_lora_export_format_t format, const dt_hf_export_opts *o,
                           int *n_tensors, int *n_files, uint64_t *bytes) {
    dt_lora_spec ls;
    const char *pretrained = NULL;
    dt_model_spec spec;
    dt_model_layout base, adapters;
    dt_lora_t lo;
    DT_CHECK(saved_spec(c, &ls, &pretrained));
    DT_CHECK(dt_ckpt_model_spec(c, &spec));
    DT_CHECK(dt_model_layout_init(&spec, &base));
    dt_status_t st = dt_lora_init(&base, &ls, DT_DTYPE_F32, &lo, &adapters);
    if (st != DT_STATUS_OK) goto out_free_base;
    st = dt_ckpt_check_layout(c, &adapters);
    float *params = NULL, *merged = NULL;
    if (st == DT_STATUS_OK) {
        params = dt_mem_alloc(DT_MEM_PARAMS, (adapters.n_params ? adapters.n_params : 1) * sizeof(float));
        st = params ? dt_ckpt_read(c, "params", 0, adapters.n_params, params) : DT_STATUS_NOMEM;
    }
    *n_files = 1;
    if (st == DT_STATUS_OK && format == DT_LORA_EXPORT_PEFT) {
        st = dt_fs_mkdir_p(out);
        if (st == DT_STATUS_OK) st = write_adapter(&adapters, params, out, bytes);
        if (st == DT_STATUS_OK) st = write_config(&lo, pretrained, out);
        *n_tensors = adapters.n_tensors;
    } else if (st == DT_STATUS_OK && format == DT_LORA_EXPORT_ADAPTERS) {
        size_t b = 0;
        st = dt_safetensors_write_tensors(&adapters, params, out, 0, adapters.n_tensors, o->bf16, &b);
        *bytes = b;
        *n_tensors = adapters.n_tensors;
    } else if (st == DT_STATUS_OK) {
        if (!pretrained) {
            st = dt_error(DT_STATUS_INVALID, "%s: the checkpoint's config has no model.pretrained (the base to merge into)",
                          dt_ckpt_path(c));
        } else {
            merged = dt_mem_alloc(DT_MEM_PARAMS, base.n_params * sizeof(float));
            st = merged ? merge(&lo, pretrained, params, merged) : DT_STATUS_NOMEM;
            if (st == DT_STATUS_OK) st = dt_hf_export(&base, merged, out, o, n_files, bytes);
            *n_tensors = base.n_tensors;
        }
    }
    dt_mem_free(merged);
    dt_mem_free(params);
    dt_lora_free(&lo);
    dt_model_layout_free(&adapters);
out_free_base:
    dt_model_layout_free(&base);
    return st;
}
