/*
 * sched.c - learning-rate schedules (sched.h), DeepSpeed's formulas in double
 * precision. Warmup, for every schedule:
 *   n = max(2, warmup_num_steps)
 *   log:    g = ln(it + 1) / ln(n)        linear: g = it / n        for it < n
 * WarmupLR:       lr = min_lr + (max_lr - min_lr) * (it < n ? g : 1)
 * WarmupDecayLR:  after warmup g = max(0, (T - it) / max(1, T - n)), T = total_num_steps
 * WarmupCosineLR: ratio = warmup_min_ratio + g * (1 - warmup_min_ratio) during warmup,
 *                 then p = min(1, (it - n + 1) / max(1, T - n)),
 *                 ratio = max(0, cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi p)) / 2);
 *                 lr = optimizer lr * ratio.
 */
#include "runtime/train/sched.h"

#include <math.h>

static double warmup_gamma(const dt_config_t *cfg, int64_t it, int64_t n) {
    if (cfg->scheduler.warmup_type == DT_WARMUP_LINEAR) return (double)it / (double)n;
    return log((double)it + 1.0) / log((double)n);
}

double dt_sched_factor(const dt_config_t *cfg, int64_t it) {
    int64_t n = cfg->scheduler.warmup_num_steps < 2 ? 2 : cfg->scheduler.warmup_num_steps;
    int64_t total = cfg->scheduler.total_num_steps;
    switch (cfg->scheduler.type) {
    case DT_SCHED_NONE: return 1.0;
    case DT_SCHED_WARMUP_LR:
        if (it < 0) return 0.0;
        return it < n ? warmup_gamma(cfg, it, n) : 1.0;
    case DT_SCHED_WARMUP_DECAY_LR: {
        if (it < 0) return 0.0;
        if (it < n) return warmup_gamma(cfg, it, n);
        double span = (double)(total - n) > 1.0 ? (double)(total - n) : 1.0;
        double g = (double)(total - it) / span;
        return g > 0.0 ? g : 0.0;
    }
    case DT_SCHED_WARMUP_COSINE_LR: {
        if (it < 0) return 0.0;
        if (it < n) {
            double r = warmup_gamma(cfg, it, n);
            return cfg->scheduler.warmup_min_ratio + r * (1.0 - cfg->scheduler.warmup_min_ratio);
        }
        double done = (double)(it - n + 1);
        double span = total - n > 1 ? (double)(total - n) : 1.0;
        double p = done / span < 1.0 ? done / span : 1.0;
        double r = cfg->scheduler.cos_min_ratio +
                   (1.0 - cfg->scheduler.cos_min_ratio) * (1.0 + cos(M_PI * p)) / 2.0;
        return r > 0.0 ? r : 0.0;
    }
    }
    return 1.0;
}

double dt_sched_lr(const dt_config_t *cfg, int64_t it) {
    double f = dt_sched_factor(cfg, it);
    switch (cfg->scheduler.type) {
    case DT_SCHED_WARMUP_LR:
    case DT_SCHED_WARMUP_DECAY_LR:
        return cfg->scheduler.warmup_min_lr +
               (cfg->scheduler.warmup_max_lr - cfg->scheduler.warmup_min_lr) * f;
    case DT_SCHED_WARMUP_COSINE_LR: return cfg->optimizer.lr * f;
    case DT_SCHED_NONE:
    default: return cfg->optimizer.lr;
    }
}
