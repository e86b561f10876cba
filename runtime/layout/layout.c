/*
 * layout.c - the parallel layout (layout.h): the derived DP size, each rank's
 * coordinates and group indices, and the message when the sizes do not divide the
 * world.
 */
#include "runtime/layout/layout.h"

#include <stdio.h>
#include <string.h>

/* Each dimension's config key, in dt_layout_dim_t order. */
static const char *const dim_keys[DT_LAYOUT_N_DIMS] = {
    [DT_LAYOUT_TP] = "tensor_parallel.size",
    [DT_LAYOUT_CP] = "context_parallel.size",
    [DT_LAYOUT_PP] = "pipeline.stages",
    [DT_LAYOUT_DP] = NULL,
};

const char *dt_layout_dim_key(dt_layout_dim_t dim) {
    return (unsigned)dim < DT_LAYOUT_N_DIMS ? dim_keys[dim] : NULL;
}

dt_layout_dims dt_layout_dims_tp_pp(int64_t tp_size, int64_t pp_size) {
    dt_layout_dims d = {{0}};
    d.size[DT_LAYOUT_TP] = tp_size;
    d.size[DT_LAYOUT_PP] = pp_size;
    return d;
}

dt_layout_dims dt_layout_dims_of(int64_t tp_size, int64_t cp_size, int64_t pp_size) {
    dt_layout_dims d = dt_layout_dims_tp_pp(tp_size, pp_size);
    d.size[DT_LAYOUT_CP] = cp_size;
    return d;
}

/* The message of a world the sizes do not divide: the product named key by key
 * when more than TP is cut, else TP's remainder. */
static dt_status_t not_dividing(const int64_t *size, int world_size) {
    int64_t tp = size[DT_LAYOUT_TP], prod = 1;
    int others = 0;
    for (int d = 0; d < DT_LAYOUT_DP; d++) {
        prod *= size[d];
        if (d != DT_LAYOUT_TP && size[d] > 1) others = 1;
    }
    if (!others)
        return dt_error(DT_STATUS_CONFIG,
                        "tensor_parallel.size %lld: expected a divisor of the world size %d (world = "
                        "tensor_parallel.size x data-parallel ranks), found %d %% %lld = %lld",
                        (long long)tp, world_size, world_size, (long long)tp, (long long)(world_size % tp));
    char names[256] = "", world[256] = "";
    size_t nn = 0, nw = 0;
    for (int d = 0; d < DT_LAYOUT_DP; d++) {
        /* TP is always named (it is the innermost); another only when it cuts */
        if (d != DT_LAYOUT_TP && size[d] <= 1) continue;
        const char *sep = nn ? " x " : "";
        nn += (size_t)snprintf(names + nn, sizeof names - nn, "%s%s %lld", sep, dim_keys[d], (long long)size[d]);
        nw += (size_t)snprintf(world + nw, sizeof world - nw, "%s x ", dim_keys[d]);
        if (nn >= sizeof names) nn = sizeof names - 1;
        if (nw >= sizeof world) nw = sizeof world - 1;
    }
    return dt_error(DT_STATUS_CONFIG,
                    "%s = %lld: expected a divisor of the world size %d (world = %sdata-parallel ranks)", names,
                    (long long)prod, world_size, world);
}

dt_status_t dt_layout_of(const dt_layout_dims *dims, int world_size, int rank, dt_layout *out) {
    memset(out, 0, sizeof *out);
    out->world_size = world_size;
    out->rank = rank;
    if (world_size < 1) return dt_error(DT_STATUS_CONFIG, "world size: expected an integer >= 1, found %d", world_size);
    int64_t size[DT_LAYOUT_N_DIMS], prod = 1;
    for (int d = 0; d < DT_LAYOUT_DP; d++) {
        size[d] = dims->size[d] > 0 ? dims->size[d] : 1;
        /* a product past the world cannot divide it (and stays far from overflow) */
        prod = prod > world_size ? prod : prod * size[d];
    }
    size[DT_LAYOUT_DP] = world_size / prod; /* the one place DP = world / (TP x CP x PP) is computed */
    int64_t stride = 1;
    for (int d = 0; d < DT_LAYOUT_N_DIMS; d++) {
        out->size[d] = (int)size[d];
        out->stride[d] = (int)(stride < world_size ? stride : world_size);
        out->coord[d] = d == DT_LAYOUT_DP ? (int)(rank / prod) : (int)((rank / stride) % size[d]);
        if (stride <= world_size) stride *= size[d]; /* past the world only a failure reads it */
    }
    if (world_size % prod != 0) {
        out->size[DT_LAYOUT_DP] = 0;
        return not_dividing(size, world_size);
    }
    return DT_STATUS_OK;
}

int dt_layout_replica_size(const dt_layout *l) {
    int n = 1;
    for (int d = 0; d < DT_LAYOUT_N_DIMS; d++)
        if (d != DT_LAYOUT_DP) n *= l->size[d];
    return n;
}

int dt_layout_group_index(const dt_layout *l, dt_layout_dim_t dim) {
    int index = 0, scale = 1;
    for (int d = 0; d < DT_LAYOUT_N_DIMS; d++) {
        if (d == (int)dim) continue;
        index += l->coord[d] * scale;
        scale *= l->size[d];
    }
    return index;
}

int dt_layout_group_index_dp_cp(const dt_layout *l) {
    return l->coord[DT_LAYOUT_TP] + l->size[DT_LAYOUT_TP] * l->coord[DT_LAYOUT_PP];
}

int dt_layout_rank_dp_cp(const dt_layout *l) {
    return l->coord[DT_LAYOUT_DP] * l->size[DT_LAYOUT_CP] + l->coord[DT_LAYOUT_CP];
}
