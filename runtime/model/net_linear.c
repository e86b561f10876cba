/*
 * net_linear.c - a net's linear layers by tensor index (net_impl.h: dt_net_linear_*)
 * and LoRA's part of them: the frozen base's matmul in its storage dtype (the
 * compute dtype's op, or the int8 ops that dequantize on the fly) plus, per targeted
 * tensor of a fused group, the adapters on that tensor's rows of the output:
 *   forward   U = x A^T (N, r);  out[:, rows] += s U B^T
 *   backward  U again (recomputed: the arena stays the model's), dU = s dout[:, rows] B,
 *             dB += s dout[:, rows]^T U,  dA += dU^T x,  dinp += dU A
 * with s = alpha / r, PEFT's y = W x + s B (A x). The adapters are reached through
 * the net's units (unit_params / unit_grads, which a data-parallel strategy binds to
 * the adapters' flat buffers) and lora->adapters' offsets.
 */
#include "runtime/model/net_impl.h"

/* Adapter tensor a (of lora->adapters) through the unit bases in bases. */
static void *adapter_in(const dt_net_t *net, void *const *bases, int a) {
    const dt_model_layout *al = net->lora->adapters;
    const dt_tensor_info *ti = &al->tensors[a];
    return (char *)bases[ti->unit] + (ti->offset - al->units[ti->unit].offset) * net->elsize;
}

dt_status_t dt_net_lora_attach(dt_net_t *net, struct dt_lora *lora) {
    const dt_ops_t *o = net->dev->ops;
    if (!o->gemm || (lora->spec.base == DT_LORA_BASE_INT8 && (!o->matmul_forward_q8 || !o->matmul_backward_q8)))
        return dt_error(DT_STATUS_UNSUPPORTED, "lora: the %s device has no %s op yet (use device cpu)",
                        dt_device_kind_name(net->dev->kind), o->gemm ? "int8 matmul" : "LoRA gemm");
    if (lora->base != net->layout)
        return dt_error(DT_STATUS_INVALID, "lora: the net must be made with the lora's base layout");
    size_t bytes = 2 * (size_t)net->n_rows * (size_t)lora->spec.r * net->elsize;
    dt_status_t st = o->alloc(net->dev, DT_MEM_ACTIVATIONS, bytes, &net->lora_scratch);
    if (st != DT_STATUS_OK)
        return dt_error_prefix(st, "lora: cannot allocate %.1f MiB of adapter activations", (double)bytes / (1 << 20));
    net->lora = lora;
    return DT_STATUS_OK;
}

/* The base's matmul of tensor t's group (the compute dtype's op, or int8). */
static void base_forward(dt_net_t *net, void *out, const void *x, int t, const void *bias, int N, int C, int OC) {
    const dt_ops_t *o = net->dev->ops;
    dt_lora_t *lo = net->lora;
    if (lo->linear[t] && lo->spec.base == DT_LORA_BASE_INT8)
        o->matmul_forward_q8(net->dev, out, x, lo->d_q8 + lo->boff[t], lo->d_scales + lo->soff[t], bias, N, C, OC);
    else
        o->matmul_forward(net->dev, out, x, dt_net_param(net, t), bias, N, C, OC);
}

void dt_net_linear_forward(dt_net_t *net, void *out, const void *x, int t, const void *bias, int N, int C, int OC) {
    const dt_ops_t *o = net->dev->ops;
    dt_lora_t *lo = net->lora;
    if (!lo) {
        o->matmul_forward(net->dev, out, x, dt_net_param(net, t), bias, N, C, OC);
        return;
    }
    base_forward(net, out, x, t, bias, N, C, OC);
    int r = lo->spec.r;
    void *U = net->lora_scratch;
    size_t es = net->elsize;
    for (int k = t, row = 0; row < OC && k < net->layout->n_tensors; row += (int)net->layout->tensors[k++].shape[0]) {
        int a = lo->adapter[k], rows = (int)net->layout->tensors[k].shape[0];
        if (a < 0) continue;
        o->gemm(net->dev, 0, 1, N, r, C, 1.0f, x, C, adapter_in(net, net->unit_params, a), C, 0.0f, U, r);
        o->gemm(net->dev, 0, 1, N, rows, r, lo->scale, U, r, adapter_in(net, net->unit_params, a + 1), r, 1.0f,
                (char *)out + (size_t)row * es, OC);
    }
}

void dt_net_linear_backward(dt_net_t *net, void *dinp, void *db, const void *dout, const void *x, int t, int N,
                            int C, int OC) {
    const dt_ops_t *o = net->dev->ops;
    dt_lora_t *lo = net->lora;
    if (!lo) {
        o->matmul_backward(net->dev, dinp, dt_net_grad(net, t), db, dout, x, dt_net_param(net, t), N, C, OC);
        return;
    }
    if (dinp) { /* the frozen base: its input gradient only */
        if (lo->linear[t] && lo->spec.base == DT_LORA_BASE_INT8)
            o->matmul_backward_q8(net->dev, dinp, dout, lo->d_q8 + lo->boff[t], lo->d_scales + lo->soff[t], N, C,
                                  OC);
        else
            o->matmul_backward(net->dev, dinp, NULL, NULL, dout, x, dt_net_param(net, t), N, C, OC);
    }
    int r = lo->spec.r;
    size_t es = net->elsize;
    void *U = net->lora_scratch, *dU = (char *)net->lora_scratch + (size_t)net->n_rows * r * es;
    for (int k = t, row = 0; row < OC && k < net->layout->n_tensors; row += (int)net->layout->tensors[k++].shape[0]) {
        int a = lo->adapter[k], rows = (int)net->layout->tensors[k].shape[0];
        if (a < 0) continue;
        const void *A = adapter_in(net, net->unit_params, a), *B = adapter_in(net, net->unit_params, a + 1);
        void *dA = adapter_in(net, net->unit_grads, a), *dB = adapter_in(net, net->unit_grads, a + 1);
        const char *dy = (const char *)dout + (size_t)row * es;
        o->gemm(net->dev, 0, 1, N, r, C, 1.0f, x, C, A, C, 0.0f, U, r);
        o->gemm(net->dev, 0, 0, N, r, rows, lo->scale, dy, OC, B, r, 0.0f, dU, r);
        o->gemm(net->dev, 1, 0, rows, r, N, lo->scale, dy, OC, U, r, 1.0f, dB, r);
        o->gemm(net->dev, 1, 0, r, C, N, 1.0f, dU, r, x, C, 1.0f, dA, C);
        if (dinp) o->gemm(net->dev, 0, 0, N, C, r, 1.0f, dU, r, A, C, 1.0f, dinp, C);
    }
}

void dt_net_linear_row_forward(dt_net_t *net, void *out, void *part, const void *inp, int t, const void *bias,
                               int BT, int IC, int C) {
    if (net->lora) dt_net_linear_forward(net, out, inp, t, bias, BT, IC, C);
    else dt_net_tp_row_forward(net, out, part, inp, dt_net_param(net, t), bias, BT, IC, C);
}

void *dt_net_linear_column_backward(dt_net_t *net, void *dtmp, void *dred, int t, void *db, const void *dout,
                                    const void *x, int BT, int C, int OC) {
    if (!net->lora)
        return dt_net_tp_column_backward(net, dtmp, dred, dt_net_grad(net, t), db, dout, x, dt_net_param(net, t), BT,
                                         C, OC);
    net->dev->ops->set(net->dev, dtmp, 0, (size_t)BT * C * net->elsize);
    dt_net_linear_backward(net, dtmp, NULL, dout, x, t, BT, C, OC);
    return dtmp;
}
