/*
 * fuzz_st_index.c - libFuzzer target for model.safetensors.index.json
 * (runtime/ckpt/st_read.c, dt_st_set_open), built by `make fuzz`.
 *
 * The folder holds two small shards made once: model-00001-of-00002.safetensors
 * with tensors "a" and "b", model-00002-of-00002.safetensors with "c". The input
 * is written as the index and the set opened; a set that opens must find every
 * tensor of its map in a file of the set.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ckpt/safetensors.h"
#include "tests/fuzz/fuzz_file.h"

/* A safetensors file of F32 tensors of 2 elements each, named by names[]. */
static void write_shard(const char *file, const char *const *names, int n) {
    char hdr[512];
    int len = snprintf(hdr, sizeof hdr, "{");
    for (int i = 0; i < n; i++)
        len += snprintf(hdr + len, sizeof hdr - (size_t)len, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[2],"
                        "\"data_offsets\":[%d,%d]}", i ? "," : "", names[i], 8 * i, 8 * i + 8);
    len += snprintf(hdr + len, sizeof hdr - (size_t)len, "}");
    uint8_t buf[1024] = {0};
    for (int b = 0; b < 8; b++) buf[b] = (uint8_t)((uint64_t)len >> (8 * b));
    memcpy(buf + 8, hdr, (size_t)len);
    fuzz_write(file, buf, 8 + (size_t)len + 8 * (size_t)n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) {
        static const char *const one[] = {"a", "b"}, *const two[] = {"c"};
        write_shard("model-00001-of-00002.safetensors", one, 2);
        write_shard("model-00002-of-00002.safetensors", two, 1);
        ready = 1;
    }
    fuzz_write("model.safetensors.index.json", data, size);
    dt_st_set_t *s = NULL;
    if (dt_st_set_open(fuzz_dir(), &s) != DT_STATUS_OK) return 0;
    uint64_t bytes = 0;
    for (int i = 0; i < dt_st_set_files(s); i++) {
        dt_st_file_t *f = dt_st_set_file(s, i);
        for (int k = 0; k < dt_st_count(f); k++) {
            const dt_st_tensor *t = dt_st_at(f, k);
            dt_st_file_t *in = NULL;
            if (dt_st_set_find(s, t->name, &in) != t || in != f) abort();
            bytes += t->end - t->begin;
        }
    }
    if (bytes != dt_st_set_bytes(s)) abort();
    dt_st_set_close(s);
    return 0;
}
