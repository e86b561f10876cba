/*
 * test_plan.c - dtrun plan's arithmetic against the standard figures (16 bytes
 * per parameter, the ZeRO paper's 7.5B model on 64 GPUs), hand-computed ring
 * collectives, activations and cost, the exact GPT-2 124M count, the hardware
 * tables and the recommendation.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "common/gpuinfo.h"
#include "kernels/kernels.h"
#include "runtime/config/config.h"
#include "runtime/model/net.h"
#include "runtime/model/model.h"
#include "runtime/tools/plan.h"
#include "cli/cmd_plan.h" /* defines: cmd_plan_detail, plan's messages in `dtrun plan`'s flags */

/* A model of psi parameters (the layer sizes do not enter model states). */
static dt_plan_model sized(double psi) {
    dt_plan_model m;
    cr_assert_eq(dt_plan_model_from_sizes(psi, 32, 4096, 32, 2048, 50304, &m), DT_STATUS_OK);
    return m;
}

static double states(const dt_plan_model *m, dt_plan_precision_t p, dt_strategy_t s, int n,
                     int g) {
    dt_plan_mem r = dt_plan_model_states(m, p, s, n, g);
    return r.params + r.grads + r.optim;
}

#define GB 1e9
#define assert_near(a, b, tol) \
    cr_assert(fabs((a) - (b)) <= (tol), "%s = %.6g, expected %.6g (±%g)", #a, (double)(a), (double)(b), (double)(tol))

Test(plan, sixteen_bytes_per_parameter) {
    const double psi[] = {1e9, 7e9, 13e9, 34e9, 70e9};
    const double want[] = {16 * GB, 112 * GB, 208 * GB, 544 * GB, 1120 * GB};
    for (int i = 0; i < 5; i++) {
        dt_plan_model m = sized(psi[i]);
        double ddp = states(&m, DT_PLAN_PRECISION_BF16, DT_STRATEGY_DDP, 1, 8);
        assert_near(ddp, want[i], 1);
        dt_plan_mem r = dt_plan_model_states(&m, DT_PLAN_PRECISION_BF16, DT_STRATEGY_DDP, 8, 8);
        assert_near(r.params, 2 * psi[i], 1); /* bf16 */
        assert_near(r.grads, 2 * psi[i], 1);
        assert_near(r.optim, 12 * psi[i], 1); /* fp32 master + m + v */
        /* fp32 on CPU is 16 bytes too, split 4 + 4 + 8 */
        r = dt_plan_model_states(&m, DT_PLAN_PRECISION_FP32, DT_STRATEGY_DDP, 1, 8);
        assert_near(r.params, 4 * psi[i], 1);
        assert_near(r.optim, 8 * psi[i], 1);
        dt_plan_model_free(&m);
    }
    dt_plan_model m = sized(7e9);
    assert_near(states(&m, DT_PLAN_PRECISION_BF16, DT_STRATEGY_FSDP, 4, 8), 28 * GB, 1);
    dt_plan_model_free(&m);
}

Test(plan, zero_paper_figures_for_7_5b_on_64_gpus) {
    dt_plan_model m = sized(7.5e9);
    dt_plan_precision_t p = DT_PLAN_PRECISION_BF16;
    assert_near(states(&m, p, DT_STRATEGY_DDP, 64, 8) / GB, 120.0, 0.05);
    assert_near(states(&m, p, DT_STRATEGY_ZERO1, 64, 8) / GB, 31.4, 0.05);
    assert_near(states(&m, p, DT_STRATEGY_ZERO2, 64, 8) / GB, 16.6, 0.05);
    assert_near(states(&m, p, DT_STRATEGY_FSDP, 64, 8) / GB, 1.9, 0.05);
    /* hybrid: shards within the node of 8, replicated across the 8 nodes: 16Ψ/8 */
    assert_near(states(&m, p, DT_STRATEGY_HSDP, 64, 8) / GB, 15.0, 1e-9);
    /* ... and at or below one node it is FSDP */
    assert_near(states(&m, p, DT_STRATEGY_HSDP, 4, 8), states(&m, p, DT_STRATEGY_FSDP, 4, 8), 0);
    dt_plan_model_free(&m);
}

Test(plan, fp32_splits_on_cpu) {
    dt_plan_model m = sized(1e9);
    dt_plan_precision_t p = DT_PLAN_PRECISION_FP32;
    assert_near(states(&m, p, DT_STRATEGY_ZERO1, 4, 0), 8e9 + 8e9 / 4, 1);
    assert_near(states(&m, p, DT_STRATEGY_ZERO2, 4, 0), 4e9 + 12e9 / 4, 1);
    assert_near(states(&m, p, DT_STRATEGY_FSDP, 4, 0), 16e9 / 4, 1);
    dt_plan_model_free(&m);
}

Test(plan, gpt2_124m_exact_count_from_the_layout) {
    dt_model_spec s = {.ops = &dt_model_gpt, .n_layer = 12, .n_head = 12, .n_embd = 768,
                       .seq_len = 1024, .vocab_size = 50257, .vocab_pad_multiple = 128};
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    dt_plan_model m;
    cr_assert_eq(dt_plan_model_from_layout(&l, &m), DT_STATUS_OK);
    cr_assert_eq((long long)m.n_params, 124475904LL); /* vocab padded to 50304 */
    cr_assert_eq((long long)m.n_params_unpadded, 124439808LL);
    cr_assert_eq(m.n_units, 14);
    cr_assert_eq((long long)m.largest_unit, 50304LL * 768 + 1024LL * 768); /* wte + wpe */
    assert_near(states(&m, DT_PLAN_PRECISION_BF16, DT_STRATEGY_DDP, 1, 8), 16.0 * 124475904, 0);
    /* FSDP pads each of the 14 units to a multiple of the rank count */
    double shard = 0;
    for (int u = 0; u < l.n_units; u++) shard += ceil((double)l.units[u].numel / 5);
    assert_near(states(&m, DT_PLAN_PRECISION_BF16, DT_STRATEGY_FSDP, 5, 8), 16 * shard, 0);
    cr_assert_gt(16 * shard, 16.0 * 124475904 / 5); /* 768 is not a multiple of 5 */
    dt_plan_model_free(&m);
    dt_model_layout_free(&l);
}

Test(plan, activation_bytes_by_hand) {
    dt_model_spec s = {.ops = &dt_model_gpt, .n_layer = 2, .n_head = 2, .n_embd = 16,
                       .seq_len = 8, .vocab_size = 60, .vocab_pad_multiple = 64};
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    dt_plan_model m;
    cr_assert_eq(dt_plan_model_from_layout(&l, &m), DT_STATUS_OK);
    /* B=2, T=8, C=16, fp32, attention materialised with 1 thread:
     * layer: 7 x BTC 7168, 4 LayerNorm stats 4*64 = 256, qkv 3072, fch + fch_gelu
     *        8192, attention 2*2*8*8*4 = 1024                                -> 19712
     * once:  tokens + targets + positions 192, encoded + lnf 2048, lnf stats + losses 192,
     *        logits 16*64*4 = 4096, dres + dtmp 2048, dqkv 3072, dfch x2 8192,
     *        attention scratch 4*1*8*8 = 256                                  -> 20096 */
    cr_assert_eq(dt_plan_activation_bytes(&m, 2, 4, 1, 0), 2 * 19712 + 20096);
    /* full recomputation: two layer outputs 2*1024, one layer's set less what a
     * checkpointed layer keeps (the scratch), the once-part; selective keeps qkv
     * 3072, res2 and res3 2048, fch 4096 = 9216 per layer */
    cr_assert_eq(dt_plan_activation_bytes(&m, 2, 4, 1, DT_MODEL_RECOMPUTE_FULL), 2 * 1024 + (19712 - 1024) + 20096);
    cr_assert_eq(dt_plan_activation_bytes(&m, 2, 4, 1, DT_MODEL_RECOMPUTE_SELECTIVE),
                 2 * 9216 + (19712 - 9216) + 20096);
    /* bf16 on the GPU: attention keeps the probabilities B*NH*T*T in bf16 = 512 bytes
     * per layer, and the score gradients of all sequences, B*NH*T*T bf16 = 512 bytes,
     * as backward scratch: layer 3584 + 256 + 1536 + 4096 + 512 = 9984;
     * once 192 + 1024 + 192 + 2048 + 1024 + 1536 + 4096 + 512 = 10624 */
    cr_assert_eq(dt_plan_activation_bytes(&m, 2, 2, 0, 0), 2 * 9984 + 10624);
    /* the fused GPU attention saves the log-sum-exp 4*B*NH*T = 128 and a copy of out
     * B*T*C bf16 = 512 (640 in place of 512), and its scratch is D, 4*B*NH*T = 128
     * (in place of 512): layer 10112, once 10240 */
    cr_assert_eq(dt_plan_activation_bytes(&m, 2, 2, DT_PLAN_ATTENTION_FUSED, 0), 2 * 10112 + 10240);
    dt_plan_model_free(&m);
    dt_model_layout_free(&l);
}

/* A llama of hidden 40, 3 layers, 4 query heads, nkv key/value heads, head_dim hd
 * (0: 10), intermediate 52, seq 9, vocab 77 (padded to 128). */
static dt_model_spec llama(int tied, int bias, int hd, int nkv) {
    dt_model_spec s = {.ops = &dt_model_llama, .seq_len = 9, .vocab_size = 77, .vocab_pad_multiple = 64};
    const char *paths[] = {"model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads",
                           "model.num_key_value_heads", "model.head_dim", "model.intermediate_size",
                           "model.max_position_embeddings", "model.rope_theta", "model.tie_word_embeddings",
                           "model.attention_bias"};
    double v[] = {40, 3, 4, nkv, hd, 52, 16, 10000, tied, bias};
    for (int i = 0; i < 10; i++) dt_model_key_set(&s, dt_model_key_find(s.ops, paths[i]), v[i]);
    return s;
}

/* The plan's activation formula is the trainer's arena (runtime/model/net.c), byte for
 * byte, on sizes that exercise the 64-byte slot rounding. */
Test(plan, activations_match_the_trainers_arena) {
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 3), DT_STATUS_OK, "%s", dt_error_detail());
    dt_model_spec specs[] = {
        {.ops = &dt_model_gpt, .n_layer = 3, .n_head = 3, .n_embd = 12, .seq_len = 7,
         .vocab_size = 50, .vocab_pad_multiple = 1},
        {.ops = &dt_model_gpt, .n_layer = 2, .n_head = 4, .n_embd = 64, .seq_len = 100,
         .vocab_size = 256, .vocab_pad_multiple = 64},
        {.ops = &dt_model_mlp, .in_dim = 5, .hidden_dim = 7, .n_hidden_layers = 2,
         .n_classes = 3},
        llama(0, 0, 0, 2),  /* GQA, untied */
        llama(1, 1, 12, 4), /* tied, q/k/v biases, head_dim 12 (attention width 48 > hidden 40), MHA */
        llama(0, 1, 4, 1),  /* head_dim 4 (attention width 16 < hidden 40), one key/value head */
        {.ops = &dt_model_mlp, .in_dim = 33, .hidden_dim = 9, .n_hidden_layers = 0,
         .n_classes = 40},
    };
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
        for (int B = 1; B <= 5; B += 2) {
            dt_model_layout l;
            cr_assert_eq(dt_model_layout_init(&specs[i], &l), DT_STATUS_OK);
            dt_plan_model m;
            cr_assert_eq(dt_plan_model_from_layout(&l, &m), DT_STATUS_OK);
            double want = (double)dt_net_arena_bytes(dev, &l, B);
            double got = dt_plan_activation_bytes(&m, B, 4, 3, 0);
            cr_assert_eq(got, want, "spec %zu, B %d: plan %.0f, net.c %.0f", i, B, got, want);
            dt_plan_model_free(&m);
            dt_model_layout_free(&l);
        }
    dt_device_free(dev);
}

/* Under tensor parallelism too: every TP size the models' heads allow, with and
 * without sequence parallelism, equals the arena net.c allocates for the TP piece. */
Test(plan, activations_match_the_trainers_arena_under_tp) {
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 3), DT_STATUS_OK, "%s", dt_error_detail());
    dt_model_spec specs[] = {
        {.ops = &dt_model_gpt, .n_layer = 2, .n_head = 4, .n_embd = 64, .seq_len = 100,
         .vocab_size = 256, .vocab_pad_multiple = 64},
        llama(0, 0, 0, 2), /* GQA, untied */
        llama(1, 1, 12, 4),
    };
    int checked = 0;
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
        for (int tp = 2; tp <= 4; tp *= 2)
            for (int sp = 0; sp <= 1; sp++) {
                char msg[256];
                if (dt_model_tp_check(&specs[i], tp, msg, sizeof msg)) continue;
                for (int B = 2; B <= 4; B += 2) {
                    dt_model_layout l;
                    cr_assert_eq(dt_model_layout_init_tp(&specs[i], tp, 1, sp, &l), DT_STATUS_OK, "%s",
                                 dt_error_detail());
                    dt_plan_model m;
                    cr_assert_eq(dt_plan_model_from_layout(&l, &m), DT_STATUS_OK);
                    double want = (double)dt_net_arena_bytes(dev, &l, B);
                    double got = dt_plan_activation_bytes(&m, B, 4, 3, 0);
                    cr_assert_eq(got, want, "spec %zu, TP %d, sp %d, B %d: plan %.0f, net.c %.0f", i, tp, sp, B, got,
                                 want);
                    dt_plan_model_free(&m);
                    dt_model_layout_free(&l);
                    checked++;
                }
            }
    cr_assert_geq(checked, 12, "only %d TP layouts checked", checked);
    dt_device_free(dev);
}

/* Under context parallelism: CP 2 and 4, gpt and llama (GQA; MHA with head_dim 12),
 * each recomputation policy, alone and with TP 2 (with sequence parallelism): the
 * plan's bytes equal the arena net.c allocates for a CP rank (T/C rows, the ring's
 * attention slots, the positions slot with the attention's indices). 3 threads: the
 * block kernel's scratch is per thread. */
Test(plan, activations_match_the_trainers_arena_under_cp) {
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 3), DT_STATUS_OK, "%s", dt_error_detail());
    dt_model_spec specs[] = {
        {.ops = &dt_model_gpt, .n_layer = 2, .n_head = 4, .n_embd = 64, .seq_len = 96,
         .vocab_size = 256, .vocab_pad_multiple = 64},
        {.ops = &dt_model_gpt, .n_layer = 3, .n_head = 3, .n_embd = 12, .seq_len = 200,
         .vocab_size = 50, .vocab_pad_multiple = 1},
        llama(0, 0, 0, 2),  /* GQA, untied */
        llama(1, 1, 12, 4), /* MHA, head_dim 12 */
    };
    specs[2].seq_len = specs[3].seq_len = 16;
    int checked = 0, uchecked = 0;
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
        for (int cp = 2; cp <= 4; cp *= 2)
            for (int tp = 1; tp <= 2; tp++)
                for (int k = 0; k < 2 * (DT_MODEL_RECOMPUTE_FULL + 1); k++) {
                    char msg[256];
                    /* each policy p with the ring (u 0), then with Ulysses where the heads divide */
                    int u = k > DT_MODEL_RECOMPUTE_FULL, p = k % (DT_MODEL_RECOMPUTE_FULL + 1), nh, nkv;
                    specs[i].ops->heads(&specs[i], &nh, &nkv);
                    if (u && (nh % (tp * cp) || nkv % (tp * cp))) continue;
                    if (tp > 1 && dt_model_tp_check(&specs[i], tp, msg, sizeof msg)) continue;
                    int B = 1 + (p & 1) * 2, every = 1 + p % 2;
                    dt_model_layout l;
                    cr_assert_eq(tp > 1 ? dt_model_layout_init_tp(&specs[i], tp, 1, 1, &l)
                                        : dt_model_layout_init(&specs[i], &l),
                                 DT_STATUS_OK, "%s", dt_error_detail());
                    dt_model_layout_set_cp(&l, cp, cp - 1, u);
                    dt_model_layout_set_recompute(&l, (dt_model_recompute_t)p, every);
                    dt_plan_model m;
                    cr_assert_eq(dt_plan_model_from_layout(&l, &m), DT_STATUS_OK);
                    cr_assert_eq(m.cp_size, cp);
                    cr_assert_eq(dt_plan_model_rows(&m), specs[i].seq_len / cp);
                    m.recompute_every = every;
                    double want = (double)dt_net_arena_bytes(dev, &l, B);
                    double got = dt_plan_activation_bytes(&m, B, 4, 3, p);
                    cr_assert_eq(got, want, "spec %zu, CP %d%s, TP %d, policy %d, B %d: plan %.0f, net.c %.0f", i,
                                 cp, u ? " Ulysses" : "", tp, p, B, got, want);
                    dt_plan_model_free(&m);
                    dt_model_layout_free(&l);
                    checked++;
                    uchecked += u;
                }
    cr_assert_geq(checked, 36, "only %d CP layouts checked", checked);
    cr_assert_geq(uchecked, 9, "only %d Ulysses layouts checked", uchecked);
    dt_device_free(dev);
}

/* A CP rank's activations on a long sequence: the T² probabilities are gone, so CP
 * C holds well under 1/C of CP 1's arena; set_cp refuses what the trainer refuses. */
Test(plan, cp_activations_and_checks) {
    dt_plan_model m;
    cr_assert_eq(dt_plan_model_from_shape(8e9, 32, 4096, 32, 8, 14336, 32768, 128256, &m), DT_STATUS_OK);
    double one = dt_plan_activation_bytes(&m, 1, 2, 1, 0);
    cr_assert_eq(dt_plan_model_set_cp(&m, 4), DT_STATUS_OK);
    double four = dt_plan_activation_bytes(&m, 1, 2, 1, 0);
    cr_assert(four < one / 4, "CP 4 %.4g, CP 1 %.4g", four, one);
    cr_assert_eq(dt_plan_model_set_cp(&m, 3), DT_STATUS_USAGE); /* 32768 % 6 */
    cr_assert(strstr(cmd_plan_detail(), "--cp 3"), "%s", cmd_plan_detail());
    dt_plan_model_free(&m);
}

/* The ring by hand: CP 4, one layer, B 1, T/C = 256 rows of 2 key/value heads of 64,
 * bf16, on a 100 GB/s link with no latency. A block K = 256·256·2 = 131072 bytes, a
 * gradient block 262144; forward 3 K, backward 3 K + 4 gradient blocks. */
Test(plan, cp_ring_by_hand) {
    dt_plan_model m;
    cr_assert_eq(dt_plan_model_from_shape(1e9, 1, 512, 8, 2, 1024, 1024, 1000, &m), DT_STATUS_OK);
    cr_assert_eq(dt_plan_model_set_cp(&m, 4), DT_STATUS_OK);
    dt_plan_link ln = {"x", 100, 0, ""};
    double K = 256.0 * 256 * 2, G = 256.0 * 256 * 4;
    /* compute so slow the forward's transfers hide: exposed only the gradients */
    dt_plan_cp_ring r = dt_plan_cp_ring_time(&m, 1, 2, 1e6, &ln);
    assert_near(r.fwd_bytes, 3 * K, 0);
    assert_near(r.bwd_bytes, 3 * K + 4 * G, 0);
    assert_near(r.fwd_s, 3 * K / 1e11, 1e-15);
    assert_near(r.fwd_exposed_s, 0, 0);
    assert_near(r.bwd_exposed_s, 4 * G / 1e11, 1e-15);
    /* infinitely fast compute: everything exposed */
    r = dt_plan_cp_ring_time(&m, 1, 2, 1e30, &ln);
    assert_near(r.fwd_exposed_s, r.fwd_s, 1e-15);
    assert_near(r.bwd_exposed_s, r.bwd_s, 1e-15);
    dt_plan_model_free(&m);
}

Test(plan, ring_collectives_by_hand) {
    /* 1 GB over 4 ranks at 1 GB/s: all-reduce 2*3/4 = 1.5 s, RS/AG 0.75 s */
    assert_near(dt_plan_all_reduce_s(1e9, 4, 1e9, 0), 1.5, 1e-12);
    assert_near(dt_plan_reduce_scatter_s(1e9, 4, 1e9, 0), 0.75, 1e-12);
    assert_near(dt_plan_all_gather_s(1e9, 4, 1e9, 1e-3), 0.751, 1e-12);
    assert_near(dt_plan_all_reduce_s(2e9, 8, 50e9, 30e-6), 2.0 * 7 / 8 * 2e9 / 50e9 + 30e-6, 1e-12);
    cr_assert_eq(dt_plan_all_reduce_s(1e9, 1, 1e9, 1), 0);
}

Test(plan, cost_formula) {
    double h, c;
    /* H = 1000 one-GPU hours, 8 GPUs at 80% efficiency, 2 per GPU-hour */
    dt_plan_cost(1000, 8, 2.0, 0.8, &h, &c);
    assert_near(h, 1000 / (8 * 0.8), 1e-9);
    assert_near(c, 8 * 2.0 * 1000 / (8 * 0.8), 1e-9); /* = p*H/e = 2500 */
    assert_near(c, 2500, 1e-9);
}

static dt_plan_input input_7b(void) {
    dt_plan_input in;
    dt_plan_input_defaults(&in);
    in.model = sized(7e9);
    in.mem_bytes = 80.0 * 1073741824.0;
    in.peak_flops = 989e12;
    return in;
}

Test(plan, ddp_step_time_and_efficiency) {
    dt_plan_input in = input_7b();
    in.hours_1gpu = 1000;
    in.price = 3;
    dt_plan_row r;
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_DDP, 8, &r), DT_STATUS_OK);
    double tokens = 2048; /* micro-batch 1 x seq 2048 */
    double fpt = 6 * 7e9 + 12.0 * 32 * 4096 * 2048;
    assert_near(r.compute_s, fpt * tokens / (989e12 * 0.4), 1e-12);
    double buckets = ceil(7e9 / 6553600);
    double ar = 2.0 * 7 / 8 * 7e9 * 2 / 450e9 + buckets * 10e-6; /* bf16 grads, nvlink4 */
    assert_near(r.comm_s, ar, 1e-9);
    double tail = 2.0 * 7 / 8 * 6553600 * 2 / 450e9 + 10e-6;
    assert_near(r.exposed_s, fmax(ar - r.compute_s * 2 / 3, tail), 1e-9);
    assert_near(r.step_s, r.compute_s + r.exposed_s, 1e-12);
    assert_near(r.efficiency, r.compute_s / r.step_s, 1e-12);
    assert_near(r.hours, 1000 / (8 * r.efficiency), 1e-9);
    assert_near(r.cost, 8 * 3 * r.hours, 1e-9);
    cr_assert_eq(r.fit, DT_PLAN_FIT_NO); /* 112 GB of states on an 80 GiB GPU */
    cr_assert_eq(r.n_collectives, buckets);
    dt_plan_model_free(&in.model);
}

Test(plan, fsdp_moves_one_and_a_half_times_ddp) {
    dt_plan_input in = input_7b();
    in.intra.alpha_us = 0;
    dt_plan_row d, f, z1;
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_DDP, 8, &d), DT_STATUS_OK);
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_FSDP, 8, &f), DT_STATUS_OK);
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_ZERO1, 8, &z1), DT_STATUS_OK);
    assert_near(f.comm_s, 1.5 * d.comm_s, 1e-12);
    assert_near(z1.comm_s, d.comm_s, 1e-12);
    cr_assert_eq(f.fit, DT_PLAN_FIT_YES);
    assert_near(f.total, f.params + f.grads + f.optim + f.acts + f.comm_buf, 1);
    assert_near(f.usable, 80.0 * 1073741824.0 * 0.9, 1);
    dt_plan_model_free(&in.model);
}

Test(plan, hybrid_uses_the_inter_node_link_for_the_shard) {
    dt_plan_input in = input_7b();
    in.intra.alpha_us = in.inter.alpha_us = 0;
    dt_plan_row h, f;
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_HSDP, 16, &h), DT_STATUS_OK);
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_FSDP, 16, &f), DT_STATUS_OK);
    cr_assert_eq(h.n_nodes, 2);
    cr_assert_eq(h.shard, 8);
    double S = 7e9 * 2;
    double intra = 7.0 / 8 * S / 450e9 * 3;             /* AG fwd, AG bwd, RS within the node */
    double inter = 2.0 * 1 / 2 * (S / 8) / 50e9;        /* all-reduce of 1/8 across 2 nodes */
    assert_near(h.comm_s, intra + inter, 1e-9);
    assert_near(f.comm_s, 15.0 / 16 * S / 50e9 * 3, 1e-9); /* flat ring at the NIC's rate */
    cr_assert_lt(h.comm_s, f.comm_s);
    /* 12 GPUs on nodes of 8 is not a layout */
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_HSDP, 12, &h), DT_STATUS_USAGE);
    cr_assert(strstr(cmd_plan_detail(), "--gpus"));
    dt_plan_model_free(&in.model);
}

Test(plan, recommendation_picks_what_fits) {
    dt_plan_input in = input_7b();
    in.hours_1gpu = 100;
    in.price = 2;
    dt_plan_row rows[10];
    int counts[] = {1, 8};
    int n = 0;
    for (int s = 0; s < DT_STRATEGY_COUNT; s++)
        for (int i = 0; i < 2; i++)
            cr_assert_eq(dt_plan_row_compute(&in, s, counts[i], &rows[n++]), DT_STATUS_OK);
    dt_plan_choice ch;
    dt_plan_recommend(&in, rows, n, &ch);
    cr_assert_geq(ch.cheapest, 0);
    cr_assert_neq(rows[ch.cheapest].fit, DT_PLAN_FIT_NO);
    cr_assert_eq(rows[ch.cheapest].n_gpus, 8); /* nothing fits on one GPU */
    cr_assert_neq(rows[ch.cheapest].strategy, DT_STRATEGY_DDP);
    for (int i = 0; i < n; i++)
        if (rows[i].fit != DT_PLAN_FIT_NO) {
            cr_assert_leq(rows[ch.cheapest].cost, rows[i].cost * 1.001);
            cr_assert_geq(rows[ch.fastest].tokens_per_s, rows[i].tokens_per_s * 0.999);
        }
    cr_assert(strstr(ch.cheapest_reason, "fits"), "%s", ch.cheapest_reason);

    in.mem_bytes = 1e9; /* nothing fits anywhere */
    for (int i = 0; i < n; i++)
        cr_assert_eq(dt_plan_row_compute(&in, rows[i].strategy, rows[i].n_gpus, &rows[i]),
                     DT_STATUS_OK);
    dt_plan_recommend(&in, rows, n, &ch);
    cr_assert_eq(ch.cheapest, -1);
    cr_assert_eq(ch.fastest, -1);
    cr_assert(strstr(ch.cheapest_reason, "nothing fits"), "%s", ch.cheapest_reason);
    dt_plan_model_free(&in.model);
}

Test(plan, hardware_tables) {
    const dt_gpu_spec *g = dt_gpu_spec_find("H100");
    cr_assert(g && g->mem_gib == 80 && g->tflops == 989);
    cr_assert_eq(dt_gpu_spec_find("h200")->mem_gib, 141);
    cr_assert_str_eq(dt_gpu_spec_by_device_name("NVIDIA A100-SXM4-80GB")->name, "a100-80");
    cr_assert_str_eq(dt_gpu_spec_by_device_name("NVIDIA A100-PCIE-40GB")->name, "a100-40");
    cr_assert_str_eq(dt_gpu_spec_by_device_name("NVIDIA H100 PCIe")->name, "h100-pcie");
    cr_assert_str_eq(dt_gpu_spec_by_device_name("NVIDIA L40S")->name, "l40s");
    cr_assert_null(dt_gpu_spec_by_device_name("Mystery GPU"));
    cr_assert_null(dt_gpu_spec_find("tpu"));
    cr_assert_eq(dt_plan_link_find("nvlink4")->gbps, 450);
    cr_assert_eq(dt_plan_link_find("ib400")->gbps, 50);
    cr_assert_null(dt_plan_link_find("carrier-pigeon"));
    char names[512];
    dt_gpu_spec_names(names, sizeof names);
    cr_assert(strstr(names, "rtx5090") && strstr(names, "a100-40"), "%s", names);
    cr_assert_eq(dt_strategy_parse("zero3"), DT_STRATEGY_FSDP);
    cr_assert_eq(dt_strategy_parse("nope"), -1);
}

Test(plan, bad_sizes_name_the_flag) {
    dt_plan_model m;
    cr_assert_eq(dt_plan_model_from_sizes(7e9, 32, 4096, 33, 2048, 50304, &m), DT_STATUS_USAGE);
    cr_assert(strstr(cmd_plan_detail(), "--heads"));
    cr_assert_eq(dt_plan_model_from_sizes(0, 32, 4096, 32, 2048, 50304, &m), DT_STATUS_USAGE);
    cr_assert(strstr(cmd_plan_detail(), "--params"));
    cr_assert_eq(dt_plan_model_from_sizes(7e9, 32, 4096, 32, 0, 50304, &m), DT_STATUS_USAGE);
    cr_assert(strstr(cmd_plan_detail(), "--seq"));
}

Test(plan, gpt2_124m_from_the_preset_config) {
    dt_config_t cfg;
    dt_status_t st = dt_config_load("configs/gpt2-124m.json", NULL, 0, &cfg);
    cr_assert_eq(st, DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    dt_model_spec s = {.ops = cfg.model.ops, .n_layer = (int)cfg.model.n_layer,
                       .n_head = (int)cfg.model.n_head, .n_embd = (int)cfg.model.n_embd,
                       .seq_len = (int)cfg.model.seq_len, .vocab_size = (int)cfg.model.vocab_size,
                       .vocab_pad_multiple = (int)cfg.model.vocab_pad_multiple};
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    dt_plan_model m;
    cr_assert_eq(dt_plan_model_from_layout(&l, &m), DT_STATUS_OK);
    cr_assert_eq((long long)m.n_params, 124475904LL);
    cr_assert_eq((long long)m.n_params_unpadded, 124439808LL);
    /* 16 bytes per parameter of the padded buffer: 1.99 GB under DDP */
    assert_near(states(&m, DT_PLAN_PRECISION_BF16, DT_STRATEGY_DDP, 8, 8), 1991614464.0, 0);
    dt_plan_model_free(&m);
    dt_model_layout_free(&l);
    dt_config_free(&cfg);
}
