/*
 * data_ahead.c - read-ahead (data.h): a thread fills a ring of `prefetch`
 * micro-batches from its own copy of the position while the step computes;
 * dt_data_next takes them in order and only then moves the consumed position, so
 * a checkpoint saves what was trained on. The thread blocks every signal (SIGTERM
 * preemption reaches the training thread) and is joined by dt_data_set_pos and
 * dt_data_close, which the trainer's teardown runs on every exit path.
 *
 * The ring is plain host memory: kernels/kernels.h offers no pinned host
 * allocation, and the trainer uploads the batch from its own buffer.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"
#include "runtime/train/data_impl.h"

dt_status_t dt_data_ahead_init_(dt_data_t *d, dt_data_produce_fn produce) {
    data_ahead *a = &d->ahead;
    a->produce = produce;
    a->depth = d->o.prefetch;
    if (a->depth == 0) return DT_STATUS_OK;
    size_t n = (size_t)d->o.micro_batch * (size_t)d->o.seq_len;
    a->slots = dt_xcalloc((size_t)a->depth, sizeof *a->slots);
    for (int i = 0; i < a->depth; i++) {
        a->slots[i].inputs = dt_xcalloc(n, sizeof(int32_t));
        a->slots[i].targets = dt_xcalloc(n, sizeof(int32_t));
        if (d->src[0].set.masked) a->slots[i].positions = dt_xcalloc(n, sizeof(int32_t));
    }
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    return DT_STATUS_OK;
}

static void *ahead_main(void *arg) {
    dt_data_t *d = arg;
    data_ahead *a = &d->ahead;
    sigset_t all;
    sigfillset(&all);
    sigdelset(&all, SIGBUS); /* a data file cut short: data_read.c turns it into an error naming the file */
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->stop && a->head == a->tail + (uint64_t)a->depth) pthread_cond_wait(&a->cv, &a->mu);
        if (a->stop) break;
        ahead_slot *s = &a->slots[a->head % (uint64_t)a->depth];
        pthread_mutex_unlock(&a->mu);
        s->st = a->produce(d, &a->next, s->inputs, s->targets, s->positions); /* slot head is the producer's alone */
        if (s->st != DT_STATUS_OK) snprintf(s->err, sizeof s->err, "%s", dt_error_detail());
        s->after = a->next;
        pthread_mutex_lock(&a->mu);
        a->head++;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

dt_status_t dt_data_ahead_take_(dt_data_t *d, int32_t *inputs, int32_t *targets, int32_t *positions) {
    data_ahead *a = &d->ahead;
    size_t n = (size_t)d->o.micro_batch * (size_t)d->o.seq_len;
    if (!a->running) { /* starts from the consumed position (after any resume) */
        a->next = d->pos;
        a->head = a->tail = 0;
        a->stop = 0;
        if (pthread_create(&a->thread, NULL, ahead_main, d) != 0) {
            DT_LOG_WARN("data.prefetch: cannot start the read-ahead thread; reading synchronously");
            d->o.prefetch = 0;
            return a->produce(d, &d->pos, inputs, targets, positions);
        }
        a->running = 1;
    }
    pthread_mutex_lock(&a->mu);
    while (a->head == a->tail) pthread_cond_wait(&a->cv, &a->mu);
    ahead_slot *s = &a->slots[a->tail % (uint64_t)a->depth];
    pthread_mutex_unlock(&a->mu);
    if (s->st != DT_STATUS_OK) /* the slot stays: every later take reports it too */
        return dt_error(s->st, "%s", s->err);
    memcpy(inputs, s->inputs, n * sizeof(int32_t)); /* the producer does not touch slot tail */
    memcpy(targets, s->targets, n * sizeof(int32_t));
    if (positions) {
        if (s->positions) memcpy(positions, s->positions, n * sizeof(int32_t));
        else
            for (size_t i = 0; i < n; i++) positions[i] = (int32_t)(i % (size_t)d->o.seq_len);
    }
    pthread_mutex_lock(&a->mu);
    d->pos = s->after;
    a->tail++;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    return DT_STATUS_OK;
}

void dt_data_ahead_stop_(dt_data_t *d) {
    data_ahead *a = &d->ahead;
    if (!a->running) return;
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL);
    a->running = 0;
}

void dt_data_ahead_free_(dt_data_t *d) {
    data_ahead *a = &d->ahead;
    if (a->depth == 0 || !a->slots) return;
    dt_data_ahead_stop_(d);
    for (int i = 0; i < a->depth; i++) {
        free(a->slots[i].inputs);
        free(a->slots[i].targets);
        free(a->slots[i].positions);
    }
    free(a->slots);
    a->slots = NULL;
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
}
