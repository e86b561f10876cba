/*
 * data_read.c - a sample copied out of a data set's maps (data_impl.h): the file that
 * holds it, its pages advised ahead for lazy sets, SIGBUS of a file cut short turned
 * into an error naming the file, and a lazy set's ids checked against the vocabulary.
 * The bottom of the data loader: data.c (validation) and data_mix.c (training) call it.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>

#include "runtime/train/data_impl.h"

/* The file holding sample id: the last whose first_sample <= id. */
static const data_file *sample_file(const data_set *s, uint64_t id) {
    int lo = 0, hi = s->nfiles - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->files[mid].first_sample <= id) lo = mid;
        else hi = mid - 1;
    }
    return &s->files[lo];
}

void dt_data_set_advise_(const data_set *s, uint64_t id, int T) {
    if (!s->lazy || s->masked) return;
    const data_file *f = sample_file(s, id);
    size_t page = 4096, w = (size_t)f->token_bytes;
    size_t a = (size_t)((const uint8_t *)f->tokens - (const uint8_t *)f->map) + (size_t)(id - f->first_sample) * T * w;
    size_t b = a + (size_t)(T + 1) * w;
    a &= ~(page - 1);
    madvise((uint8_t *)f->map + a, b - a, MADV_WILLNEED);
}

/* A data file cut short while it is mapped (rewritten, truncated) makes reading
 * the lost pages raise SIGBUS, which would kill the worker with no word of which
 * file. The sample copy is the one place that reads the maps during the run: it
 * sets bus_jump (per thread: the read-ahead copies too), and the handler returns
 * there, so that the copy fails with an error naming the file. A SIGBUS anywhere
 * else keeps its default action. */
static __thread sigjmp_buf *bus_jump;
static pthread_once_t bus_once = PTHREAD_ONCE_INIT;

static void on_sigbus(int sig, siginfo_t *si, void *uctx) {
    (void)si, (void)uctx;
    if (bus_jump) siglongjmp(*bus_jump, 1);
    signal(sig, SIG_DFL); /* not ours: die of it as before */
    raise(sig);
}

static void bus_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

dt_status_t dt_data_set_sample_(const data_set *s, uint64_t id, int T, int32_t *inp, int32_t *tgt, int32_t *pos) {
    /* volatile: read again after the longjmp */
    const data_file *volatile f = s->masked ? &s->files[s->segs[s->seq[id]].file] : sample_file(s, id);
    uint64_t off = (id - f->first_sample) * (uint64_t)T;
    pthread_once(&bus_once, bus_install);
    sigjmp_buf jump;
    if (sigsetjmp(jump, 0) /* SA_NODEFER: no mask to restore, no syscall per sample */) {
        bus_jump = NULL;
        return dt_error(DT_STATUS_IO,
                        "%s: reading token %llu failed (SIGBUS): the file is shorter than when it was "
                        "opened (%zu bytes); was it truncated or rewritten during the run?",
                        f->path, (unsigned long long)off, f->map_len);
    }
    bus_jump = &jump;
    if (s->masked) {
        dt_status_t st = dt_data_pack_sample_(s, id, T, inp, tgt, pos);
        bus_jump = NULL;
        return st;
    }
    if (pos)
        for (int t = 0; t < T; t++) pos[t] = t;
    if (f->token_bytes == 1) {
        const uint8_t *p = f->bytes + off;
        for (int t = 0; t < T; t++) inp[t] = p[t], tgt[t] = p[t + 1];
    } else if (f->token_bytes == 2) {
        const uint16_t *p = (const uint16_t *)f->tokens + off;
        for (int t = 0; t < T; t++) inp[t] = p[t], tgt[t] = p[t + 1];
    } else {
        const uint32_t *p = (const uint32_t *)f->tokens + off;
        for (int t = 0; t < T; t++) inp[t] = (int32_t)p[t], tgt[t] = (int32_t)p[t + 1];
    }
    bus_jump = NULL;
    if (s->lazy) { /* ids 0..T-1 are inp, T is the last target */
        for (int t = 0; t <= T; t++) {
            uint32_t v = (uint32_t)(t < T ? inp[t] : tgt[T - 1]);
            if (v >= (uint32_t)s->vocab)
                return dt_error(DT_STATUS_FORMAT, "%s: token id %u at index %llu is not below the model's vocab size %d",
                                f->path, v, (unsigned long long)(off + (uint64_t)t), s->vocab);
        }
    }
    return DT_STATUS_OK;
}
