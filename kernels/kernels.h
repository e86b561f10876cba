/*
 * kernels.h - the device op table: one C ABI that every compute backend fills.
 *
 * A device is a context (kind, thread count, and for CUDA its stream, cuBLASLt
 * handle and workspace) plus a table of function pointers, as in ggml-backend. The
 * models (runtime/) see only this file: they allocate their flat parameter, gradient
 * and optimizer buffers and their activation arena through dev->ops, and run forward
 * and backward as a sequence of ops. kernels/backend.c is the one file that knows
 * which backends exist; the CUDA one lives in the CUDA library (common/cudalib.h),
 * loaded when a CUDA device is first counted or opened.
 *
 * Types. Tensors of parameters, activations and gradients are `void *` holding
 * elements of the table's compute dtype (dev->ops->dtype: fp32 on CPU; bf16 or
 * fp32 on CUDA). Always fp32 (`float *`): layernorm mean/rstd, losses,
 * master weights, Adam m and v, regression targets. Token ids and class targets
 * are `const int *`. Pointers given to compute ops are device memory (for CPU that
 * is any host memory). Shapes are row-major and written in comments, `// (N, C)`.
 *
 * Conventions of the compute ops.
 *  - Every backward ACCUMULATES (+=) into every gradient it produces, input or
 *    parameter, as llm.c does: the caller zeroes gradient buffers once per step (or
 *    not, for gradient accumulation). A NULL gradient pointer means "not needed".
 *  - Loss ops are the start of the backward chain and WRITE their gradient (=).
 *  - Compute ops return nothing: given shapes that match the buffers they cannot
 *    fail (the CUDA backend reports launch errors at synchronize). Validating
 *    inputs (token ids < vocab, sizes) is the caller's job, done once at start.
 *  - Results are bitwise identical run to run for a fixed dev->nthreads: work is
 *    split statically and every reduction has a fixed order.
 *  - Slots marked (optional) may be NULL in a backend, and callers check them
 *    (peak_flops, relu_*, mse_*); the CPU backend fills every slot.
 */
#ifndef DT_KERNELS_KERNELS_H
#define DT_KERNELS_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "common/mem.h"    /* defines: dt_mem_category_t */
#include "common/status.h" /* defines: dt_status_t */

typedef enum dt_device_kind {
    DT_DEVICE_CPU = 0,
    DT_DEVICE_CUDA = 1,
} dt_device_kind_t;

typedef enum dt_dtype {
    DT_DTYPE_F32 = 0,
    DT_DTYPE_BF16 = 1,
} dt_dtype_t;

typedef enum dt_copy_kind {
    DT_COPY_HOST_TO_DEVICE = 0,
    DT_COPY_DEVICE_TO_HOST = 1,
    DT_COPY_DEVICE_TO_DEVICE = 2,
    DT_COPY_HOST_TO_HOST = 3,
} dt_copy_kind_t;

typedef struct dt_ops dt_ops_t;
typedef struct dt_device dt_device_t;

struct dt_device {
    dt_device_kind_t kind;
    int ordinal;        /* CUDA device index; 0 on CPU */
    int nthreads;       /* CPU threads the ops use (OpenMP); >= 1 */
    const dt_ops_t *ops;
    void *impl;         /* backend-private state (CUDA stream, cuBLASLt, workspace) */
    char name[128];     /* CUDA: the GPU's name (cudaDeviceProp.name), for the peak
                           FLOP/s table in runtime/tools/plan.c; CPU: "cpu" */
};

/* Hyper-parameters of one AdamW step (decoupled weight decay, Loshchilov & Hutter;
 * the same update as torch.optim.AdamW). */
typedef struct dt_adamw_args {
    float lr;
    float beta1, beta2, eps;
    float weight_decay; /* applied only when the op's `decay` flag is set */
    int step;           /* 1-based step number, for bias correction (< 1 taken as 1) */
    float grad_scale;   /* gradients are multiplied by this first (clipping); 1 = none */
    /* Rounding of the bf16 parameter copy written from the fp32 master weights:
     * 0 = round to nearest even; otherwise stochastic rounding (rounds up with
     * probability equal to the distance from the lower bf16 neighbour, so the
     * expected value is the fp32 weight) driven by a counter-based hash of
     * (sr_seed, step, element index): the same seed gives the same bits run to run.
     * Only the CUDA bf16 table rounds; the CPU backend and fp32 tables ignore it. */
    unsigned sr_seed;
} dt_adamw_args_t;

/* Rotary position embedding as Hugging Face's LlamaRotaryEmbedding computes it:
 * rotate_half pairs x[i] with x[i + HS/2] (i < HS/2) and turns the pair by the
 * angle pos * inv_freq[i]; optionally with Llama 3's frequency rescaling
 * (config.json's rope_scaling with rope_type "llama3"). */
typedef struct dt_rope_args {
    double theta;                             /* rope_theta: 10000, 500000, 1e6 */
    double factor;                            /* llama3 rescaling factor; 0 = none */
    double low_freq_factor, high_freq_factor; /* llama3: 1, 4 */
    int original_max_pos;                     /* llama3: original_max_position_embeddings, 8192 */
} dt_rope_args_t;
#define DT_ROPE_MAX_HS 256

/* inv_freq[i] for i < HS/2, in fp32 step by step as transformers computes it
 * (modeling_rope_utils.py: _compute_default_rope_parameters and, when factor > 0,
 * _compute_llama3_parameters), so that positions map to the same fp32 angles:
 * inv_freq = 1 / theta^(float(2i) / HS) in fp32; llama3 then keeps frequencies
 * whose wavelength 2 pi / inv_freq is below original_max_pos / high_freq_factor,
 * divides those above original_max_pos / low_freq_factor by factor, and blends
 * the two in between. Scalars enter the fp32 arithmetic rounded to float, as
 * PyTorch's tensor-scalar ops do; `scalar / tensor` is reciprocal times scalar.
 * theta^e is rounded correctly here, PyTorch's vectorised powf (SLEEF) to within
 * 1 ulp: of the 1632 values for theta 1e4, 5e5, 1e6 and HS 16..256, with and
 * without llama3, 6 differ from transformers' by 1 ulp, the rest are equal. */
static inline void dt_rope_inv_freq(const dt_rope_args_t *a, int HS, float *inv_freq) {
    float base = (float)a->theta;
    for (int i = 0; i < HS / 2; i++) {
        float e = (float)(2 * i) / (float)HS;
        float f = 1.0f / (float)pow((double)base, (double)e);
        if (a->factor > 0) {
            float factor = (float)a->factor, lo = (float)a->low_freq_factor;
            float old = (float)a->original_max_pos;
            float low_wl = (float)(a->original_max_pos / a->low_freq_factor);
            float high_wl = (float)(a->original_max_pos / a->high_freq_factor);
            float wavelen = (1.0f / f) * (float)6.283185307179586;
            float scaled = wavelen > low_wl ? f / factor : f;
            /* volatile: each product rounded to fp32 on its own, as PyTorch's separate
             * ops do, never fused into an FMA with the following sum. */
            volatile float ratio = (1.0f / wavelen) * old;
            float smooth = (ratio - lo) / (float)(a->high_freq_factor - a->low_freq_factor);
            volatile float keep = smooth * scaled, part = (1.0f - smooth) * scaled;
            float smoothed = part / factor + keep;
            f = (!(wavelen < high_wl) && !(wavelen > low_wl)) ? smoothed : scaled;
        }
        inv_freq[i] = f;
    }
}

struct dt_ops {
    const char *name;  /* "cpu", "cuda" */
    dt_dtype_t dtype;  /* element type of parameters, activations and gradients */

    /* ---- memory (copy/set play memcpy/memset; those names can be libc macros) - */
    /* Zero-filled, 64-byte aligned, accounted under cat (common/mem.h). */
    dt_status_t (*alloc)(dt_device_t *dev, dt_mem_category_t cat, size_t bytes, void **out);
    void (*free)(dt_device_t *dev, void *ptr); /* NULL is fine */
    /* Ordered after the ops already issued on the device; a copy to the host has
     * landed when it returns, and the source of a copy from the host may be reused
     * when it returns (upload_f32 too). Overlapping ranges are fine on CPU. */
    dt_status_t (*copy)(dt_device_t *dev, void *dst, const void *src, size_t bytes,
                        dt_copy_kind_t kind);
    /* (optional) Device-to-device strided copy of `height` rows of width_bytes
     * each: row i from src + i * src_pitch to dst + i * dst_pitch (pitches in bytes,
     * each >= width_bytes), ordered like copy. One call where a loop of copy would
     * issue one per row (CUDA: cudaMemcpy2DAsync; CPU: a memcpy per row). The two
     * ranges must not overlap. INVALID for a pitch below the width or a NULL
     * pointer with bytes to copy; nothing to do when width_bytes or height is 0. */
    dt_status_t (*copy_2d)(dt_device_t *dev, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                           size_t width_bytes, size_t height);
    dt_status_t (*set)(dt_device_t *dev, void *ptr, int byte, size_t bytes);
    /* Waits for all queued work; reports errors of asynchronous ops. */
    dt_status_t (*synchronize)(dt_device_t *dev);
    /* n elements between host fp32 and device tensors of the compute dtype
     * (initialisation, checkpoints, export). */
    dt_status_t (*upload_f32)(dt_device_t *dev, void *dst, const float *src, size_t n);
    dt_status_t (*download_f32)(dt_device_t *dev, float *dst, const void *src, size_t n);
    /* ---- pinned host memory and asynchronous copies (optimizer offload) ---------
     * host_alloc: host memory the device copies to and from at full speed and
     * without staging (CUDA: cudaHostAlloc, page-locked), zero-filled, 64-byte
     * aligned on the CPU, accounted under cat; the CPU device returns plain memory.
     * host_free releases it (NULL is fine). */
    dt_status_t (*host_alloc)(dt_device_t *dev, dt_mem_category_t cat, size_t bytes, void **out);
    void (*host_free)(dt_device_t *dev, void *ptr);
    /* Starts a copy between device memory and host_alloc memory (HOST_TO_DEVICE or
     * DEVICE_TO_HOST) after the ops already issued, on the device's copy stream, and
     * returns without waiting: the ops issued next run while the bytes move. Neither
     * buffer may be written, nor a host destination read, before copy_async_wait.
     * The CPU device copies at once. */
    dt_status_t (*copy_async)(dt_device_t *dev, void *dst, const void *src, size_t bytes,
                              dt_copy_kind_t kind);
    /* Waits for every copy_async issued so far; ops issued after it see their data. */
    dt_status_t (*copy_async_wait)(dt_device_t *dev);
    /* (optional) Peak FLOP/s in the compute dtype with dev->nthreads, for MFU.
     * CPU: measured by a short sgemm probe through matmul_forward (~0.1 s, once per
     * device; cached). 0 when the backend does not know it (CUDA): runtime/ then
     * looks the device up by dev->name in the GPU table of runtime/tools/plan.c. */
    double (*peak_flops)(dt_device_t *dev);
    /* (optional) The device memory free now and in total, bytes (CUDA:
     * cudaMemGetInfo; CPU: what the host can still give, common/meminfo.h, and its
     * physical memory). */
    dt_status_t (*mem_info)(dt_device_t *dev, size_t *free_bytes, size_t *total_bytes);

    /* ---- embedding: out[b,t,:] = wte[inp[b,t],:] + wpe[p,:] ----------------
     * p is the row's position: t, or pos[b,t] when pos is given (packed sequences,
     * below). wpe NULL: no position table (positions enter elsewhere, e.g. RoPE), out
     * is the token's row of wte. An id < 0 has no row here (tensor parallelism: another
     * rank holds the token's vocabulary row): its wte term is 0 forward and it adds
     * nothing to dwte backward (the wpe terms stay).
     *
     * Packed sequences. The ops that see positions (encoder, attention, rope) take
     * `const int *pos`, device memory (B, T): the position of each row inside its
     * document, 0 where a document starts and the previous row's + 1 after (pos[b,0]
     * is 0; the caller checks). NULL is one document per row: row t at position t,
     * the plain causal attention, bitwise what the ops computed before pos existed. */
    void (*encoder_forward)(dt_device_t *dev, void *out,  // (B, T, C)
                            const int *inp,               // (B, T) token ids < V, or < 0
                            const void *wte,              // (V, C)
                            const void *wpe,              // (maxT, C), T <= maxT, or NULL
                            const int *pos,               // (B, T) or NULL
                            int B, int T, int C);
    /* dwpe may be NULL. dwpe[p] sums its rows in row order (b, then t). */
    void (*encoder_backward)(dt_device_t *dev, void *dwte, // (V, C) +=
                             void *dwpe,                   // (maxT, C) +=
                             const void *dout,             // (B, T, C)
                             const int *inp,               // (B, T)
                             const int *pos,               // (B, T) or NULL
                             int B, int T, int C);

    /* ---- layernorm over the last dim, eps 1e-5, saving mean and rstd ------- */
    void (*layernorm_forward)(dt_device_t *dev, void *out, // (N, C)
                              float *mean, float *rstd,    // (N), (N)
                              const void *inp,             // (N, C)
                              const void *weight,          // (C)
                              const void *bias,            // (C)
                              int N, int C);
    void (*layernorm_backward)(dt_device_t *dev, void *dinp, // (N, C) +=
                               void *dweight, void *dbias,   // (C) +=, (C) +=
                               const void *dout,             // (N, C)
                               const void *inp,              // (N, C)
                               const void *weight,           // (C)
                               const float *mean, const float *rstd, // (N), (N)
                               int N, int C);

    /* ---- matmul: out = inp @ weight^T + bias (bias may be NULL) ------------- */
    void (*matmul_forward)(dt_device_t *dev, void *out, // (N, OC)
                           const void *inp,             // (N, C)
                           const void *weight,          // (OC, C)
                           const void *bias,            // (OC) or NULL
                           int N, int C, int OC);
    /* dinp, dweight and dbias may be NULL (each is its own product, so a caller can
     * start communicating dinp before the weight gradient: tensor parallelism). */
    void (*matmul_backward)(dt_device_t *dev, void *dinp, // (N, C) +=
                            void *dweight,                // (OC, C) +=
                            void *dbias,                  // (OC) +=
                            const void *dout,             // (N, OC)
                            const void *inp,              // (N, C)
                            const void *weight,           // (OC, C)
                            int N, int C, int OC);

    /* ---- causal multi-head self-attention, with grouped-query attention --------
     * NH query heads and NKV key/value heads (NH % NKV == 0; NKV == NH is plain
     * multi-head attention), all HS = C / NH wide: C is the width of q and of out,
     * which for Llama-family models with head_dim set need not be the hidden size.
     * Each qkv row is q (NH*HS) | k (NKV*HS) | v (NKV*HS), that is C + 2*NKV*HS wide,
     * and query head h uses key/value head h / (NH / NKV), as transformers'
     * repeat_kv does. out = softmax(q k^T / sqrt(HS), causal) v, heads concatenated.
     * With pos (packed sequences, see the embedding) the mask is block-causal: query
     * (b, t) attends to exactly the keys j with t - pos[b,t] <= j <= t, its own
     * document up to itself; NULL is the plain causal mask (j <= t).
     * `saved` is what the backward needs (CPU: the probabilities (B, NH, T, T));
     * `scratch` is workspace for the backward only. Their sizes in bytes come from
     * the two *_bytes slots and depend on dev->nthreads; in the CPU and CUDA
     * backends not on NKV (key/value heads are read in place, never expanded). */
    size_t (*attention_saved_bytes)(const dt_device_t *dev, int B, int T, int C, int NH, int NKV);
    size_t (*attention_scratch_bytes)(const dt_device_t *dev, int B, int T, int C, int NH, int NKV);
    void (*attention_forward)(dt_device_t *dev, void *out, // (B, T, C)
                              void *saved,                 // attention_saved_bytes
                              const void *qkv,             // (B, T, C + 2*NKV*HS)
                              const int *pos,              // (B, T) or NULL
                              int B, int T, int C, int NH, int NKV);
    /* The gradient of each key/value head sums over the NH / NKV query heads that
     * read it. */
    void (*attention_backward)(dt_device_t *dev, void *dqkv, // (B, T, C + 2*NKV*HS) +=
                               void *scratch,                // attention_scratch_bytes
                               const void *dout,             // (B, T, C)
                               const void *qkv,              // (B, T, C + 2*NKV*HS)
                               const void *saved,            // from the forward
                               const int *pos,               // (B, T), the forward's, or NULL
                               int B, int T, int C, int NH, int NKV);
    /* (optional) KV-cache decoding: B sequences, one new query each, at position
     * pos (it attends to positions 0..pos). q: (B, q_stride), q (NH*HS) at the start
     * of each row (a qkv row, say); kv: (B, max_T, 2*NKV*HS), row t = keys (NKV*HS)
     * then values (NKV*HS) of position t, filled for t <= pos: exactly the k|v tail
     * of a qkv row, so a model copies qkv[C .. C + 2*NKV*HS) of the new position
     * into cache row pos. out (B, C) is written (=): row pos of the causal attention
     * over the same q, k, v. pos < max_T; the CUDA backend takes HS <= DT_ROPE_MAX_HS
     * (a larger head is an error at synchronize). */
    void (*attention_decode)(dt_device_t *dev, void *out, // (B, C) =
                             const void *q, int q_stride, // (B, q_stride)
                             const void *kv, int max_T,   // (B, max_T, 2*NKV*HS)
                             int pos, int B, int C, int NH, int NKV);

    /* ---- (optional) attention one key/value block at a time: context parallelism
     * (ring attention). Each rank of a context-parallel group holds Tq "local" query
     * rows of every sequence with their GLOBAL token indices, and the key/value
     * blocks of the group's ranks pass around a ring; these ops attend the local
     * queries to one block, flash-style, merging into a running (output,
     * log-sum-exp). NULL where a device lacks context parallelism (all or none).
     * Heads and scale as attention_forward: KV = NKV*HS, a qkv row is C + 2*KV wide
     * (q read from its first C), query head h uses key/value head h / (NH / NKV). A
     * kv block row is k (KV) | v (KV), 2*KV wide, in the compute dtype.
     * Masking is by global index: query row (b, q), at global index qidx[b,q] with
     * lowest visible key qlo[b,q], attends to key row (b, k) of the block exactly
     * when qlo[b,q] <= kidx[b,k] <= qidx[b,q] (one document per row: qlo 0; packed
     * sequences: the global index of the row's document's start). qidx, qlo (B, Tq)
     * and kidx (B, Tk) are device memory. Sums have a fixed order for any thread
     * count; `scratch` is workspace of attention_block_scratch_bytes (both block
     * ops; on the CPU it depends on dev->nthreads, the CUDA backend needs none: 0,
     * and then any pointer will do). A forward over every block, in any
     * order, then attention_block_finish gives attention_forward's out; the
     * backward over every block gives attention_backward's dqkv (dkv added into
     * the owner's rows with attention_kv_grad_add). */
    size_t (*attention_block_scratch_bytes)(const dt_device_t *dev, int B, int Tq, int Tk, int C, int NH,
                                            int NKV);
    /* kv (B, T, 2*KV) = the k|v part of each qkv row: qkv[:, :, C : C + 2*KV]. */
    void (*attention_kv_pack)(dt_device_t *dev, void *kv, // (B, T, 2*KV) =
                              const void *qkv,            // (B, T, C + 2*KV)
                              int B, int T, int C, int NH, int NKV);
    /* o and lse are the running normalised output and log-sum-exp of the scaled
     * scores q.k / sqrt(HS) over the keys seen so far, fp32. first = 1 starts them
     * (o = 0, lse = -INFINITY) and then merges this block; a query row that sees no
     * key of the block keeps its o and lse bitwise. The merge of a block's own
     * (o_blk, lse_blk): m = logaddexp(lse, lse_blk), o = o exp(lse - m) +
     * o_blk exp(lse_blk - m), lse = m. */
    void (*attention_block_forward)(dt_device_t *dev, float *o, // (B, Tq, C) fp32, updated
                                    float *lse,                 // (B, NH, Tq) fp32, updated
                                    void *scratch,              // attention_block_scratch_bytes
                                    const void *qkv,            // (B, Tq, C + 2*KV): q read
                                    const void *kv,             // (B, Tk, 2*KV)
                                    const int *qidx, const int *qlo, // (B, Tq), (B, Tq)
                                    const int *kidx,                 // (B, Tk)
                                    int first, int B, int Tq, int Tk, int C, int NH, int NKV);
    /* out (compute dtype) = o after the last block; a row that saw no key is 0. */
    void (*attention_block_finish)(dt_device_t *dev, void *out, // (B, Tq, C) =
                                   const float *o,              // (B, Tq, C) fp32
                                   int B, int Tq, int C);
    /* delta[b,h,q] = sum over head h's HS columns of dout * out, out being the
     * forward's output (the row term of the softmax backward). */
    void (*attention_block_delta)(dt_device_t *dev, float *delta, // (B, NH, Tq) fp32 =
                                  const void *dout,               // (B, Tq, C)
                                  const void *out,                // (B, Tq, C)
                                  int B, int Tq, int C, int NH);
    /* The gradient from one block, given the FINAL lse of the forward and delta:
     * the probabilities are recomputed in fp32 (P = exp(S scale - lse), dP = dO V^T,
     * dS = P (dP - delta)); the q part of dqkv += dS K scale (its k and v parts are
     * not touched) and dkv += dS^T Q scale | P^T dO, each key/value head summed over
     * the NH / NKV query heads that read it. */
    void (*attention_block_backward)(dt_device_t *dev, void *dqkv, // (B, Tq, C + 2*KV) +=, q part
                                     float *dkv,                   // (B, Tk, 2*KV) fp32 +=
                                     void *scratch,                // attention_block_scratch_bytes
                                     const void *dout,             // (B, Tq, C)
                                     const void *qkv,              // (B, Tq, C + 2*KV)
                                     const void *kv,               // (B, Tk, 2*KV)
                                     const float *lse,             // (B, NH, Tq), final
                                     const float *delta,           // (B, NH, Tq)
                                     const int *qidx, const int *qlo, // (B, Tq), (B, Tq)
                                     const int *kidx,                 // (B, Tk)
                                     int B, int Tq, int Tk, int C, int NH, int NKV);
    /* dqkv[:, :, C : C + 2*KV] += dkv, fp32 into the compute dtype: a block's
     * gradient back into the rows that own it. */
    void (*attention_kv_grad_add)(dt_device_t *dev, void *dqkv, // (B, T, C + 2*KV) +=
                                  const float *dkv,             // (B, T, 2*KV) fp32
                                  int B, int T, int C, int NH, int NKV);

    /* ---- RMSNorm over the last dim (Llama): out = inp * rstd * weight with
     * rstd = 1 / sqrt(mean(inp^2) + eps), computed in fp32; rstd is saved. ------ */
    void (*rmsnorm_forward)(dt_device_t *dev, void *out, // (N, C)
                            float *rstd,                 // (N)
                            const void *inp,             // (N, C)
                            const void *weight,          // (C)
                            int N, int C, float eps);
    /* dinp and dweight may be NULL. */
    void (*rmsnorm_backward)(dt_device_t *dev, void *dinp, // (N, C) +=
                             void *dweight,                // (C) +=
                             const void *dout,             // (N, C)
                             const void *inp,              // (N, C)
                             const void *weight,           // (C)
                             const float *rstd,            // (N)
                             int N, int C);

    /* ---- rotary position embedding (dt_rope_args_t), IN PLACE on the first n_heads
     * heads (HS wide, HS even and <= DT_ROPE_MAX_HS) of each row of x, which is
     * (B, T, row_stride); row t sits at position pos0 + t, or, when pos (B, T) is
     * given (packed sequences), row (b, t) at pos[b,t] (pos0 unused). For Llama's
     * qkv rows, n_heads = NH + NKV (the q heads, then the k heads) and row_stride =
     * (NH + 2*NKV) * HS. The backward maps, in place, the gradient w.r.t. the
     * rotated values into the gradient w.r.t. the unrotated ones (the transposed
     * rotation): it OVERWRITES dx, the one exception to the += convention. ---- */
    void (*rope_forward)(dt_device_t *dev, void *x, int B, int T, int row_stride, int n_heads,
                         int HS, int pos0, const int *pos, const dt_rope_args_t *rope);
    void (*rope_backward)(dt_device_t *dev, void *dx, int B, int T, int row_stride, int n_heads,
                          int HS, int pos0, const int *pos, const dt_rope_args_t *rope);

    /* ---- SwiGLU: each row of inp (N, 2*IC) holds gate then up, IC wide each (the
     * intermediate size; not `I`, which <complex.h> takes); out (N, IC) =
     * silu(gate) * up with silu(x) = x / (1 + exp(-x)). ------------------------ */
    void (*swiglu_forward)(dt_device_t *dev, void *out, // (N, IC)
                           const void *inp,             // (N, 2*IC)
                           int N, int IC);
    void (*swiglu_backward)(dt_device_t *dev, void *dinp, // (N, 2*IC) +=
                            const void *inp,              // (N, 2*IC)
                            const void *dout,             // (N, IC)
                            int N, int IC);

    /* ---- elementwise --------------------------------------------------------
     * gelu: tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
    void (*gelu_forward)(dt_device_t *dev, void *out, const void *inp, size_t n);
    void (*gelu_backward)(dt_device_t *dev, void *dinp, // (n) +=
                          const void *inp, const void *dout, size_t n);
    /* (optional) relu and mse, for the MLP model. */
    void (*relu_forward)(dt_device_t *dev, void *out, const void *inp, size_t n);
    void (*relu_backward)(dt_device_t *dev, void *dinp, // (n) +=
                          const void *inp, const void *dout, size_t n);
    /* out = a + b; backward: da += dout, db += dout (either may be NULL). */
    void (*residual_forward)(dt_device_t *dev, void *out, const void *a, const void *b,
                             size_t n);
    void (*residual_backward)(dt_device_t *dev, void *da, void *db, const void *dout,
                              size_t n);

    /* ---- losses ---------------------------------------------------------------
     * Fused softmax + cross-entropy over a padded vocabulary: only the first V of
     * the Vp logits of a row take part; padded columns are ignored. A target < 0
     * marks a row to ignore (loss 0, gradient 0). losses[i] = -log p[i, target[i]]. */
    void (*softmax_xent_forward)(dt_device_t *dev, float *losses, // (N)
                                 const void *logits,              // (N, Vp)
                                 const int *targets,              // (N), < V
                                 int N, int V, int Vp);
    /* Writes dlogits = dscale * (softmax(logits) - onehot(target)), 0 in padded
     * columns, e.g. dscale = 1 / (B * T * grad_accum). dlogits may alias logits
     * (then the logits are consumed). losses (N) is written too unless NULL. */
    void (*softmax_xent_backward)(dt_device_t *dev, void *dlogits, // (N, Vp) =
                                  float *losses,                   // (N) or NULL
                                  const void *logits,              // (N, Vp)
                                  const int *targets,              // (N)
                                  float dscale, int N, int V, int Vp);
    /* ---- vocabulary-parallel softmax + cross-entropy (tensor parallelism, as
     * Megatron's vocab_parallel_cross_entropy): the same loss and gradient as
     * softmax_xent_* while each of the T ranks of a TP group holds only its slice of
     * the logits, columns [v0, v0 + Vl) of the padded vocabulary Vp (Vl = Vp / T,
     * v0 = r * Vl). Global columns >= V are padding: outside the softmax, gradient 0.
     * A target < 0 marks an ignored row (loss 0, gradient 0). The caller runs the
     * collectives between the ops, on the fp32 stats buffer (3*N floats, device):
     *   stats = [ max (N) | sum of exp(x - max) (N) | target logit (N) ]
     *   xent_vp_max -> all-reduce MAX of stats[0, N) -> xent_vp_sums ->
     *   all-reduce SUM of stats[N, 3N) -> xent_vp_loss and/or xent_vp_backward.
     * No rank ever holds more than N * Vl logits.
     *
     * stats[n] = max of row n over this rank's real columns (global index < V);
     * -INFINITY when the rank has none (all of its columns are padding). */
    void (*xent_vp_max)(dt_device_t *dev, float *stats, // (3, N): writes [0, N)
                        const void *logits,             // (N, Vl)
                        int N, int Vl, int v0, int V);
    /* With the global max in stats[0, N): stats[N + n] = sum over this rank's real
     * columns of exp(x - max) (0 when it has none), stats[2N + n] = x[target - v0]
     * when v0 <= target < min(v0 + Vl, V), else 0 (exactly one rank holds it).
     * Ignored rows get 0 in both. */
    void (*xent_vp_sums)(dt_device_t *dev, float *stats, // (3, N): writes [N, 3N)
                         const void *logits,             // (N, Vl)
                         const int *targets,             // (N), global ids < V
                         int N, int Vl, int v0, int V);
    /* From the reduced stats: losses[n] = log(sum) + max - target logit, 0 for
     * targets < 0 (the same value on every rank of the group). */
    void (*xent_vp_loss)(dt_device_t *dev, float *losses, // (N)
                         const float *stats,              // (3, N), reduced
                         const int *targets,              // (N)
                         int N);
    /* Writes (=) dlogits = dscale * (softmax - onehot(target)) on this rank's real
     * columns, 0 on its padded columns and on ignored rows. dlogits may alias logits
     * (then the logits are consumed). */
    void (*xent_vp_backward)(dt_device_t *dev, void *dlogits, // (N, Vl) =
                             const void *logits,              // (N, Vl)
                             const int *targets,              // (N)
                             const float *stats,              // (3, N), reduced
                             float dscale, int N, int Vl, int v0, int V);
    /* Mean squared error per row: losses[i] = (1/D) sum_d (pred - target)^2.
     * Backward writes dpred = dscale * 2 (pred - target) / D. */
    void (*mse_forward)(dt_device_t *dev, float *losses, // (N)
                        const void *pred,                // (N, D)
                        const float *target,             // (N, D)
                        int N, int D);
    void (*mse_backward)(dt_device_t *dev, void *dpred, // (N, D) =
                         const void *pred, const float *target, float dscale, int N, int D);

    /* ---- optimizer and gradient utilities over flat ranges ---------------------
     * AdamW over n elements. With master == NULL (fp32 compute) params are the
     * master weights and are updated in place; otherwise master (fp32) is updated
     * and params receive its copy in the compute dtype. m, v (fp32) start at 0.
     * decay = 0 skips weight decay for this range (biases, LayerNorm, embeddings). */
    void (*adamw)(dt_device_t *dev, void *params, float *master, const void *grads,
                  float *m, float *v, size_t n, const dt_adamw_args_t *args, int decay);
    /* Sum of squares of n gradient elements, accumulated in double. */
    double (*grad_sq_norm)(dt_device_t *dev, const void *grads, size_t n);
    /* The same over n ranges (grads[i], counts[i] elements each; a count may be 0):
     * the sum of grad_sq_norm of each range, added in range order, with one wait for
     * the device in all (a ZeRO shard is many ranges). */
    double (*grad_sq_norm_ranges)(dt_device_t *dev, const void *const *grads, const size_t *counts, int n);
    /* x *= s over n elements (gradient clipping, averaging). */
    void (*scale)(dt_device_t *dev, void *x, float s, size_t n);
    /* dst (n elements of dtype `to`) = src (n elements of dtype `from`), on the device;
     * into bf16 rounds to nearest even (NaN stays NaN). dst and src do not overlap
     * unless equal with to == from. For gradient reductions in a dtype other than the
     * compute dtype (communication_data_type). */
    void (*cast)(dt_device_t *dev, void *dst, dt_dtype_t to, const void *src, dt_dtype_t from, size_t n);

    /* ---- LoRA (runtime/model/lora.h; optional: NULL where a device lacks them) ----
     * C (M, N) = alpha * op(A) @ op(B) + beta * C, row-major, each matrix with its
     * own row stride (ld*, elements): op(X) = X, or X^T when its trans flag is 1 (A
     * then (K, M) in memory, B (N, K)). Compute dtype. The adapters' small products,
     * which read and write column blocks of a fused output. */
    void (*gemm)(dt_device_t *dev, int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A,
                 int lda, const void *B, int ldb, float beta, void *C, int ldc);
    /* matmul_forward with an int8 weight quantized per output row (absmax): weight
     * row o is wq[o, :] * scale[o], dequantized on the fly (never whole in memory). */
    void (*matmul_forward_q8)(dt_device_t *dev, void *out, // (N, OC)
                              const void *inp,             // (N, C)
                              const int8_t *wq,            // (OC, C)
                              const float *scale,          // (OC)
                              const void *bias,            // (OC) or NULL
                              int N, int C, int OC);
    /* dinp += dout @ dequant(wq): the input gradient of matmul_forward_q8 (the
     * weight is frozen: no weight gradient). */
    void (*matmul_backward_q8)(dt_device_t *dev, void *dinp, // (N, C) +=
                               const void *dout,             // (N, OC)
                               const int8_t *wq,             // (OC, C)
                               const float *scale,           // (OC)
                               int N, int C, int OC);
};

/* AdamW on the host for a device whose optimizer state lives in host memory
 * (zero_optimization.offload_optimizer): the update of the CPU device's adamw
 * (kernels/cpu/cpu_optim.c, the same arithmetic) on n elements whose gradients
 * and parameters are in `dtype` (fp32 or bf16, host memory) while master, m and v
 * are fp32: master is updated and params receive its copy, rounded to bf16 as the
 * CUDA adamw rounds (nearest even, or stochastic with args->sr_seed, the same bits
 * for the same seed, step and element index `index0 + i`). params may equal grads
 * (each gradient is read before its parameter is written). nthreads OpenMP
 * threads (<= 0: omp_get_max_threads()), each a static share: bitwise the same
 * for any thread count. */
void dt_host_adamw(int nthreads, dt_dtype_t dtype, void *params, float *master, const void *grads, float *m,
                   float *v, size_t n, size_t index0, const dt_adamw_args_t *args, int decay);

/* How to open a device. */
/* The layout of what the binary and the CUDA library share through this header
 * (sizes of the device, the op table and the optimizer's arguments). The library
 * exports the value it was compiled with (dt_cuda_kernels_layout); the binary
 * refuses a library whose value differs from its own, so a stale library beside a
 * rebuilt dtrun is an error naming it, not memory read through the wrong offsets. */
#define DT_KERNELS_LAYOUT                                                                  \
    ((unsigned long)sizeof(dt_device_t) * 1000003ul + (unsigned long)sizeof(dt_ops_t) * 1009ul + \
     (unsigned long)sizeof(dt_adamw_args_t))

typedef struct dt_device_opts {
    dt_device_kind_t kind;
    int nthreads;     /* CPU threads the ops use; <= 0 takes omp_get_max_threads() */
    int ordinal;      /* CUDA device index, as numbered under CUDA_VISIBLE_DEVICES; CPU: 0 */
    dt_dtype_t dtype; /* compute dtype: CPU only F32; CUDA F32 or BF16 (fp32 master weights) */
} dt_device_opts_t;

/* The CUDA backend's attention, chosen by DTRUN_CUDA_ATTENTION at device open:
 * "cublas" (also unset or empty; the default) materialises the (B, NH, T, T)
 * probabilities around cuBLAS GEMMs (kernels/cuda/cuda_attention.cu); "fused" is
 * the flash-style kernel (cuda_attention_fused.cu) that saves only out and the
 * per-row log-sum-exp, for head sizes up to DT_ATTENTION_FUSED_MAX_HS (larger
 * heads use cuBLAS). runtime/tools/plan.c models whichever is in use. */
typedef enum dt_attention_kind {
    DT_ATTENTION_CUBLAS = 0,
    DT_ATTENTION_FUSED = 1,
} dt_attention_kind_t;
#define DT_ATTENTION_FUSED_MAX_HS 128
/* DTRUN_CUDA_ATTENTION -> kind; INVALID naming the value when it is neither. */
dt_status_t dt_attention_kind_from_env(dt_attention_kind_t *out);
/* 1 when a device asked for `kind` runs the fused kernel at head size HS. */
static inline int dt_attention_uses_fused(dt_attention_kind_t kind, int HS) {
    return kind == DT_ATTENTION_FUSED && HS >= 1 && HS <= DT_ATTENTION_FUSED_MAX_HS;
}

/* Opens a device. Errors: UNSUPPORTED when the kind's code cannot be loaded (CUDA:
 * the CUDA library or one of its CUDA libraries is missing; the detail names it and
 * where it was looked for), no such device is present, or the kind does not compute
 * in opts->dtype; the detail says which (and CUDA's own message). */
dt_status_t dt_device_open(dt_device_t **out, const dt_device_opts_t *opts);
/* Devices of a kind present: CPU 1; CUDA the visible GPUs, 0 when none or when the
 * CUDA library cannot be loaded. Loads the CUDA library only when the driver has a
 * GPU (common/gpuinfo.h counts them without CUDA). */
int dt_device_count(dt_device_kind_t kind);
/* Loads the code of a kind (CUDA: the CUDA library, common/cudalib.h, which must
 * have been built against this kernels.h: DT_KERNELS_LAYOUT), OK for the CPU;
 * UNSUPPORTED with the loader's message naming what is missing and where. */
dt_status_t dt_device_load(dt_device_kind_t kind);

/* dt_device_open with ordinal 0 and the kind's default dtype (CPU fp32, CUDA bf16).
 * nthreads <= 0 takes omp_get_max_threads(), which honours OMP_NUM_THREADS. */
dt_status_t dt_device_init(dt_device_t **out, dt_device_kind_t kind, int nthreads);
void dt_device_free(dt_device_t *dev);
/* 1 when the code of a kind is at hand, found without loading it (CUDA: the CUDA
 * library is linked in, beside the binary or in LD_LIBRARY_PATH); not that a
 * device is present. */
int dt_device_built(dt_device_kind_t kind);
const char *dt_device_kind_name(dt_device_kind_t kind);
/* "cpu" / "cuda" -> kind; INVALID (naming the value) otherwise. */
dt_status_t dt_device_kind_parse(const char *s, dt_device_kind_t *out);
/* Bytes of one element: 4 for F32, 2 for BF16. */
size_t dt_dtype_size(dt_dtype_t dtype);
const char *dt_dtype_name(dt_dtype_t dtype);

#endif /* DT_KERNELS_KERNELS_H */
