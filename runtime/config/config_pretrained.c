/*
 * config_pretrained.c - model.pretrained (config_impl.h): model.type and the model's
 * keys from DIR/config.json (runtime/model/hf_config.h). A key the user gave must
 * agree with the file, or the error names both values ("model.hidden_size: the
 * config says 64, DIR/config.json says 32"); seq_len is ours: at most the model's
 * positions, and when not given GPT-2's n_positions or llama's default cut to
 * max_position_embeddings. Idempotent: finish() runs again after each dt_config_set.
 * The weights themselves are checked outside config (runtime/train:
 * dt_trainer_check_pretrained), as config does not read safetensors.
 */
#include "runtime/config/config_impl.h"
#include "runtime/config/config_errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/model/hf_config.h" /* defines: dt_hf_config_read */

__attribute__((format(printf, 3, 4))) static void err(dt_config_t *cfg, const char *src, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dt_config_add_error_(cfg, src, msg);
}

/* A model key's value as text, for messages. */
static void model_key_text(const dt_model_spec *spec, const dt_model_key *k, char *out, size_t len) {
    double v = dt_model_key_get(spec, k);
    if (k->kind == DT_MODEL_KEY_BOOL) snprintf(out, len, "%s", v != 0 ? "true" : "false");
    else {
        snprintf(out, len, "%g", v);
        if (strtod(out, NULL) != v) snprintf(out, len, "%.17g", v);
    }
}

void dt_config_apply_pretrained_(dt_config_t *cfg, const char *src) {
    if (!cfg->model_pretrained) return;
    dt_hf_config h;
    if (dt_hf_config_read(cfg->model_pretrained, &h) != DT_STATUS_OK) {
        err(cfg, src, "model.pretrained: %s", dt_error_detail());
        return;
    }
    int rt = dt_config_key_find_("model.type");
    int idx = -1;
    for (int i = 0; i < dt_model_count(); i++)
        if (dt_model_at(i) == h.spec.ops) idx = i;
    if (cfg->origin[rt] != DT_CONFIG_ORIGIN_DEFAULT && cfg->model_type != idx) {
        err(cfg, src, "model.type: the config says %s, %s says %s (model_type %s)",
                  dt_model_at(cfg->model_type)->name, h.path, h.spec.ops->name, h.model_type);
        return;
    }
    cfg->model_type = idx;
    const dt_model_ops *ops = h.spec.ops;
    for (int k = 0; k < ops->n_keys && k < DT_HF_MAX_KEYS; k++) {
        const dt_model_key *mk = &ops->keys[k];
        int row = dt_config_key_find_(mk->path);
        if (!h.from_file[k] || row < 0) continue;
        double theirs = dt_model_key_get(&h.spec, mk);
        if (cfg->origin[row] != DT_CONFIG_ORIGIN_DEFAULT && dt_model_key_get(&cfg->model, mk) != theirs) {
            char a[64], b[64];
            model_key_text(&cfg->model, mk, a, sizeof a);
            model_key_text(&h.spec, mk, b, sizeof b);
            err(cfg, src, "%s: the config says %s, %s says %s", mk->path, a, h.path, b);
            continue;
        }
        dt_model_key_set(&cfg->model, mk, theirs);
    }
    int rs = dt_config_key_find_("model.seq_len");
    if (rs >= 0 && cfg->origin[rs] == DT_CONFIG_ORIGIN_DEFAULT) { /* gpt: n_positions; llama: the default, within the positions */
        if (h.seq_len_default > 0) cfg->model.seq_len = h.seq_len_default;
        else if (h.max_seq_len > 0 && cfg->model.seq_len > h.max_seq_len) cfg->model.seq_len = h.max_seq_len;
    }
    /* (llama's own config_check bounds seq_len by max_position_embeddings, a key) */
    if (h.seq_len_default > 0 && cfg->model.seq_len > h.max_seq_len)
        err(cfg, src, "model.seq_len: expected at most %d (%s: the model's positions), found %d", h.max_seq_len,
                  h.path, cfg->model.seq_len);
    if (h.sliding_window > 0 && cfg->model.seq_len > h.sliding_window)
        err(cfg, src,
                  "model.seq_len: %d is past %s's sliding_window %d: dtrun's attention is not windowed (use seq_len "
                  "<= %d)",
                  cfg->model.seq_len, h.path, h.sliding_window, h.sliding_window);
}

