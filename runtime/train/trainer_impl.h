/*
 * trainer_impl.h - what trainer.c shares with train_check.c (the launcher's checks
 * before workers start): the config's data sources and the model spec the workers
 * will build, so that the checks and the run read the config the same way.
 */
#ifndef DT_RUNTIME_TRAINER_IMPL_H
#define DT_RUNTIME_TRAINER_IMPL_H

#include "runtime/config/config.h" /* defines: dt_config_t */
#include "runtime/model/model.h"   /* defines: dt_model_spec */
#include "runtime/train/data.h"    /* defines: dt_data_source */

/* data.train's sources into out (DT_DATA_MAX_SOURCES): the config's list, or its
 * one path with weight 1. Returns how many. */
int dt_trainer_sources_(const dt_config_t *cfg, dt_data_source *out);

/* The configured model's spec; a token model's vocabulary 0 comes from the data. */
dt_status_t dt_trainer_spec_(const dt_config_t *cfg, dt_model_spec *spec);

#endif /* DT_RUNTIME_TRAINER_IMPL_H */
