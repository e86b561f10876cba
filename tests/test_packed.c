/*
 * test_packed.c - packed sequences through CPU nets (net.h: dt_batch.positions):
 * gpt (wpe rows by position, tied head) and llama (RoPE by position, grouped
 * query heads) with one row packing three documents of 5, 7 and 4 tokens give each
 * token's loss and the parameter gradients of running each document alone (its own
 * row, the rest untrained) within 1e-5 (tests/packed_harness.h): as a whole net,
 * under selective and full recomputation (bitwise the packed run without), and as
 * two pipeline chunks, the second of which reads no tokens but the positions, and
 * as two tensor-parallel ranks (threads of this process with in-memory
 * collectives), with and without sequence parallelism. The positions are checked
 * at upload, and each arena keeps its own batch's.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/packed_harness.h"

#define TOL 1e-5

static dt_device_t *cpu(void) {
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 1), DT_STATUS_OK, "%s", dt_error_detail());
    return dev;
}

static void expect_bitwise(const pk_run *a, const pk_run *b, const char *what) {
    cr_assert_eq(a->n, b->n);
    cr_assert(memcmp(a->losses, b->losses, sizeof a->losses) == 0, "%s: losses differ", what);
    size_t diff = 0;
    for (size_t i = 0; i < a->n; i++) diff += memcmp(&a->grads[i], &b->grads[i], sizeof(float)) != 0;
    cr_assert_eq(diff, 0, "%s: %zu of %zu gradients differ", what, diff, a->n);
}

/* Whole net, each recomputation policy, and the two chunks (with and without full
 * recomputation) against the documents alone. */
static void packed_equals_alone(int llama) {
    dt_device_t *dev = cpu();
    dt_model_spec s = pk_spec(llama);
    pk_run alone = pk_run_whole(dev, &s, DT_MODEL_RECOMPUTE_NONE, 0);
    pk_run packed = pk_run_whole(dev, &s, DT_MODEL_RECOMPUTE_NONE, 1);
    pk_expect_close(&packed, &alone, TOL, "packed whole");
    const struct {
        dt_model_recompute_t p;
        const char *name;
    } policies[] = {{DT_MODEL_RECOMPUTE_SELECTIVE, "packed, selective recomputation"},
                    {DT_MODEL_RECOMPUTE_FULL, "packed, full recomputation"}};
    for (int i = 0; i < 2; i++) {
        pk_run r = pk_run_whole(dev, &s, policies[i].p, 1);
        expect_bitwise(&r, &packed, policies[i].name);
        pk_free(&r);
    }
    for (int full = 0; full < 2; full++) {
        pk_run r = pk_run_chunks(dev, &s, full ? DT_MODEL_RECOMPUTE_FULL : DT_MODEL_RECOMPUTE_NONE, 1);
        pk_expect_close(&r, &alone, TOL, full ? "packed, two chunks, full recomputation" : "packed, two chunks");
        pk_free(&r);
    }
    pk_free(&alone), pk_free(&packed);
    dt_device_free(dev);
}

Test(packed, gpt_packed_equals_documents_alone) { packed_equals_alone(0); }
Test(packed, llama_packed_equals_documents_alone) { packed_equals_alone(1); }

/* The packing matters: without its positions the packed row is one document, and
 * the losses of the second and third documents change. */
Test(packed, positions_change_the_result) {
    dt_device_t *dev = cpu();
    for (int llama = 0; llama < 2; llama++) {
        dt_model_spec s = pk_spec(llama);
        dt_model_layout lay;
        cr_assert_eq(dt_model_layout_init(&s, &lay), DT_STATUS_OK, "%s", dt_error_detail());
        float *params = calloc(lay.n_params, sizeof(float));
        dt_model_init_params(&lay, 5, params);
        dt_net_t net;
        cr_assert_eq(dt_net_init(&net, dev, &lay, 1), DT_STATUS_OK, "%s", dt_error_detail());
        dt_net_bind(&net, params, NULL);
        pk_batch bt;
        pk_batch_init(&bt, 1);
        double with, without;
        cr_assert_eq(dt_net_forward(&net, &bt.b, &with), DT_STATUS_OK, "%s", dt_error_detail());
        float first = net.h_losses[0], third = net.h_losses[PK_T - 1];
        bt.b.positions = NULL;
        cr_assert_eq(dt_net_forward(&net, &bt.b, &without), DT_STATUS_OK, "%s", dt_error_detail());
        cr_assert_eq(net.h_losses[0], first, "%s: the first token sees only itself either way", s.ops->name);
        cr_assert_neq(net.h_losses[PK_T - 1], third, "%s: the last document sees the others", s.ops->name);
        dt_net_free(&net);
        dt_model_layout_free(&lay);
        free(params);
    }
    dt_device_free(dev);
}

/* Two arenas in flight, one packed and one not (a pipeline keeps several
 * micro-batches): each backward uses its own arena's positions, so the gradients
 * are those of the two run one after the other in one arena, bitwise. */
Test(packed, arenas_keep_their_own_positions) {
    dt_device_t *dev = cpu();
    dt_model_spec s = pk_spec(1);
    dt_model_layout lay;
    cr_assert_eq(dt_model_layout_init(&s, &lay), DT_STATUS_OK, "%s", dt_error_detail());
    float *params = calloc(lay.n_params, sizeof(float));
    float *g1 = calloc(lay.n_params, sizeof(float)), *g2 = calloc(lay.n_params, sizeof(float));
    dt_model_init_params(&lay, 5, params);
    pk_batch packed, plain;
    pk_batch_init(&packed, 1);
    pk_batch_init(&plain, 1);
    plain.b.positions = NULL;
    double loss;
    float l1[2][PK_T], l2[2][PK_T];
    /* in turn, one arena */
    dt_net_t net;
    cr_assert_eq(dt_net_init(&net, dev, &lay, 1), DT_STATUS_OK, "%s", dt_error_detail());
    dt_net_bind(&net, params, g1);
    const dt_batch *order[2] = {&packed.b, &plain.b};
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(dt_net_forward(&net, order[k], &loss), DT_STATUS_OK, "%s", dt_error_detail());
        memcpy(l1[k], net.h_losses, sizeof l1[k]);
        cr_assert_eq(dt_net_backward(&net, 1.0f), DT_STATUS_OK, "%s", dt_error_detail());
    }
    dt_net_free(&net);
    /* both forwards first, in two arenas, then both backwards */
    cr_assert_eq(dt_net_init(&net, dev, &lay, 1), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_net_arenas(&net, 2), DT_STATUS_OK, "%s", dt_error_detail());
    dt_net_bind(&net, params, g2);
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(dt_net_use(&net, k), DT_STATUS_OK);
        cr_assert_eq(dt_net_forward(&net, order[k], &loss), DT_STATUS_OK, "%s", dt_error_detail());
        memcpy(l2[k], net.h_losses, sizeof l2[k]);
        cr_assert_eq(net.d_positions != NULL, k == 0);
    }
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(dt_net_use(&net, k), DT_STATUS_OK);
        cr_assert_eq(net.d_positions != NULL, k == 0, "arena %d: its own batch's positions", k);
        cr_assert_eq(dt_net_backward(&net, 1.0f), DT_STATUS_OK, "%s", dt_error_detail());
    }
    cr_assert(memcmp(l1, l2, sizeof l1) == 0, "losses");
    size_t diff = 0;
    for (size_t i = 0; i < lay.n_params; i++) diff += memcmp(&g1[i], &g2[i], sizeof(float)) != 0;
    cr_assert_eq(diff, 0, "%zu of %zu gradients differ", diff, lay.n_params);
    dt_net_free(&net);
    dt_model_layout_free(&lay);
    free(params), free(g1), free(g2);
    dt_device_free(dev);
}

/* Positions that break the rule are refused at upload naming the row and column;
 * a model without tokens takes none. */
Test(packed, bad_positions_are_refused) {
    dt_device_t *dev = cpu();
    dt_model_spec s = pk_spec(0);
    dt_model_layout lay;
    cr_assert_eq(dt_model_layout_init(&s, &lay), DT_STATUS_OK, "%s", dt_error_detail());
    float *params = calloc(lay.n_params, sizeof(float));
    dt_net_t net;
    cr_assert_eq(dt_net_init(&net, dev, &lay, 2), DT_STATUS_OK, "%s", dt_error_detail());
    dt_net_bind(&net, params, NULL);
    int32_t tok[2 * PK_T] = {0}, tgt[2 * PK_T] = {0}, pos[2 * PK_T];
    for (int i = 0; i < 2 * PK_T; i++) pos[i] = i % PK_T;
    dt_batch b = {.tokens = tok, .targets = tgt, .positions = pos};
    double loss;
    cr_assert_eq(dt_net_forward(&net, &b, &loss), DT_STATUS_OK, "%s", dt_error_detail());
    const struct {
        int at, value;
        const char *want;
    } bad[] = {{PK_T, 1, "positions[1][0] = 1"},       /* a row starts a document */
               {PK_T + 3, 5, "positions[1][3] = 5"},   /* neither 0 nor the previous + 1 */
               {7, -1, "positions[0][7] = -1"},
               {3, 1, "positions[0][3] = 1"}};         /* a step back */
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int keep = pos[bad[k].at];
        pos[bad[k].at] = bad[k].value;
        cr_assert_eq(dt_net_forward(&net, &b, &loss), DT_STATUS_INVALID, "%s", bad[k].want);
        cr_assert(strstr(dt_error_detail(), bad[k].want), "%s", dt_error_detail());
        pos[bad[k].at] = keep;
    }
    cr_assert_eq(dt_net_check_positions(pos, 2, PK_T), DT_STATUS_OK);
    dt_net_free(&net);
    dt_model_layout_free(&lay);
    free(params);

    dt_model_spec m = {.ops = &dt_model_mlp, .in_dim = 3, .hidden_dim = 4, .n_hidden_layers = 1, .n_classes = 2};
    cr_assert_eq(dt_model_layout_init(&m, &lay), DT_STATUS_OK, "%s", dt_error_detail());
    params = calloc(lay.n_params, sizeof(float));
    cr_assert_eq(dt_net_init(&net, dev, &lay, 2), DT_STATUS_OK, "%s", dt_error_detail());
    dt_net_bind(&net, params, NULL);
    float feat[6] = {0};
    int32_t cls[2] = {0, 1}, two[2] = {0, 0};
    dt_batch f = {.features = feat, .targets = cls, .positions = two};
    cr_assert_eq(dt_net_forward(&net, &f, &loss), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "takes no positions"), "%s", dt_error_detail());
    dt_net_free(&net);
    dt_model_layout_free(&lay);
    free(params);
    dt_device_free(dev);
}

/* ---- tensor parallelism: two ranks as two threads ------------------------------ */

/* The collectives of net.h's dt_net_tp_ops over two threads' fp32 buffers: each
 * rank publishes its input, both wait, each computes its result in rank order, both
 * wait again before the inputs may change. */
typedef struct tp_group {
    pthread_barrier_t bar;
    const float *in[2];
} tp_group;

typedef struct tp_rank {
    tp_group *g;
    int rank;
    const dt_model_spec *spec;
    int sp, packed;
    pk_run out; /* this rank's piece's gradients (its local layout) */
} tp_rank;

static void tp_publish(tp_rank *r, const void *in) {
    r->g->in[r->rank] = in;
    pthread_barrier_wait(&r->g->bar);
}

static void tp_all_reduce(void *ctx, void *buf, size_t count, int f32, int max) {
    tp_rank *r = ctx;
    float *b = buf, *mine = malloc(count * sizeof *mine);
    memcpy(mine, b, count * sizeof *mine);
    tp_publish(r, mine);
    const float *a = r->g->in[0], *c = r->g->in[1];
    for (size_t i = 0; i < count; i++) b[i] = max ? fmaxf(a[i], c[i]) : a[i] + c[i];
    pthread_barrier_wait(&r->g->bar);
    free(mine);
}

static void tp_all_gather(void *ctx, const void *send, void *recv, size_t count) {
    tp_rank *r = ctx;
    tp_publish(r, send);
    for (int k = 0; k < 2; k++) memcpy((float *)recv + k * count, r->g->in[k], count * sizeof(float));
    pthread_barrier_wait(&r->g->bar);
}

static void tp_reduce_scatter(void *ctx, const void *send, void *recv, size_t count) {
    tp_rank *r = ctx;
    tp_publish(r, send);
    size_t n = count / 2, o = (size_t)r->rank * n;
    for (size_t i = 0; i < n; i++) ((float *)recv)[i] = r->g->in[0][o + i] + r->g->in[1][o + i];
    pthread_barrier_wait(&r->g->bar);
}

static void *tp_reduce_start(void *ctx, void *part, void *out, size_t count) {
    if (out == part) tp_all_reduce(ctx, part, count, 0, 0);
    else tp_reduce_scatter(ctx, part, out, count);
    return part;
}

static void tp_wait(void *ctx, void *handle) { (void)ctx, (void)handle; }

static const dt_net_tp_ops tp_threads = {tp_all_reduce, tp_all_gather, tp_reduce_scatter, tp_reduce_start, tp_wait};

/* One rank: its piece of the model, a forward and backward of the batch. */
static void *tp_rank_main(void *arg) {
    tp_rank *r = arg;
    dt_device_t *dev = cpu();
    dt_model_layout lay;
    cr_assert_eq(dt_model_layout_init_tp(r->spec, 2, r->rank, r->sp, &lay), DT_STATUS_OK, "%s", dt_error_detail());
    pk_batch bt;
    pk_batch_init(&bt, r->packed);
    float *params = calloc(lay.n_params, sizeof(float));
    r->out = (pk_run){.n = lay.n_params, .grads = calloc(lay.n_params, sizeof(float))};
    dt_model_init_params(&lay, 5, params);
    dt_net_t net;
    cr_assert_eq(dt_net_init(&net, dev, &lay, bt.B), DT_STATUS_OK, "%s", dt_error_detail());
    dt_net_bind(&net, params, r->out.grads);
    net.tp = &tp_threads;
    net.tp_ctx = r;
    double loss;
    cr_assert_eq(dt_net_forward(&net, &bt.b, &loss), DT_STATUS_OK, "%s", dt_error_detail());
    pk_losses(&r->out, &net, r->packed);
    cr_assert_eq(dt_net_backward(&net, 1.0f), DT_STATUS_OK, "%s", dt_error_detail());
    dt_net_free(&net);
    dt_model_layout_free(&lay);
    free(params);
    dt_device_free(dev);
    return NULL;
}

static void run_tp(const dt_model_spec *s, int sp, int packed, pk_run out[2]) {
    tp_group g;
    pthread_barrier_init(&g.bar, NULL, 2);
    tp_rank r[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        r[k] = (tp_rank){.g = &g, .rank = k, .spec = s, .sp = sp, .packed = packed};
        cr_assert_eq(pthread_create(&th[k], NULL, tp_rank_main, &r[k]), 0);
    }
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL), out[k] = r[k].out;
    pthread_barrier_destroy(&g.bar);
}

Test(packed, tensor_parallel_packed_equals_documents_alone) {
    for (int llama = 0; llama < 2; llama++)
        for (int sp = 0; sp < 2; sp++) {
            dt_model_spec s = pk_spec(llama);
            pk_run packed[2], alone[2];
            run_tp(&s, sp, 1, packed);
            run_tp(&s, sp, 0, alone);
            dt_device_t *dev = cpu(); /* the losses are the whole model's (TP ran) */
            pk_run whole = pk_run_whole(dev, &s, DT_MODEL_RECOMPUTE_NONE, 1);
            dt_device_free(dev);
            for (int k = 0; k < 2; k++) {
                char what[96];
                snprintf(what, sizeof what, "%s TP 2 rank %d%s", s.ops->name, k, sp ? ", sequence parallel" : "");
                pk_expect_close(&packed[k], &alone[k], TOL, what);
                for (int i = 0; i < PK_T; i++)
                    cr_assert(fabsf(packed[k].losses[i] - whole.losses[i]) <= TOL, "%s: loss %d %.9g vs TP 1 %.9g",
                              what, i, packed[k].losses[i], whole.losses[i]);
                pk_free(&packed[k]), pk_free(&alone[k]);
            }
            pk_free(&whole);
        }
}
