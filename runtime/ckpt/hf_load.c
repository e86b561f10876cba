/*
 * hf_load.c - a Hugging Face directory read whole: config.json into a layout
 * with its context, then every parameter (hf_load.h).
 */
#include "runtime/ckpt/hf_load.h"

#include <stdio.h>
#include <unistd.h>

#include "common/mem.h" /* defines: dt_mem_alloc */
#include "runtime/ckpt/hf_weights.h"
#include "runtime/model/hf_config.h" /* defines: dt_hf_config_read */

int dt_hf_is_dir(const char *path) {
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", path);
    return access(p, F_OK) == 0;
}

dt_status_t dt_hf_load_params(const char *dir, int seq_len, dt_model_layout *l, float **host,
                              int *seq_len_max) {
    dt_hf_config h;
    *seq_len_max = 0;
    DT_CHECK(dt_hf_config_read(dir, &h));
    int bound = h.max_seq_len > 0 ? h.max_seq_len : 0;
    if (h.sliding_window > 0 && (bound == 0 || h.sliding_window < bound)) bound = h.sliding_window;
    if (seq_len > 0) {
        if (bound > 0 && seq_len > bound) {
            *seq_len_max = bound;
            return dt_error(DT_STATUS_CONFIG, "%s allows at most %d positions%s", h.path, bound,
                            h.sliding_window == bound ? " (its sliding_window)" : "");
        }
        h.spec.seq_len = seq_len;
    } else if (h.seq_len_default > 0) {
        h.spec.seq_len = h.seq_len_default;
    } else {
        h.spec.seq_len = bound > 0 && bound < DT_HF_DEFAULT_CONTEXT ? bound : DT_HF_DEFAULT_CONTEXT;
    }
    if (bound > 0 && h.spec.seq_len > bound) h.spec.seq_len = bound;
    DT_CHECK(dt_model_layout_init(&h.spec, l));
    dt_hf_weights_t *w = NULL;
    dt_status_t st = dt_hf_weights_open(dir, l, &w);
    if (st == DT_STATUS_OK) {
        *host = dt_mem_alloc(DT_MEM_PARAMS, l->n_params * sizeof(float));
        if (!*host) st = dt_error(DT_STATUS_NOMEM, "%s: no memory for %zu parameters", dir, l->n_params);
        else st = dt_hf_weights_fill(w, 0, l->n_params, *host);
    }
    dt_hf_weights_close(w);
    if (st != DT_STATUS_OK) {
        dt_mem_free(*host);
        *host = NULL;
        dt_model_layout_free(l);
    }
    return st;
}
