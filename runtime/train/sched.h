/*
 * sched.h - learning rate at a step, with DeepSpeed's formulas
 * (deepspeed/runtime/lr_schedules.py: WarmupLR, WarmupDecayLR, WarmupCosineLR),
 * and a constant optimizer.params.lr when no scheduler is configured.
 *
 * `it` is DeepSpeed's last_batch_iteration: the lr DeepSpeed's scheduler holds
 * after its step() was called it+1 times. The trainer calls dt_sched_lr(cfg, s)
 * for its 0-based optimizer step s, so step 0 runs at warmup_min_lr (WarmupLR) or
 * lr * warmup_min_ratio (WarmupCosineLR). (DeepSpeed's engine runs its first step
 * at the lr of iteration -1 and so lags this by one step.) The schedule is a pure
 * function of the step: resuming from a checkpoint needs only the step.
 */
#ifndef DT_RUNTIME_SCHED_H
#define DT_RUNTIME_SCHED_H

#include <stdint.h>

#include "runtime/config/config.h" /* defines: dt_config_t, dt_sched_type_t */

/* The learning rate for DeepSpeed iteration `it` (it < 0: DeepSpeed's value before
 * the first step(): warmup_min_lr, or 0 for WarmupCosineLR). */
double dt_sched_lr(const dt_config_t *cfg, int64_t it);

/* The multiplier DeepSpeed calls gamma (WarmupLR, WarmupDecayLR: lr = min + (max -
 * min) * gamma) or the lr ratio (WarmupCosineLR: lr = optimizer lr * ratio). */
double dt_sched_factor(const dt_config_t *cfg, int64_t it);

#endif /* DT_RUNTIME_SCHED_H */
