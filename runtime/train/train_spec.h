/*
 * train_spec.h - the config read as the workers will read it (train_spec.c): data.train's
 * sources and the model spec, shared by the loop (trainer.c), the launcher's checks
 * (train_check.c) and LoRA's (train_lora.c), so that the checks and the run agree. The
 * bottom of runtime/train/'s parts: it calls only the data loader.
 */
#ifndef DT_RUNTIME_TRAIN_SPEC_H
#define DT_RUNTIME_TRAIN_SPEC_H

#include "common/status.h"
#include "runtime/config/config.h" /* defines: dt_config_t */
#include "runtime/model/model.h"   /* defines: dt_model_spec */
#include "runtime/train/data.h"    /* defines: dt_data_source */

/* data.train's sources into out (DT_DATA_MAX_SOURCES): the config's list, or its
 * one path with weight 1. Returns how many. */
int dt_trainer_sources_(const dt_config_t *cfg, dt_data_source *out);

/* The configured model's spec; a token model's vocabulary 0 comes from the data. */
dt_status_t dt_trainer_spec_(const dt_config_t *cfg, dt_model_spec *spec);

/* TensorBoard's folder: <tensorboard.output_path or log.dir>/<tensorboard.job_name>.
 * CONFIG naming the key when job_name is not one folder name (empty, ".", "..",
 * a '/') or the path does not fit len. */
dt_status_t dt_trainer_tb_dir_(const dt_config_t *cfg, char *out, size_t len);

#endif /* DT_RUNTIME_TRAIN_SPEC_H */
