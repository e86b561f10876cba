/*
 * test_config.c - the config loader: types, ranges, unknown and ignored keys,
 * "auto", the batch identity at several world sizes, strategy vs ZeRO stage,
 * overrides, dump/reload round trips and the presets in configs/.
 */
#include <criterion/criterion.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "runtime/config/config.h"

static void quiet(void) { dt_log_set_level(DT_LOG_OFF); }
TestSuite(config, .init = quiet);

/* Loads json (with overrides) into cfg; returns the status. */
static dt_status_t load(const char *json, dt_config_t *cfg, int n, const char *const *ov) {
    return dt_config_load_string(json, "x.json", ov, n, cfg);
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

#define ASSERT_ERR(cfg, text)                                                          \
    cr_assert(strstr(dt_config_errors(cfg), text), "missing error <%s> in:\n%s", text, \
              dt_config_errors(cfg))

Test(config, defaults_are_valid_and_documented) {
    dt_config_t cfg;
    dt_config_init(&cfg);
    cr_assert_eq(cfg.n_errors, 0, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.optimizer.type, DT_OPTIM_ADAMW);
    cr_assert_eq(cfg.optimizer.lr, 1e-3);
    cr_assert_eq(cfg.optimizer.betas[0], 0.9);
    cr_assert_eq(cfg.optimizer.betas[1], 0.999);
    cr_assert_eq(cfg.gradient_clipping, 1.0);
    cr_assert_eq(cfg.zero.reduce_bucket_size, 25 * 1024 * 1024 / 4);
    cr_assert_eq(cfg.zero.stage3_prefetch_bucket_size, 50000000);
    cr_assert_eq(cfg.comm.timeout_s, 300.0);
    cr_assert_eq(cfg.model.vocab_pad_multiple, 64);
    cr_assert_str_eq(cfg.checkpoint.resume, "auto");
    cr_assert_null(cfg.data.train);
    cr_assert_eq(cfg.train_batch_size, 0); /* derived by resolve */
    dt_config_free(&cfg);

    /* --keys lists every key once, with its default */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    dt_config_print_keys(f);
    fclose(f);
    cr_assert(strstr(buf, "optimizer.params.lr"));
    cr_assert(strstr(buf, "zero_optimization.reduce_bucket_size"));
    cr_assert(strstr(buf, "ddp|zero1|zero2|fsdp|hsdp"));
    char *dump = NULL;
    dt_config_init(&cfg);
    dump = dt_config_dump_json(&cfg);
    /* one line per key in --keys, plus the header */
    int keys_listed = count_lines(buf) - 1;
    int colons = 0;
    for (char *p = dump; (p = strstr(p, "\":\t")); p++) colons++;
    cr_assert_gt(keys_listed, 50);
    /* the dump holds every key plus its sections (optimizer, optimizer.params, ...,
     * model.rope_scaling, tensor_parallel, context_parallel, pipeline,
     * activation_checkpointing, zero_optimization.offload_optimizer, lora, tensorboard) */
    cr_assert_eq(colons, keys_listed + 20, "dump %d entries, keys %d", colons, keys_listed);
    free(dump);
    free(buf);
    dt_config_free(&cfg);
}

Test(config, type_errors_name_file_key_expected_and_found) {
    const char *json = "{\"bf16\":{\"enabled\":\"yes\"},"
                       "\"train_steps\":\"10\","
                       "\"seed\":2.5,"
                       "\"optimizer\":{\"params\":{\"lr\":\"abc\",\"betas\":[0.9]}},"
                       "\"data\":{\"train\":5},"
                       "\"strategy\":\"zero4\","
                       "\"eval\":[1,2],"
                       "\"log\":{\"dir\":\"\"}}";
    dt_config_t cfg;
    cr_assert_eq(load(json, &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: bf16.enabled: expected true or false, found \"yes\"");
    ASSERT_ERR(&cfg, "x.json: train_steps: expected an integer >= 1, found \"10\"");
    ASSERT_ERR(&cfg, "x.json: seed: expected an integer >= 0, found 2.5");
    ASSERT_ERR(&cfg, "x.json: optimizer.params.lr: expected a number > 0, found \"abc\"");
    ASSERT_ERR(&cfg,
               "x.json: optimizer.params.betas: expected a list of 2 numbers in [0, 1), found [0.9]");
    ASSERT_ERR(&cfg, "x.json: data.train: expected a non-empty path string, found 5");
    ASSERT_ERR(&cfg, "x.json: strategy: expected one of \"ddp\", \"zero1\", \"zero2\", \"fsdp\", "
                     "\"hsdp\", found \"zero4\"");
    ASSERT_ERR(&cfg, "x.json: eval: expected an object, found [1,2]");
    ASSERT_ERR(&cfg, "x.json: log.dir: expected a non-empty path string, found \"\"");
    /* all of them, not just the first: one line each */
    cr_assert_eq(cfg.n_errors, 9, "%s", dt_config_errors(&cfg));
    cr_assert_eq(count_lines(dt_config_errors(&cfg)), 9);
    /* the status detail carries the start of the list */
    cr_assert(strstr(dt_error_detail(), "9 config errors"));
    dt_config_free(&cfg);
}

Test(config, range_errors) {
    const char *json = "{\"zero_optimization\":{\"stage\":4},"
                       "\"optimizer\":{\"params\":{\"lr\":0,\"eps\":-1,\"weight_decay\":-0.1,"
                       "\"betas\":[0.9,1.0]}},"
                       "\"scheduler\":{\"params\":{\"warmup_min_ratio\":1.5,\"warmup_num_steps\":0}},"
                       "\"data\":{\"val_fraction\":1},"
                       "\"model\":{\"n_layer\":0,\"vocab_size\":-1},"
                       "\"comm\":{\"timeout_s\":0},"
                       "\"threads\":-1,"
                       "\"train_batch_size\":0}";
    dt_config_t cfg;
    cr_assert_eq(load(json, &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "zero_optimization.stage: expected an integer in [0, 3], found 4");
    ASSERT_ERR(&cfg, "optimizer.params.lr: expected a number > 0, found 0");
    ASSERT_ERR(&cfg, "optimizer.params.eps: expected a number > 0, found -1");
    ASSERT_ERR(&cfg, "optimizer.params.weight_decay: expected a number >= 0, found -0.1");
    ASSERT_ERR(&cfg, "optimizer.params.betas: expected a list of 2 numbers in [0, 1), found [0.9,1]");
    ASSERT_ERR(&cfg, "scheduler.params.warmup_min_ratio: expected a number in [0, 1], found 1.5");
    ASSERT_ERR(&cfg, "scheduler.params.warmup_num_steps: expected an integer >= 1, found 0");
    ASSERT_ERR(&cfg, "data.val_fraction: expected a number in [0, 1), found 1");
    ASSERT_ERR(&cfg, "model.n_layer: expected an integer in [1, 1024], found 0");
    ASSERT_ERR(&cfg, "model.vocab_size: expected an integer in [0, 1.67772e+07], found -1");
    ASSERT_ERR(&cfg, "comm.timeout_s: expected a number in (0, 1e+06], found 0");
    ASSERT_ERR(&cfg, "threads: expected an integer in [0, 4096], found -1");
    ASSERT_ERR(&cfg, "train_batch_size: expected an integer >= 1, found 0");
    cr_assert_eq(cfg.n_errors, 13, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
}

Test(config, unknown_keys_get_did_you_mean) {
    const char *json = "{\"optimiser\":{},\"model\":{\"n_layers\":2},"
                       "\"zero_optimization\":{\"stag\":1},"
                       "\"train_micro_batch_size\":4,"
                       "\"optimizer\":{\"param\":{\"lr\":1}},"
                       "\"totally_unrelated_thing\":1}";
    dt_config_t cfg;
    cr_assert_eq(load(json, &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: optimiser: unknown key (did you mean optimizer?)");
    ASSERT_ERR(&cfg, "x.json: model.n_layers: unknown key (did you mean model.n_layer?)");
    ASSERT_ERR(&cfg, "zero_optimization.stag: unknown key (did you mean zero_optimization.stage?)");
    ASSERT_ERR(&cfg, "train_micro_batch_size: unknown key (did you mean "
                     "train_micro_batch_size_per_gpu?)");
    ASSERT_ERR(&cfg, "optimizer.param: unknown key (did you mean optimizer.params?)");
    ASSERT_ERR(&cfg, "totally_unrelated_thing: unknown key (dtrun config --keys lists them)");
    cr_assert_eq(cfg.n_errors, 6, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
}

Test(config, deepspeed_keys_dtrun_ignores_are_listed_once) {
    const char *json = "{\"fp16\":{\"enabled\":true,\"loss_scale\":0},"
                       "\"wall_clock_breakdown\":false,\"activation_checkpointing\":{},"
                       "\"flops_profiler\":{\"enabled\":false},\"wandb\":{},"
                       "\"tensorboard\":{\"enabled\":true,\"output_path\":\"tb\",\"job_name\":\"j\"},"
                       "\"zero_allow_untested_optimizer\":true,\"prescale_gradients\":false,"
                       "\"zero_optimization\":{\"stage\":2,\"offload_optimizer\":{\"device\":"
                       "\"cpu\",\"buffer_count\":4},\"sub_group_size\":1e9},"
                       "\"optimizer\":{\"type\":\"Adam\",\"params\":{\"torch_adam\":true}}}";
    dt_config_t cfg;
    cr_assert_eq(load(json, &cfg, 0, NULL), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    const char *w = dt_config_warnings(&cfg);
    const char *line = strstr(w, "ignoring DeepSpeed keys that dtrun does not implement: ");
    cr_assert(line, "%s", w);
    cr_assert_null(strstr(line + 1, "ignoring DeepSpeed keys"), "listed once");
    const char *names[] = {"fp16", "wall_clock_breakdown", "flops_profiler", "wandb", "zero_allow_untested_optimizer",
                           "prescale_gradients", "zero_optimization.offload_optimizer.buffer_count",
                           "zero_optimization.sub_group_size", "optimizer.params.torch_adam"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        cr_assert(strstr(line, names[i]), "%s not listed in %s", names[i], line);
    /* sub-keys of an ignored key are covered by it, not listed one by one */
    cr_assert_null(strstr(line, "fp16.enabled"));
    /* activation_checkpointing is implemented (config_recompute.c): an empty section
     * is not ignored and turns nothing on */
    cr_assert_null(strstr(line, "activation_checkpointing"), "%s", line);
    cr_assert_eq(cfg.recompute.policy, DT_MODEL_RECOMPUTE_NONE);
    /* tensorboard is implemented (runtime/train/train_tb.c): its keys are read, not ignored */
    cr_assert_null(strstr(line, "tensorboard"), "%s", line);
    cr_assert(cfg.tensorboard.enabled);
    cr_assert_str_eq(cfg.tensorboard.output_path, "tb");
    cr_assert_str_eq(cfg.tensorboard.job_name, "j");
    cr_assert_eq(cfg.zero.stage, 2);
    cr_assert_eq(cfg.strategy, DT_STRATEGY_ZERO2);
    /* offload_optimizer is implemented: device and pin_memory are keys, its other knobs ignored */
    cr_assert_null(strstr(line, "offload_optimizer.device"));
    cr_assert_eq(cfg.zero.offload_optimizer.device, DT_CONFIG_OFFLOAD_CPU);
    cr_assert(cfg.zero.offload_optimizer.pin_memory, "pin_memory defaults to true, as DeepSpeed's");
    cr_assert_eq(cfg.optimizer.type, DT_OPTIM_ADAM);
    cr_assert(cfg.optimizer.adam_w_mode, "DeepSpeed's Adam decays as AdamW by default");
    dt_config_free(&cfg);
}

/* activation_checkpointing: dtrun's policy and every; DeepSpeed's keys mean full and
 * number_checkpoints sets every; the keys without effect warn by name. */
Test(config, activation_checkpointing_section) {
    dt_config_t cfg;
    cr_assert_eq(load("{\"model\":{\"type\":\"gpt\",\"n_layer\":6},\"data\":{\"train\":\"x\"},"
                      "\"activation_checkpointing\":{\"policy\":\"selective\",\"every\":2}}",
                      &cfg, 0, NULL),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.recompute.policy, DT_MODEL_RECOMPUTE_SELECTIVE);
    cr_assert_eq(cfg.recompute.every, 2);
    dt_config_free(&cfg);
    cr_assert_eq(load("{\"model\":{\"type\":\"gpt\",\"n_layer\":6},\"data\":{\"train\":\"x\"},"
                      "\"activation_checkpointing\":{\"number_checkpoints\":4,\"cpu_checkpointing\":true}}",
                      &cfg, 0, NULL),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.recompute.policy, DT_MODEL_RECOMPUTE_FULL);
    cr_assert_eq(cfg.recompute.every, 2, "ceil(6 / 4)");
    cr_assert(strstr(dt_config_warnings(&cfg), "activation_checkpointing.cpu_checkpointing is accepted and has no effect"),
              "%s", dt_config_warnings(&cfg));
    dt_config_free(&cfg);
}

/* A ZeRO-2 config as the HF Trainer integration writes it, "auto" everywhere. */
static const char hf_ds_config[] =
    "{\n"
    "  \"fp16\": {\"enabled\": \"auto\", \"loss_scale\": 0, \"loss_scale_window\": 1000,\n"
    "           \"initial_scale_power\": 16, \"hysteresis\": 2, \"min_loss_scale\": 1},\n"
    "  \"bf16\": {\"enabled\": \"auto\"},\n"
    "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"betas\": \"auto\",\n"
    "                \"eps\": \"auto\", \"weight_decay\": \"auto\"}},\n"
    "  \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": \"auto\",\n"
    "                \"warmup_max_lr\": \"auto\", \"warmup_num_steps\": \"auto\",\n"
    "                \"total_num_steps\": \"auto\"}},\n"
    "  \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\",\n"
    "      \"pin_memory\": true}, \"allgather_partitions\": true, \"allgather_bucket_size\": 2e8,\n"
    "      \"overlap_comm\": true, \"reduce_scatter\": true, \"reduce_bucket_size\": \"auto\",\n"
    "      \"contiguous_gradients\": true, \"round_robin_gradients\": true},\n"
    "  \"gradient_accumulation_steps\": \"auto\",\n"
    "  \"gradient_clipping\": \"auto\",\n"
    "  \"steps_per_print\": 2000,\n"
    "  \"train_batch_size\": \"auto\",\n"
    "  \"train_micro_batch_size_per_gpu\": \"auto\",\n"
    "  \"wall_clock_breakdown\": false\n"
    "}\n";

Test(config, deepspeed_hf_config_with_auto_loads_as_it_is) {
    dt_config_t cfg;
    cr_assert_eq(load(hf_ds_config, &cfg, 0, NULL), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(dt_config_resolve(&cfg, 4), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.train_micro_batch_size_per_gpu, 1);
    cr_assert_eq(cfg.gradient_accumulation_steps, 1);
    cr_assert_eq(cfg.train_batch_size, 4);
    cr_assert_eq(cfg.optimizer.lr, 1e-3);
    cr_assert_eq(cfg.optimizer.betas[1], 0.999);
    cr_assert_eq(cfg.gradient_clipping, 1.0);
    cr_assert_eq(cfg.scheduler.type, DT_SCHED_WARMUP_DECAY_LR);
    cr_assert_eq(cfg.scheduler.warmup_max_lr, cfg.optimizer.lr);
    cr_assert_eq(cfg.scheduler.total_num_steps, cfg.train_steps);
    cr_assert_eq(cfg.zero.stage, 2);
    cr_assert_eq(cfg.strategy, DT_STRATEGY_ZERO2);
    cr_assert_eq(cfg.zero.allgather_bucket_size, 200000000);
    cr_assert_eq(cfg.zero.reduce_bucket_size, 6553600);
    cr_assert_eq(cfg.model.ops, &dt_model_mlp); /* no model section: synthetic MLP */
    const char *w = dt_config_warnings(&cfg);
    cr_assert(strstr(w, "\"auto\" resolved to dtrun's default or derived value for: "), "%s", w);
    cr_assert(strstr(w, "optimizer.params.lr"));
    cr_assert(strstr(w, "train_batch_size"));
    cr_assert(strstr(w, "zero_optimization.round_robin_gradients"));
    cr_assert(strstr(w, "no \"model\" section"));
    dt_config_free(&cfg);
}

Test(config, auto_cannot_stand_for_a_path) {
    dt_config_t cfg;
    cr_assert_eq(load("{\"data\":{\"train\":\"auto\"}}", &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "data.train: expected a non-empty path string, found \"auto\" (dtrun "
                     "cannot resolve \"auto\" for a path)");
    dt_config_free(&cfg);
}

/* The batch identity: {given tb, mb, ga (0 = not given), world size, want tb, mb, ga
 * (0 = an error)}. */
static const struct {
    int tb, mb, ga, ws, want_tb, want_mb, want_ga;
} batch_cases[] = {
    /* all three */
    {32, 8, 4, 1, 32, 8, 4},   {32, 8, 2, 2, 32, 8, 2},   {24, 8, 1, 3, 24, 8, 1},
    {32, 8, 1, 4, 32, 8, 1},   {32, 8, 4, 2, 0, 0, 0},    {32, 8, 1, 3, 0, 0, 0},
    /* train + micro -> accumulation */
    {32, 8, 0, 1, 32, 8, 4},   {32, 8, 0, 2, 32, 8, 2},   {48, 8, 0, 3, 48, 8, 2},
    {32, 8, 0, 4, 32, 8, 1},   {32, 8, 0, 3, 0, 0, 0},    {16, 8, 0, 4, 0, 0, 0},
    /* train + accumulation -> micro */
    {32, 0, 4, 1, 32, 8, 4},   {32, 0, 4, 2, 32, 4, 4},   {36, 0, 4, 3, 36, 3, 4},
    {32, 0, 4, 4, 32, 2, 4},   {32, 0, 4, 3, 0, 0, 0},
    /* micro + accumulation -> train */
    {0, 8, 4, 1, 32, 8, 4},    {0, 8, 4, 2, 64, 8, 4},    {0, 8, 4, 3, 96, 8, 4},
    {0, 8, 4, 4, 128, 8, 4},
    /* one of them */
    {32, 0, 0, 1, 32, 32, 1},  {32, 0, 0, 2, 32, 16, 1},  {32, 0, 0, 3, 0, 0, 0},
    {32, 0, 0, 4, 32, 8, 1},   {0, 8, 0, 1, 8, 8, 1},     {0, 8, 0, 3, 24, 8, 1},
    {0, 0, 4, 2, 8, 1, 4},     {0, 0, 0, 3, 3, 1, 1},
};

Test(config, batch_identity_at_world_sizes_1_to_4) {
    for (size_t i = 0; i < sizeof batch_cases / sizeof *batch_cases; i++) {
        char json[256];
        size_t n = (size_t)snprintf(json, sizeof json, "{\"train_steps\":5");
        if (batch_cases[i].tb)
            n += (size_t)snprintf(json + n, sizeof json - n, ",\"train_batch_size\":%d",
                                  batch_cases[i].tb);
        if (batch_cases[i].mb)
            n += (size_t)snprintf(json + n, sizeof json - n,
                                  ",\"train_micro_batch_size_per_gpu\":%d", batch_cases[i].mb);
        if (batch_cases[i].ga)
            n += (size_t)snprintf(json + n, sizeof json - n,
                                  ",\"gradient_accumulation_steps\":%d", batch_cases[i].ga);
        snprintf(json + n, sizeof json - n, "}");
        dt_config_t cfg;
        cr_assert_eq(load(json, &cfg, 0, NULL), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
        dt_status_t st = dt_config_resolve(&cfg, batch_cases[i].ws);
        if (batch_cases[i].want_tb) {
            cr_assert_eq(st, DT_STATUS_OK, "case %zu: %s", i, dt_config_errors(&cfg));
            cr_assert_eq(cfg.train_batch_size, batch_cases[i].want_tb, "case %zu", i);
            cr_assert_eq(cfg.train_micro_batch_size_per_gpu, batch_cases[i].want_mb, "case %zu", i);
            cr_assert_eq(cfg.gradient_accumulation_steps, batch_cases[i].want_ga, "case %zu", i);
            cr_assert_eq(cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu *
                                                   cfg.gradient_accumulation_steps *
                                                   batch_cases[i].ws);
        } else {
            cr_assert_eq(st, DT_STATUS_CONFIG, "case %zu should fail: %s", i, json);
            const char *e = dt_config_errors(&cfg);
            char ws[32];
            snprintf(ws, sizeof ws, "world size %d", batch_cases[i].ws);
            cr_assert(strstr(e, "train_batch_size") && strstr(e, "train_micro_batch_size_per_gpu") &&
                          strstr(e, "gradient_accumulation_steps") && strstr(e, ws),
                      "case %zu: %s", i, e);
            cr_assert_eq(cfg.n_errors, 1, "%s", e);
        }
        dt_config_free(&cfg);
    }
}

Test(config, batch_error_text_and_resolve_again_for_another_world_size) {
    dt_config_t cfg;
    const char *json = "{\"train_batch_size\":32,\"train_micro_batch_size_per_gpu\":8,"
                       "\"gradient_accumulation_steps\":4}";
    cr_assert_eq(load(json, &cfg, 0, NULL), DT_STATUS_OK);
    cr_assert_eq(dt_config_resolve(&cfg, 2), DT_STATUS_CONFIG);
    cr_assert_str_eq(dt_config_errors(&cfg),
                     "x.json: train_batch_size 32, train_micro_batch_size_per_gpu 8, "
                     "gradient_accumulation_steps 4, world size 2: expected train_batch_size = "
                     "train_micro_batch_size_per_gpu * gradient_accumulation_steps * world size, "
                     "found 8 * 4 * 2 = 64, not 32\n");
    /* the same config is fine at world size 1, and the old error is gone */
    cr_assert_eq(dt_config_resolve(&cfg, 1), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_str_eq(dt_config_errors(&cfg), "");
    dt_config_free(&cfg);

    /* derived values never count as given: 32 / 8 gives 4 at ws 1, 2 at ws 2 */
    cr_assert_eq(load("{\"train_batch_size\":32,\"train_micro_batch_size_per_gpu\":8}", &cfg, 0,
                      NULL),
                 DT_STATUS_OK);
    cr_assert_eq(dt_config_resolve(&cfg, 1), DT_STATUS_OK);
    cr_assert_eq(cfg.gradient_accumulation_steps, 4);
    cr_assert_eq(dt_config_resolve(&cfg, 2), DT_STATUS_OK);
    cr_assert_eq(cfg.gradient_accumulation_steps, 2);
    cr_assert_eq(dt_config_resolve(&cfg, 0), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "world size: expected an integer >= 1, found 0");
    dt_config_free(&cfg);
}

Test(config, strategy_and_zero_stage) {
    dt_config_t cfg;
    /* both in the file and different: an error naming both */
    cr_assert_eq(load("{\"strategy\":\"fsdp\",\"zero_optimization\":{\"stage\":1}}", &cfg, 0, NULL),
                 DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "strategy \"fsdp\" and zero_optimization.stage 1: expected the same thing "
                     "(fsdp is stage 3)");
    dt_config_free(&cfg);

    /* both and the same */
    cr_assert_eq(load("{\"strategy\":\"hsdp\",\"zero_optimization\":{\"stage\":3}}", &cfg, 0, NULL),
                 DT_STATUS_OK);
    cr_assert_eq(cfg.strategy, DT_STRATEGY_HSDP);
    dt_config_free(&cfg);

    /* one gives the other */
    cr_assert_eq(load("{\"strategy\":\"zero2\"}", &cfg, 0, NULL), DT_STATUS_OK);
    cr_assert_eq(cfg.zero.stage, 2);
    dt_config_free(&cfg);
    cr_assert_eq(load("{\"zero_optimization\":{\"stage\":3}}", &cfg, 0, NULL), DT_STATUS_OK);
    cr_assert_eq(cfg.strategy, DT_STRATEGY_FSDP);
    dt_config_free(&cfg);

    /* a command-line override of either sets both, over the file's pair */
    const char *file = "{\"strategy\":\"fsdp\",\"zero_optimization\":{\"stage\":3}}";
    const char *ov1[] = {"strategy=zero1"};
    cr_assert_eq(load(file, &cfg, 1, ov1), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.strategy, DT_STRATEGY_ZERO1);
    cr_assert_eq(cfg.zero.stage, 1);
    dt_config_free(&cfg);
    const char *ov2[] = {"zero_optimization.stage=0"};
    cr_assert_eq(load(file, &cfg, 1, ov2), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.strategy, DT_STRATEGY_DDP);
    cr_assert_eq(cfg.zero.stage, 0);
    dt_config_free(&cfg);
    /* and it also settles a file that contradicted itself */
    const char *ov3[] = {"strategy=zero2"};
    cr_assert_eq(load("{\"strategy\":\"fsdp\",\"zero_optimization\":{\"stage\":1}}", &cfg, 1, ov3),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.zero.stage, 2);
    dt_config_free(&cfg);
}

Test(config, overrides) {
    const char *ov[] = {
        "optimizer.params.lr=3e-4",          /* nested number */
        "model.n_layer=2",                   /* int */
        "strategy=fsdp",                     /* enum, not JSON: taken as a string */
        "data.train=runs/data/x.txt",        /* path */
        "data.val=\"quoted.txt\"",           /* a JSON string works too */
        "log.dir=2024",                      /* a string key keeps the text as it is */
        "optimizer.params.betas=[0.8,0.95]", /* JSON list */
        "bf16.enabled=true",                 /* JSON bool */
        "optimizer={\"params\":{\"eps\":1e-6}}", /* a whole section */
        "scheduler.type=warmupcosinelr",     /* enum names ignore case */
        "model.type=gpt",
        "optimizer.params.adam_w_mode=false",
    };
    dt_config_t cfg;
    cr_assert_eq(load("{\"optimizer\":{\"params\":{\"lr\":1}}}", &cfg, 12, ov), DT_STATUS_OK, "%s",
                 dt_config_errors(&cfg));
    cr_assert_eq(cfg.optimizer.lr, 3e-4);
    cr_assert_eq(cfg.model.n_layer, 2);
    cr_assert_eq(cfg.strategy, DT_STRATEGY_FSDP);
    cr_assert_eq(cfg.zero.stage, 3);
    cr_assert_str_eq(cfg.data.train, "runs/data/x.txt");
    cr_assert_str_eq(cfg.data.val, "quoted.txt");
    cr_assert_str_eq(cfg.log.dir, "2024");
    cr_assert_eq(cfg.optimizer.betas[0], 0.8);
    cr_assert_eq(cfg.optimizer.betas[1], 0.95);
    cr_assert(cfg.bf16.enabled);
    cr_assert_eq(cfg.optimizer.eps, 1e-6);
    cr_assert_eq(cfg.scheduler.type, DT_SCHED_WARMUP_COSINE_LR);
    cr_assert_eq(cfg.model.ops, &dt_model_gpt);
    cr_assert_not(cfg.optimizer.adam_w_mode);
    /* a later override on the loaded config */
    cr_assert_eq(dt_config_set(&cfg, "train_steps=77"), DT_STATUS_OK);
    cr_assert_eq(cfg.train_steps, 77);
    cr_assert_eq(cfg.scheduler.total_num_steps, 77);
    dt_config_free(&cfg);
}

Test(config, bad_overrides_name_the_override) {
    const char *ov[] = {"optimizer.params.lr=abc", "model.n_layr=2", "novalue", "=3",
                        "fp16.enabled=true"};
    dt_config_t cfg;
    cr_assert_eq(load("{}", &cfg, 5, ov), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "override optimizer.params.lr=abc: optimizer.params.lr: expected a number > 0, "
                     "found \"abc\"");
    ASSERT_ERR(&cfg, "override model.n_layr=2: model.n_layr: unknown key (did you mean "
                     "model.n_layer?)");
    ASSERT_ERR(&cfg, "override novalue: expected KEY=VALUE (e.g. optimizer.params.lr=3e-4), found "
                     "no '='");
    ASSERT_ERR(&cfg, "override =3: expected KEY=VALUE");
    cr_assert_eq(cfg.n_errors, 4, "%s", dt_config_errors(&cfg));
    /* an ignored DeepSpeed key on the command line is a warning, like in a file */
    cr_assert(strstr(dt_config_warnings(&cfg), "fp16.enabled"));
    dt_config_free(&cfg);
}

Test(config, duplicate_key_and_model_rules) {
    dt_config_t cfg;
    cr_assert_eq(load("{\"seed\":1,\"seed\":2}", &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: seed: expected the key once, found it given twice");
    dt_config_free(&cfg);

    cr_assert_eq(load("{\"model\":{\"type\":\"gpt\",\"n_head\":6,\"n_embd\":128},"
                      "\"data\":{\"val_fraction\":0}}",
                      &cfg, 0, NULL),
                 DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: model.n_embd: expected a multiple of model.n_head (6), found 128");
    ASSERT_ERR(&cfg, "x.json: data.train: expected a path or glob of training data");
    ASSERT_ERR(&cfg, "x.json: data.val_fraction: expected a number in (0, 1) when data.val is not "
                     "given and eval.every_steps is 100");
    cr_assert_eq(cfg.n_errors, 3, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);
    cr_assert_eq(dt_config_padded_vocab(50257, 128), 50304);
    cr_assert_eq(dt_config_padded_vocab(50257, 64), 50304);
    cr_assert_eq(dt_config_padded_vocab(256, 64), 256);
    cr_assert_eq(dt_config_padded_vocab(65, 1), 65);
}

/* dump -> load -> dump gives the same text, and the same values. */
static void assert_round_trip(dt_config_t *cfg, const char *what) {
    char *d1 = dt_config_dump_json(cfg);
    cr_assert_not_null(d1);
    dt_config_t back;
    dt_status_t st = dt_config_load_string(d1, "dump.json", NULL, 0, &back);
    cr_assert_eq(st, DT_STATUS_OK, "%s: reload of the dump: %s", what, dt_config_errors(&back));
    if (cfg->world_size) {
        cr_assert_eq(dt_config_resolve(&back, cfg->world_size), DT_STATUS_OK, "%s: %s", what,
                     dt_config_errors(&back));
    }
    char *d2 = dt_config_dump_json(&back);
    cr_assert_str_eq(d1, d2, "%s: dump differs after reload", what);
    cr_assert_eq(back.optimizer.lr, cfg->optimizer.lr);
    cr_assert_eq(back.optimizer.betas[1], cfg->optimizer.betas[1]);
    cr_assert_eq(back.scheduler.cos_min_ratio, cfg->scheduler.cos_min_ratio);
    cr_assert_eq(back.train_batch_size, cfg->train_batch_size);
    cr_assert_eq(back.strategy, cfg->strategy);
    cr_assert_eq(back.zero.stage, cfg->zero.stage);
    free(d1);
    free(d2);
    dt_config_free(&back);
}

Test(config, dump_reload_round_trip) {
    dt_config_t cfg;
    const char *ov[] = {"optimizer.params.lr=0.000123456789012345", "scheduler.type=WarmupLR",
                        "scheduler.params.cos_min_ratio=0.3333333333333333", "strategy=hsdp",
                        "data.train=a b/c\"d.txt", "seed=9007199254740991", "bf16.enabled=true",
                        "model.type=gpt", "threads=3"};
    cr_assert_eq(load("{\"train_micro_batch_size_per_gpu\":3}", &cfg, 9, ov), DT_STATUS_OK, "%s",
                 dt_config_errors(&cfg));
    assert_round_trip(&cfg, "before resolve"); /* batch sizes dumped as "auto" */
    cr_assert_eq(dt_config_resolve(&cfg, 3), DT_STATUS_OK);
    assert_round_trip(&cfg, "after resolve");
    dt_config_free(&cfg);

    dt_config_init(&cfg);
    assert_round_trip(&cfg, "defaults");
    dt_config_free(&cfg);
}

Test(config, every_preset_loads_resolves_and_round_trips) {
    glob_t g;
    cr_assert_eq(glob("configs/*.json", 0, NULL, &g), 0, "run from the repository root");
    cr_assert_geq(g.gl_pathc, 5);
    int seen = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        dt_config_t cfg;
        dt_status_t st = dt_config_load(g.gl_pathv[i], NULL, 0, &cfg);
        cr_assert_eq(st, DT_STATUS_OK, "%s", dt_config_errors(&cfg));
        cr_assert_str_eq(dt_config_warnings(&cfg), "", "%s", g.gl_pathv[i]);
        cr_assert_eq(dt_config_resolve(&cfg, 1), DT_STATUS_OK, "%s: %s", g.gl_pathv[i],
                     dt_config_errors(&cfg));
        assert_round_trip(&cfg, g.gl_pathv[i]);
        if (strstr(g.gl_pathv[i], "demo.json")) {
            seen++;
            cr_assert_eq(cfg.model.ops, &dt_model_gpt);
            cr_assert_str_eq(cfg.data.train, "runs/data/fortunes.txt");
            cr_assert_eq(cfg.model.vocab_size, 0); /* from the data: 256 for text, the shards' header's */
            cr_assert_eq(cfg.train_micro_batch_size_per_gpu, 16);
            cr_assert_eq(dt_config_resolve(&cfg, 2), DT_STATUS_OK);
            cr_assert_eq(cfg.train_batch_size, 32);
        }
        if (strstr(g.gl_pathv[i], "gpt2-124m.json")) {
            seen++;
            cr_assert_eq(cfg.model.n_layer, 12);
            cr_assert_eq(cfg.model.n_embd, 768);
            cr_assert_eq(dt_config_padded_vocab(cfg.model.vocab_size, cfg.model.vocab_pad_multiple),
                         50304);
            cr_assert(cfg.bf16.enabled);
            cr_assert_eq(cfg.optimizer.lr, 6e-4);
            for (int ws = 1; ws <= 8; ws *= 2) {
                cr_assert_eq(dt_config_resolve(&cfg, ws), DT_STATUS_OK);
                cr_assert_eq(cfg.train_batch_size, 512);
                cr_assert_eq(cfg.gradient_accumulation_steps, 8 / ws);
            }
        }
        if (strstr(g.gl_pathv[i], "fsdp-example.json")) {
            seen++;
            cr_assert_eq(cfg.strategy, DT_STRATEGY_FSDP);
            cr_assert_eq(cfg.zero.stage, 3);
        }
        if (strstr(g.gl_pathv[i], "llama-tiny.json")) {
            seen++;
            cr_assert_eq(cfg.model.ops, &dt_model_llama);
            cr_assert_str_eq(cfg.data.train, "runs/data/fortunes.txt");
            dt_model_layout l;
            cr_assert_eq(dt_model_layout_init(&cfg.model, &l), DT_STATUS_OK, "%s", dt_error_detail());
            cr_assert_eq(l.tied_head, 0);
            cr_assert_geq(dt_model_find(&l, "model.layers.3.mlp.down_proj.weight"), 0);
            dt_model_layout_free(&l);
        }
        if (strstr(g.gl_pathv[i], "mlp-tiny.json")) {
            seen++;
            cr_assert_eq(cfg.model.ops, &dt_model_mlp);
            cr_assert_leq(cfg.train_steps, 50);
        }
        dt_config_free(&cfg);
    }
    cr_assert_eq(seen, 5);
    globfree(&g);
}

Test(config, file_errors) {
    char dir[] = "/tmp/dt-config-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256];
    dt_config_t cfg;

    snprintf(path, sizeof path, "%s/missing.json", dir);
    cr_assert_eq(dt_config_load(path, NULL, 0, &cfg), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "missing.json: expected a readable JSON file, found an error: No such file");
    dt_config_free(&cfg);

    snprintf(path, sizeof path, "%s/bad.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\n  \"seed\": 1,\n  \"train_steps\": 10,,\n}\n", f);
    fclose(f);
    cr_assert_eq(dt_config_load(path, NULL, 0, &cfg), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "bad.json: line 3, column 21: expected valid JSON, found \",\"");
    dt_config_free(&cfg);

    f = fopen(path, "w");
    fputs("[1, 2]", f);
    fclose(f);
    cr_assert_eq(dt_config_load(path, NULL, 0, &cfg), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "bad.json: expected a JSON object at the top, found [1,2]");
    dt_config_free(&cfg);

    f = fopen(path, "w");
    fputs("  \n", f);
    fclose(f);
    cr_assert_eq(dt_config_load(path, NULL, 0, &cfg), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "bad.json: expected a JSON object, found an empty file");
    dt_config_free(&cfg);

    f = fopen(path, "w");
    fwrite("{\"seed\":1}\0{}", 1, 13, f);
    fclose(f);
    cr_assert_eq(dt_config_load(path, NULL, 0, &cfg), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "bad.json: expected a JSON text file, found a NUL byte at offset 10");
    dt_config_free(&cfg);

    cr_assert_eq(dt_config_load(dir, NULL, 0, &cfg), DT_STATUS_CONFIG); /* a directory */
    cr_assert_eq(cfg.n_errors, 1, "%s", dt_config_errors(&cfg));
    dt_config_free(&cfg);

    unlink(path);
    rmdir(dir);
}

Test(config, data_train_mixture_list) {
    dt_config_t cfg;
    cr_assert_eq(load("{\"data\":{\"train\":[{\"path\":\"a_*.bin\",\"weight\":0.7},"
                      "{\"path\":\"b_*.bin\",\"weight\":0.3}],\"prefetch\":4}}",
                      &cfg, 0, NULL),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_null(cfg.data.train);
    cr_assert_eq(cfg.data.n_sources, 2);
    cr_assert_str_eq(cfg.data.sources[1].path, "b_*.bin");
    cr_assert_eq(cfg.data.sources[0].weight, 0.7);
    cr_assert_eq(cfg.data.prefetch, 4);
    char *dump = dt_config_dump_json(&cfg);
    cr_assert(strstr(dump, "\"path\":\t\"a_*.bin\"") || strstr(dump, "\"path\": \"a_*.bin\""), "%s", dump);
    free(dump);
    assert_round_trip(&cfg, "mixture");
    /* an override with a plain path replaces the list */
    const char *ov[] = {"data.train=c.txt"};
    dt_config_free(&cfg);
    cr_assert_eq(load("{\"data\":{\"train\":[{\"path\":\"a.bin\",\"weight\":1}]}}", &cfg, 1, ov), DT_STATUS_OK);
    cr_assert_eq(cfg.data.n_sources, 0);
    cr_assert_str_eq(cfg.data.train, "c.txt");
    dt_config_free(&cfg);
    dt_config_init(&cfg);
    cr_assert_eq(cfg.data.prefetch, 2, "read-ahead of 2 by default");
    dt_config_free(&cfg);
}

Test(config, data_train_mixture_errors_name_the_item) {
    dt_config_t cfg;
    cr_assert_eq(load("{\"data\":{\"train\":[{\"path\":\"a.bin\",\"weight\":0.7},"
                      "{\"path\":\"b.bin\",\"weight\":-1},{\"path\":\"c.bin\",\"wieght\":1},"
                      "{\"weight\":2},{\"path\":3},\"d.bin\"]}}",
                      &cfg, 0, NULL),
                 DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: data.train[1].weight: expected a number > 0, found -1");
    ASSERT_ERR(&cfg, "x.json: data.train[2].wieght: unknown key");
    ASSERT_ERR(&cfg, "x.json: data.train[3].path: expected a path or glob, found nothing");
    ASSERT_ERR(&cfg, "x.json: data.train[4].path: expected a non-empty path or glob, found 3");
    ASSERT_ERR(&cfg, "x.json: data.train[5]: expected an object");
    dt_config_free(&cfg);
    cr_assert_eq(load("{\"data\":{\"train\":[]}}", &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "x.json: data.train: expected a path or glob, or a list of 1 to 16 sources, found an empty list");
    dt_config_free(&cfg);
    cr_assert_eq(load("{\"data\":{\"prefetch\":-1}}", &cfg, 0, NULL), DT_STATUS_CONFIG);
    ASSERT_ERR(&cfg, "data.prefetch");
    dt_config_free(&cfg);
}

/* dt_config_set_batch (the elastic resize's setter) leaves a config as the three
 * KEY=VALUE overrides it replaced did: the same status, errors, error detail, given
 * keys and dump, before and after a resolve; the first bad key stops the others. */
Test(config, set_batch_is_the_three_overrides) {
    static const char *const json =
        "{\"model\":{\"type\":\"gpt\",\"n_layer\":2,\"n_head\":2,\"n_embd\":32,\"seq_len\":32,"
        "\"vocab_size\":256},\"data\":{\"train\":\"t.txt\"},\"train_micro_batch_size_per_gpu\":4,"
        "\"gradient_accumulation_steps\":2}";
    static const int64_t cases[][3] = {
        {16, 4, 2}, {24, 4, 3}, {16, 4, 70000}, {3000000000LL, 1, 1}, {16, 3000000000LL, 2}, {16, 0, 2}, {8, 8, 1},
    };
    static const char *const keys[] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                       "gradient_accumulation_steps"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dt_config_t a, b;
        cr_assert_eq(load(json, &a, 0, NULL), DT_STATUS_OK, "%s", dt_config_errors(&a));
        cr_assert_eq(load(json, &b, 0, NULL), DT_STATUS_OK, "%s", dt_config_errors(&b));
        dt_status_t sa = DT_STATUS_OK;
        for (int k = 0; k < 3 && sa == DT_STATUS_OK; k++) {
            char kv[128];
            snprintf(kv, sizeof kv, "%s=%lld", keys[k], (long long)cases[c][k]);
            sa = dt_config_set(&a, kv);
        }
        char detail_a[4096];
        snprintf(detail_a, sizeof detail_a, "%s", dt_error_detail());
        dt_status_t sb = dt_config_set_batch(&b, cases[c][0], cases[c][1], cases[c][2]);
        cr_assert_eq(sb, sa, "case %zu", c);
        cr_assert_str_eq(dt_config_errors(&b), dt_config_errors(&a), "case %zu", c);
        if (sa != DT_STATUS_OK) cr_assert_str_eq(dt_error_detail(), detail_a, "case %zu", c);
        for (int k = 0; k < 3; k++)
            cr_assert_eq(dt_config_given(&b, keys[k]), dt_config_given(&a, keys[k]), "case %zu: %s", c, keys[k]);
        for (int resolved = 0; resolved < 2; resolved++) {
            if (resolved) { /* world size 2: the identity over the values set */
                cr_assert_eq(dt_config_resolve(&b, 2), dt_config_resolve(&a, 2), "case %zu", c);
                cr_assert_str_eq(dt_config_errors(&b), dt_config_errors(&a), "case %zu", c);
            }
            char *da = dt_config_dump_json(&a), *db = dt_config_dump_json(&b);
            cr_assert_str_eq(db, da, "case %zu", c);
            free(da);
            free(db);
        }
        dt_config_free(&a);
        dt_config_free(&b);
    }
}

Test(config, train_steps_override_ties_the_schedule_or_warns) {
    dt_config_t cfg;
    const char *tied = "{\"train_steps\": 1000, \"scheduler\": {\"type\": \"WarmupCosineLR\", "
                       "\"params\": {\"warmup_num_steps\": 10, \"total_num_steps\": 1000}}}";
    const char *ov[] = {"train_steps=100"};
    cr_assert_eq(load(tied, &cfg, 1, ov), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_expect_eq(cfg.scheduler.total_num_steps, 100, "the schedule follows train_steps: %lld",
                 (long long)cfg.scheduler.total_num_steps);
    cr_expect(strstr(dt_config_warnings(&cfg), "scheduler.params.total_num_steps follows it"), "%s",
              dt_config_warnings(&cfg));
    dt_config_free(&cfg);
    const char *apart = "{\"train_steps\": 1000, \"scheduler\": {\"type\": \"WarmupCosineLR\", "
                        "\"params\": {\"warmup_num_steps\": 10, \"total_num_steps\": 2000}}}";
    cr_assert_eq(load(apart, &cfg, 1, ov), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_expect_eq(cfg.scheduler.total_num_steps, 2000);
    cr_expect(strstr(dt_config_warnings(&cfg), "train_steps=100 from the command line, but "
                                               "scheduler.params.total_num_steps is 2000"),
              "%s", dt_config_warnings(&cfg));
    dt_config_free(&cfg);
    const char *both[] = {"train_steps=100", "scheduler.params.total_num_steps=500"};
    cr_assert_eq(load(apart, &cfg, 2, both), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_expect_eq(cfg.scheduler.total_num_steps, 500, "both given: as given");
    cr_expect_null(strstr(dt_config_warnings(&cfg), "train_steps=100"), "%s", dt_config_warnings(&cfg));
    dt_config_free(&cfg);
}
