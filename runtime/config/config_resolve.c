/*
 * config_resolve.c - the batch identity (config.h): train_batch_size =
 * micro batch x gradient accumulation x world size, any two given and the third
 * derived, checked against the world size the launcher knows; and whether a config
 * runs on CUDA.
 */
#include "runtime/config/config_impl.h"

#include <stdbool.h>
#include <stdio.h>

#include "common/gpuinfo.h" /* defines: dt_gpuinfo_count */

dt_status_t dt_config_resolve(dt_config_t *cfg, int world_size) {
    /* forget the errors of an earlier resolve */
    cfg->errors_len = cfg->load_errors_len;
    cfg->n_errors = cfg->load_n_errors;
    if (cfg->errors) cfg->errors[cfg->errors_len] = '\0';
    const char *src = cfg->source ? cfg->source : "config";

    if (world_size < 1) {
        char msg[600];
        snprintf(msg, sizeof msg, "world size: expected an integer >= 1, found %d", world_size);
        dt_config_add_error_(cfg, src, msg);
        dt_config_error_detail_(cfg);
        return DT_STATUS_CONFIG;
    }
    cfg->world_size = world_size;
    bool g_tb = cfg->origin[dt_config_key_find_("train_batch_size")] != 0;
    bool g_mb = cfg->origin[dt_config_key_find_("train_micro_batch_size_per_gpu")] != 0;
    bool g_ga = cfg->origin[dt_config_key_find_("gradient_accumulation_steps")] != 0;
    int64_t tb = g_tb ? cfg->train_batch_size : 0;
    int64_t mb = g_mb ? cfg->train_micro_batch_size_per_gpu : 0;
    int64_t ga = g_ga ? cfg->gradient_accumulation_steps : 0;
    int64_t ws = world_size;
    const char *why = NULL;
    char whybuf[200];

    if (g_tb && g_mb && g_ga) {
        if (tb != mb * ga * ws) {
            snprintf(whybuf, sizeof whybuf, "%lld * %lld * %lld = %lld, not %lld",
                     (long long)mb, (long long)ga, (long long)ws, (long long)(mb * ga * ws),
                     (long long)tb);
            why = whybuf;
        }
    } else if (g_tb && g_mb) {
        if (tb % (mb * ws) != 0) {
            snprintf(whybuf, sizeof whybuf,
                     "%lld is not a multiple of %lld * %lld, so gradient_accumulation_steps "
                     "cannot be derived",
                     (long long)tb, (long long)mb, (long long)ws);
            why = whybuf;
        } else {
            ga = tb / (mb * ws);
        }
    } else if (g_tb && g_ga) {
        if (tb % (ga * ws) != 0) {
            snprintf(whybuf, sizeof whybuf,
                     "%lld is not a multiple of %lld * %lld, so train_micro_batch_size_per_gpu "
                     "cannot be derived",
                     (long long)tb, (long long)ga, (long long)ws);
            why = whybuf;
        } else {
            mb = tb / (ga * ws);
        }
    } else if (g_mb && g_ga) {
        tb = mb * ga * ws;
    } else if (g_tb) {
        ga = 1;
        if (tb % ws != 0) {
            snprintf(whybuf, sizeof whybuf,
                     "%lld is not a multiple of the world size, so "
                     "train_micro_batch_size_per_gpu cannot be derived",
                     (long long)tb);
            why = whybuf;
        } else {
            mb = tb / ws;
        }
    } else if (g_mb) {
        ga = 1;
        tb = mb * ws;
    } else {
        mb = 1;
        ga = g_ga ? ga : 1;
        tb = mb * ga * ws;
    }
    if (why) {
        char a[32], b[32], c[32];
        snprintf(a, sizeof a, g_tb ? "%lld" : "(not given)", (long long)tb);
        snprintf(b, sizeof b, g_mb ? "%lld" : "(not given)", (long long)mb);
        snprintf(c, sizeof c, g_ga ? "%lld" : "(not given)", (long long)ga);
        char msg[600];
        snprintf(msg, sizeof msg,
                  "train_batch_size %s, train_micro_batch_size_per_gpu %s, "
                  "gradient_accumulation_steps %s, world size %d: expected train_batch_size = "
                  "train_micro_batch_size_per_gpu * gradient_accumulation_steps * world size, "
                  "found %s",
                  a, b, c, world_size, why);
        dt_config_add_error_(cfg, src, msg);
        dt_config_error_detail_(cfg);
        return DT_STATUS_CONFIG;
    }
    cfg->train_batch_size = tb;
    cfg->train_micro_batch_size_per_gpu = mb;
    cfg->gradient_accumulation_steps = ga;
    if (cfg->n_errors) {
        dt_config_error_detail_(cfg);
        return DT_STATUS_CONFIG;
    }
    return DT_STATUS_OK;
}

int dt_config_uses_cuda(const dt_config_t *cfg) {
    return cfg->device == DT_CONFIG_DEVICE_CUDA || (cfg->device == DT_CONFIG_DEVICE_AUTO && dt_gpuinfo_count() > 0);
}
