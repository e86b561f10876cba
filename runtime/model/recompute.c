/*
 * recompute.c - activation recomputation (model.h: dt_model_recompute_t): the
 * policies' names, a layout's policy and which blocks it checkpoints. The models'
 * arenas (arena_sizes) and forward/backward ask here which blocks keep what.
 */
#include <string.h>

#include "runtime/model/model.h"

#define NAME_(n, s) s,
static const char *const recompute_names[] = {DT_MODEL_RECOMPUTE_MAP(NAME_)};
#undef NAME_

const char *dt_model_recompute_name(dt_model_recompute_t policy) {
    return policy >= DT_MODEL_RECOMPUTE_NONE && policy <= DT_MODEL_RECOMPUTE_FULL ? recompute_names[policy] : "?";
}

int dt_model_recompute_parse(const char *name, dt_model_recompute_t *out) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, recompute_names[i])) {
            *out = (dt_model_recompute_t)i;
            return 0;
        }
    return -1;
}

void dt_model_layout_set_recompute(dt_model_layout *l, dt_model_recompute_t policy, int every) {
    l->recompute = (int)policy;
    l->recompute_every = every > 0 ? every : 1;
}

static int every_of(const dt_model_layout *l) { return l->recompute_every > 0 ? l->recompute_every : 1; }

dt_model_recompute_t dt_model_block_recompute(const dt_model_layout *l, int j) {
    if (l->recompute == DT_MODEL_RECOMPUTE_NONE || j % every_of(l) != 0) return DT_MODEL_RECOMPUTE_NONE;
    return (dt_model_recompute_t)l->recompute;
}

dt_model_recompute_t dt_model_gblock_recompute(const dt_model_layout *l, int block) {
    for (int k = 0; k < l->n_chunks; k++)
        if (block >= l->chunks[k].l0 && block < l->chunks[k].l1)
            return dt_model_block_recompute(l, block - l->chunks[k].l0);
    return DT_MODEL_RECOMPUTE_NONE;
}

int dt_model_recompute_count(const dt_model_layout *l, int n) {
    if (l->recompute == DT_MODEL_RECOMPUTE_NONE || n <= 0) return 0;
    return (n + every_of(l) - 1) / every_of(l);
}

int dt_model_block_slot(const dt_model_layout *l, const dt_model_block_slots *b, int j, int s) {
    int block = b->keep[dt_model_block_recompute(l, j)] & (1u << s) ? j : dt_model_max_chunk_blocks(l);
    return b->first + block * b->per_block + s;
}

int dt_model_block_slot_count(const dt_model_layout *l, const dt_model_block_slots *b) {
    return b->first + (dt_model_max_chunk_blocks(l) + 1) * b->per_block;
}

void dt_model_block_sizes(const dt_model_layout *l, const dt_model_block_slots *b, const size_t *set, size_t *sizes) {
    int nb = dt_model_max_chunk_blocks(l);
    unsigned scratch = dt_model_recompute_count(l, nb) ? ~b->keep[l->recompute] : 0;
    for (int k = 0; k < b->per_block; k++) {
        for (int j = 0; j < nb; j++)
            if (b->keep[dt_model_block_recompute(l, j)] & (1u << k)) sizes[b->first + j * b->per_block + k] = set[k];
        if (scratch & (1u << k)) sizes[b->first + nb * b->per_block + k] = set[k];
    }
}
