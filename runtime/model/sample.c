/*
 * sample.c - text generation, with a KV cache when the model has one (see sample.h).
 */
#include "runtime/model/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/rng.h"

dt_status_t dt_sample_net_init(dt_sample_net *s, dt_device_t *dev, const dt_model_layout *layout,
                               const float *host_params, dt_mem_category_t cat) {
    memset(s, 0, sizeof *s);
    s->dev = dev;
    s->layout = layout;
    DT_CHECK(dev->ops->alloc(dev, cat, layout->n_params * dt_dtype_size(dev->ops->dtype), &s->params));
    dt_status_t st = dev->ops->upload_f32(dev, s->params, host_params, layout->n_params);
    if (st == DT_STATUS_OK && dt_net_can_decode(dev, layout)) {
        st = dt_net_decode_init(&s->dec, dev, layout);
        if (st == DT_STATUS_OK) {
            s->have_dec = 1;
            dt_net_bind(&s->dec, s->params, NULL);
        }
    }
    if (st != DT_STATUS_OK) {
        dev->ops->free(dev, s->params);
        s->params = NULL;
        return st;
    }
    return DT_STATUS_OK;
}

/* The full (1, seq_len) net, made on first use. */
static dt_status_t full_net(dt_sample_net *s, dt_net_t **out) {
    if (!s->have_net) {
        DT_CHECK(dt_net_init(&s->net, s->dev, s->layout, 1));
        dt_net_bind(&s->net, s->params, NULL);
        s->have_net = 1;
    }
    *out = &s->net;
    return DT_STATUS_OK;
}

void dt_sample_net_free(dt_sample_net *s) {
    if (s->have_net) dt_net_free(&s->net);
    if (s->have_dec) dt_net_free(&s->dec);
    if (s->dev && s->params) s->dev->ops->free(s->dev, s->params);
    memset(s, 0, sizeof *s);
}

uint64_t dt_sample_rows_run(const dt_sample_net *s) {
    return (s->have_net ? s->net.rows_run : 0) + (s->have_dec ? s->dec.rows_run : 0);
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Picks a token from logits[0, V). */
static int32_t pick(const float *logits, int V, const dt_sample_opts *o, dt_rng *rng, float *scratch) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (o->temperature <= 0) return best;
    float cut = -INFINITY;
    if (o->top_k > 0 && o->top_k < V) {
        memcpy(scratch, logits, (size_t)V * sizeof *scratch);
        qsort(scratch, (size_t)V, sizeof *scratch, cmp_desc);
        cut = scratch[o->top_k - 1];
    }
    double mx = logits[best], sum = 0;
    for (int v = 0; v < V; v++)
        if (logits[v] >= cut) sum += exp((logits[v] - mx) / o->temperature);
    double r = dt_rng_uniform(rng) * sum, acc = 0;
    for (int v = 0; v < V; v++) {
        if (logits[v] < cut) continue;
        acc += exp((logits[v] - mx) / o->temperature);
        if (acc >= r) return v;
    }
    return best;
}

/* One generation: over s (decode net when it has one and !no_cache, its full net
 * made when needed), or over the caller's full net when s is NULL. */
static dt_status_t generate(dt_sample_net *s, dt_net_t *full, const dt_model_layout *l, const int32_t *prompt,
                            int n_prompt, const dt_sample_opts *opts, int32_t *out) {
    if (l->spec.ops->logits_slot < 0)
        return dt_error(DT_STATUS_UNSUPPORTED, "sampling needs a model with logits (model %s has none)",
                        l->spec.ops->name);
    if (n_prompt < 1) return dt_error(DT_STATUS_INVALID, "sampling needs a prompt of at least one token");
    int T = l->seq_len, V = l->spec.vocab_size, Vp = l->vocab_padded;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return dt_error(DT_STATUS_INVALID, "prompt token %d is outside the vocabulary [0, %d)", prompt[i], V);
    dt_net_t *dec = s && s->have_dec && !opts->no_cache ? &s->dec : NULL;
    int32_t *ctx = dt_xcalloc((size_t)T, sizeof *ctx);
    int len = n_prompt < T ? n_prompt : T;
    float *logits = dt_xcalloc((size_t)Vp * (size_t)len, sizeof *logits);
    float *scratch = dt_xcalloc((size_t)V, sizeof *scratch);
    memcpy(ctx, prompt + (n_prompt - len), (size_t)len * sizeof *ctx);
    dt_rng rng;
    dt_rng_seed(&rng, opts->seed, 0x73616d706c65ull);
    dt_status_t st = DT_STATUS_OK;
    /* Logits of the last context position into logits[0, Vp): by the cache, the
     * prompt one position at a time; else one forward over the context. */
    if (dec && (opts->prompt_logits || opts->tokens > 0)) {
        for (int p = 0; p < len; p++) {
            DT_CHECK_GOTO(dt_net_decode(dec, ctx[p], p, logits), st, out_free);
            if (opts->prompt_logits) memcpy(opts->prompt_logits + (size_t)p * V, logits, (size_t)V * sizeof *logits);
        }
    } else if (opts->prompt_logits || opts->tokens > 0) {
        if (!full) DT_CHECK_GOTO(full_net(s, &full), st, out_free);
        DT_CHECK_GOTO(dt_net_logits_rows(full, ctx, 0, 0, len, logits), st, out_free);
        if (opts->prompt_logits)
            for (int p = 0; p < len; p++)
                memcpy(opts->prompt_logits + (size_t)p * V, logits + (size_t)p * Vp, (size_t)V * sizeof *logits);
        memmove(logits, logits + (size_t)(len - 1) * Vp, (size_t)Vp * sizeof *logits);
    }
    for (int i = 0; i < opts->tokens; i++) {
        /* NaN weights give NaN logits, which pick() would turn into token 0 for ever */
        for (int v = 0; v < V; v++)
            if (!isfinite(logits[v])) {
                st = dt_error(DT_STATUS_FORMAT,
                              "generation step %d (position %d): the logits are not finite (%g for token %d): the "
                              "model's weights hold NaN or inf",
                              i + 1, len - 1, (double)logits[v], v);
                goto out_free;
            }
        int32_t tok = pick(logits, V, opts, &rng, scratch);
        out[i] = tok;
        int stop = 0;
        for (int k = 0; k < opts->n_stop; k++) stop |= tok == opts->stop[k];
        if (stop) {
            for (int j = i + 1; j < opts->tokens; j++) out[j] = -1;
            break;
        }
        if (i + 1 == opts->tokens) break; /* its logits would go unused */
        if (len < T) {
            ctx[len] = tok;
            if (dec) DT_CHECK_GOTO(dt_net_decode(dec, tok, len, logits), st, out_free);
            len++;
        } else {
            /* Sliding: every position moves, so the cache is stale from here on. */
            memmove(ctx, ctx + 1, (size_t)(T - 1) * sizeof *ctx);
            ctx[T - 1] = tok;
            dec = NULL;
        }
        if (!dec) {
            if (!full) DT_CHECK_GOTO(full_net(s, &full), st, out_free);
            DT_CHECK_GOTO(dt_net_logits(full, ctx, 0, len - 1, logits), st, out_free);
        }
    }
out_free:
    free(ctx);
    free(logits);
    free(scratch);
    return st;
}

dt_status_t dt_sample_run(dt_sample_net *s, const int32_t *prompt, int n_prompt, const dt_sample_opts *opts,
                          int32_t *out) {
    return generate(s, NULL, s->layout, prompt, n_prompt, opts, out);
}

dt_status_t dt_sample_generate(dt_net_t *net, const int32_t *prompt, int n_prompt, const dt_sample_opts *opts,
                               int32_t *out) {
    return generate(NULL, net, net->layout, prompt, n_prompt, opts, out);
}

int dt_sample_char(int32_t id, int ascii_only) {
    if (id == '\n' || id == '\t') return id;
    if (id >= 32 && (ascii_only ? id < 127 : id < 256)) return id;
    return '?';
}
