/*
 * train_preflight.c - what must be equal on every node of a multi-node training run,
 * as the launcher posts it for the preflight comparison (runtime/launch/preflight.c):
 * the resolved config (dt_config_dump_json, flattened to dotted keys) minus the keys
 * that may differ per node, with each per-node path replaced by the identity of what
 * it names: every data file's name, size and header digest, model.pretrained's index
 * digest. checkpoint.dir is a path per node and nothing of what it holds is compared:
 * the launcher reads it once at start, while a running (elastic) job moves its
 * `latest` on, so a node that joins later would see another step.
 *
 * The output is text, one "key\tvalue\n" line per key, so that the agent (which may
 * not know configs, ARCHITECTURE.md) compares lines without parsing anything.
 */
#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/clock.h"
#include "common/fs_safe.h" /* defines: dt_fs_open_regular */
#include "common/mem.h"
#include "common/sha256.h"
#include "common/torchenv.h" /* defines: DT_PREFLIGHT_COMM_ENV */
#include "runtime/comm/comm_bench.h" /* defines: dt_comm_health_run */
#include "runtime/tools/mem_check.h" /* defines: dt_mem_check */
#include "runtime/train/train_spec.h" /* defines: dt_trainer_sources_ */
#include "runtime/train/trainer.h"

/* The keys that may differ per node (README "Preflight" lists them with the why).
 * A trailing "[]" matches every element of a list (data.train[0].path, ...). */
static const char *const per_node_keys[] = {
    "log.dir",                 /* each node's own log files */
    "checkpoint.dir",          /* the shared storage's mount point on this node */
    "tensorboard.output_path", /* rank 0's node writes it */
    "threads",                 /* each node's cores; the math does not depend on it */
    "data.prefetch",           /* read-ahead depth: speed only */
    "comm.timeout_s",          /* each node's own hang watchdog decides when it gives up */
    "data.train",              /* paths; the files' names, sizes and headers are compared */
    "data.train[].path",
    "data.val",
    "model.pretrained",        /* a path; the weights' index digest is compared */
};

static int per_node(const char *key) {
    for (size_t i = 0; i < sizeof per_node_keys / sizeof per_node_keys[0]; i++) {
        const char *p = per_node_keys[i];
        const char *br = strstr(p, "[]");
        if (!br) {
            if (!strcmp(key, p)) return 1;
            continue;
        }
        size_t n = (size_t)(br - p); /* "data.train" of "data.train[].path" */
        if (strncmp(key, p, n) || key[n] != '[') continue;
        const char *close = strchr(key + n, ']');
        if (close && !strcmp(close + 1, br + 2)) return 1;
    }
    return 0;
}

typedef struct text {
    char *buf;
    size_t len, cap;
} text_t;

static void put(text_t *t, const char *key, const char *val) {
    size_t need = strlen(key) + strlen(val) + 3;
    if (t->len + need > t->cap) {
        t->cap = (t->len + need) * 2;
        t->buf = dt_xrealloc(t->buf, t->cap);
    }
    /* a tab or newline inside a value would break the line format */
    size_t o = t->len;
    for (const char *c = key; *c; c++) t->buf[o++] = (*c == '\t' || *c == '\n') ? ' ' : *c;
    t->buf[o++] = '\t';
    for (const char *c = val; *c; c++) t->buf[o++] = (*c == '\t' || *c == '\n') ? ' ' : *c;
    t->buf[o++] = '\n';
    t->buf[o] = '\0';
    t->len = o;
}

/* Objects recurse by ".name", lists of objects by "[i]"; everything else is one value. */
static void flatten(text_t *t, const cJSON *j, const char *prefix) {
    char key[512];
    if (cJSON_IsObject(j) || (cJSON_IsArray(j) && cJSON_GetArraySize(j) > 0 && cJSON_IsObject(j->child))) {
        int i = 0;
        for (const cJSON *c = j->child; c; c = c->next, i++) {
            if (cJSON_IsObject(j))
                snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", c->string ? c->string : "?");
            else
                snprintf(key, sizeof key, "%s[%d]", prefix, i);
            flatten(t, c, key);
        }
        return;
    }
    if (per_node(prefix)) return;
    char *v = cJSON_IsString(j) ? NULL : cJSON_PrintUnformatted(j);
    put(t, prefix, v ? v : j->valuestring ? j->valuestring : "");
    free(v);
}

static void hex(const uint8_t *d, int n, char *out) {
    for (int i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* "text.txt (12000 bytes, header 1a2b3c4d5e6f)": the file's name, size and the
 * digest of its first 1024 bytes (a token shard's header). */
static void file_identity(const char *path, char *out, size_t len) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    int fd = -1;
    struct stat sb;
    if (dt_fs_open_regular(path, O_RDONLY, 0, &fd, &sb) != DT_STATUS_OK) {
        snprintf(out, len, "%s (cannot be opened: %s)", base, dt_error_detail());
        dt_error_clear();
        return;
    }
    uint8_t head[1024], d[DT_SHA256_BYTES];
    ssize_t n = read(fd, head, sizeof head);
    close(fd);
    dt_sha256(head, n > 0 ? (size_t)n : 0, d);
    char h[13];
    hex(d, 6, h);
    snprintf(out, len, "%s (%lld bytes, header %s)", base, (long long)sb.st_size, h);
}

/* One source's files: "KEY file" when it matches one file, else "KEY files" (the
 * count) and "KEY file I" for each. A pattern that matches nothing was refused before. */
static void data_identity(text_t *t, const char *key, const char *pattern) {
    glob_t g;
    if (glob(pattern, GLOB_ERR | GLOB_BRACE | GLOB_TILDE, NULL, &g) != 0) {
        char k[256];
        snprintf(k, sizeof k, "%s files", key);
        put(t, k, "(no file matches)");
        return;
    }
    char k[256], v[1024];
    if (g.gl_pathc == 1) {
        snprintf(k, sizeof k, "%s file", key);
        file_identity(g.gl_pathv[0], v, sizeof v);
        put(t, k, v);
    } else {
        snprintf(k, sizeof k, "%s files", key);
        snprintf(v, sizeof v, "%zu", g.gl_pathc);
        put(t, k, v);
        for (size_t i = 0; i < g.gl_pathc && i < 4096; i++) {
            snprintf(k, sizeof k, "%s file %zu", key, i + 1);
            file_identity(g.gl_pathv[i], v, sizeof v);
            put(t, k, v);
        }
    }
    globfree(&g);
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

/* model.pretrained's index digest: every *.json file's bytes and every
 * *.safetensors file's name, size and header (the tensor index), in name order. */
static void pretrained_identity(text_t *t, const char *dir) {
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, NULL, by_name);
    if (n < 0) {
        put(t, "model.pretrained (index digest)", "(cannot be read)");
        return;
    }
    dt_sha256_ctx c;
    dt_sha256_init(&c);
    int files = 0;
    for (int i = 0; i < n; i++) {
        const char *name = ents[i]->d_name;
        size_t ln = strlen(name);
        int json = ln > 5 && !strcmp(name + ln - 5, ".json");
        int st = ln > 12 && !strcmp(name + ln - 12, ".safetensors");
        if (json || st) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, name);
            int fd = -1;
            struct stat sb;
            if (dt_fs_open_regular(path, O_RDONLY, 0, &fd, &sb) == DT_STATUS_OK) {
                /* the JSON files whole; a safetensors file's 8-byte length and header */
                size_t want = json ? (size_t)sb.st_size : 8;
                uint64_t hlen = 0;
                if (st && pread(fd, &hlen, 8, 0) == 8 && hlen < (64u << 20)) want = 8 + (size_t)hlen;
                if (want > (64u << 20)) want = 64u << 20;
                char *buf = dt_xmalloc(want + 1);
                ssize_t got = pread(fd, buf, want, 0);
                close(fd);
                char line[300];
                int ll = snprintf(line, sizeof line, "%s %lld\n", name, (long long)sb.st_size);
                dt_sha256_update(&c, line, (size_t)ll);
                if (got > 0) dt_sha256_update(&c, buf, (size_t)got);
                free(buf);
                files++;
            } else {
                dt_error_clear();
            }
        }
        free(ents[i]);
    }
    free(ents);
    uint8_t d[DT_SHA256_BYTES];
    dt_sha256_final(&c, d);
    char h[17], v[64];
    hex(d, 8, h);
    snprintf(v, sizeof v, "%s (%d file(s))", h, files);
    put(t, "model.pretrained (index digest)", v);
}

dt_status_t dt_trainer_preflight_desc(const dt_config_t *cfg, char **out) {
    *out = NULL;
    char *dump = dt_config_dump_json(cfg);
    if (!dump) return dt_error(DT_STATUS_NOMEM, "preflight: cannot dump the resolved config");
    cJSON *j = cJSON_Parse(dump);
    free(dump);
    if (!j) return dt_error(DT_STATUS_FORMAT, "preflight: the config's dump is not JSON");
    text_t t = {0};
    t.cap = 4096;
    t.buf = dt_xmalloc(t.cap);
    t.buf[0] = '\0';
    flatten(&t, j, "");
    cJSON_Delete(j);

    /* the per-node paths, replaced by what they name */
    dt_data_source src[DT_DATA_MAX_SOURCES];
    int n = cfg->model.ops->data == DT_MODEL_DATA_TOKENS ? dt_trainer_sources_(cfg, src) : 0;
    for (int i = 0; i < n; i++) {
        char key[48];
        if (cfg->data.n_sources) snprintf(key, sizeof key, "data.train[%d]", i);
        else snprintf(key, sizeof key, "data.train");
        data_identity(&t, key, src[i].path);
    }
    if (n > 0 && cfg->data.val && *cfg->data.val) data_identity(&t, "data.val", cfg->data.val);
    if (cfg->model_pretrained) pretrained_identity(&t, cfg->model_pretrained);
    *out = t.buf;
    return DT_STATUS_OK;
}

dt_status_t dt_trainer_preflight_mem(const dt_config_t *cfg, int world_size, int local_world_size, int gpu,
                                     double *need) {
    *need = 0;
    dt_model_spec spec;
    DT_CHECK(dt_trainer_spec_(cfg, &spec));
    /* plan's bytes per rank, priced against room that always fits: only need is used */
    dt_mem_check_in in = {.cfg = cfg, .spec = &spec, .world_size = world_size,
                          .local_world_size = local_world_size > 0 ? local_world_size : 1, .gpu = gpu,
                          .gpu_sharers = 1, .cpu_threads = cfg->threads > 0 ? (int)cfg->threads : 1,
                          .avail_bytes = 1e18, .avail_what = "preflight"};
    dt_mem_check_out out;
    DT_CHECK(dt_mem_check(&in, &out));
    if (out.checked) *need = gpu ? out.need : out.need * in.local_world_size;
    return DT_STATUS_OK;
}

static int preflight_failed;

int dt_trainer_preflight_failed(void) { return preflight_failed; }

dt_status_t dt_trainer_comm_health_(dt_comm_t *comm, dt_device_t *dev, int local_world_size, int rank) {
    const char *e = getenv(DT_PREFLIGHT_COMM_ENV);
    if (!e || !*e || !comm) return DT_STATUS_OK;
    dt_comm_health_opts ho = {.bytes = 0, .iters = 0, .min_busbw_gbps = 0};
    unsigned long long bytes = 0;
    if (sscanf(e, "%llu,%d,%lf", &bytes, &ho.iters, &ho.min_busbw_gbps) != 3 || bytes == 0 || bytes > (1ull << 32) ||
        ho.iters < 1 || ho.iters > 1000 || !(ho.min_busbw_gbps >= 0))
        return dt_error(DT_STATUS_USAGE, "%s=%s: expected BYTES,ITERS,MIN_BUSBW (set by the launcher)",
                        DT_PREFLIGHT_COMM_ENV, e);
    ho.bytes = (size_t)bytes;
    dt_comm_health_result res;
    double t0 = dt_now_s();
    DT_CHECK(dt_comm_health_run(comm, dev, local_world_size, &ho, &res));
    if (rank == 0 && res.report) {
        fputs(res.report, stderr);
        fprintf(stderr, "preflight: the communicator's health check took %.0f ms\n", (dt_now_s() - t0) * 1e3);
        fflush(stderr);
    }
    free(res.report);
    if (res.bad) preflight_failed = 1;
    if (res.bad)
        return dt_error(DT_STATUS_RENDEZVOUS, "preflight: the communicator's health check found %d problem(s) "
                        "(rank 0 printed them; no step was taken; --no-preflight skips the check)", res.bad);
    return DT_STATUS_OK;
}
