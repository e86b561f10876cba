/*
 * sample.h - text generation from a token model's parameters (any model with
 * logits, model.h): temperature, top-k, a seeded RNG (the same seed gives the same
 * text), greedy at temperature 0. The trainer's end-of-run sample and `dtrun
 * sample` both use it.
 */
#ifndef DT_RUNTIME_SAMPLE_H
#define DT_RUNTIME_SAMPLE_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/kernels.h"     /* defines: dt_device_t, dt_mem_category_t */
#include "runtime/model/net.h" /* defines: dt_net_t */

typedef struct dt_sample_opts {
    int tokens;         /* how many to generate */
    double temperature; /* 0: greedy (argmax) */
    int top_k;          /* 0: the whole vocabulary */
    uint64_t seed;
} dt_sample_opts;

/* A micro-batch-1 net of layout over a device copy of host_params (fp32,
 * n_params), counted under memory category cat. Free with dt_sample_net_free. */
typedef struct dt_sample_net {
    dt_net_t net;
    void *params;
} dt_sample_net;
dt_status_t dt_sample_net_init(dt_sample_net *s, dt_device_t *dev, const dt_model_layout *layout,
                               const float *host_params, dt_mem_category_t cat);
void dt_sample_net_free(dt_sample_net *s);

/* net: a net of micro-batch 1 of a model with logits, bound to parameters. The prompt (n_prompt >= 1
 * token ids) is the start of the context; the last seq_len tokens are kept as the
 * context grows. out gets opts->tokens ids. */
dt_status_t dt_sample_generate(dt_net_t *net, const int32_t *prompt, int n_prompt, const dt_sample_opts *opts,
                               int32_t *out);

/* How a byte-level token id prints: itself when printable (ascii_only: 32-126;
 * else any byte >= 32), '\n' and '\t' as themselves, anything else '?'. */
int dt_sample_char(int32_t id, int ascii_only);

#endif /* DT_RUNTIME_SAMPLE_H */
