/*
 * test_config_tp.c - the tensor_parallel config section: its keys (size,
 * sequence_parallel, DeepSpeed's autotp_size as the same key as size), the batch
 * identity over the data-parallel size (world / tensor_parallel.size), and every
 * check made before workers start: the size dividing the world and each node's
 * ranks, the model's shapes (heads, KV heads, MLP width, vocabulary) and the
 * strategy. Each error must name the key.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "runtime/config/config.h"

static void quiet(void) { dt_log_set_level(DT_LOG_OFF); }
TestSuite(config_tp, .init = quiet);

#define ASSERT_ERR(cfg, text)                                                          \
    cr_assert(strstr(dt_config_errors(cfg), text), "missing error <%s> in:\n%s", text, \
              dt_config_errors(cfg))

/* A small gpt config (4 heads, vocab from the data) with the given tensor_parallel
 * section text (and any other top-level members after it). */
static dt_status_t load_gpt(const char *tp_json, dt_config_t *cfg, int n, const char *const *ov) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"model\":{\"type\":\"gpt\",\"n_layer\":2,\"n_head\":4,\"n_embd\":64,\"seq_len\":32},"
             "\"data\":{\"train\":\"x.txt\"}%s%s}",
             tp_json[0] ? "," : "", tp_json);
    return dt_config_load_string(json, "x.json", ov, n, cfg);
}

Test(config_tp, keys_defaults_dump_and_round_trip) {
    dt_config_t cfg;
    dt_config_init(&cfg);
    cr_assert_eq(cfg.tp.size, 1);
    cr_assert_eq(cfg.tp.sequence_parallel, false);
    dt_config_free(&cfg);

    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2,\"sequence_parallel\":true}", &cfg, 0, NULL),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.tp.size, 2);
    cr_assert_eq(cfg.tp.sequence_parallel, true);
    cr_assert_eq(dt_config_resolve(&cfg, 4), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    char *d1 = dt_config_dump_json(&cfg);
    cr_assert(strstr(d1, "\"tensor_parallel\":\t{\n\t\t\"size\":\t2,\n\t\t\"sequence_parallel\":\ttrue\n\t}"),
              "%s", d1);
    cr_assert_null(strstr(d1, "autotp_size"), "the alias is not dumped: %s", d1);
    dt_config_t back;
    cr_assert_eq(dt_config_load_string(d1, "dump.json", NULL, 0, &back), DT_STATUS_OK, "%s",
                 dt_config_errors(&back));
    cr_assert_eq(dt_config_resolve(&back, 4), DT_STATUS_OK, "%s", dt_config_errors(&back));
    char *d2 = dt_config_dump_json(&back);
    cr_assert_str_eq(d1, d2);
    cr_assert_eq(back.tp.size, 2);
    cr_assert_eq(back.tp.sequence_parallel, true);
    free(d1);
    free(d2);
    dt_config_free(&back);
    dt_config_free(&cfg);

    /* --keys lists both keys, the alias in size's help */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    dt_config_print_keys(f);
    fclose(f);
    cr_assert(strstr(buf, "tensor_parallel.size"));
    cr_assert(strstr(buf, "tensor_parallel.sequence_parallel"));
    cr_assert(strstr(buf, "tensor_parallel.autotp_size is the same key"), "%s", buf);
    free(buf);

    /* overrides */
    const char *ov[] = {"tensor_parallel.size=4", "tensor_parallel.sequence_parallel=true"};
    cr_assert_eq(load_gpt("", &cfg, 2, ov), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.tp.size, 4);
    cr_assert_eq(cfg.tp.sequence_parallel, true);
    dt_config_free(&cfg);
}

Test(config_tp, size_range_and_type_errors_name_the_key) {
    dt_config_t cfg;
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":0}", &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: tensor_parallel.size: expected an integer >= 1, found 0");
    dt_config_free(&cfg);
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":1.5,\"sequence_parallel\":1}", &cfg, 0, NULL),
                 DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: tensor_parallel.size: expected an integer >= 1, found 1.5");
    ASSERT_ERR(&cfg, "x.json: tensor_parallel.sequence_parallel: expected true or false, found 1");
    cr_assert_eq(cfg.n_errors, 2, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"sise\":2}", &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "tensor_parallel.sise: unknown key (did you mean tensor_parallel.size?)");
    dt_config_free(&cfg);
    /* sequence parallelism at size 1 is allowed (it changes nothing) */
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"sequence_parallel\":true}", &cfg, 0, NULL), DT_STATUS_OK,
                 "%s", dt_config_errors(&cfg));
    cr_assert_eq(dt_config_resolve(&cfg, 3), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.dp_size, 3);
    dt_config_free(&cfg);
}

Test(config_tp, autotp_size_is_the_same_key_as_size) {
    dt_config_t cfg;
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"autotp_size\":2}", &cfg, 0, NULL), DT_STATUS_OK, "%s",
                 dt_config_errors(&cfg));
    cr_assert_eq(cfg.tp.size, 2);
    char *d = dt_config_dump_json(&cfg);
    cr_assert(strstr(d, "\"size\":\t2") && !strstr(d, "autotp_size"), "%s", d);
    free(d);
    dt_config_free(&cfg);

    /* both, equal: fine, in either order */
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":4,\"autotp_size\":4}", &cfg, 0, NULL), DT_STATUS_OK,
                 "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.tp.size, 4);
    dt_config_free(&cfg);
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"autotp_size\":4,\"size\":4}", &cfg, 0, NULL), DT_STATUS_OK,
                 "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.tp.size, 4);
    dt_config_free(&cfg);

    /* both, different: one error naming both with their values, in either order */
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2,\"autotp_size\":4}", &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: tensor_parallel.size 2 and tensor_parallel.autotp_size 4: expected the same value "
                     "(tensor_parallel.autotp_size is DeepSpeed's name for tensor_parallel.size); give one");
    cr_assert_eq(cfg.n_errors, 1, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"autotp_size\":4,\"size\":2}", &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: tensor_parallel.size 2 and tensor_parallel.autotp_size 4: expected the same value");
    cr_assert_eq(cfg.n_errors, 1, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);

    /* "auto" beside a value: the value stands */
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2,\"autotp_size\":\"auto\"}", &cfg, 0, NULL),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.tp.size, 2);
    dt_config_free(&cfg);
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"autotp_size\":\"auto\",\"size\":2}", &cfg, 0, NULL),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.tp.size, 2);
    dt_config_free(&cfg);

    /* errors under the alias name it as given */
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"autotp_size\":0}", &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: tensor_parallel.autotp_size: expected an integer >= 1, found 0");
    dt_config_free(&cfg);
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"autotp_size\":2,\"autotp_size\":2}", &cfg, 0, NULL),
                 DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: tensor_parallel.autotp_size: expected the key once, found it given twice");
    dt_config_free(&cfg);

    /* an override under the alias replaces the file's size, as any override */
    const char *ov[] = {"tensor_parallel.autotp_size=4"};
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2}", &cfg, 1, ov), DT_STATUS_OK, "%s",
                 dt_config_errors(&cfg));
    cr_assert_eq(cfg.tp.size, 4);
    dt_config_free(&cfg);
}

Test(config_tp, size_must_divide_the_world) {
    dt_config_t cfg;
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2}", &cfg, 0, NULL), DT_STATUS_OK, "%s",
                 dt_config_errors(&cfg));
    cr_assert_eq(dt_config_resolve(&cfg, 3), DT_STATUS_CONFIG);
    cr_assert_str_eq(dt_config_errors(&cfg),
                     "x.json: tensor_parallel.size 2: expected a divisor of the world size 3 (world = "
                     "tensor_parallel.size x data-parallel ranks), found 3 % 2 = 1\n");
    /* another world size: the old error is gone */
    cr_assert_eq(dt_config_resolve(&cfg, 2), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.dp_size, 1);
    cr_assert_eq(cfg.world_size, 2);
    dt_config_free(&cfg);
}

Test(config_tp, batch_identity_is_over_the_data_parallel_size) {
    static const struct {
        int tp, ws, tb, mb, ga; /* given (0 = not) */
        int want_tb, want_mb, want_ga;
    } cases[] = {
        {2, 4, 0, 2, 3, 12, 2, 3}, /* micro and accumulation: tb = 2 * 3 * (4 / 2) */
        {2, 4, 8, 0, 0, 8, 4, 1},  /* tb alone: micro = 8 / 2 DP ranks */
        {4, 4, 8, 2, 0, 8, 2, 4},  /* one DP rank: accumulation = 8 / 2 */
        {2, 8, 0, 0, 0, 4, 1, 1},  /* nothing: micro 1, tb = DP size 4 */
        {1, 4, 8, 0, 0, 8, 2, 1},  /* TP 1: DP = world */
        {2, 2, 6, 3, 2, 6, 3, 2},  /* all three, DP 1 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char json[512];
        size_t n = (size_t)snprintf(json, sizeof json, "\"tensor_parallel\":{\"size\":%d}", cases[i].tp);
        if (cases[i].tb) n += (size_t)snprintf(json + n, sizeof json - n, ",\"train_batch_size\":%d", cases[i].tb);
        if (cases[i].mb)
            n += (size_t)snprintf(json + n, sizeof json - n, ",\"train_micro_batch_size_per_gpu\":%d", cases[i].mb);
        if (cases[i].ga)
            snprintf(json + n, sizeof json - n, ",\"gradient_accumulation_steps\":%d", cases[i].ga);
        dt_config_t cfg;
        cr_assert_eq(load_gpt(json, &cfg, 0, NULL), DT_STATUS_OK, "case %zu: %s", i, dt_config_errors(&cfg));
        cr_assert_eq(dt_config_resolve(&cfg, cases[i].ws), DT_STATUS_OK, "case %zu: %s", i,
                     dt_config_errors(&cfg));
        cr_assert_eq(cfg.dp_size, cases[i].ws / cases[i].tp, "case %zu", i);
        cr_assert_eq(cfg.train_batch_size, cases[i].want_tb, "case %zu", i);
        cr_assert_eq(cfg.train_micro_batch_size_per_gpu, cases[i].want_mb, "case %zu", i);
        cr_assert_eq(cfg.gradient_accumulation_steps, cases[i].want_ga, "case %zu", i);
        dt_config_free(&cfg);
    }

    /* errors say the DP size and how it came */
    dt_config_t cfg;
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2},\"train_batch_size\":16,"
                          "\"train_micro_batch_size_per_gpu\":2,\"gradient_accumulation_steps\":2",
                          &cfg, 0, NULL),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(dt_config_resolve(&cfg, 4), DT_STATUS_CONFIG);
    cr_assert_str_eq(dt_config_errors(&cfg),
                     "x.json: train_batch_size 16, train_micro_batch_size_per_gpu 2, gradient_accumulation_steps 2, "
                     "world size 4 / tensor_parallel.size 2 = 2 data-parallel ranks: expected train_batch_size = "
                     "train_micro_batch_size_per_gpu * gradient_accumulation_steps * data-parallel size, found "
                     "2 * 2 * 2 = 8, not 16\n");
    /* the same batch holds at world 8 (4 DP ranks) */
    cr_assert_eq(dt_config_resolve(&cfg, 8), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2},\"train_batch_size\":3", &cfg, 0, NULL), DT_STATUS_OK);
    cr_assert_eq(dt_config_resolve(&cfg, 4), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "world size 4 / tensor_parallel.size 2 = 2 data-parallel ranks");
    ASSERT_ERR(&cfg, "3 is not a multiple of the data-parallel size, so train_micro_batch_size_per_gpu");
    dt_config_free(&cfg);
}

Test(config_tp, a_group_may_not_span_nodes) {
    dt_config_t cfg;
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2}", &cfg, 0, NULL), DT_STATUS_OK);
    cr_assert_eq(dt_config_resolve(&cfg, 4), DT_STATUS_OK); /* 4 nodes x 1: the world divides */
    cr_assert_eq(dt_config_check_nodes(&cfg, 1), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: tensor_parallel.size 2 and nproc_per_node 1: expected nproc_per_node to be a "
                     "multiple of tensor_parallel.size (a tensor-parallel group is consecutive local ranks of "
                     "one node and may not span nodes)");
    cr_assert_eq(cfg.n_errors, 1, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);

    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2}", &cfg, 0, NULL), DT_STATUS_OK);
    cr_assert_eq(dt_config_resolve(&cfg, 6), DT_STATUS_OK);
    cr_assert_eq(dt_config_check_nodes(&cfg, 3), DT_STATUS_CONFIG); /* 2 nodes x 3 */
    ASSERT_ERR(&cfg, "tensor_parallel.size 2 and nproc_per_node 3");
    dt_config_free(&cfg);

    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2}", &cfg, 0, NULL), DT_STATUS_OK);
    cr_assert_eq(dt_config_resolve(&cfg, 8), DT_STATUS_OK);
    cr_assert_eq(dt_config_check_nodes(&cfg, 4), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
    /* size 1: any node shape */
    cr_assert_eq(load_gpt("", &cfg, 0, NULL), DT_STATUS_OK);
    cr_assert_eq(dt_config_check_nodes(&cfg, 3), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
}

Test(config_tp, the_model_must_cut) {
    dt_config_t cfg;
    /* the MLP model has no tensor-parallel layers */
    cr_assert_eq(dt_config_load_string("{\"model\":{\"type\":\"mlp\"},\"tensor_parallel\":{\"size\":2}}", "x.json",
                                       NULL, 0, &cfg),
                 DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: tensor_parallel.size: model.type mlp has no tensor-parallel layers");
    cr_assert_eq(cfg.n_errors, 1, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);

    /* gpt: whole heads per rank */
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":8}", &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: tensor_parallel.size: 8 does not divide model.n_head (4)");
    dt_config_free(&cfg);
    const char *ov3[] = {"tensor_parallel.size=3"};
    cr_assert_eq(load_gpt("", &cfg, 1, ov3), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "tensor_parallel.size: 3 does not divide model.n_head (4)");
    dt_config_free(&cfg);

    /* llama: KV heads are cut (GQA with 2 KV heads: size 4 cannot) */
    const char *llama = "{\"model\":{\"type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                        "\"num_key_value_heads\":2,\"num_hidden_layers\":1,\"seq_len\":16},"
                        "\"data\":{\"train\":\"x.txt\"},\"tensor_parallel\":{\"size\":%d}}";
    char json[512];
    snprintf(json, sizeof json, llama, 4);
    cr_assert_eq(dt_config_load_string(json, "x.json", NULL, 0, &cfg), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "tensor_parallel.size: 4 does not divide model.num_key_value_heads (2)");
    dt_config_free(&cfg);
    snprintf(json, sizeof json, llama, 2);
    cr_assert_eq(dt_config_load_string(json, "x.json", NULL, 0, &cfg), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);

    /* the vocabulary, when the config gives it: padded rows must divide */
    const char *vocab[] = {"model.vocab_size=50257", "model.vocab_pad_multiple=1"};
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2}", &cfg, 2, vocab), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "model.vocab_pad_multiple: the padded vocabulary (50257 rows, a multiple of 1) must divide "
                     "among tensor_parallel.size 2 ranks");
    dt_config_free(&cfg);
    /* vocab 0 (from the data): skipped at load, checked once the data's is known */
    const char *pad1[] = {"model.vocab_pad_multiple=1"};
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2}", &cfg, 1, pad1), DT_STATUS_OK, "%s",
                 dt_config_errors(&cfg));
    char msg[512];
    cr_assert_eq(dt_config_tp_check_vocab(&cfg, 50257, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "model.vocab_pad_multiple") && strstr(msg, "tensor_parallel.size 2"), "%s", msg);
    cr_assert_eq(dt_config_tp_check_vocab(&cfg, 256, msg, sizeof msg), 0, "%s", msg);
    dt_config_free(&cfg);
    /* GPT-2's vocabulary padded to 64 divides among 2 */
    const char *gpt2[] = {"model.vocab_size=50257"};
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2}", &cfg, 1, gpt2), DT_STATUS_OK, "%s",
                 dt_config_errors(&cfg));
    dt_config_free(&cfg);
}

Test(config_tp, not_with_hsdp) {
    dt_config_t cfg;
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2},\"strategy\":\"hsdp\"", &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: tensor_parallel.size 2 with strategy \"hsdp\": expected tensor_parallel.size 1");
    cr_assert_eq(cfg.n_errors, 1, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
    /* the other strategies compose with it; hsdp at size 1 is fine */
    const char *strategies[] = {"ddp", "zero1", "zero2", "fsdp"};
    for (int i = 0; i < 4; i++) {
        char json[128];
        snprintf(json, sizeof json, "\"tensor_parallel\":{\"size\":2},\"strategy\":\"%s\"", strategies[i]);
        cr_assert_eq(load_gpt(json, &cfg, 0, NULL), DT_STATUS_OK, "%s: %s", strategies[i], dt_config_errors(&cfg));
        dt_config_free(&cfg);
    }
    cr_assert_eq(load_gpt("\"strategy\":\"hsdp\"", &cfg, 0, NULL), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
    /* an override to hsdp meets the file's size */
    const char *ov[] = {"strategy=hsdp"};
    cr_assert_eq(load_gpt("\"tensor_parallel\":{\"size\":2}", &cfg, 1, ov), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "tensor_parallel.size 2 with strategy \"hsdp\"");
    dt_config_free(&cfg);
}
