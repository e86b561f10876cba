/*
 * net_impl.h - what a model file's forward and backward see of a net (net.h):
 * its arena slots, its parameters and gradients by tensor index, the hook and a
 * zeroing helper. Only runtime/model/ includes it.
 */
#ifndef DT_RUNTIME_NET_IMPL_H
#define DT_RUNTIME_NET_IMPL_H

#include "runtime/model/net.h"

/* Arena slot `slot` (a byte address in device memory). */
static inline void *dt_net_slot(const dt_net_t *net, int slot) {
    return (char *)net->arena + net->off[slot];
}

static inline void *dt_net_tensor_in(const dt_net_t *net, void *const *bases, int t) {
    const dt_tensor_info *ti = &net->layout->tensors[t];
    size_t rel = ti->offset - net->layout->units[ti->unit].offset;
    return (char *)bases[ti->unit] + rel * net->elsize;
}
/* Parameters / gradients of tensor t (index in the layout), through the unit's base. */
static inline void *dt_net_param(const dt_net_t *net, int t) { return dt_net_tensor_in(net, net->unit_params, t); }
static inline void *dt_net_grad(const dt_net_t *net, int t) { return dt_net_tensor_in(net, net->unit_grads, t); }

/* Tells the data-parallel strategy that unit is about to be used / is done. */
static inline void dt_net_hook(dt_net_t *net, int unit, dt_net_phase_t phase) {
    if (net->hook) net->hook(net->hook_ctx, unit, phase);
}

/* Zeroes the first elems elements of a slot (backward accumulates into it). */
static inline void dt_net_zero(dt_net_t *net, int slot, size_t elems) {
    net->dev->ops->set(net->dev, dt_net_slot(net, slot), 0, elems * net->elsize);
}

#endif /* DT_RUNTIME_NET_IMPL_H */
