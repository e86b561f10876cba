/*
 * train_lora.h - the trainer's LoRA part (train_lora.c; runtime/model/lora.h): the
 * config's lora section as a spec, and LoRA's state as an object the trainer holds,
 * dt_train_lora: the frozen base model (its layout and lora's buffers, read from
 * model.pretrained) and lora.init's adapter file, with its own setup/free and its part
 * of summary.json. Calls below itself only: train_spec.c, runtime/model, runtime/ckpt.
 */
#ifndef DT_RUNTIME_TRAIN_LORA_H
#define DT_RUNTIME_TRAIN_LORA_H

#include <stddef.h>

#include "common/status.h"
#include "kernels/kernels.h"           /* defines: dt_device_t, dt_dtype_t */
#include "runtime/ckpt/hf_weights.h"   /* defines: dt_hf_weights_t */
#include "runtime/ckpt/safetensors.h"  /* defines: dt_st_file_t */
#include "runtime/config/config.h"     /* defines: dt_config_t */
#include "runtime/model/lora.h"        /* defines: dt_lora_t, dt_lora_spec */
#include "runtime/model/model.h"       /* defines: dt_model_layout */

struct cJSON;

/* A run's LoRA (lora.r > 0); all zero otherwise. */
typedef struct dt_train_lora {
    uint64_t seed;               /* PEFT's initialisation of the adapters draws from it */
    dt_model_layout base_layout; /* the model the net computes, frozen in lora's buffers */
    dt_lora_t lora;
    dt_st_file_t *init;          /* lora.init's adapter file (NULL: PEFT's init) */
} dt_train_lora;

/* The launcher's check before workers start, with lora.r > 0: model.pretrained set,
 * lora.dropout 0, data parallelism only (any strategy; no TP or PP), lora.base_dtype
 * against the compute dtype, every lora.target_modules a linear module of the model,
 * lora.init holding every adapter tensor. DT_STATUS_CONFIG naming the key.
 * (dt_trainer_check_data runs it first) */
dt_status_t dt_train_lora_check_(const dt_config_t *cfg);
/* The config's lora section for a compute dtype (DT_STATUS_CONFIG naming the key). */
dt_status_t dt_train_lora_spec_(const dt_config_t *cfg, dt_dtype_t compute, dt_lora_spec *out);
/* With lora.r > 0, after the layout and the device: *layout (the model) becomes the
 * frozen base, l->base_layout, its weights read from model.pretrained (*hf, opened
 * here) into l->lora's frozen buffers, and *layout the adapters'. rank 0 logs it. */
dt_status_t dt_train_lora_setup_(dt_train_lora *l, const dt_config_t *cfg, dt_device_t *dev, int rank,
                                 dt_model_layout *layout, dt_hf_weights_t **hf);
/* 1 when the run trains adapters (after dt_train_lora_setup_). */
int dt_train_lora_on_(const dt_train_lora *l);
/* The adapters' (of layout adapters) initial elements [offset, offset + count):
 * lora.init's, else PEFT's init. */
dt_status_t dt_train_lora_fill_(const dt_train_lora *l, const dt_model_layout *adapters, size_t offset, size_t count,
                                float *dst);
void dt_train_lora_free_(dt_train_lora *l);

/* ---- summary.json ---- */

/* The bytes of the frozen base this rank holds (0 without LoRA): gathered for the summary. */
double dt_train_lora_base_bytes_(const dt_train_lora *l);
/* A rank's "lora_base" in its model_state_bytes from its gathered base bytes (nothing
 * without LoRA). */
void dt_train_lora_write_rank_summary_(const dt_train_lora *l, double base_bytes, struct cJSON *model_state);

#endif /* DT_RUNTIME_TRAIN_LORA_H */
