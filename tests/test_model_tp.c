/*
 * test_model_tp.c - tensor-parallel layouts (model.h): the pieces of every TP rank
 * tile the global model exactly once (replicated tensors aside), each piece's
 * elements are the global tensor's rows or columns Megatron's cut gives (checked
 * against the cut done by hand on a tensor's (row, column) indices), a TP piece
 * initialises to the global model's values, dt_model_tp_fill reads a piece from a
 * global source in spans, and bad TP sizes are refused naming the key.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/model/model.h"

static dt_model_spec gpt_spec(void) {
    return (dt_model_spec){.ops = &dt_model_gpt, .n_layer = 2, .n_head = 4, .n_embd = 16, .seq_len = 8,
                           .vocab_size = 50, .vocab_pad_multiple = 8};
}

static dt_model_spec llama_spec(void) {
    dt_model_spec s = {.ops = &dt_model_llama};
    for (int i = 0; i < dt_model_llama.n_keys; i++) { /* defaults */
        const dt_model_key *k = &dt_model_llama.keys[i];
        dt_model_key_set(&s, k, strtod(k->def, NULL));
    }
    const struct {
        const char *key;
        double v;
    } set[] = {{"model.hidden_size", 32}, {"model.num_hidden_layers", 2}, {"model.num_attention_heads", 4},
               {"model.num_key_value_heads", 2}, {"model.intermediate_size", 48}, {"model.seq_len", 8},
               {"model.vocab_size", 40}, {"model.vocab_pad_multiple", 8}, {"model.attention_bias", 1}};
    for (size_t i = 0; i < sizeof set / sizeof *set; i++)
        dt_model_key_set(&s, dt_model_key_find(&dt_model_llama, set[i].key), set[i].v);
    return s;
}

typedef struct cover {
    int *hits;       /* per global element: times written by a non-replicated piece */
    int *rep_hits;   /* ... by a replicated piece */
    size_t last_local, last_global;
    int monotone;
} cover;

static void count_piece(void *ctx, size_t local, size_t global, size_t n, int replicated) {
    cover *c = ctx;
    if (local < c->last_local || global < c->last_global) c->monotone = 0;
    c->last_local = local + n;
    c->last_global = global + n;
    for (size_t i = 0; i < n; i++) (replicated ? c->rep_hits : c->hits)[global + i]++;
}

/* Every TP rank's pieces together: each cut element exactly once, each replicated
 * element once per rank; pieces in increasing local and global order. */
static void check_tiling(dt_model_spec spec, int tp) {
    dt_model_layout g;
    cr_assert_eq(dt_model_layout_init(&spec, &g), DT_STATUS_OK, "%s", dt_error_detail());
    cover c = {.hits = calloc(g.n_params, sizeof(int)), .rep_hits = calloc(g.n_params, sizeof(int))};
    size_t local_total = 0;
    for (int r = 0; r < tp; r++) {
        dt_model_layout l;
        cr_assert_eq(dt_model_layout_init_tp(&spec, tp, r, 0, &l), DT_STATUS_OK, "%s", dt_error_detail());
        cr_assert_eq((l.global ? l.global : &l)->n_params, g.n_params); /* TP 1: no separate global */
        c.last_local = c.last_global = 0;
        c.monotone = 1;
        dt_model_tp_segments(&l, 0, l.n_params, count_piece, &c);
        cr_assert(c.monotone, "TP %d rank %d: pieces out of order", tp, r);
        if (r == 0) local_total = l.n_params;
        cr_assert_eq(l.n_params, local_total, "TP ranks hold pieces of the same size");
        dt_model_layout_free(&l);
    }
    for (size_t i = 0; i < g.n_params; i++) {
        int cut = c.hits[i], rep = c.rep_hits[i];
        cr_assert((cut == 1 && rep == 0) || (cut == 0 && rep == tp), "TP %d: global element %zu held %d + %d/%d times",
                  tp, i, cut, rep, tp);
    }
    free(c.hits);
    free(c.rep_hits);
    dt_model_layout_free(&g);
}

Test(model_tp, pieces_tile_the_global_model) {
    for (int tp = 1; tp <= 4; tp *= 2) check_tiling(gpt_spec(), tp);
    check_tiling(llama_spec(), 2); /* 2 key/value heads: one per rank */
}

typedef struct one_piece {
    size_t *global_of; /* per local element */
} one_piece;

static void note_piece(void *ctx, size_t local, size_t global, size_t n, int replicated) {
    (void)replicated;
    one_piece *p = ctx;
    for (size_t i = 0; i < n; i++) p->global_of[local + i] = global + i;
}

/* Megatron's cut by hand on (row, column) indices: gpt's fused c_attn rows are
 * q|k|v, each part cut in T; c_proj's columns are cut; wte's vocabulary rows. */
Test(model_tp, pieces_are_megatrons_cut) {
    dt_model_spec spec = gpt_spec();
    int tp = 2, C = 16;
    for (int r = 0; r < tp; r++) {
        dt_model_layout l;
        cr_assert_eq(dt_model_layout_init_tp(&spec, tp, r, 0, &l), DT_STATUS_OK);
        one_piece p = {calloc(l.n_params, sizeof(size_t))};
        dt_model_tp_segments(&l, 0, l.n_params, note_piece, &p);
        const dt_model_layout *g = l.global;
        int t = dt_model_find(&l, "h.1.attn.c_attn.weight");
        cr_assert_eq(l.tensors[t].shape[0], 3 * C / tp);
        for (int i = 0; i < 3 * C / tp; i++)
            for (int j = 0; j < C; j++) {
                int part = i / (C / tp), row = part * C + r * (C / tp) + i % (C / tp);
                size_t want = g->tensors[t].offset + (size_t)row * C + j;
                cr_assert_eq(p.global_of[l.tensors[t].offset + (size_t)i * C + j], want, "c_attn (%d, %d)", i, j);
            }
        t = dt_model_find(&l, "h.0.mlp.c_proj.weight"); /* (C, 4C) cut along 4C */
        cr_assert_eq(l.tensors[t].shape[1], 4 * C / tp);
        for (int i = 0; i < C; i++)
            for (int j = 0; j < 4 * C / tp; j++) {
                size_t want = g->tensors[t].offset + (size_t)i * 4 * C + (size_t)r * (4 * C / tp) + j;
                cr_assert_eq(p.global_of[l.tensors[t].offset + (size_t)i * (4 * C / tp) + j], want, "c_proj (%d, %d)",
                             i, j);
            }
        t = dt_model_find(&l, "wte.weight"); /* 56 padded rows: 28 per rank */
        cr_assert_eq(l.tensors[t].shape[0], 28);
        cr_assert_eq(p.global_of[l.tensors[t].offset], g->tensors[t].offset + (size_t)r * 28 * C);
        t = dt_model_find(&l, "h.0.ln_1.weight");
        cr_assert_eq(l.tensors[t].shape[0], C);
        cr_assert_eq(p.global_of[l.tensors[t].offset], g->tensors[t].offset);
        free(p.global_of);
        dt_model_layout_free(&l);
    }
}

/* A piece's initial values are the global model's at its elements, and
 * dt_model_tp_fill from a global buffer gives the same (any sub-range too). */
typedef struct from_buffer {
    const float *global;
    int reads;
} from_buffer;

static dt_status_t read_buffer(void *ctx, size_t goffset, size_t n, float *dst) {
    from_buffer *b = ctx;
    memcpy(dst, b->global + goffset, n * sizeof(float));
    b->reads++;
    return DT_STATUS_OK;
}

Test(model_tp, init_and_fill_equal_the_global_models_values) {
    dt_model_spec specs[] = {gpt_spec(), llama_spec()};
    for (int s = 0; s < 2; s++) {
        dt_model_layout g;
        cr_assert_eq(dt_model_layout_init(&specs[s], &g), DT_STATUS_OK);
        float *global = malloc(g.n_params * sizeof(float));
        dt_model_init_params(&g, 42, global);
        for (int r = 0; r < 2; r++) {
            dt_model_layout l;
            cr_assert_eq(dt_model_layout_init_tp(&specs[s], 2, r, 1, &l), DT_STATUS_OK);
            cr_assert(l.sequence_parallel);
            one_piece p = {calloc(l.n_params, sizeof(size_t))};
            dt_model_tp_segments(&l, 0, l.n_params, note_piece, &p);
            float *mine = malloc(l.n_params * sizeof(float)), *filled = malloc(l.n_params * sizeof(float));
            dt_model_init_params(&l, 42, mine);
            from_buffer b = {global, 0};
            cr_assert_eq(dt_model_tp_fill(&l, 0, l.n_params, filled, read_buffer, &b), DT_STATUS_OK);
            for (size_t i = 0; i < l.n_params; i++) {
                cr_assert_eq(mine[i], global[p.global_of[i]], "spec %d rank %d element %zu", s, r, i);
                cr_assert_eq(filled[i], mine[i]);
            }
            /* spans: far fewer reads than pieces */
            int pieces = 0;
            for (int t = 0; t < l.n_tensors; t++)
                pieces += l.tensors[t].tp_split == DT_TP_COLS ? (int)l.tensors[t].shape[0] : 1;
            cr_assert_lt(b.reads, pieces / 4, "%d reads for %d pieces", b.reads, pieces);
            /* a sub-range in the middle of a row-parallel weight */
            int t = s == 0 ? dt_model_find(&l, "h.0.attn.c_proj.weight")
                           : dt_model_find(&l, "model.layers.0.self_attn.o_proj.weight");
            size_t off = l.tensors[t].offset + 5, n = l.tensors[t].numel - 9;
            memset(filled, 0, l.n_params * sizeof(float));
            cr_assert_eq(dt_model_tp_fill(&l, off, n, filled, read_buffer, &b), DT_STATUS_OK);
            for (size_t i = 0; i < n; i++) cr_assert_eq(filled[i], mine[off + i]);
            dt_model_init_range(&l, 42, off, n, filled);
            for (size_t i = 0; i < n; i++) cr_assert_eq(filled[i], mine[off + i]);
            free(mine);
            free(filled);
            free(p.global_of);
            dt_model_layout_free(&l);
        }
        free(global);
        dt_model_layout_free(&g);
    }
}

Test(model_tp, bad_sizes_name_the_key) {
    char msg[512];
    dt_model_spec g = gpt_spec();
    cr_assert_eq(dt_model_tp_check(&g, 3, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "model.n_head"), "%s", msg);
    dt_model_spec v = gpt_spec();
    v.vocab_pad_multiple = 1; /* 50 rows over 4 */
    cr_assert_eq(dt_model_tp_check(&v, 4, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "model.vocab_pad_multiple"), "%s", msg);
    dt_model_spec l = llama_spec();
    cr_assert_eq(dt_model_tp_check(&l, 4, msg, sizeof msg), 1); /* 2 key/value heads */
    cr_assert(strstr(msg, "model.num_key_value_heads"), "%s", msg);
    dt_model_spec m = {.ops = &dt_model_mlp, .in_dim = 4, .hidden_dim = 8, .n_hidden_layers = 1, .n_classes = 3};
    cr_assert_eq(dt_model_tp_check(&m, 2, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "tensor_parallel.size") && strstr(msg, "mlp"), "%s", msg);
    dt_model_layout out;
    cr_assert_eq(dt_model_layout_init_tp(&g, 3, 0, 0, &out), DT_STATUS_CONFIG);
    cr_assert_eq(dt_model_tp_check(&g, 1, msg, sizeof msg), 0);
    cr_assert_eq(dt_model_tp_check(&g, 4, msg, sizeof msg), 0);
}
