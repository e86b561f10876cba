/*
 * lora.c - LoRA's layout and frozen base (lora.h): which tensors are linear
 * weights and which get adapters, the adapters' layout and PEFT's initialisation,
 * the base's storage plan, its loading and int8 quantization.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xcalloc, dt_mem_alloc */
#include "common/rng.h" /* defines: dt_rng_seed, dt_rng_uniform */
#include "runtime/model/lora.h"
#include "runtime/model/lora_config.h" /* defines: dt_lora_default_targets */

const char *dt_lora_peft_prefix(const dt_model_layout *l) {
    return !strcmp(l->spec.ops->name, "gpt") ? "base_model.model.transformer." : "base_model.model.";
}

dt_status_t dt_lora_parse_targets(dt_lora_spec *spec, const char *list) {
    spec->n_targets = 0;
    if (!list || !list[0]) return DT_STATUS_OK;
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 0 || n >= DT_LORA_NAME_LEN)
            return dt_error(DT_STATUS_CONFIG, "lora.target_modules: expected module names of 1 to %d characters, "
                            "found \"%.*s\"", DT_LORA_NAME_LEN - 1, (int)n, p);
        if (spec->n_targets == DT_LORA_MAX_TARGETS)
            return dt_error(DT_STATUS_CONFIG, "lora.target_modules: at most %d names", DT_LORA_MAX_TARGETS);
        memcpy(spec->targets[spec->n_targets], p, n);
        spec->targets[spec->n_targets++][n] = '\0';
        p += n + (e ? 1 : 0);
    }
    return DT_STATUS_OK;
}

/* A linear weight: 2-D, in a block's unit (not the embedding, not the final unit). */
static int is_linear(const dt_model_layout *l, int t) {
    const dt_tensor_info *ti = &l->tensors[t];
    int u = l->units[ti->unit].gunit;
    return ti->ndim == 2 && u > 0 && u < l->n_units - 1 && strlen(ti->name) > 7 &&
           !strcmp(ti->name + strlen(ti->name) - 7, ".weight");
}

/* The module name of a linear weight: the component before ".weight" (q_proj). */
static void module_of(const char *name, char *out, size_t len) {
    size_t n = strlen(name) - 7; /* without ".weight" */
    size_t s = n;
    while (s > 0 && name[s - 1] != '.') s--;
    snprintf(out, len, "%.*s", (int)(n - s), name + s);
}

/* PEFT matches a target by the module name's last component ("c_proj" adapts both
 * of GPT-2's c_proj). */
static int target_index(const dt_lora_spec *s, const char *module) {
    for (int i = 0; i < s->n_targets; i++)
        if (!strcmp(s->targets[i], module)) return i;
    return -1;
}

dt_status_t dt_lora_init(const dt_model_layout *base, const dt_lora_spec *spec, dt_dtype_t compute,
                         dt_lora_t *out, dt_model_layout *adapters) {
    memset(out, 0, sizeof *out);
    memset(adapters, 0, sizeof *adapters);
    if (base->tp_size > 1 || base->pp_size > 1 || base->n_chunks > 1)
        return dt_error(DT_STATUS_CONFIG, "lora: runs on the whole model (tensor_parallel.size and pipeline.stages 1)");
    if (spec->r < 1) return dt_error(DT_STATUS_CONFIG, "lora.r: expected an integer >= 1, found %d", spec->r);
    out->spec = *spec;
    if (out->spec.n_targets == 0) DT_CHECK(dt_lora_parse_targets(&out->spec, dt_lora_default_targets(base->spec.ops->name)));
    out->scale = (float)(spec->alpha / spec->r);
    out->base = base;
    out->adapters = adapters;
    out->dtype = compute;
    int n = base->n_tensors;
    out->adapter = dt_xcalloc((size_t)n, sizeof *out->adapter);
    out->linear = dt_xcalloc((size_t)n, sizeof *out->linear);
    out->boff = dt_xcalloc((size_t)n, sizeof *out->boff);
    out->soff = dt_xcalloc((size_t)n, sizeof *out->soff);
    out->goff = dt_xcalloc((size_t)n, sizeof *out->goff);
    int used[DT_LORA_MAX_TARGETS] = {0};
    char modules[512] = "", module[DT_LORA_NAME_LEN * 2];
    size_t es = dt_dtype_size(compute);
    int q8 = spec->base == DT_LORA_BASE_INT8;

    /* the adapters' layout: the base's spec and units, the pairs as tensors */
    *adapters = *base;
    adapters->tensors = NULL;
    adapters->n_tensors = 0;
    adapters->n_params = 0;
    adapters->global = NULL;
    adapters->units = dt_xcalloc((size_t)base->n_units, sizeof *adapters->units);
    for (int u = 0; u < base->n_units; u++) {
        dt_unit_info *au = &adapters->units[u];
        au->gunit = base->units[u].gunit;
        au->offset = adapters->n_params;
        au->tensor0 = adapters->n_tensors;
        for (int t = base->units[u].tensor0; t < base->units[u].tensor0 + base->units[u].n_tensors; t++) {
            const dt_tensor_info *ti = &base->tensors[t];
            out->adapter[t] = -1;
            out->linear[t] = is_linear(base, t);
            if (ti->ndim == 1) {
                out->goff[t] = out->sink_elems;
                out->sink_elems += ti->numel;
            }
            if (out->linear[t] && q8) {
                out->boff[t] = out->q8_bytes;
                out->soff[t] = out->n_scales;
                out->q8_bytes += ti->numel;
                out->n_scales += (size_t)ti->shape[0];
            } else {
                out->boff[t] = out->base_bytes;
                out->base_bytes += ti->numel * es;
            }
            if (!out->linear[t]) continue;
            module_of(ti->name, module, sizeof module);
            if (!strstr(modules, module) && strlen(modules) + strlen(module) + 3 < sizeof modules)
                snprintf(modules + strlen(modules), sizeof modules - strlen(modules), "%s%s", modules[0] ? ", " : "",
                         module);
            int k = target_index(&out->spec, module);
            if (k < 0) continue;
            used[k] = 1;
            char prefix[DT_MODEL_NAME_LEN];
            snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(ti->name) - 7), ti->name);
            if (strlen(prefix) + strlen(".lora_A.weight") >= DT_MODEL_NAME_LEN) {
                dt_lora_free(out);
                dt_model_layout_free(adapters);
                return dt_error(DT_STATUS_UNSUPPORTED, "lora: the adapter name of %s exceeds %d characters",
                                ti->name, DT_MODEL_NAME_LEN - 1);
            }
            out->adapter[t] = adapters->n_tensors;
            int64_t r = spec->r;
            /* decay 1: torch's AdamW decays every parameter of its group */
            dt_model_add_tensor(adapters, u, 1, DT_MODEL_INIT_NORMAL, 2, (const int64_t[]){r, ti->shape[1]},
                                "%s.lora_A.weight", prefix);
            dt_model_add_tensor(adapters, u, 1, DT_MODEL_INIT_ZERO, 2, (const int64_t[]){ti->shape[0], r},
                                "%s.lora_B.weight", prefix);
        }
        au->numel = adapters->n_params - au->offset;
        au->n_tensors = adapters->n_tensors - au->tensor0;
    }
    for (int k = 0; k < out->spec.n_targets; k++)
        if (!used[k]) {
            char bad[DT_LORA_NAME_LEN];
            snprintf(bad, sizeof bad, "%s", out->spec.targets[k]);
            dt_lora_free(out);
            dt_model_layout_free(adapters);
            return dt_error(DT_STATUS_CONFIG, "lora.target_modules: %s is not a linear module of model %s (it has: %s)",
                            bad, base->spec.ops->name, modules);
        }
    return DT_STATUS_OK;
}

void dt_lora_free(dt_lora_t *lora) {
    if (lora->dev) {
        const dt_ops_t *o = lora->dev->ops;
        if (lora->d_base) o->free(lora->dev, lora->d_base);
        if (lora->d_q8) o->free(lora->dev, lora->d_q8);
        if (lora->d_scales) o->free(lora->dev, lora->d_scales);
        if (lora->d_sink) o->free(lora->dev, lora->d_sink);
    }
    free(lora->adapter);
    free(lora->linear);
    free(lora->boff);
    free(lora->soff);
    free(lora->goff);
    memset(lora, 0, sizeof *lora);
}

size_t dt_lora_base_state_bytes(const dt_lora_t *lora) {
    return lora->base_bytes + lora->q8_bytes + lora->n_scales * sizeof(float);
}

long dt_lora_quantize_rows(const float *w, size_t rows, size_t cols, int8_t *q, float *scale) {
    long bad = -1;
    for (size_t r = 0; r < rows; r++) {
        const float *x = w + r * cols;
        float m = 0;
        int finite = 1;
        for (size_t c = 0; c < cols; c++) {
            finite &= isfinite(x[c]) != 0;
            m = fmaxf(m, fabsf(x[c]));
        }
        if (!finite) { /* (int8_t)NaN is undefined: the caller reports the row */
            if (bad < 0) bad = (long)r;
            scale[r] = 1.0f;
            memset(q + r * cols, 0, cols);
            continue;
        }
        float s = m > 0 ? m / 127.0f : 1.0f;
        scale[r] = s;
        for (size_t c = 0; c < cols; c++) {
            float v = nearbyintf(x[c] / s);
            q[r * cols + c] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    }
    return bad;
}

/* Allocates n bytes (at least 1) of model state on the device. */
static dt_status_t alloc_state(dt_device_t *dev, size_t n, void **p, const char *what) {
    dt_status_t st = dev->ops->alloc(dev, DT_MEM_PARAMS, n ? n : 1, p);
    if (st != DT_STATUS_OK)
        return dt_error_prefix(st, "lora: cannot allocate %.1f MiB for the frozen base's %s", (double)n / (1 << 20),
                               what);
    return DT_STATUS_OK;
}

dt_status_t dt_lora_load(dt_lora_t *lora, dt_device_t *dev, dt_lora_read_fn read, void *ctx) {
    const dt_ops_t *o = dev->ops;
    const dt_model_layout *b = lora->base;
    lora->dev = dev;
    DT_CHECK(alloc_state(dev, lora->base_bytes, &lora->d_base, "weights"));
    DT_CHECK(alloc_state(dev, lora->q8_bytes, (void **)&lora->d_q8, "int8 weights"));
    DT_CHECK(alloc_state(dev, lora->n_scales * sizeof(float), (void **)&lora->d_scales, "scales"));
    DT_CHECK(alloc_state(dev, lora->sink_elems * dt_dtype_size(lora->dtype), &lora->d_sink, "gradient sink"));
    size_t most = 0;
    for (int t = 0; t < b->n_tensors; t++)
        if (b->tensors[t].numel > most) most = b->tensors[t].numel;
    float *h = dt_mem_alloc(DT_MEM_OTHER, (most ? most : 1) * sizeof(float));
    int8_t *hq = dt_mem_alloc(DT_MEM_OTHER, most ? most : 1);
    float *hs = dt_mem_alloc(DT_MEM_OTHER, (most ? most : 1) * sizeof(float));
    dt_status_t st = h && hq && hs ? DT_STATUS_OK : DT_STATUS_NOMEM;
    for (int t = 0; t < b->n_tensors && st == DT_STATUS_OK; t++) {
        const dt_tensor_info *ti = &b->tensors[t];
        st = read(ctx, ti->goffset, ti->numel, h);
        if (st != DT_STATUS_OK) break;
        if (lora->linear[t] && lora->spec.base == DT_LORA_BASE_INT8) {
            size_t rows = (size_t)ti->shape[0];
            long bad = dt_lora_quantize_rows(h, rows, ti->numel / rows, hq, hs);
            if (bad >= 0) {
                st = dt_error(DT_STATUS_CONFIG, "lora.base_dtype int8: model.pretrained's %s has a NaN or infinite "
                              "weight in row %ld: it cannot be quantized (fix the weights, or use base_dtype fp32/bf16)",
                              ti->name, bad);
                break;
            }
            st = o->copy(dev, lora->d_q8 + lora->boff[t], hq, ti->numel, DT_COPY_HOST_TO_DEVICE);
            if (st == DT_STATUS_OK)
                st = o->copy(dev, lora->d_scales + lora->soff[t], hs, rows * sizeof(float), DT_COPY_HOST_TO_DEVICE);
        } else {
            st = o->upload_f32(dev, (char *)lora->d_base + lora->boff[t], h, ti->numel);
        }
        if (st == DT_STATUS_OK) st = o->synchronize(dev);
    }
    dt_mem_free(h);
    dt_mem_free(hq);
    dt_mem_free(hs);
    return st;
}

void dt_lora_init_range(const dt_lora_t *lora, uint64_t seed, size_t offset, size_t count, float *dst) {
    const dt_model_layout *a = lora->adapters;
    memset(dst, 0, count * sizeof(float));
    for (int t = 0; t < a->n_tensors; t++) {
        const dt_tensor_info *ti = &a->tensors[t];
        if (ti->init == DT_MODEL_INIT_ZERO) continue; /* B */
        size_t lo = ti->offset, hi = ti->offset + ti->numel;
        if (hi <= offset || lo >= offset + count) continue;
        /* The whole tensor's stream up to the range's end, so any range gives the same values. */
        dt_rng rng;
        dt_rng_seed(&rng, seed, 0x6c6f7261ull + (uint64_t)t);
        double bound = 1.0 / sqrt((double)ti->shape[1]);
        size_t end = hi < offset + count ? hi : offset + count;
        for (size_t i = lo; i < end; i++) {
            float v = (float)((2 * dt_rng_uniform(&rng) - 1) * bound);
            if (i >= offset) dst[i - offset] = v;
        }
    }
}
