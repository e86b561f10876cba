/*
 * sample.h - text generation from a token model's parameters (any model with
 * logits, model.h): temperature, top-k, a seeded RNG (the same seed gives the same
 * text), greedy at temperature 0; with a KV cache (net.h's decode net) when the
 * model and the device have one, so n tokens cost O(n) positions, not n forwards
 * of seq_len. The trainer's end-of-run sample and `dtrun sample` both use it.
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
    int no_cache;       /* dt_sample_run: 1 = a full forward per token even when the
                         * model can decode with a KV cache (the reference path) */
    float *prompt_logits; /* (optional) gets the logits (vocab_size floats a row) of
                           * every prompt position kept: min(n_prompt, seq_len) rows */
    const int32_t *stop;  /* (optional) n_stop ids that end the generation: the one
                           * picked is kept in out, the rest of out is -1 */
    int n_stop;
} dt_sample_opts;

/* What sampling runs on: a device copy of the parameters, a decode net (KV cache,
 * net.h) when the model and the device have one, and a full (1, seq_len) net made
 * when first needed (no decode path, no_cache, or a context past seq_len). Free
 * with dt_sample_net_free. */
typedef struct dt_sample_net {
    dt_net_t net; /* the full net (have_net) */
    dt_net_t dec; /* the decode net (have_dec) */
    int have_net, have_dec;
    void *params;
    dt_device_t *dev;
    const dt_model_layout *layout;
} dt_sample_net;
/* Over a device copy of host_params (fp32, n_params), counted under memory
 * category cat. */
dt_status_t dt_sample_net_init(dt_sample_net *s, dt_device_t *dev, const dt_model_layout *layout,
                               const float *host_params, dt_mem_category_t cat);
void dt_sample_net_free(dt_sample_net *s);
/* Positions the model computed for s so far (full forwards count seq_len each,
 * decode steps 1): generation cost, for tests and people. */
uint64_t dt_sample_rows_run(const dt_sample_net *s);

/* Generates opts->tokens ids into out from a prompt (n_prompt >= 1 token ids; its
 * last seq_len are the start of the context).
 * With a decode net: the prompt's positions are run one by one into the KV cache,
 * then each new token is one position, so n tokens cost n_prompt + n - 1 positions.
 * Past seq_len the context slides as without a cache (the oldest token drops out,
 * so every position moves and the cache is stale): each further token is a full
 * forward of the last seq_len tokens, as before. The ids are those of the full
 * forward path (the same logits up to float rounding). Logits that are not finite
 * (NaN or inf weights) are DT_STATUS_FORMAT naming the generation step, never a
 * token picked from them. */
dt_status_t dt_sample_run(dt_sample_net *s, const int32_t *prompt, int n_prompt, const dt_sample_opts *opts,
                          int32_t *out);
/* The same with full forwards only, on a net of micro-batch 1 of a model with
 * logits, bound to parameters (opts->no_cache does not matter). */
dt_status_t dt_sample_generate(dt_net_t *net, const int32_t *prompt, int n_prompt, const dt_sample_opts *opts,
                               int32_t *out);

/* How a byte-level token id prints: itself when printable (ascii_only: 32-126;
 * else any byte >= 32), '\n' and '\t' as themselves, anything else '?'. */
int dt_sample_char(int32_t id, int ascii_only);

#endif /* DT_RUNTIME_SAMPLE_H */
