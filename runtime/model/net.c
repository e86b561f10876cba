/*
 * net.c - GPT-2 and MLP forward/backward as sequences of device ops (llm.c's
 * structure over the op table), activations in one arena.
 */
#include "runtime/model/net.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"

/* Arena slots shared by the whole model ... */
enum {
    G_TOKENS, G_TARGETS, G_FEATURES, G_ENCODED, G_LNF, G_LNF_MEAN, G_LNF_RSTD, G_LOGITS,
    G_LOSSES, G_DRES, G_DTMP, G_DQKV, G_DFCH, G_DFCH_GELU, G_ATT_SCRATCH, G_COUNT
};
/* ... and per GPT layer (or per MLP layer: L_LN1 = pre-activation, L_QKV = post-relu). */
enum {
    L_LN1, L_LN1_MEAN, L_LN1_RSTD, L_QKV, L_ATTY, L_ATT_SAVED, L_ATTPROJ, L_RES2, L_LN2,
    L_LN2_MEAN, L_LN2_RSTD, L_FCH, L_FCH_GELU, L_FCPROJ, L_RES3, L_COUNT
};
#define LSLOT(l, s) (G_COUNT + (l) * L_COUNT + (s))

/* Tensor k of GPT layer l in the table built by model.c. */
enum {
    T_LN1W, T_LN1B, T_QKVW, T_QKVB, T_ATTPROJW, T_ATTPROJB, T_LN2W, T_LN2B, T_FCW, T_FCB,
    T_FCPROJW, T_FCPROJB, T_PER_LAYER
};
#define GPT_LAYER_T(l, k) (2 + (l) * T_PER_LAYER + (k))

static int n_layers_of(const dt_model_layout *l) {
    return l->spec.type == DT_MODEL_GPT ? l->spec.n_layer : l->spec.n_hidden_layers + 1;
}

/* Computes slot offsets (64-byte aligned); returns the arena size. off may be NULL. */
static size_t plan_arena(const dt_device_t *dev, const dt_model_layout *lay, int B, size_t *off) {
    size_t es = dt_dtype_size(dev->ops->dtype), pos = 0;
    size_t sizes[G_COUNT] = {0};
    int nl = n_layers_of(lay);
    size_t *lsizes = calloc((size_t)nl * L_COUNT, sizeof *lsizes);
    if (lay->spec.type == DT_MODEL_GPT) {
        size_t T = (size_t)lay->spec.seq_len, C = (size_t)lay->spec.n_embd, BT = (size_t)B * T;
        size_t Vp = (size_t)lay->vocab_padded;
        int NH = lay->spec.n_head;
        sizes[G_TOKENS] = sizes[G_TARGETS] = BT * sizeof(int);
        sizes[G_ENCODED] = sizes[G_LNF] = BT * C * es;
        sizes[G_LNF_MEAN] = sizes[G_LNF_RSTD] = sizes[G_LOSSES] = BT * sizeof(float);
        sizes[G_LOGITS] = BT * Vp * es;
        sizes[G_DRES] = sizes[G_DTMP] = BT * C * es;
        sizes[G_DQKV] = BT * 3 * C * es;
        sizes[G_DFCH] = sizes[G_DFCH_GELU] = BT * 4 * C * es;
        sizes[G_ATT_SCRATCH] = dev->ops->attention_scratch_bytes(dev, B, (int)T, (int)C, NH);
        for (int l = 0; l < nl; l++) {
            size_t *s = lsizes + (size_t)l * L_COUNT;
            s[L_LN1] = s[L_ATTY] = s[L_ATTPROJ] = s[L_RES2] = s[L_LN2] = s[L_FCPROJ] =
                s[L_RES3] = BT * C * es;
            s[L_LN1_MEAN] = s[L_LN1_RSTD] = s[L_LN2_MEAN] = s[L_LN2_RSTD] = BT * sizeof(float);
            s[L_QKV] = BT * 3 * C * es;
            s[L_ATT_SAVED] = dev->ops->attention_saved_bytes(dev, B, (int)T, (int)C, NH);
            s[L_FCH] = s[L_FCH_GELU] = BT * 4 * C * es;
        }
    } else {
        size_t maxd = (size_t)lay->spec.in_dim;
        if ((size_t)lay->spec.hidden_dim > maxd) maxd = (size_t)lay->spec.hidden_dim;
        if ((size_t)lay->spec.n_classes > maxd) maxd = (size_t)lay->spec.n_classes;
        sizes[G_TARGETS] = (size_t)B * sizeof(int);
        sizes[G_FEATURES] = (size_t)B * (size_t)lay->spec.in_dim * es;
        sizes[G_LOSSES] = (size_t)B * sizeof(float);
        sizes[G_DRES] = sizes[G_DTMP] = (size_t)B * maxd * es;
        for (int l = 0; l < nl; l++) {
            size_t out = l == nl - 1 ? (size_t)lay->spec.n_classes : (size_t)lay->spec.hidden_dim;
            lsizes[(size_t)l * L_COUNT + L_LN1] = (size_t)B * out * es;
            lsizes[(size_t)l * L_COUNT + L_QKV] = (size_t)B * out * es;
        }
    }
    for (int i = 0; i < G_COUNT; i++) {
        if (off) off[i] = pos;
        pos += (sizes[i] + 63) & ~(size_t)63;
    }
    for (int i = 0; i < nl * L_COUNT; i++) {
        if (off) off[G_COUNT + i] = pos;
        pos += (lsizes[i] + 63) & ~(size_t)63;
    }
    free(lsizes);
    return pos;
}

size_t dt_net_arena_bytes(const dt_device_t *dev, const dt_model_layout *layout, int B) {
    return plan_arena(dev, layout, B, NULL);
}

dt_status_t dt_net_init(dt_net_t *net, dt_device_t *dev, const dt_model_layout *layout, int B) {
    memset(net, 0, sizeof *net);
    if (B <= 0) return dt_error(DT_STATUS_INVALID, "micro-batch must be > 0, found %d", B);
    if (layout->spec.type == DT_MODEL_GPT) { /* the table order net.c relies on */
        for (int l = 0; l < layout->spec.n_layer; l++) {
            char name[DT_MODEL_NAME_LEN];
            snprintf(name, sizeof name, "h.%d.mlp.c_proj.bias", l);
            if (dt_model_find(layout, name) != GPT_LAYER_T(l, T_FCPROJB))
                return dt_error(DT_STATUS_INVALID, "model layout out of the expected order at %s", name);
        }
    }
    net->dev = dev;
    net->layout = layout;
    net->B = B;
    net->T = layout->spec.type == DT_MODEL_GPT ? layout->spec.seq_len : 1;
    net->elsize = dt_dtype_size(dev->ops->dtype);
    net->n_rows = B * net->T;
    size_t nslots = G_COUNT + (size_t)n_layers_of(layout) * L_COUNT;
    net->off = dt_xcalloc(nslots, sizeof *net->off);
    net->arena_bytes = plan_arena(dev, layout, B, net->off);
    dt_status_t st = dev->ops->alloc(dev, DT_MEM_ACTIVATIONS, net->arena_bytes, &net->arena);
    if (st != DT_STATUS_OK) {
        free(net->off);
        net->off = NULL;
        return dt_error(st, "cannot allocate %.1f MiB of activations for micro-batch %d: %s",
                        (double)net->arena_bytes / (1 << 20), B, dt_error_detail());
    }
    net->d_tokens = (int *)((char *)net->arena + net->off[G_TOKENS]);
    net->d_targets = (int *)((char *)net->arena + net->off[G_TARGETS]);
    net->d_features = (char *)net->arena + net->off[G_FEATURES];
    net->h_losses = dt_xcalloc((size_t)net->n_rows, sizeof(float));
    net->unit_params = dt_xcalloc((size_t)layout->n_units, sizeof(void *));
    net->unit_grads = dt_xcalloc((size_t)layout->n_units, sizeof(void *));
    return DT_STATUS_OK;
}

void dt_net_free(dt_net_t *net) {
    if (net->dev && net->arena) net->dev->ops->free(net->dev, net->arena);
    free(net->off);
    free(net->h_losses);
    free(net->unit_params);
    free(net->unit_grads);
    memset(net, 0, sizeof *net);
}

void dt_net_bind(dt_net_t *net, void *params, void *grads) {
    for (int u = 0; u < net->layout->n_units; u++) {
        size_t off = net->layout->units[u].offset * net->elsize;
        net->unit_params[u] = params ? (char *)params + off : NULL;
        net->unit_grads[u] = grads ? (char *)grads + off : NULL;
    }
}

static void *ptr_in_unit(const dt_net_t *net, void *const *bases, int t) {
    const dt_tensor_info *ti = &net->layout->tensors[t];
    size_t rel = ti->offset - net->layout->units[ti->unit].offset;
    return (char *)bases[ti->unit] + rel * net->elsize;
}
#define P(t) ptr_in_unit(net, net->unit_params, (t))
#define G(t) ptr_in_unit(net, net->unit_grads, (t))
#define A(slot) ((void *)((char *)net->arena + net->off[(slot)]))
#define AF(slot) ((float *)A(slot))

static void hook(dt_net_t *net, int unit, dt_net_phase_t phase) {
    if (net->hook) net->hook(net->hook_ctx, unit, phase);
}

static void zero(dt_net_t *net, int slot, size_t elems) {
    net->dev->ops->set(net->dev, A(slot), 0, elems * net->elsize);
}

/* GPT forward up to the logits; losses too when targets were uploaded. */
static void gpt_forward(dt_net_t *net, int with_loss) {
    const dt_ops_t *o = net->dev->ops;
    dt_device_t *d = net->dev;
    const dt_model_spec *s = &net->layout->spec;
    int B = net->B, T = net->T, C = s->n_embd, NH = s->n_head, L = s->n_layer;
    int BT = B * T, V = s->vocab_size, Vp = net->layout->vocab_padded;
    hook(net, 0, DT_NET_FWD_PRE);
    o->encoder_forward(d, A(G_ENCODED), net->d_tokens, P(0), P(1), B, T, C);
    hook(net, 0, DT_NET_FWD_POST);
    void *residual = A(G_ENCODED);
    for (int l = 0; l < L; l++) {
        hook(net, 1 + l, DT_NET_FWD_PRE);
        o->layernorm_forward(d, A(LSLOT(l, L_LN1)), AF(LSLOT(l, L_LN1_MEAN)), AF(LSLOT(l, L_LN1_RSTD)),
                             residual, P(GPT_LAYER_T(l, T_LN1W)), P(GPT_LAYER_T(l, T_LN1B)), BT, C);
        o->matmul_forward(d, A(LSLOT(l, L_QKV)), A(LSLOT(l, L_LN1)), P(GPT_LAYER_T(l, T_QKVW)),
                          P(GPT_LAYER_T(l, T_QKVB)), BT, C, 3 * C);
        o->attention_forward(d, A(LSLOT(l, L_ATTY)), A(LSLOT(l, L_ATT_SAVED)), A(LSLOT(l, L_QKV)),
                             B, T, C, NH);
        o->matmul_forward(d, A(LSLOT(l, L_ATTPROJ)), A(LSLOT(l, L_ATTY)),
                          P(GPT_LAYER_T(l, T_ATTPROJW)), P(GPT_LAYER_T(l, T_ATTPROJB)), BT, C, C);
        o->residual_forward(d, A(LSLOT(l, L_RES2)), residual, A(LSLOT(l, L_ATTPROJ)), (size_t)BT * C);
        o->layernorm_forward(d, A(LSLOT(l, L_LN2)), AF(LSLOT(l, L_LN2_MEAN)), AF(LSLOT(l, L_LN2_RSTD)),
                             A(LSLOT(l, L_RES2)), P(GPT_LAYER_T(l, T_LN2W)), P(GPT_LAYER_T(l, T_LN2B)),
                             BT, C);
        o->matmul_forward(d, A(LSLOT(l, L_FCH)), A(LSLOT(l, L_LN2)), P(GPT_LAYER_T(l, T_FCW)),
                          P(GPT_LAYER_T(l, T_FCB)), BT, C, 4 * C);
        o->gelu_forward(d, A(LSLOT(l, L_FCH_GELU)), A(LSLOT(l, L_FCH)), (size_t)BT * 4 * C);
        o->matmul_forward(d, A(LSLOT(l, L_FCPROJ)), A(LSLOT(l, L_FCH_GELU)),
                          P(GPT_LAYER_T(l, T_FCPROJW)), P(GPT_LAYER_T(l, T_FCPROJB)), BT, 4 * C, C);
        o->residual_forward(d, A(LSLOT(l, L_RES3)), A(LSLOT(l, L_RES2)), A(LSLOT(l, L_FCPROJ)),
                            (size_t)BT * C);
        residual = A(LSLOT(l, L_RES3));
        hook(net, 1 + l, DT_NET_FWD_POST);
    }
    int lnf = GPT_LAYER_T(L, 0);
    hook(net, L + 1, DT_NET_FWD_PRE);
    o->layernorm_forward(d, A(G_LNF), AF(G_LNF_MEAN), AF(G_LNF_RSTD), residual, P(lnf), P(lnf + 1),
                         BT, C);
    hook(net, L + 1, DT_NET_FWD_POST);
    hook(net, 0, DT_NET_FWD_PRE);
    o->matmul_forward(d, A(G_LOGITS), A(G_LNF), P(0), NULL, BT, C, Vp);
    hook(net, 0, DT_NET_FWD_POST);
    if (with_loss) o->softmax_xent_forward(d, AF(G_LOSSES), A(G_LOGITS), net->d_targets, BT, V, Vp);
}

static void gpt_backward(dt_net_t *net, float dscale) {
    const dt_ops_t *o = net->dev->ops;
    dt_device_t *d = net->dev;
    const dt_model_spec *s = &net->layout->spec;
    int B = net->B, T = net->T, C = s->n_embd, NH = s->n_head, L = s->n_layer;
    int BT = B * T, V = s->vocab_size, Vp = net->layout->vocab_padded;
    size_t btc = (size_t)BT * C;
    hook(net, 0, DT_NET_BWD_PRE);
    /* The logits buffer becomes dlogits. */
    o->softmax_xent_backward(d, A(G_LOGITS), NULL, A(G_LOGITS), net->d_targets, dscale, BT, V, Vp);
    zero(net, G_DTMP, btc);
    o->matmul_backward(d, A(G_DTMP), G(0), NULL, A(G_LOGITS), A(G_LNF), P(0), BT, C, Vp);
    int lnf = GPT_LAYER_T(L, 0);
    void *last = L > 0 ? A(LSLOT(L - 1, L_RES3)) : A(G_ENCODED);
    hook(net, L + 1, DT_NET_BWD_PRE);
    zero(net, G_DRES, btc);
    o->layernorm_backward(d, A(G_DRES), G(lnf), G(lnf + 1), A(G_DTMP), last, P(lnf), AF(G_LNF_MEAN),
                          AF(G_LNF_RSTD), BT, C);
    hook(net, L + 1, DT_NET_BWD_POST);
    for (int l = L - 1; l >= 0; l--) {
        hook(net, 1 + l, DT_NET_BWD_PRE);
        void *residual = l > 0 ? A(LSLOT(l - 1, L_RES3)) : A(G_ENCODED);
        /* dres holds d(res3) = d(fcproj) = the part of d(res2) from the skip. */
        zero(net, G_DFCH_GELU, btc * 4);
        o->matmul_backward(d, A(G_DFCH_GELU), G(GPT_LAYER_T(l, T_FCPROJW)), G(GPT_LAYER_T(l, T_FCPROJB)),
                           A(G_DRES), A(LSLOT(l, L_FCH_GELU)), P(GPT_LAYER_T(l, T_FCPROJW)), BT, 4 * C, C);
        zero(net, G_DFCH, btc * 4);
        o->gelu_backward(d, A(G_DFCH), A(LSLOT(l, L_FCH)), A(G_DFCH_GELU), btc * 4);
        zero(net, G_DTMP, btc);
        o->matmul_backward(d, A(G_DTMP), G(GPT_LAYER_T(l, T_FCW)), G(GPT_LAYER_T(l, T_FCB)), A(G_DFCH),
                           A(LSLOT(l, L_LN2)), P(GPT_LAYER_T(l, T_FCW)), BT, C, 4 * C);
        o->layernorm_backward(d, A(G_DRES), G(GPT_LAYER_T(l, T_LN2W)), G(GPT_LAYER_T(l, T_LN2B)),
                              A(G_DTMP), A(LSLOT(l, L_RES2)), P(GPT_LAYER_T(l, T_LN2W)),
                              AF(LSLOT(l, L_LN2_MEAN)), AF(LSLOT(l, L_LN2_RSTD)), BT, C);
        /* dres now holds d(res2) = d(attproj) = the skip part of d(residual). */
        zero(net, G_DTMP, btc);
        o->matmul_backward(d, A(G_DTMP), G(GPT_LAYER_T(l, T_ATTPROJW)), G(GPT_LAYER_T(l, T_ATTPROJB)),
                           A(G_DRES), A(LSLOT(l, L_ATTY)), P(GPT_LAYER_T(l, T_ATTPROJW)), BT, C, C);
        zero(net, G_DQKV, btc * 3);
        o->attention_backward(d, A(G_DQKV), A(G_ATT_SCRATCH), A(G_DTMP), A(LSLOT(l, L_QKV)),
                              A(LSLOT(l, L_ATT_SAVED)), B, T, C, NH);
        zero(net, G_DTMP, btc);
        o->matmul_backward(d, A(G_DTMP), G(GPT_LAYER_T(l, T_QKVW)), G(GPT_LAYER_T(l, T_QKVB)), A(G_DQKV),
                           A(LSLOT(l, L_LN1)), P(GPT_LAYER_T(l, T_QKVW)), BT, C, 3 * C);
        o->layernorm_backward(d, A(G_DRES), G(GPT_LAYER_T(l, T_LN1W)), G(GPT_LAYER_T(l, T_LN1B)),
                              A(G_DTMP), residual, P(GPT_LAYER_T(l, T_LN1W)), AF(LSLOT(l, L_LN1_MEAN)),
                              AF(LSLOT(l, L_LN1_RSTD)), BT, C);
        hook(net, 1 + l, DT_NET_BWD_POST);
    }
    o->encoder_backward(d, G(0), G(1), A(G_DRES), net->d_tokens, B, T, C);
    hook(net, 0, DT_NET_BWD_POST);
}

static void mlp_forward(dt_net_t *net) {
    const dt_ops_t *o = net->dev->ops;
    dt_device_t *d = net->dev;
    const dt_model_spec *s = &net->layout->spec;
    int B = net->B, nl = n_layers_of(net->layout), in = s->in_dim;
    const void *x = net->d_features;
    for (int l = 0; l < nl; l++) {
        int out = l == nl - 1 ? s->n_classes : s->hidden_dim;
        hook(net, l, DT_NET_FWD_PRE);
        o->matmul_forward(d, A(LSLOT(l, L_LN1)), x, P(2 * l), P(2 * l + 1), B, in, out);
        if (l < nl - 1) o->relu_forward(d, A(LSLOT(l, L_QKV)), A(LSLOT(l, L_LN1)), (size_t)B * out);
        hook(net, l, DT_NET_FWD_POST);
        x = A(LSLOT(l, L_QKV));
        in = out;
    }
    o->softmax_xent_forward(d, AF(G_LOSSES), A(LSLOT(nl - 1, L_LN1)), net->d_targets, B, s->n_classes,
                            s->n_classes);
}

static void mlp_backward(dt_net_t *net, float dscale) {
    const dt_ops_t *o = net->dev->ops;
    dt_device_t *d = net->dev;
    const dt_model_spec *s = &net->layout->spec;
    int B = net->B, nl = n_layers_of(net->layout);
    /* G_DRES: gradient at the current layer's output; G_DTMP: at its input. */
    o->softmax_xent_backward(d, A(G_DRES), NULL, A(LSLOT(nl - 1, L_LN1)), net->d_targets, dscale, B,
                             s->n_classes, s->n_classes);
    for (int l = nl - 1; l >= 0; l--) {
        int out = l == nl - 1 ? s->n_classes : s->hidden_dim;
        int in = l == 0 ? s->in_dim : s->hidden_dim;
        const void *x = l == 0 ? net->d_features : A(LSLOT(l - 1, L_QKV));
        hook(net, l, DT_NET_BWD_PRE);
        if (l > 0) zero(net, G_DTMP, (size_t)B * in);
        o->matmul_backward(d, l > 0 ? A(G_DTMP) : NULL, G(2 * l), G(2 * l + 1), A(G_DRES), x, P(2 * l),
                           B, in, out);
        if (l > 0) {
            zero(net, G_DRES, (size_t)B * in);
            o->relu_backward(d, A(G_DRES), A(LSLOT(l - 1, L_LN1)), A(G_DTMP), (size_t)B * in);
        }
        hook(net, l, DT_NET_BWD_POST);
    }
}

static dt_status_t upload(dt_net_t *net, void *dst, const void *src, size_t bytes) {
    return net->dev->ops->copy(net->dev, dst, src, bytes, DT_COPY_HOST_TO_DEVICE);
}

dt_status_t dt_net_forward(dt_net_t *net, const dt_batch *batch, double *mean_loss) {
    const dt_model_spec *s = &net->layout->spec;
    size_t rows = (size_t)net->n_rows;
    if (s->type == DT_MODEL_GPT) {
        DT_CHECK(upload(net, net->d_tokens, batch->tokens, rows * sizeof(int)));
        DT_CHECK(upload(net, net->d_targets, batch->targets, rows * sizeof(int)));
        gpt_forward(net, 1);
    } else {
        DT_CHECK(net->dev->ops->upload_f32(net->dev, net->d_features, batch->features,
                                           (size_t)net->B * (size_t)s->in_dim));
        DT_CHECK(upload(net, net->d_targets, batch->targets, rows * sizeof(int)));
        mlp_forward(net);
    }
    DT_CHECK(net->dev->ops->copy(net->dev, net->h_losses, A(G_LOSSES), rows * sizeof(float),
                                 DT_COPY_DEVICE_TO_HOST));
    DT_CHECK(net->dev->ops->synchronize(net->dev));
    double sum = 0;
    for (size_t i = 0; i < rows; i++) sum += net->h_losses[i];
    *mean_loss = sum / (double)rows;
    net->have_forward = 1;
    return DT_STATUS_OK;
}

dt_status_t dt_net_backward(dt_net_t *net, float dscale) {
    if (!net->have_forward) return dt_error(DT_STATUS_INVALID, "backward without a forward");
    if (net->layout->spec.type == DT_MODEL_GPT) gpt_backward(net, dscale);
    else mlp_backward(net, dscale);
    net->have_forward = 0; /* the logits were consumed */
    return net->dev->ops->synchronize(net->dev);
}

dt_status_t dt_net_logits(dt_net_t *net, const int32_t *tokens, int b, int t, float *out) {
    if (net->layout->spec.type != DT_MODEL_GPT)
        return dt_error(DT_STATUS_UNSUPPORTED, "logits are for GPT models");
    size_t rows = (size_t)net->n_rows;
    DT_CHECK(upload(net, net->d_tokens, tokens, rows * sizeof(int)));
    gpt_forward(net, 0);
    size_t Vp = (size_t)net->layout->vocab_padded;
    const char *row = (const char *)A(G_LOGITS) + ((size_t)b * (size_t)net->T + (size_t)t) * Vp * net->elsize;
    net->have_forward = 0;
    DT_CHECK(net->dev->ops->download_f32(net->dev, out, row, Vp));
    return net->dev->ops->synchronize(net->dev);
}
