/*
 * registry.c - the one place that knows which models exist (model.h). Adding a
 * model: its own file filling a dt_model_ops (a decoder stack: its math in a
 * dt_net_stack, net_impl.h, which net.c's chunk driver runs), and one line X(name) in
 * DT_MODELS below.
 * The order is the order `dtrun config --keys` lists model keys and model.type's
 * names in.
 */
#include "runtime/model/model.h"

#include <stdio.h>
#include <string.h>

/* X(name): the file runtime/model/<name>.c defines dt_model_<name>. */
#define DT_MODELS(X) \
    X(gpt)           \
    X(llama)         \
    X(mlp)

#define DECLARE_(n) extern const dt_model_ops dt_model_##n;
DT_MODELS(DECLARE_)
#undef DECLARE_

#define ENTRY_(n) &dt_model_##n,
static const dt_model_ops *const models[] = {DT_MODELS(ENTRY_)};
#undef ENTRY_

#define N_MODELS ((int)(sizeof models / sizeof models[0]))

int dt_model_count(void) { return N_MODELS; }

const dt_model_ops *dt_model_at(int i) { return i >= 0 && i < N_MODELS ? models[i] : NULL; }

const dt_model_ops *dt_model_lookup(const char *name) {
    for (int i = 0; name && i < N_MODELS; i++)
        if (!strcmp(models[i]->name, name)) return models[i];
    return NULL;
}

void dt_model_names(char *buf, size_t len) {
    size_t off = 0;
    if (len) buf[0] = '\0';
    for (int i = 0; i < N_MODELS && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "", models[i]->name);
}
