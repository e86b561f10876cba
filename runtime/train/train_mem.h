/*
 * train_mem.h - out of memory before it happens (train_mem.c): the check a rank makes
 * before the trainer allocates its model state and activations. Calls below itself
 * only: runtime/tools' plan arithmetic.
 */
#ifndef DT_RUNTIME_TRAIN_MEM_H
#define DT_RUNTIME_TRAIN_MEM_H

#include "common/status.h"
#include "common/torchenv.h"       /* defines: dt_torchenv_t */
#include "kernels/kernels.h"       /* defines: dt_device_t */
#include "runtime/config/config.h" /* defines: dt_config_t */
#include "runtime/model/model.h"   /* defines: dt_model_spec */

/* Before the model state and activations are allocated (the device dev is open): for
 * the rank env describes, DT_STATUS_CONFIG naming the shortfall, the biggest consumer
 * and the cheapest change that fits when `dtrun plan`'s bytes for this rank exceed
 * what it can get. DTRUN_SKIP_MEMORY_CHECK=1 skips it. */
dt_status_t dt_train_mem_check_(const dt_config_t *cfg, const dt_torchenv_t *env, dt_device_t *dev,
                                const dt_model_spec *spec);

#endif /* DT_RUNTIME_TRAIN_MEM_H */
