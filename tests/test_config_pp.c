/*
 * test_config_pp.c - the pipeline config section: its keys and defaults, the batch
 * identity over DP = world / (tensor_parallel.size x pipeline.stages), and the checks
 * before workers start: the layout dividing the world, the schedule against the
 * micro-batches (the config's rules equal dt_pp_schedule_check's over a grid), the
 * strategy and the model. Each error names the key.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "runtime/config/config.h"
#include "runtime/layout/pp_sched.h"

static void quiet(void) { dt_log_set_level(DT_LOG_OFF); }
TestSuite(config_pp, .init = quiet);

#define ASSERT_ERR(cfg, text)                                                          \
    cr_assert(strstr(dt_config_errors(cfg), text), "missing error <%s> in:\n%s", text, \
              dt_config_errors(cfg))

static dt_status_t load(const char *model, const char *extra, dt_config_t *cfg) {
    char json[1024];
    snprintf(json, sizeof json, "{\"model\":%s,\"data\":{\"train\":\"x.txt\"}%s%s}", model, extra[0] ? "," : "",
             extra);
    return dt_config_load_string(json, "x.json", NULL, 0, cfg);
}
static const char *gpt = "{\"type\":\"gpt\",\"n_layer\":4,\"n_head\":4,\"n_embd\":64,\"seq_len\":32}";

Test(config_pp, keys_defaults_and_identity) {
    dt_config_t cfg;
    dt_config_init(&cfg);
    cr_assert_eq(cfg.pp.stages, 1);
    cr_assert_eq(cfg.pp.virtual_stages, 1);
    cr_assert_eq(dt_pp_schedule_parse("1f1b"), cfg.pp.schedule);
    cr_assert_eq(cfg.pp.partition, DT_CONFIG_PP_PARTITION_UNIFORM);
    dt_config_free(&cfg);
    cr_assert_eq(load(gpt,
                      "\"pipeline\":{\"stages\":2,\"schedule\":\"gpipe\",\"partition\":\"flops\"},"
                      "\"tensor_parallel\":{\"size\":2},\"train_micro_batch_size_per_gpu\":2,"
                      "\"gradient_accumulation_steps\":3",
                      &cfg),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.pp.schedule, DT_PP_GPIPE);
    cr_assert_eq(cfg.pp.partition, DT_CONFIG_PP_PARTITION_FLOPS);
    cr_assert_eq(dt_config_resolve(&cfg, 8), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.dp_size, 2);
    cr_assert_eq(cfg.train_batch_size, 2 * 3 * 2);
    cr_assert_neq(dt_config_resolve(&cfg, 6), DT_STATUS_OK);
    ASSERT_ERR(&cfg, "tensor_parallel.size 2 x pipeline.stages 2 = 4: expected a divisor of the world size 6");
    dt_config_free(&cfg);
    /* train_batch_size over DP = 8 / (1 x 4) = 2 */
    cr_assert_eq(load(gpt, "\"pipeline\":{\"stages\":4},\"train_batch_size\":16,\"train_micro_batch_size_per_gpu\":2",
                      &cfg),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(dt_config_resolve(&cfg, 8), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.gradient_accumulation_steps, 4);
    dt_config_free(&cfg);
}

/* The config's schedule rules are dt_pp_schedule_check's. */
Test(config_pp, schedule_rules_equal_the_scheduler) {
    static const char *names[] = {"gpipe", "1f1b", "interleaved"};
    for (int k = 0; k < 3; k++)
        for (int P = 2; P <= 4; P++)
            for (int V = 1; V <= 3; V++)
                for (int m = 1; m <= 9; m++) {
                    char extra[256], msg[256];
                    snprintf(extra, sizeof extra,
                             "\"pipeline\":{\"stages\":%d,\"schedule\":\"%s\",\"virtual_stages\":%d},"
                             "\"gradient_accumulation_steps\":%d",
                             P, names[k], V, m);
                    dt_config_t cfg;
                    cr_assert_eq(load("{\"type\":\"gpt\",\"n_layer\":12,\"n_head\":4,\"n_embd\":64}", extra, &cfg),
                                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
                    int cfg_bad = dt_config_resolve(&cfg, P) != DT_STATUS_OK;
                    int sched_bad = dt_pp_schedule_check((dt_pp_schedule_t)dt_pp_schedule_parse(names[k]), P, V, m,
                                                         msg, sizeof msg);
                    cr_assert_eq(cfg_bad, sched_bad, "%s P %d V %d m %d: config %s, scheduler %s", names[k], P, V, m,
                                 cfg_bad ? dt_config_errors(&cfg) : "ok", sched_bad ? msg : "ok");
                    if (cfg_bad) cr_assert(strstr(dt_config_errors(&cfg), msg), "%s vs %s", dt_config_errors(&cfg), msg);
                    dt_config_free(&cfg);
                }
}

Test(config_pp, errors_name_the_key) {
    dt_config_t cfg;
    cr_assert_neq(load(gpt, "\"pipeline\":{\"stages\":2},\"strategy\":\"hsdp\"", &cfg), DT_STATUS_OK);
    ASSERT_ERR(&cfg, "pipeline.stages 2 with strategy \"hsdp\"");
    dt_config_free(&cfg);
    cr_assert_neq(load("{\"type\":\"mlp\"}", "\"pipeline\":{\"stages\":2}", &cfg), DT_STATUS_OK);
    ASSERT_ERR(&cfg, "model.type \"mlp\" has no pipeline stages");
    dt_config_free(&cfg);
    cr_assert_neq(load(gpt, "\"pipeline\":{\"stages\":0}", &cfg), DT_STATUS_OK);
    ASSERT_ERR(&cfg, "pipeline.stages");
    dt_config_free(&cfg);
    cr_assert_neq(load(gpt, "\"pipeline\":{\"schedule\":\"interleaved\",\"virtual_stages\":2}", &cfg),
                  DT_STATUS_OK);
    ASSERT_ERR(&cfg, "pipeline.virtual_stages 2: expected 1 without a pipeline");
    dt_config_free(&cfg);
    cr_assert_neq(load(gpt, "\"pipeline\":{\"schedule\":\"zb\"}", &cfg), DT_STATUS_OK);
    ASSERT_ERR(&cfg, "pipeline.schedule");
    dt_config_free(&cfg);
}
