/*
 * config_recompute.c - the activation_checkpointing section (config.h: recompute):
 * DeepSpeed's keys and dtrun's policy and every, resolved once the model is known.
 * DeepSpeed turns checkpointing on by the section itself (its models wrap each block
 * in checkpoint()), so any of its keys given without a policy means full;
 * number_checkpoints N sets every to ceil(layers / N) unless every is given; the keys
 * that change nothing here are accepted with a warning naming them.
 */
#include <stdio.h>
#include <string.h>

#include "runtime/config/config_errors.h"
#include "runtime/config/config_impl.h"

/* The row of path was set by the file or an override. */
static int given(const dt_config_t *cfg, const char *path) {
    int r = dt_config_key_find_(path);
    return r >= 0 && cfg->origin[r] != DT_CONFIG_ORIGIN_DEFAULT;
}

/* The model's blocks (the layers a policy checkpoints), 0 for a model without. */
static int model_layers(const dt_config_t *cfg) {
    const dt_model_ops *ops = cfg->model.ops;
    if (!ops || !ops->pipeline) return 0;
    dt_model_spec spec = cfg->model;
    if (spec.vocab_size == 0) spec.vocab_size = 256; /* from the data later: the blocks do not depend on it */
    dt_model_layout l;
    if (dt_model_layout_init(&spec, &l) != DT_STATUS_OK) return 0; /* the model's own error says why */
    int n = dt_model_max_chunk_blocks(&l);
    dt_model_layout_free(&l);
    return n;
}

void dt_config_recompute_finish_(dt_config_t *cfg, const char *src) {
    static const char *const ds_keys[] = {"number_checkpoints", "partition_activations", "cpu_checkpointing",
                                          "contiguous_memory_optimization", "synchronize_checkpoint_boundary",
                                          "profile"};
    char path[96], msg[600];
    int any_ds = 0;
    for (size_t i = 0; i < sizeof ds_keys / sizeof *ds_keys; i++) {
        snprintf(path, sizeof path, "activation_checkpointing.%s", ds_keys[i]);
        any_ds |= given(cfg, path);
    }
    if (any_ds && !given(cfg, "activation_checkpointing.policy")) cfg->recompute.policy = DT_MODEL_RECOMPUTE_FULL;
    const struct {
        bool on;
        const char *key, *why;
    } idle[] = {
        {cfg->recompute.partition_activations, "partition_activations", "checkpoints are not split over TP ranks"},
        {cfg->recompute.cpu_checkpointing, "cpu_checkpointing", "checkpoints stay in device memory"},
        {cfg->recompute.contiguous_memory_optimization, "contiguous_memory_optimization",
         "the activation arena is one contiguous buffer already"},
        {cfg->recompute.synchronize_checkpoint_boundary, "synchronize_checkpoint_boundary", "nothing to synchronize"},
        {cfg->recompute.profile, "profile", "the step's compute time includes the recompute"},
    };
    for (size_t i = 0; i < sizeof idle / sizeof *idle; i++)
        if (idle[i].on) {
            snprintf(msg, sizeof msg, "%s: activation_checkpointing.%s is accepted and has no effect in dtrun (%s)",
                     src, idle[i].key, idle[i].why);
            dt_config_add_warning_(cfg, msg);
        }
    if (cfg->recompute.policy == DT_MODEL_RECOMPUTE_NONE) return;
    int layers = model_layers(cfg);
    if (layers == 0 && cfg->model.ops && !cfg->model.ops->pipeline) {
        snprintf(msg, sizeof msg,
                 "activation_checkpointing.policy: expected \"none\" for model.type \"%s\" (it has no blocks to "
                 "recompute; gpt and llama have), found \"%s\"",
                 cfg->model.ops->name, dt_model_recompute_name(cfg->recompute.policy));
        dt_config_add_error_(cfg, src, msg);
        return;
    }
    int64_t n = cfg->recompute.number_checkpoints;
    if (n > 0 && layers > 0 && !given(cfg, "activation_checkpointing.every")) {
        if (n > layers) {
            snprintf(msg, sizeof msg,
                     "activation_checkpointing.number_checkpoints: expected at most the model's %d blocks, found "
                     "%lld",
                     layers, (long long)n);
            dt_config_add_error_(cfg, src, msg);
            return;
        }
        cfg->recompute.every = (layers + n - 1) / n;
    }
}
