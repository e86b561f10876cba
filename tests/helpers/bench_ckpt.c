/*
 * bench_ckpt.c - checkpoint save and load throughput for a GPT model.
 *
 *   bench_ckpt DIR N_LAYER N_HEAD N_EMBD SEQ_LEN VOCAB SAVE_RANKS LOAD_RANKS
 *
 * Fills params, m and v (fp32, the model's size), saves them as SAVE_RANKS ranks
 * writing their even slices in parallel (one forked process per rank, the parent's
 * waitpid as the barrier, then rank 0's commit), drops the shards from the page
 * cache (posix_fadvise), then loads them back as LOAD_RANKS ranks (in turn, each
 * its own even slice, so the split differs) and checks every element. Prints one
 * JSON line: bytes, save_s, save_gbps, load_s, load_gbps.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/mem.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/model/model.h"

static const char *bufs[3] = {"params", "m", "v"};

static void slice(size_t n, int r, int w, size_t *lo, size_t *cnt) {
    size_t per = (n + (size_t)w - 1) / (size_t)w;
    *lo = per * (size_t)r < n ? per * (size_t)r : n;
    size_t hi = *lo + per < n ? *lo + per : n;
    *cnt = hi - *lo;
}

static void drop_cache(const char *dir, int w) {
    char p[4200];
    for (int r = 0; r < w; r++) {
        snprintf(p, sizeof p, "%s/latest", dir);
        FILE *f = fopen(p, "r");
        char name[64] = {0};
        if (!f || !fgets(name, sizeof name, f)) exit(1);
        fclose(f);
        name[strcspn(name, "\n")] = 0;
        snprintf(p, sizeof p, "%s/%s/shard_%05d.bin", dir, name, r);
        int fd = open(p, O_RDONLY);
        if (fd >= 0) {
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: bench_ckpt DIR N_LAYER N_HEAD N_EMBD SEQ_LEN VOCAB SAVE_RANKS LOAD_RANKS\n");
        return 2;
    }
    const char *dir = argv[1];
    dt_model_spec s = {.ops = &dt_model_gpt, .n_layer = atoi(argv[2]), .n_head = atoi(argv[3]),
                       .n_embd = atoi(argv[4]), .seq_len = atoi(argv[5]), .vocab_size = atoi(argv[6]),
                       .vocab_pad_multiple = 128};
    int W = atoi(argv[7]), M = atoi(argv[8]);
    dt_model_layout l;
    if (dt_model_layout_init(&s, &l) != DT_STATUS_OK) return 2;
    size_t n = l.n_params;
    float *data[3];
    for (int b = 0; b < 3; b++) {
        data[b] = dt_mem_alloc(DT_MEM_OTHER, n * sizeof(float));
        for (size_t i = 0; i < n; i++) data[b][i] = (float)((i * 2654435761u + (size_t)b) % 1000003) * 1e-6f;
    }
    double t0 = dt_now_s();
    dt_ckpt_save_args a = {.dir = dir, .step = 1, .world_size = W, .strategy = "zero1", .layout = &l, .keep_last = 1};
    for (int r = 0; r < W; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            size_t lo, cnt;
            slice(n, r, W, &lo, &cnt);
            dt_ckpt_range rr[3];
            for (int b = 0; b < 3; b++) rr[b] = (dt_ckpt_range){.buffer = bufs[b], .offset = lo, .count = cnt, .data = data[b] + lo};
            a.rank = r, a.ranges = rr, a.n_ranges = cnt ? 3 : 0;
            if (dt_ckpt_write_shard(&a, NULL) != DT_STATUS_OK) {
                fprintf(stderr, "rank %d: %s\n", r, dt_error_detail());
                _exit(1);
            }
            _exit(0);
        }
    }
    int ok = 1, status;
    for (int r = 0; r < W; r++)
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ok = 0;
    a.rank = 0;
    if (!ok || dt_ckpt_commit(&a, NULL) != DT_STATUS_OK) {
        fprintf(stderr, "save failed: %s\n", dt_error_detail());
        return 1;
    }
    double save_s = dt_now_s() - t0;
    drop_cache(dir, W);
    float *got = dt_mem_alloc(DT_MEM_OTHER, n * sizeof(float));
    double t1 = dt_now_s();
    for (int b = 0; b < 3; b++)
        for (int r = 0; r < M; r++) {
            dt_ckpt_t *c;
            size_t lo, cnt;
            slice(n, r, M, &lo, &cnt);
            if (dt_ckpt_open(dir, &c) != DT_STATUS_OK || dt_ckpt_read(c, bufs[b], lo, cnt, got + lo) != DT_STATUS_OK) {
                fprintf(stderr, "load failed: %s\n", dt_error_detail());
                return 1;
            }
            dt_ckpt_close(c);
        }
    double load_s = dt_now_s() - t1;
    if (memcmp(got, data[2], n * sizeof(float)) != 0) { /* v, the last buffer read */
        fprintf(stderr, "loaded data differs\n");
        return 1;
    }
    double bytes = 3.0 * 4.0 * (double)n;
    printf("{\"n_params\": %zu, \"bytes\": %.0f, \"save_ranks\": %d, \"load_ranks\": %d, \"save_s\": %.3f, "
           "\"save_gbps\": %.3f, \"load_s\": %.3f, \"load_gbps\": %.3f}\n",
           n, bytes, W, M, save_s, bytes / save_s / 1e9, load_s, bytes / load_s / 1e9);
    return 0;
}
