/*
 * sample.c - text generation (see sample.h).
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
    DT_CHECK(dev->ops->alloc(dev, cat, layout->n_params * dt_dtype_size(dev->ops->dtype), &s->params));
    dt_status_t st = dev->ops->upload_f32(dev, s->params, host_params, layout->n_params);
    if (st == DT_STATUS_OK) st = dt_net_init(&s->net, dev, layout, 1);
    if (st != DT_STATUS_OK) {
        dev->ops->free(dev, s->params);
        s->params = NULL;
        return st;
    }
    dt_net_bind(&s->net, s->params, NULL);
    return DT_STATUS_OK;
}

void dt_sample_net_free(dt_sample_net *s) {
    dt_device_t *dev = s->net.dev;
    dt_net_free(&s->net);
    if (dev) dev->ops->free(dev, s->params);
    memset(s, 0, sizeof *s);
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

dt_status_t dt_sample_generate(dt_net_t *net, const int32_t *prompt, int n_prompt, const dt_sample_opts *opts,
                               int32_t *out) {
    const dt_model_layout *l = net->layout;
    if (l->spec.ops->logits_slot < 0)
        return dt_error(DT_STATUS_UNSUPPORTED, "sampling needs a model with logits (model %s has none)",
                        l->spec.ops->name);
    if (n_prompt < 1) return dt_error(DT_STATUS_INVALID, "sampling needs a prompt of at least one token");
    int T = l->spec.seq_len, V = l->spec.vocab_size;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return dt_error(DT_STATUS_INVALID, "prompt token %d is outside the vocabulary [0, %d)", prompt[i], V);
    int32_t *ctx = dt_xcalloc((size_t)T, sizeof *ctx);
    float *logits = dt_xcalloc((size_t)l->vocab_padded, sizeof *logits);
    float *scratch = dt_xcalloc((size_t)V, sizeof *scratch);
    int len = n_prompt < T ? n_prompt : T;
    memcpy(ctx, prompt + (n_prompt - len), (size_t)len * sizeof *ctx);
    dt_rng rng;
    dt_rng_seed(&rng, opts->seed, 0x73616d706c65ull);
    dt_status_t st = DT_STATUS_OK;
    for (int i = 0; i < opts->tokens; i++) {
        DT_CHECK_GOTO(dt_net_logits(net, ctx, 0, len - 1, logits), st, out_free);
        int32_t tok = pick(logits, V, opts, &rng, scratch);
        out[i] = tok;
        if (len < T) ctx[len++] = tok;
        else {
            memmove(ctx, ctx + 1, (size_t)(T - 1) * sizeof *ctx);
            ctx[T - 1] = tok;
        }
    }
out_free:
    free(ctx);
    free(logits);
    free(scratch);
    return st;
}

int dt_sample_char(int32_t id, int ascii_only) {
    if (id == '\n' || id == '\t') return id;
    if (id >= 32 && (ascii_only ? id < 127 : id < 256)) return id;
    return '?';
}
