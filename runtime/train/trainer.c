/*
 * trainer.c - the training loop. Model state and the gradient reduction across
 * ranks belong to the data-parallel object (dp.h); the loop drives it, averages
 * the loss over ranks for metrics and gathers every rank's memory figures into
 * rank 0's summary.json. The initial parameters come from model.pretrained's weight
 * files (runtime/ckpt/hf_weights.h) or the seed, filled by the ranges dp holds; a
 * checkpoint to resume from replaces them.
 *
 * Hidden test facility: with DTRUN_DUMP_PARAMS=PATH in the environment, after
 * training every rank gathers the full fp32 parameters (model layout, as
 * model.h) and rank 0 writes them raw (n_params little-endian floats) to PATH.
 */
#include "runtime/train/trainer.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs_safe.h" /* defines: dt_fs_open_regular */
#include "common/log.h"
#include "common/mem.h"
#include "common/rng.h"
#include "common/trace.h"
#include "kernels/kernels.h"
#include "runtime/ckpt/hf_weights.h"
#include "runtime/comm/comm.h"
#include "runtime/train/data.h"
#include "runtime/parallel/dp.h"
#include "runtime/train/metrics.h"
#include "runtime/model/model.h"
#include "runtime/model/net.h"
#include "runtime/model/sample.h"
#include "runtime/parallel/tp.h"
#include "runtime/train/sched.h"
#include "runtime/train/train_ckpt.h"
#include "runtime/train/train_elastic.h"
#include "runtime/train/train_lora.h"
#include "runtime/train/train_mem.h"
#include "runtime/train/train_parallel.h"
#include "runtime/train/train_spec.h"
#include "runtime/train/train_trace.h"
#include "runtime/train/trainer_impl.h"

/* Token models read the data; feature models draw the model's synthetic samples,
 * rank r taking the r-th B of each global batch. */
static dt_status_t next_batch(dt_trainer_t *t, dt_batch *batch) {
    if (t->data) {
        DT_CHECK(dt_data_next(t->data, t->tokens, t->targets));
        batch->tokens = t->tokens;
    } else {
        uint64_t first = t->mlp_cursor + (uint64_t)t->env->rank * (uint64_t)t->B;
        t->layout.spec.ops->synthetic_batch(&t->layout, (uint64_t)t->cfg->seed, first, t->B, t->features,
                                            t->targets);
        t->mlp_cursor += (uint64_t)t->env->world_size * (uint64_t)t->B;
        batch->features = t->features;
    }
    batch->targets = t->targets;
    return DT_STATUS_OK;
}

/* kB of a /proc/self/status line ("VmRSS", "VmHWM"), 0 when unknown. */
static double proc_status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    double kb = 0;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') kb = strtod(line + n + 1, NULL);
    fclose(f);
    return kb;
}

/* device: cpu; cuda (an error when none is visible); auto: cuda when a GPU is
 * visible, else cpu. A CUDA worker binds GPU LOCAL_RANK of the visible ones
 * (CUDA_VISIBLE_DEVICES renumbers them); more ranks than GPUs on a node share
 * them round-robin (tests, learning), with a warning. Computes in bf16 with fp32
 * master weights when bf16.enabled, else in fp32. */
static dt_status_t open_device(const dt_config_t *cfg, const dt_torchenv_t *env, dt_device_t **dev) {
    dt_device_opts_t o = {.kind = DT_DEVICE_CPU, .nthreads = (int)cfg->threads, .dtype = DT_DTYPE_F32};
    int ngpu = 0;
    /* The CUDA library is loaded for device cuda, or auto on a node whose driver has a
     * GPU (counted without CUDA): a CPU worker never maps it. */
    if (dt_config_uses_cuda(cfg)) {
        if (dt_device_load(DT_DEVICE_CUDA) != DT_STATUS_OK) {
            char why[2048];
            snprintf(why, sizeof why, "%s", dt_error_detail());
            return dt_error(DT_STATUS_CONFIG, "device %s: %s",
                            cfg->device == DT_CONFIG_DEVICE_CUDA ? "cuda" : "auto (this node has a GPU)", why);
        }
        ngpu = dt_device_count(DT_DEVICE_CUDA);
    }
    if (cfg->device == DT_CONFIG_DEVICE_CUDA && ngpu == 0) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return dt_error(DT_STATUS_CONFIG, "device cuda: no GPU is visible%s%s%s", vis ? " (CUDA_VISIBLE_DEVICES=" : "",
                        vis ? vis : "", vis ? ")" : "");
    }
    if (ngpu > 0) {
        o.kind = DT_DEVICE_CUDA;
        o.dtype = dt_config_compute_dtype(cfg, 1);
        o.ordinal = env->local_rank % ngpu;
        if (env->local_world_size > ngpu && env->local_rank == 0)
            DT_LOG_WARN("%d ranks on this node share %d GPU(s) (rank r uses GPU r %% %d)", env->local_world_size,
                        ngpu, ngpu);
    } else if (cfg->bf16.enabled && env->rank == 0) {
        DT_LOG_WARN("bf16.enabled: the CPU device computes in fp32");
    }
    return dt_device_open(dev, &o);
}

/* ---- checkpoints (runtime/train/train_ckpt.h) ---------------------------------- */

typedef struct ckpt_load_ctx {
    dt_trainer_t *t;
    dt_ckpt_t *c;
    dt_train_ckpt view;
} ckpt_load_ctx;

static dt_status_t ckpt_barrier(void *ctx) {
    dt_trainer_t *t = ctx;
    return t->comm ? dt_comm_barrier(t->comm) : DT_STATUS_OK;
}

/* The AND of ok over ranks. */
static dt_status_t ckpt_agree(void *ctx, int *ok) {
    dt_trainer_t *t = ctx;
    int n = dt_dp_world_size(t->dp);
    if (n == 1) return DT_STATUS_OK;
    double mine = *ok, *all = dt_xcalloc((size_t)n, sizeof *all);
    dt_status_t st = dt_dp_all_gather_f64(t->dp, &mine, 1, all);
    for (int r = 0; r < n; r++)
        if (all[r] == 0) *ok = 0;
    free(all);
    return st;
}

static dt_status_t ckpt_dp_read(void *ctx, const dt_dp_range *r) {
    ckpt_load_ctx *x = ctx;
    return dt_train_ckpt_read_range(&x->view, x->c, r->offset, r->count, r->param, r->m, r->v);
}

/* Elements [goffset, goffset + n) of the whole model's pretrained weights. */
static dt_status_t hf_read(void *ctx, size_t goffset, size_t n, float *dst) {
    return dt_hf_weights_fill(((dt_trainer_t *)ctx)->hf, goffset, n, dst);
}

/* Elements [offset, offset + count) of this rank's initial parameters (its TP
 * piece's): model.pretrained's weights, else the seed's. */
static dt_status_t init_fill(void *ctx, size_t offset, size_t count, float *dst) {
    dt_trainer_t *t = ctx;
    if (dt_train_lora_on_(&t->lora)) /* the adapters */
        return dt_train_lora_fill_(&t->lora, &t->layout, offset, count, dst);
    if (t->hf) return dt_model_tp_fill(&t->layout, offset, count, dst, hf_read, t); /* a TP piece: its parts */
    dt_model_init_range(&t->layout, (uint64_t)t->cfg->seed, offset, count, dst);
    return DT_STATUS_OK;
}

/* Fresh state for one range: initial parameters (through the host in bounded
 * chunks), zero moments. */
static dt_status_t ckpt_dp_fresh(void *ctx, const dt_dp_range *r) {
    ckpt_load_ctx *x = ctx;
    const dt_ops_t *o = x->t->dev->ops;
    size_t chunk = r->count < ((size_t)1 << 22) ? r->count : ((size_t)1 << 22);
    float *h = dt_mem_alloc(DT_MEM_OTHER, (chunk ? chunk : 1) * sizeof(float));
    if (!h) return DT_STATUS_NOMEM;
    dt_status_t st = DT_STATUS_OK;
    for (size_t k = 0; k < r->count && st == DT_STATUS_OK; k += chunk) {
        size_t c = r->count - k < chunk ? r->count - k : chunk;
        st = init_fill(x->t, r->offset + k, c, h);
        if (st != DT_STATUS_OK) break;
        if (r->host) /* offloaded fp32 masters (host memory) */
            memcpy(r->param + k, h, c * sizeof(float));
        else if (r->cparam) /* fp32 masters; dt_dp_load_ranges refreshes the compute copy */
            st = o->copy(x->t->dev, r->param + k, h, c * sizeof(float), DT_COPY_HOST_TO_DEVICE);
        else
            st = o->upload_f32(x->t->dev, r->param + k, h, c);
        if (st == DT_STATUS_OK) st = o->synchronize(x->t->dev);
    }
    dt_mem_free(h);
    DT_CHECK(st);
    if (r->host) {
        memset(r->m, 0, r->count * sizeof(float));
        memset(r->v, 0, r->count * sizeof(float));
        return DT_STATUS_OK;
    }
    DT_CHECK(o->set(x->t->dev, r->m, 0, r->count * sizeof(float)));
    return o->set(x->t->dev, r->v, 0, r->count * sizeof(float));
}

static dt_status_t ckpt_load(void *ctx, dt_ckpt_t *c) {
    ckpt_load_ctx *x = ctx;
    x->c = c;
    if (c) dt_train_resume_note_checkpoint_(&x->t->resume, c); /* what an elastic resize reports */
    return dt_dp_load_ranges(x->t->dp, c ? ckpt_dp_read : ckpt_dp_fresh, x);
}

/* What a checkpoint saves and loads: the ranges dp owns (dt_dp_owned_ranges), read
 * back through dt_dp_load_ranges; ranks agree on the checkpoint and meet at a
 * barrier of the communicator. *owned is malloc'd (free it). */
static dt_train_ckpt ckpt_view(dt_trainer_t *t, dt_train_ckpt_owned **owned, ckpt_load_ctx *lc) {
    int max = dt_dp_owned_ranges(t->dp, NULL, 0), n;
    dt_dp_range *r = dt_xcalloc((size_t)max + 1, sizeof *r);
    n = dt_dp_owned_ranges(t->dp, r, max);
    *owned = dt_xcalloc((size_t)n + 1, sizeof **owned);
    for (int i = 0; i < n; i++) (*owned)[i] = (dt_train_ckpt_owned){r[i].offset, r[i].count, r[i].param, r[i].m, r[i].v};
    free(r);
    dt_train_ckpt c = {.cfg = t->cfg, .layout = &t->layout, .dev = t->dev, .rank = t->env->rank,
                       .world_size = t->env->world_size, .owned = *owned, .n_owned = n, .data = t->data,
                       .rng = &t->rng, .load = ckpt_load, .load_ctx = lc,
                       .params_fp32 = dt_dp_has_master(t->dp), .state_host = dt_dp_offloaded(t->dp),
                       .run_id = t->resume.run_id};
    if (n == 0) c.n_owned = -1; /* owns nothing (an HSDP replica): writes an empty shard */
    if (t->env->world_size > 1) {
        c.barrier = ckpt_barrier, c.barrier_ctx = t;
        c.agree = ckpt_agree, c.agree_ctx = t;
    }
    if (t->layout.spec.ops->data == DT_MODEL_DATA_FEATURES) c.mlp_cursor = &t->mlp_cursor;
    lc->t = t;
    lc->view = c;
    return c;
}

/* Resumes per checkpoint.resume; a resumed run appends to metrics.jsonl from the
 * step after its checkpoint. */
static dt_status_t resume_checkpoint(dt_trainer_t *t) {
    dt_train_ckpt_owned *owned;
    ckpt_load_ctx lc;
    /* The first attempt refuses another run's checkpoints as the agent does (a
     * restart finds this run's own). */
    if (t->env->restart_count == 0) DT_CHECK(dt_train_ckpt_check_start(t->cfg));
    DT_CHECK(dt_train_ckpt_lock(t->cfg, t->env->rank));
    dt_train_ckpt c = ckpt_view(t, &owned, &lc);
    dt_train_resume *r = &t->resume;
    dt_status_t st = dt_train_ckpt_resume(&c, &r->start_step);
    if (st == DT_STATUS_OK && t->cfg->checkpoint.async && dt_train_ckpt_enabled(t->cfg))
        dt_train_async_prepare(&t->async, &c); /* the staging arena, before the first step */
    free(owned);
    DT_CHECK(st);
    r->saved_step = r->start_step;
    int64_t last_logged = 0; /* the newest step metrics.jsonl held: the steps an elastic resize lost */
    if (r->start_step > 0 && t->env->rank == 0)
        DT_CHECK(dt_train_ckpt_trim_metrics(t->log_dir, r->start_step, &last_logged));
    /* a resume at another world size is a resize */
    dt_train_elastic_note_resume(r, t->cfg, t->env->rank, t->env->world_size, t->env->restart_count, t->accum,
                                 t->log_dir, last_logged);
    dt_train_ckpt_catch_preemption();
    return DT_STATUS_OK;
}

/* The preemption signal any rank got (ranks may see it a step apart; all stop at
 * the same step). */
static dt_status_t preempt_signal(dt_trainer_t *t, int *sig) {
    *sig = dt_train_ckpt_preempted();
    int n = dt_dp_world_size(t->dp);
    if (n == 1) return DT_STATUS_OK;
    double mine = *sig, *all = dt_xcalloc((size_t)n, sizeof *all);
    dt_status_t st = dt_dp_all_gather_f64(t->dp, &mine, 1, all);
    for (int r = 0; r < n; r++)
        if (all[r] > 0 && !*sig) *sig = (int)all[r];
    free(all);
    return st;
}

/* After each step: fault injection, the periodic checkpoint, and preemption
 * (save, then *stop). A failed periodic save is reported and training goes on
 * (the previous checkpoint is still there); a failed final or preemption save is
 * an error. */
static dt_status_t after_step(dt_trainer_t *t, int64_t step, int *stop) {
    dt_train_elastic_progress(t->env->local_rank, step);
    dt_train_ckpt_fault_point(t->env->rank, step);
    DT_CHECK(dt_train_async_settle(t->async, t->dp, 0)); /* commits a finished async save */
    int sig;
    DT_CHECK(preempt_signal(t, &sig));
    *stop = sig != 0;
    int64_t every = t->cfg->checkpoint.every_steps;
    int last = step == t->cfg->train_steps, on = dt_train_ckpt_enabled(t->cfg);
    const char *why = sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : sig ? "SIGUSR2" : last ? "final"
                                                                                                 : "every_steps";
    if (on && (sig || step % every == 0 || last) && t->resume.saved_step != step) {
        dt_train_ckpt_owned *owned;
        ckpt_load_ctx lc;
        dt_train_ckpt c = ckpt_view(t, &owned, &lc);
        int async = t->cfg->checkpoint.async && !sig && !last; /* final and preemption: synchronous */
        dt_status_t st = async ? dt_train_async_save(&t->async, &c, t->dp, step, why)
                               : dt_train_async_settle(t->async, t->dp, 1);
        if (!async && st == DT_STATUS_OK) st = dt_train_ckpt_save(&c, step, why);
        free(owned);
        if (st != DT_STATUS_OK) {
            if (last || sig) return st;
            DT_LOG_ERROR("%s; training continues", dt_error_detail());
        } else {
            t->resume.saved_step = step;
        }
    }
    if (!sig) { /* elastic: a node waits to join, every rank stops after this boundary's save */
        int resize = 0;
        DT_CHECK(dt_train_elastic_poll(t->cfg, t->env->rank, t->dp, &t->resume, step, &resize));
        /* an async save of this boundary is committed before the workers exit (every
         * rank got the same answer: the settle is collective) */
        if (resize) DT_CHECK(dt_train_async_settle(t->async, t->dp, 1));
        if (resize) *stop = 1;
    }
    if (sig && t->env->rank == 0) {
        if (!on)
            DT_LOG_WARN("preempted by signal %d; checkpoints are off (checkpoint.every_steps 0): nothing saved", sig);
        char next[512];
        dt_train_ckpt_next_launch(t->cfg, on, next, sizeof next);
        printf("dtrun: preempted by signal %d: stopped after step %lld; %s\n", sig, (long long)step, next);
        fflush(stdout);
        dt_train_preempt_record(step, on && t->resume.saved_step == step);
    }
    return DT_STATUS_OK;
}

static dt_status_t setup(dt_trainer_t *t) {
    const dt_config_t *cfg = t->cfg;
    dt_model_spec spec;
    DT_CHECK(open_device(cfg, t->env, &t->dev));
    DT_CHECK(dt_trainer_spec_(cfg, &spec));
    t->place = dt_tp_place_of(t->env->rank, t->env->world_size, (int)cfg->tp.size, (int)cfg->cp.size,
                              (int)cfg->pp.stages);
    dt_train_pp_init_(&t->pp, cfg, t->place);
    DT_CHECK(dt_train_layout_(&t->pp, &spec, t->env->rank == 0, &t->layout));
    dt_model_layout_set_cp(&t->layout, t->place.cp_size, t->place.cp_rank, cfg->cp.mode == DT_CONFIG_CP_ULYSSES);
    /* before the net and the strategy: the arena and FSDP's use sequence follow it */
    dt_model_layout_set_recompute(&t->layout, (dt_model_recompute_t)cfg->recompute.policy, (int)cfg->recompute.every);
    t->B = (int)cfg->train_micro_batch_size_per_gpu;
    t->accum = (int)cfg->gradient_accumulation_steps;
    t->T = t->layout.seq_len;
    DT_CHECK(dt_train_mem_check_(cfg, t->env, t->dev, &spec)); /* before anything big is allocated */
    if (spec.ops->data == DT_MODEL_DATA_TOKENS) {
        dt_data_source src[DT_DATA_MAX_SOURCES];
        int n_src = dt_trainer_sources_(cfg, src);
        dt_data_opts o = {.sources = src, .n_sources = n_src, .val = cfg->data.val,
                          .val_fraction = cfg->data.val_fraction, .seq_len = t->layout.seq_len,
                          .vocab_size = spec.vocab_size, .seed = (uint64_t)cfg->seed,
                          /* the ranks of a TP group read the same batch */
                          .rank = t->place.dp_rank, .world_size = t->place.dp_size, .micro_batch = t->B,
                          .prefetch = (int)cfg->data.prefetch, .no_packing = !cfg->data.packing};
        if (!cfg->data.n_sources) o.sources = NULL, o.train = cfg->data.train; /* errors say data.train */
        DT_CHECK(dt_data_open(&o, &t->data));
    }
    if (cfg->lora.r > 0) { /* the net computes the base model; dp holds the adapters */
        DT_CHECK(dt_train_lora_setup_(&t->lora, cfg, t->dev, t->env->rank, &t->layout, &t->hf));
        DT_CHECK(dt_net_init(&t->net, t->dev, &t->lora.base_layout, t->B));
        DT_CHECK(dt_net_lora_attach(&t->net, &t->lora.lora));
    } else {
        DT_CHECK(dt_net_init(&t->net, t->dev, &t->layout, t->B));
    }
    if (t->env->world_size > 1) {
        dt_comm_config_t cc;
        DT_CHECK(dt_comm_config_from_env(&cc));
        cc.backend = cfg->comm.backend;
        cc.timeout_s = cfg->comm.timeout_s;
        if (t->dev->kind == DT_DEVICE_CUDA) {
            int ngpu = dt_device_count(DT_DEVICE_CUDA);
            cc.stage_dev = t->dev; /* shm/tcp/hier stage through host memory; NCCL ignores it */
            if (ngpu >= t->env->local_world_size)
                cc.device = t->dev->ordinal; /* backend auto picks NCCL */
            else if (cfg->comm.backend == DT_COMM_BACKEND_NCCL)
                return dt_error(DT_STATUS_CONFIG, "comm.backend nccl needs one GPU per rank, but %d ranks share %d "
                                "GPU(s) on this node: use comm.backend auto (shared memory with host staging)",
                                t->env->local_world_size, ngpu);
        }
        DT_CHECK(dt_comm_init(&cc, &t->comm));
        DT_CHECK(dt_trainer_comm_health_(t->comm, t->dev->kind == DT_DEVICE_CUDA ? t->dev : NULL,
                                         t->env->local_world_size, t->env->rank));
        if (t->place.tp_size > 1 || t->place.pp_size > 1 || t->place.cp_size > 1)
            DT_CHECK(dt_tp_split(t->comm, t->place.tp_size, t->place.cp_size, t->place.pp_size, &t->tp_comm,
                                 &t->cp_comm, &t->pp_comm, &t->dp_comm));
        if (t->place.tp_size > 1) /* dt_config_resolve checked that sequence parallelism's rows divide */
            DT_CHECK(dt_tp_init(&t->tp, t->tp_comm, t->dev, &t->net));
        if (t->place.cp_size > 1) DT_CHECK(dt_cp_init(&t->cp, t->cp_comm, t->dev, &t->net));
    }
    dt_dtype_t reduce = cfg->communication_data_type == DT_CONFIG_DTYPE_BF16 ? DT_DTYPE_BF16 : DT_DTYPE_F32;
    int sharded_grads = dt_strategy_shards(cfg->strategy, DT_STRATEGY_SHARDS_GRADS);
    if (reduce != t->dev->ops->dtype && sharded_grads && t->env->world_size > 1) {
        if (t->env->rank == 0)
            DT_LOG_WARN("communication_data_type %s: strategy %s reduces gradients in the compute dtype (%s)",
                        dt_dtype_name(reduce), dt_config_strategy_name(cfg->strategy),
                        dt_dtype_name(t->dev->ops->dtype));
        reduce = t->dev->ops->dtype;
    }
    dt_dp_opts dpo = {.strategy = cfg->strategy, .overlap_comm = cfg->zero.overlap_comm,
                      .bucket_elems = (size_t)cfg->zero.reduce_bucket_size,
                      .local_world_size = t->env->local_world_size, .seed = (uint64_t)cfg->seed,
                      .reduce_dtype = reduce};
    if (cfg->zero.offload_optimizer.device == DT_CONFIG_OFFLOAD_CPU) {
        if (t->dev->kind == DT_DEVICE_CPU) { /* the state is in host memory already */
            if (t->env->rank == 0)
                DT_LOG_WARN("zero_optimization.offload_optimizer.device cpu: no effect on the CPU device (the "
                            "optimizer state is in host memory already)");
        } else {
            dpo.offload = 1;
            dpo.offload_pinned = cfg->zero.offload_optimizer.pin_memory;
            dpo.host_threads = (int)cfg->threads;
        }
    }
    dt_comm_t *dp_comm = t->comm;
    if (t->layout.global) { /* the strategy runs over the DP group, on each rank's TP piece of its stage */
        dp_comm = t->dp_comm;
        dpo.all = t->comm, dpo.tp = t->tp_comm, dpo.pp = t->pp_comm;
    }
    if (dt_train_lora_on_(&t->lora)) { /* the adapters' initial values; the base was read */
        dpo.fill = init_fill, dpo.fill_ctx = t, dpo.init_id = dt_hf_weights_id(t->hf);
    } else if (cfg->model_pretrained) { /* initial weights from the files, each rank reading what it holds */
        DT_CHECK(dt_hf_weights_open(cfg->model_pretrained, t->layout.global ? t->layout.global : &t->layout,
                                    &t->hf));
        dpo.fill = init_fill, dpo.fill_ctx = t, dpo.init_id = dt_hf_weights_id(t->hf);
    }
    double t_load = dt_now_s(), rss0 = proc_status_kb("VmRSS");
    DT_CHECK(dt_dp_init(&t->dp, &dpo, t->dev, &t->layout, &t->net, dp_comm));
    DT_CHECK(dt_stragglers_init(t->dp, t->env->rank, &t->stragglers));
    if (t->hf) { /* each rank: what it read, how fast, and its memory peak against its model state */
        double sec = dt_now_s() - t_load;
        uint64_t b = dt_hf_weights_bytes_read(t->hf);
        dt_dp_mem m;
        dt_dp_expected_mem(t->dp, &m);
        double state = (double)(m.params + m.grads + m.master + m.optim + m.work);
        double rd = dt_hf_weights_seconds(t->hf);
        DT_LOG_INFO("pretrained: %s: rank %d read %.1f MB of %.1f MB in %.3f s (%.2f GB/s; %.3f s with the state's "
                    "allocation and upload); host RSS %.1f MB before, peak %.1f MB after, model state %.1f MB",
                    cfg->model_pretrained, t->env->rank, (double)b / 1e6, (double)dt_hf_weights_file_bytes(t->hf) / 1e6,
                    rd, rd > 0 ? (double)b / rd / 1e9 : 0.0, sec, rss0 / 1e3, proc_status_kb("VmHWM") / 1e3,
                    state / 1e6);
    }
    size_t rows = (size_t)t->B * (size_t)t->T;
    t->tokens = dt_xcalloc(rows, sizeof(int32_t));
    t->targets = dt_xcalloc(rows, sizeof(int32_t));
    dt_train_mask_init_(&t->mask, t->data, t->accum, t->B, t->T, t->place.dp_size * t->place.cp_size,
                        t->place.cp_size, t->place.cp_rank);
    if (t->layout.in_features > 0)
        t->features = dt_xcalloc((size_t)t->B * (size_t)t->layout.in_features, sizeof(float));
    t->peak_flops = t->dev->ops->peak_flops ? t->dev->ops->peak_flops(t->dev) : 0;
    if (t->peak_flops <= 0) /* a GPU: its dense bf16 peak by name, as llm.c reports MFU */
        t->peak_flops = dt_peak_flops_gpu(t->dev->name);
    snprintf(t->log_dir, sizeof t->log_dir, "%s", cfg->log.dir ? cfg->log.dir : "runs/latest");
    dt_rng_seed(&t->rng, (uint64_t)cfg->seed, 0x747261696eull);
    DT_CHECK(dt_train_pp_start_(&t->pp, t->dev, &t->net, t->dp, t->pp_comm, t->tp, t->B, t->T));
    DT_CHECK(resume_checkpoint(t));
    DT_CHECK(dt_pp_sync_tied(t->pp.engine)); /* the last stage's copy of a tied embedding */
    if (t->env->rank == 0) DT_CHECK(dt_metrics_open(t->log_dir, t->resume.start_step == 0, &t->metrics));
    if (t->env->rank == 0 && cfg->tensorboard.enabled) {
        char tb[4096], *dump = dt_config_dump_json(cfg);
        dt_status_t st = dt_trainer_tb_dir_(cfg, tb, sizeof tb);
        if (st == DT_STATUS_OK) st = dt_metrics_tensorboard(t->metrics, tb, t->resume.start_step, dump);
        free(dump);
        DT_CHECK(st);
    }
    return dt_train_trace_start(cfg, t->comm, t->dev, t->resume.start_step + 1); /* log.trace: the timeline */
}

static void teardown(dt_trainer_t *t) {
    dt_train_trace_stop();
    dt_train_async_free(t->async); /* waits for a background write (not committed) */
    dt_train_pp_free_(&t->pp);
    dt_train_mask_free_(&t->mask);
    dt_stragglers_free(t->stragglers);
    dt_dp_free(t->dp);
    dt_hf_weights_close(t->hf);
    if (t->dev) dt_net_free(&t->net);
    dt_train_lora_free_(&t->lora);
    dt_tp_free(t->tp);
    dt_cp_free(t->cp);
    dt_comm_free(t->tp_comm);
    dt_comm_free(t->cp_comm);
    dt_comm_free(t->pp_comm);
    dt_comm_free(t->dp_comm);
    dt_comm_free(t->comm);
    dt_data_close(t->data);
    dt_model_layout_free(&t->layout);
    dt_metrics_close(t->metrics);
    free(t->tokens);
    free(t->targets);
    free(t->features);
    dt_device_free(t->dev);
}

/* Rank 0's warning when a step waited more than 10% of its time for data, at most
 * every 30 s: names the sources and what helps. The first step (the read-ahead
 * starts empty) is not judged. */
static void warn_data_wait(dt_trainer_t *t, int64_t step, double data_s, double step_s, double *last_warn) {
    if (!t->data || t->env->rank != 0 || step == t->resume.start_step + 1 || data_s <= 0.1 * step_s) return;
    double now = dt_now_s();
    if (*last_warn > 0 && now - *last_warn < 30) return;
    *last_warn = now;
    char names[1024];
    size_t len = 0;
    names[0] = '\0';
    for (int i = 0; i < dt_data_n_sources(t->data) && len < sizeof names; i++)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s'%s'", i ? ", " : "", dt_data_source_path(t->data, i));
    DT_LOG_WARN("step %lld waited %.1f ms of %.1f ms (%.0f%%) for data from %s: raise data.prefetch (now %lld) "
                "or move the data to faster storage",
                (long long)step, data_s * 1e3, step_s * 1e3, 100 * data_s / step_s, names,
                (long long)t->cfg->data.prefetch);
}

/* Mean of x over ranks (NaN stays NaN), in rank order so every rank agrees. */
static dt_status_t mean_over_ranks(dt_trainer_t *t, double *x) {
    int n = dt_dp_world_size(t->dp);
    if (n == 1) return DT_STATUS_OK;
    double *all = dt_xcalloc((size_t)n, sizeof *all), sum = 0;
    dt_status_t st = dt_dp_all_gather_f64(t->dp, x, 1, all);
    for (int r = 0; r < n; r++) sum += all[r];
    if (st == DT_STATUS_OK && !isnan(*x)) *x = sum / n;
    free(all);
    return st;
}

static dt_status_t evaluate(dt_trainer_t *t, double *val_loss) {
    *val_loss = NAN;
    if (!t->data || dt_data_val_samples(t->data) == 0) return DT_STATUS_OK;
    int nb = t->cfg->eval.batches > 0 ? (int)t->cfg->eval.batches : 1;
    double sum = 0, trained = 0, rows = (double)t->net.n_rows; /* this rank's (CP: of every sequence) */
    for (int i = 0; i < nb; i++) {
        DT_CHECK(dt_dp_check(t->dp));
        int32_t *pos = t->mask.on ? t->mask.pos : NULL; /* masked data: its documents' positions */
        DT_CHECK(dt_data_val_batch_pos(t->data, (uint64_t)i, t->tokens, t->targets, pos));
        dt_batch b = {.tokens = t->tokens, .targets = t->targets, .positions = pos};
        double l;
        if (dt_train_pp_on_(&t->pp)) DT_CHECK(dt_pp_forward_only(t->pp.engine, &b, &l)); /* NAN but on the last stage */
        else DT_CHECK(dt_net_forward(&t->net, &b, &l));
        sum += t->mask.on ? l * rows : l;
        if (t->mask.on) trained += dt_train_mask_count_(&t->mask, t->targets);
    }
    t->net.have_forward = 0;
    DT_CHECK(dt_dp_check(t->dp));
    if (!t->mask.on) {
        *val_loss = sum / nb;
        return dt_train_pp_on_(&t->pp) ? dt_train_mean_loss_(&t->pp, t->dp, val_loss) : mean_over_ranks(t, val_loss);
    }
    int holds = !dt_train_pp_on_(&t->pp) || t->pp.place.pp_rank == t->pp.place.pp_size - 1;
    return dt_train_mask_val_loss_(t->dp, holds, sum, trained, val_loss);
}

static int wants_sample(const dt_trainer_t *t) {
    /* not a LoRA run: its parameters are the adapters (sample from the merged export) */
    return t->cfg->sample_tokens > 0 && !dt_train_lora_on_(&t->lora) && t->layout.spec.ops->logits_slot >= 0 &&
           t->data && dt_data_kind(t->data) == DT_DATA_TEXT;
}

/* Prints n generated characters (text data only), sampling with temperature
 * 0.8 from a fresh micro-batch-1 network over the trained parameters (the whole
 * model's: dt_train_gather_params_). */
static dt_status_t print_sample(dt_trainer_t *t, int n, const float *host_params) {
    if (n <= 0 || !wants_sample(t)) return DT_STATUS_OK;
    dt_sample_net sn;
    dt_model_layout whole = t->layout.global ? *t->layout.global : t->layout; /* (a view: nothing freed) */
    dt_model_layout_set_cp(&whole, 1, 0, 0); /* the whole model on one rank: every position */
    DT_CHECK(dt_sample_net_init(&sn, t->dev, &whole, host_params, DT_MEM_OTHER));
    int32_t prompt = '\n', *ids = dt_xcalloc((size_t)n, sizeof *ids);
    char *text = dt_xcalloc((size_t)n + 1, 1);
    dt_sample_opts o = {.tokens = n, .temperature = 0.8, .top_k = 0, .seed = (uint64_t)t->cfg->seed};
    dt_status_t st;
    st = dt_sample_run(&sn, &prompt, 1, &o, ids);
    if (st == DT_STATUS_FORMAT) { /* non-finite weights: the run's own metrics tell; no sample to show */
        DT_LOG_WARN("no sample: %s", dt_error_detail());
        st = DT_STATUS_OK;
        goto out_free;
    }
    DT_CHECK_GOTO(st, st, out_free);
    for (int i = 0; i < n; i++) text[i] = (char)dt_sample_char(ids[i], 1);
    printf("---- sample (%d characters) ----\n%s\n--------------------------------\n", n, text);
    fflush(stdout);
out_free:
    free(ids);
    free(text);
    dt_sample_net_free(&sn);
    return st;
}

dt_status_t dt_trainer_run(const dt_config_t *cfg, const dt_torchenv_t *env) {
    dt_trainer_t t = {.cfg = cfg, .env = env};
    dt_train_resume_init_(&t.resume);
    dt_status_t st = DT_STATUS_OK;
    double *mem_all = NULL;
    float *full = NULL;
    DT_CHECK_GOTO(setup(&t), st, out_teardown);
    int rank0 = env->rank == 0;
    const char *tty = getenv("DTRUN_PROGRESS_TTY");
    int live = tty ? strcmp(tty, "1") == 0 : isatty(STDOUT_FILENO);
    const dt_ops_t *o = t.dev->ops;
    size_t n = t.layout.n_params;
    int64_t steps = cfg->train_steps;
    double tokens_per_step = (double)t.B * t.T * t.accum * t.place.dp_size;
    double flops_per_token = dt_model_flops_per_token(t.layout.global ? t.layout.global : &t.layout);
    if (rank0) {
        char *dump = dt_config_dump_json(cfg);
        if (dump) dt_metrics_write_file(t.log_dir, "config.json", dump);
        free(dump);
        char par[160] = "", cpar[48] = "";
        if (t.place.cp_size > 1) snprintf(cpar, sizeof cpar, " x context parallel %d", t.place.cp_size);
        if (t.place.tp_size > 1 || t.place.pp_size > 1 || t.place.cp_size > 1)
            snprintf(par, sizeof par, " (tensor parallel %d%s%s x pipeline %d x data parallel %d)", t.place.tp_size,
                     t.layout.sequence_parallel ? " with sequence parallelism" : "", cpar, t.place.pp_size,
                     t.place.dp_size);
        printf("dtrun: %s model, %zu parameters (%.2f MB of fp32)%s, %s x%d thread(s), world %d%s, "
               "micro-batch %d x accumulation %d, %lld steps\n",
               t.layout.spec.ops->name, t.layout.global ? t.layout.global->n_params : n,
               (t.layout.global ? t.layout.global->n_params : n) * 4.0 / 1e6,
               t.layout.global ? ", this rank's piece of it" : "", dt_device_kind_name(t.dev->kind),
               t.dev->nthreads, env->world_size, par, t.B, t.accum, (long long)steps);
        if (t.mask.on) {
            char line[512];
            dt_train_mask_describe_(t.data, t.T, line, sizeof line);
            printf("dtrun: %s\n", line);
        }
        fflush(stdout);
    }
    double t_start = dt_now_s(), final_loss = NAN, final_val = NAN;
    dt_batch batch = {0};
    int stop = 0;
    double last_data_warn = 0;
    for (int64_t step = t.resume.start_step + 1; step <= steps && !stop; step++) {
        if (dt_trace_on()) dt_trace_step_begin(step);
        double t0 = dt_now_s(), data_s = 0, loss_sum = 0;
        dt_dp_take_comm_ms(t.dp); /* communication between steps is not the step's */
        dt_tp_take_comm_ms(t.tp);
        dt_cp_take_comm_ms(t.cp);
        DT_CHECK_GOTO(dt_dp_step_begin(t.dp), st, out_teardown);
        dt_stragglers_test_delay(t.stragglers);
        if (t.mask.on) { /* the step's micro-batches first: their trained targets scale every backward */
            double d0 = dt_now_s();
            DT_CHECK_GOTO(dt_train_mask_step_(&t.mask, t.data, t.dp), st, out_teardown);
            data_s += dt_now_s() - d0;
        }
        if (dt_train_pp_on_(&t.pp) && t.mask.on) {
            DT_CHECK_GOTO(dt_train_pp_step_batches_(&t.pp, t.mask.batches, t.mask.dscale, &loss_sum), st, out_teardown);
        } else if (dt_train_pp_on_(&t.pp)) {
            DT_CHECK_GOTO(dt_train_pp_step_(&t.pp, t.data, t.net.n_rows, &loss_sum, &data_s), st, out_teardown);
        } else {
            for (int a = 0; a < t.accum; a++) {
                double d0 = dt_now_s();
                if (t.mask.on) batch = t.mask.batches[a];
                else DT_CHECK_GOTO(next_batch(&t, &batch), st, out_teardown);
                double d1 = dt_now_s(), l;
                data_s += d1 - d0;
                dt_trace_span(DT_TRACE_DATA, "data", d0, d1);
                dt_dp_micro_begin(t.dp, a == t.accum - 1);
                DT_CHECK_GOTO(dt_net_forward(&t.net, &batch, &l), st, out_teardown);
                double f1 = dt_trace_now();
                dt_trace_span(DT_TRACE_COMPUTE, "forward", d1, f1);
                loss_sum += l;
                DT_CHECK_GOTO(dt_net_backward(&t.net, t.mask.on ? t.mask.dscale
                                                                : 1.0f / ((float)t.net.n_rows * (float)t.accum)),
                              st, out_teardown);
                dt_trace_end(DT_TRACE_COMPUTE, "backward", f1);
                DT_CHECK_GOTO(dt_dp_micro_end(t.dp), st, out_teardown);
                DT_CHECK_GOTO(dt_tp_check(t.tp), st, out_teardown);
                DT_CHECK_GOTO(dt_cp_check(t.cp), st, out_teardown);
            }
        }
        double loss = t.mask.on ? dt_train_mask_loss_(&t.mask, loss_sum) : loss_sum / t.accum, norm = 0,
               r0 = dt_trace_now();
        DT_CHECK_GOTO(dt_dp_reduce_finish(t.dp), st, out_teardown);
        DT_CHECK_GOTO(dt_dp_grad_norm(t.dp, &norm), st, out_teardown);
        DT_CHECK_GOTO(dt_train_pp_on_(&t.pp) ? dt_train_mean_loss_(&t.pp, t.dp, &loss) : mean_over_ranks(&t, &loss), st,
                      out_teardown);
        if (!isfinite(loss) || !isfinite(norm)) {
            st = dt_error(DT_STATUS_INVALID, "step %lld: the loss (%g) or gradient norm (%g) is not finite",
                          (long long)step, loss, norm);
            goto out_teardown;
        }
        dt_adamw_args_t args = {.lr = (float)dt_sched_lr(cfg, step - 1),
                                .beta1 = (float)cfg->optimizer.betas[0],
                                .beta2 = (float)cfg->optimizer.betas[1],
                                .eps = (float)cfg->optimizer.eps,
                                .weight_decay = (float)cfg->optimizer.weight_decay,
                                .step = (int)step,
                                .grad_scale = 1.0f,
                                /* a fixed non-zero seed per run; the op mixes in the step */
                                .sr_seed = cfg->bf16.stochastic_rounding ? (unsigned)(cfg->seed * 2654435761u) | 1u : 0};
        if (cfg->gradient_clipping > 0 && norm > cfg->gradient_clipping)
            args.grad_scale = (float)(cfg->gradient_clipping / norm);
        double o0 = dt_trace_now();
        dt_trace_span(DT_TRACE_COMPUTE, "reduce", r0, o0); /* the gradients' reduction, norm and loss */
        DT_CHECK_GOTO(dt_dp_optimizer_step(t.dp, &args), st, out_teardown);
        DT_CHECK_GOTO(dt_pp_sync_tied(t.pp.engine), st, out_teardown);
        DT_CHECK_GOTO(o->synchronize(t.dev), st, out_teardown);
        double t1 = dt_now_s(), tp_ms = dt_tp_take_comm_ms(t.tp),
               comm_ms = dt_dp_take_comm_ms(t.dp) + tp_ms + dt_cp_take_comm_ms(t.cp);
        dt_trace_span(DT_TRACE_COMPUTE, "optimizer", o0, t1);
        dt_trace_span(DT_TRACE_STEP, "step", t0, t1);
        warn_data_wait(&t, step, data_s, t1 - t0, &last_data_warn);
        double val = NAN;
        if (cfg->eval.every_steps > 0 && (step % cfg->eval.every_steps == 0 || step == steps)) {
            DT_CHECK_GOTO(evaluate(&t, &val), st, out_teardown);
            dt_dp_take_comm_ms(t.dp); /* evaluation's gathers are not the step's */
            dt_tp_take_comm_ms(t.tp);
            dt_cp_take_comm_ms(t.cp);
            DT_CHECK_GOTO(dt_tp_check(t.tp), st, out_teardown);
            DT_CHECK_GOTO(dt_cp_check(t.cp), st, out_teardown);
        }
        final_loss = loss;
        if (!isnan(val)) final_val = val;
        int print = cfg->steps_per_print > 0 ? (step % cfg->steps_per_print == 0) : 0;
        int logged = print || step == steps || step == 1 || !isnan(val);
        double ppf[4] = {NAN, NAN, NAN, NAN}; /* the stages' bubble, its ideal, wait ms, p2p bytes */
        if (dt_train_pp_on_(&t.pp)) DT_CHECK_GOTO(dt_train_pp_figures_(&t.pp, t.dp, ppf), st, out_teardown);
        /* Compute = the step less its communication and data wait; communication that
         * overlapped compute (async buckets) is counted in comm_ms too, so the
         * difference can go below 0 on tiny steps: it is clamped. */
        double compute_ms = fmax(0.0, (t1 - t0 - data_s) * 1e3 - comm_ms);
        dt_straggler_row sr = {.slowest_rank = -1}; /* every rank's compute ms of a logged step */
        if (logged) DT_CHECK_GOTO(dt_stragglers_gather(t.stragglers, step, compute_ms, &sr), st, out_teardown);
        /* On a terminal the other steps redraw one live line ('\r', no newline). */
        if (rank0 && (logged || live)) {
            double step_s = t1 - t0;
            dt_step_metrics m = {.step = step, .total_steps = steps, .loss = loss, .lr = args.lr,
                                 .grad_norm = norm, .tokens_per_s = tokens_per_step / step_s,
                                 .step_ms = step_s * 1e3, .comm_ms = comm_ms, .data_ms = data_s * 1e3,
                                 .val_loss = val, .tp_comm_ms = t.tp ? tp_ms : NAN, .pp_bubble = ppf[0],
                                 .pp_bubble_ideal = ppf[1], .pp_wait_ms = ppf[2], .p2p_bytes = ppf[3],
                                 .have_ranks = logged, .slowest_rank = sr.slowest_rank,
                                 .slowest_ms = sr.slowest_ms, .median_ms = sr.median_ms,
                                 .rank_compute_ms = sr.rank_ms, .n_ranks = sr.n_ranks,
                                 .mem_peak_mb = (double)dt_mem_peak_total() / 1e6, .world_size = env->world_size};
            m.compute_ms = compute_ms;
            m.mfu = t.peak_flops > 0 ? flops_per_token * m.tokens_per_s / env->world_size / t.peak_flops : 0;
            double elapsed = dt_now_s() - t_start;
            m.eta_s = elapsed / (double)(step - t.resume.start_step) * (double)(steps - step);
            if (logged) DT_CHECK_GOTO(dt_metrics_log(t.metrics, &m), st, out_teardown);
            char line[512];
            dt_metrics_format(&m, line, sizeof line);
            printf("%s%c", line, logged ? '\n' : '\r');
            fflush(stdout);
        }
        DT_CHECK_GOTO(after_step(&t, step, &stop), st, out_teardown);
    }
    DT_CHECK_GOTO(dt_train_trace_finish(cfg, t.log_dir, t.comm, env->rank, env->world_size), st, out_teardown);
    if (stop) goto out_teardown; /* preempted: saved; every rank stops here */
    double wall = dt_now_s() - t_start;
    /* Collective tail: every rank's memory figures, and the full parameters
     * when rank 0 samples text or the test facility asks for them. */
    const char *dump_path = getenv("DTRUN_DUMP_PARAMS");
    if (dump_path && !*dump_path) dump_path = NULL;
    double mine[DT_TRAIN_MEM_N];
    dt_train_my_memory_(&t, mine);
    mem_all = dt_xcalloc((size_t)env->world_size * DT_TRAIN_MEM_N, sizeof(double));
    DT_CHECK_GOTO(dt_dp_all_gather_f64(t.dp, mine, DT_TRAIN_MEM_N, mem_all), st, out_teardown);
    if (dump_path || wants_sample(&t)) {
        DT_CHECK_GOTO(dt_train_gather_params_(&t.pp, &t.layout, t.dev, t.dp, t.comm, &full), st, out_teardown);
        if (t.layout.global) n = t.layout.global->n_params;
    }
    if (rank0 && dump_path) {
        /* never through a symbolic link (or into a FIFO or device) planted at the path */
        int fd = -1;
        st = dt_fs_open_regular(dump_path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0666, &fd, NULL);
        if (st != DT_STATUS_OK) {
            st = dt_error(st, "DTRUN_DUMP_PARAMS: %s", dt_error_detail());
            goto out_teardown;
        }
        FILE *f = fdopen(fd, "wb");
        if (!f) close(fd);
        if (!f || fwrite(full, sizeof(float), n, f) != n) {
            st = dt_error(DT_STATUS_IO, "DTRUN_DUMP_PARAMS: cannot write %s", dump_path);
            if (f) fclose(f);
            goto out_teardown;
        }
        if (fclose(f) != 0) {
            st = dt_error(DT_STATUS_IO, "DTRUN_DUMP_PARAMS: cannot write %s", dump_path);
            goto out_teardown;
        }
    }
    if (rank0 && t.resume.start_step >= steps) {
        printf("dtrun: the checkpoint is at step %lld of %lld: nothing left to train\n", (long long)t.resume.start_step,
               (long long)steps);
        fflush(stdout);
    } else if (rank0) {
        DT_CHECK_GOTO(dt_train_write_summary_(&t, final_loss, final_val, tokens_per_step * (double)steps, wall, steps,
                                    mem_all),
                      st, out_teardown);
        printf("dtrun: done: %lld steps in %.1f s, final loss %.4f%s, log in %s\n", (long long)steps, wall,
               final_loss, isnan(final_val) ? "" : "", t.log_dir);
        if (!isnan(final_val)) printf("dtrun: final val loss %.4f (perplexity %.2f)\n", final_val, exp(final_val));
        fflush(stdout);
        DT_CHECK_GOTO(print_sample(&t, (int)cfg->sample_tokens, full), st, out_teardown);
    }
out_teardown:
    free(mem_all);
    dt_mem_free(full);
    { /* teardown's waits on requests a failed step left fail too: the step's error stands */
        char keep[2048];
        snprintf(keep, sizeof keep, "%s", dt_error_detail());
        teardown(&t);
        if (st != DT_STATUS_OK) dt_error(st, "%s", keep);
    }
    return st;
}

/* The loop stays readable in one sitting: its parts live in train_*.c (trainer_impl.h). */
_Static_assert(__LINE__ < 800, "trainer.c stays under 800 lines: move a part out (trainer_impl.h)");
