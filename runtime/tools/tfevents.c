/*
 * tfevents.c - TensorBoard event files (tfevents.h): CRC-32C, TFRecord framing,
 * the few protocol buffer messages of a scalar/text summary, both ways.
 *
 * Wire format reminders (protobuf): a field is a varint key (number << 3 | wire
 * type) then its value: 0 varint, 1 eight bytes, 2 varint length + bytes, 5 four
 * bytes. Field numbers used (event.proto, summary.proto, tensor.proto,
 * tensor_shape.proto):
 *   Event        1 wall_time (double)  2 step (int64)  3 file_version (string)
 *                5 summary (Summary)   7 session_log (SessionLog)
 *   SessionLog   1 status (enum: 1 START)
 *   Summary      1 value (repeated Value)
 *   Value        1 tag  2 simple_value (float)  8 tensor (TensorProto)  9 metadata
 *   SummaryMetadata 1 plugin_data (PluginData: 1 plugin_name, 2 content)
 *   TensorProto  1 dtype (7 = DT_STRING)  2 tensor_shape (2 dim: 1 size)  8 string_val
 */
#include "runtime/tools/tfevents.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/fs_safe.h"
#include "common/mem.h"
#include "runtime/ckpt/checkpoint.h" /* defines: dt_crc32c */

#define MAX_RECORD (64u << 20)

/* ---- CRC ---------------------------------------------------------------- */

uint32_t dt_tfrecord_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* ---- encoding --------------------------------------------------------------- */

typedef struct pbuf {
    uint8_t *p;
    size_t n, cap;
} pbuf;

static void pb_reserve(pbuf *b, size_t more) {
    if (b->n + more <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more) cap *= 2;
    b->p = dt_xrealloc(b->p, cap);
    b->cap = cap;
}

static void pb_raw(pbuf *b, const void *p, size_t n) {
    pb_reserve(b, n);
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void pb_varint(pbuf *b, uint64_t v) {
    uint8_t tmp[10];
    int k = 0;
    do {
        tmp[k++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_raw(b, tmp, (size_t)k);
}

static void pb_key(pbuf *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void pb_bytes(pbuf *b, int field, const void *p, size_t n) {
    pb_key(b, field, 2);
    pb_varint(b, n);
    pb_raw(b, p, n);
}

static void pb_le(pbuf *b, uint64_t v, int nbytes) {
    uint8_t tmp[8];
    for (int i = 0; i < nbytes; i++) tmp[i] = (uint8_t)(v >> (8 * i));
    pb_raw(b, tmp, (size_t)nbytes);
}

static void pb_double(pbuf *b, int field, double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    pb_key(b, field, 1);
    pb_le(b, u, 8);
}

static void pb_float(pbuf *b, int field, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    pb_key(b, field, 5);
    pb_le(b, u, 4);
}

/* ---- the writer ------------------------------------------------------------ */

struct dt_tfevents_writer {
    FILE *f;
    char path[4096];
    int64_t step;
    pbuf values; /* the Summary being built: its repeated Value fields */
    pbuf ev, tmp;
};

static double wall_now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

static dt_status_t write_record(dt_tfevents_writer_t *w, const pbuf *data) {
    uint8_t head[12];
    uint64_t len = data->n;
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)(len >> (8 * i));
    uint32_t c = dt_tfrecord_mask(dt_crc32c(0, head, 8));
    for (int i = 0; i < 4; i++) head[8 + i] = (uint8_t)(c >> (8 * i));
    uint32_t d = dt_tfrecord_mask(dt_crc32c(0, data->p, data->n));
    uint8_t tail[4];
    for (int i = 0; i < 4; i++) tail[i] = (uint8_t)(d >> (8 * i));
    if (fwrite(head, 1, 12, w->f) != 12 || (data->n && fwrite(data->p, 1, data->n, w->f) != data->n) ||
        fwrite(tail, 1, 4, w->f) != 4 || fflush(w->f) != 0)
        return dt_error(DT_STATUS_IO, "tensorboard: cannot write %s: %s", w->path, strerror(errno));
    return DT_STATUS_OK;
}

dt_status_t dt_tfevents_open(const char *dir, int64_t restart_step, dt_tfevents_writer_t **out) {
    *out = NULL;
    DT_CHECK(dt_fs_mkdir_p(dir));
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *h = host; *h; h++)
        if (*h == '/' || (unsigned char)*h < 0x20) *h = '_';
    struct timeval tv;
    gettimeofday(&tv, NULL);
    dt_tfevents_writer_t *w = dt_xcalloc(1, sizeof *w);
    int fd = -1;
    /* O_EXCL | O_NOFOLLOW: a fresh name every time, never an existing file or a
     * planted link; the next microsecond when two writers meet in one. */
    for (int tries = 0; tries < 1000 && fd < 0; tries++) {
        long usec = (long)tv.tv_usec + tries;
        snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%06ld.%s.%d", dir,
                 (long long)tv.tv_sec + usec / 1000000, usec % 1000000, host, (int)getpid());
        fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        dt_status_t st = dt_error(DT_STATUS_IO, "tensorboard: cannot create %s: %s", w->path, strerror(errno));
        free(w);
        return st;
    }
    w->f = fdopen(fd, "wb");
    if (!w->f) {
        close(fd);
        free(w);
        return dt_error(DT_STATUS_NOMEM, "tensorboard: fdopen failed");
    }
    pbuf *e = &w->ev;
    pb_double(e, 1, wall_now());
    static const char version[] = "brain.Event:2";
    pb_bytes(e, 3, version, sizeof version - 1);
    dt_status_t st = write_record(w, e);
    if (st == DT_STATUS_OK && restart_step > 0) {
        e->n = 0;
        pb_double(e, 1, wall_now());
        pb_key(e, 2, 0);
        pb_varint(e, (uint64_t)restart_step);
        uint8_t session[2] = {1 << 3 | 0, 1}; /* SessionLog{status: START} */
        pb_bytes(e, 7, session, sizeof session);
        st = write_record(w, e);
    }
    if (st != DT_STATUS_OK) {
        dt_tfevents_close(w);
        return st;
    }
    *out = w;
    return DT_STATUS_OK;
}

const char *dt_tfevents_path(const dt_tfevents_writer_t *w) { return w->path; }

void dt_tfevents_begin(dt_tfevents_writer_t *w, int64_t step) {
    w->step = step;
    w->values.n = 0;
}

void dt_tfevents_scalar(dt_tfevents_writer_t *w, const char *tag, double value) {
    if (!isfinite(value)) return;
    pbuf *t = &w->tmp;
    t->n = 0;
    pb_bytes(t, 1, tag, strlen(tag));
    /* beyond float's range (a diverging run): infinity, as TensorBoard would draw it */
    pb_float(t, 2, fabs(value) > FLT_MAX ? copysignf(INFINITY, (float)(value > 0 ? 1 : -1)) : (float)value);
    pb_bytes(&w->values, 1, t->p, t->n);
}

void dt_tfevents_text(dt_tfevents_writer_t *w, const char *tag, const char *text) {
    pbuf meta = {0}, plugin = {0}, tensor = {0}, shape = {0}, dim = {0};
    pb_bytes(&plugin, 1, "text", 4);
    pb_bytes(&meta, 1, plugin.p, plugin.n);
    pb_key(&dim, 1, 0);
    pb_varint(&dim, 1);
    pb_bytes(&shape, 2, dim.p, dim.n);
    pb_key(&tensor, 1, 0);
    pb_varint(&tensor, 7); /* DT_STRING */
    pb_bytes(&tensor, 2, shape.p, shape.n);
    pb_bytes(&tensor, 8, text, strlen(text));
    pbuf *t = &w->tmp;
    t->n = 0;
    pb_bytes(t, 1, tag, strlen(tag));
    pb_bytes(t, 9, meta.p, meta.n);
    pb_bytes(t, 8, tensor.p, tensor.n);
    pb_bytes(&w->values, 1, t->p, t->n);
    free(meta.p);
    free(plugin.p);
    free(tensor.p);
    free(shape.p);
    free(dim.p);
}

dt_status_t dt_tfevents_end(dt_tfevents_writer_t *w) {
    pbuf *e = &w->ev;
    e->n = 0;
    pb_double(e, 1, wall_now());
    pb_key(e, 2, 0);
    pb_varint(e, (uint64_t)w->step);
    pb_bytes(e, 5, w->values.p, w->values.n);
    w->values.n = 0;
    return write_record(w, e);
}

void dt_tfevents_close(dt_tfevents_writer_t *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    free(w->values.p);
    free(w->ev.p);
    free(w->tmp.p);
    free(w);
}

/* ---- decoding -------------------------------------------------------------- */

typedef struct pread_ {
    const uint8_t *p, *end;
} preader;

typedef struct field {
    int num, wire;
    uint64_t v;          /* wire 0, 1, 5 */
    const uint8_t *data; /* wire 2 */
    size_t len;
} field;

static int rd_varint(preader *r, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) return -1;
        uint8_t b = *r->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* The next field of a message: 1, 0 at the end, -1 when malformed. */
static int rd_field(preader *r, field *f) {
    if (r->p >= r->end) return 0;
    uint64_t key;
    if (rd_varint(r, &key) != 0 || (key >> 3) == 0 || (key >> 3) > 0x1fffffff) return -1;
    f->num = (int)(key >> 3);
    f->wire = (int)(key & 7);
    switch (f->wire) {
    case 0: return rd_varint(r, &f->v) == 0 ? 1 : -1;
    case 1:
    case 5: {
        size_t n = f->wire == 1 ? 8 : 4;
        if ((size_t)(r->end - r->p) < n) return -1;
        f->v = 0;
        for (size_t i = 0; i < n; i++) f->v |= (uint64_t)r->p[i] << (8 * i);
        r->p += n;
        return 1;
    }
    case 2: {
        uint64_t n;
        if (rd_varint(r, &n) != 0 || n > (uint64_t)(r->end - r->p)) return -1;
        f->data = r->p;
        f->len = (size_t)n;
        r->p += n;
        return 1;
    }
    default: return -1; /* groups (3, 4) and unknown types: nothing dtrun reads */
    }
}

typedef struct event_scratch {
    dt_tfevents_value_t *values;
    int n, cap;
    char **strings; /* copies to free after the callback */
    int n_strings, cap_strings;
} event_scratch;

static const char *keep_string(event_scratch *s, const uint8_t *p, size_t n) {
    char *c = dt_xmalloc(n + 1);
    if (n) memcpy(c, p, n);
    c[n] = 0;
    if (s->n_strings == s->cap_strings) {
        s->cap_strings = s->cap_strings ? 2 * s->cap_strings : 16;
        s->strings = dt_xrealloc(s->strings, (size_t)s->cap_strings * sizeof *s->strings);
    }
    s->strings[s->n_strings++] = c;
    return c;
}

static void scratch_free(event_scratch *s) {
    for (int i = 0; i < s->n_strings; i++) free(s->strings[i]);
    free(s->strings);
    free(s->values);
}

#define BAD(what) dt_error(DT_STATUS_FORMAT, "malformed %s", what)

/* The first string of a TensorProto (string_val, field 8). */
static int tensor_string(const uint8_t *p, size_t n, const uint8_t **s, size_t *len) {
    preader r = {p, p + n};
    field f;
    int k;
    while ((k = rd_field(&r, &f)) == 1)
        if (f.num == 8 && f.wire == 2) {
            *s = f.data;
            *len = f.len;
            return 1;
        }
    return k < 0 ? -1 : 0;
}

static dt_status_t decode_value(event_scratch *s, const uint8_t *p, size_t n) {
    preader r = {p, p + n};
    field f;
    int k;
    dt_tfevents_value_t v = {.tag = "", .kind = DT_TFEVENTS_OTHER};
    while ((k = rd_field(&r, &f)) == 1) {
        if (f.num == 1 && f.wire == 2) v.tag = keep_string(s, f.data, f.len);
        else if (f.num == 2 && f.wire == 5) {
            uint32_t u = (uint32_t)f.v;
            float x;
            memcpy(&x, &u, 4);
            v.kind = DT_TFEVENTS_SCALAR;
            v.value = x;
        } else if (f.num == 8 && f.wire == 2 && v.kind != DT_TFEVENTS_SCALAR) {
            const uint8_t *str;
            size_t len;
            int t = tensor_string(f.data, f.len, &str, &len);
            if (t < 0) return BAD("Summary.Value.tensor");
            if (t == 1) {
                v.kind = DT_TFEVENTS_TEXT;
                v.text = keep_string(s, str, len);
                v.text_len = len;
            }
        }
    }
    if (k < 0) return BAD("Summary.Value");
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 16;
        s->values = dt_xrealloc(s->values, (size_t)s->cap * sizeof *s->values);
    }
    s->values[s->n++] = v;
    return DT_STATUS_OK;
}

dt_status_t dt_tfevents_decode(const uint8_t *buf, size_t len, dt_tfevents_fn fn, void *ctx) {
    preader r = {buf, buf + len};
    field f;
    int k;
    event_scratch s = {0};
    dt_tfevents_event_t ev = {0};
    dt_status_t st = DT_STATUS_OK;
    while (st == DT_STATUS_OK && (k = rd_field(&r, &f)) == 1) {
        if (f.num == 1 && f.wire == 1) memcpy(&ev.wall_time, &f.v, 8);
        else if (f.num == 2 && f.wire == 0) ev.step = (int64_t)f.v;
        else if (f.num == 3 && f.wire == 2) ev.file_version = keep_string(&s, f.data, f.len);
        else if (f.num == 5 && f.wire == 2) {
            preader sr = {f.data, f.data + f.len};
            field g;
            int j;
            while (st == DT_STATUS_OK && (j = rd_field(&sr, &g)) == 1)
                if (g.num == 1 && g.wire == 2) st = decode_value(&s, g.data, g.len);
            if (st == DT_STATUS_OK && j < 0) st = BAD("Summary");
        } else if (f.num == 7 && f.wire == 2) {
            preader sr = {f.data, f.data + f.len};
            field g;
            int j;
            ev.session_status = -1; /* a SessionLog without a status field: unspecified */
            while ((j = rd_field(&sr, &g)) == 1)
                if (g.num == 1 && g.wire == 0) ev.session_status = (int)g.v;
            if (j < 0) st = BAD("SessionLog");
            if (ev.session_status < 0) ev.session_status = 0;
        }
    }
    if (st == DT_STATUS_OK && k < 0) st = BAD("Event");
    if (st == DT_STATUS_OK) {
        ev.n_values = s.n;
        ev.values = s.values;
        st = fn(ctx, &ev);
    }
    scratch_free(&s);
    return st;
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

dt_status_t dt_tfevents_read_file(const char *path, dt_tfevents_fn fn, void *ctx) {
    int fd;
    DT_CHECK(dt_fs_open_regular(path, O_RDONLY, 0, &fd, NULL));
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return dt_error(DT_STATUS_NOMEM, "%s: fdopen failed", path);
    }
    dt_status_t st = DT_STATUS_OK;
    uint8_t *buf = NULL;
    size_t cap = 0;
    uint64_t off = 0;
    for (;;) {
        uint8_t head[12];
        size_t got = fread(head, 1, 12, f);
        if (got < 12) break; /* the end, or a record being written */
        uint64_t len = le(head, 8);
        if (dt_tfrecord_mask(dt_crc32c(0, head, 8)) != (uint32_t)le(head + 8, 4)) {
            st = dt_error(DT_STATUS_FORMAT, "%s: record at byte %llu: the length's CRC does not match", path,
                          (unsigned long long)off);
            break;
        }
        if (len > MAX_RECORD) {
            st = dt_error(DT_STATUS_FORMAT, "%s: record at byte %llu: %llu bytes (over %u)", path,
                          (unsigned long long)off, (unsigned long long)len, MAX_RECORD);
            break;
        }
        if (len + 4 > cap) {
            cap = (size_t)len + 4;
            buf = dt_xrealloc(buf, cap);
        }
        if (fread(buf, 1, (size_t)len + 4, f) < len + 4) break; /* truncated last record */
        if (dt_tfrecord_mask(dt_crc32c(0, buf, (size_t)len)) != (uint32_t)le(buf + len, 4)) {
            st = dt_error(DT_STATUS_FORMAT, "%s: record at byte %llu: the data's CRC does not match", path,
                          (unsigned long long)off);
            break;
        }
        st = dt_tfevents_decode(buf, (size_t)len, fn, ctx);
        if (st == DT_STATUS_FORMAT) {
            char keep[1024];
            snprintf(keep, sizeof keep, "%s", dt_error_detail());
            st = dt_error(DT_STATUS_FORMAT, "%s: record at byte %llu: %s", path, (unsigned long long)off, keep);
        }
        if (st != DT_STATUS_OK) break;
        off += 12 + len + 4;
    }
    if (st == DT_STATUS_OK && ferror(f)) st = dt_error(DT_STATUS_IO, "%s: read error", path);
    free(buf);
    fclose(f);
    return st;
}

/* ---- a directory, as TensorBoard shows it ---------------------------------- */

typedef struct load_ctx {
    dt_tfevents_run_t *run;
    uint64_t seq;
    uint64_t *seqs; /* parallel to run->points: write order, to keep the last of a (step, tag) */
} load_ctx;

static dt_status_t on_event(void *vctx, const dt_tfevents_event_t *ev) {
    load_ctx *c = vctx;
    dt_tfevents_run_t *run = c->run;
    if (ev->session_status == 1) { /* START at S: drop steps >= S */
        size_t k = 0;
        for (size_t i = 0; i < run->n; i++) {
            if (run->points[i].step < ev->step) {
                run->points[k] = run->points[i];
                c->seqs[k++] = c->seqs[i];
            } else
                free(run->points[i].tag);
        }
        run->n = k;
    }
    for (int i = 0; i < ev->n_values; i++) {
        const dt_tfevents_value_t *v = &ev->values[i];
        if (v->kind == DT_TFEVENTS_SCALAR) {
            if (run->n == run->cap) {
                run->cap = run->cap ? 2 * run->cap : 256;
                run->points = dt_xrealloc(run->points, run->cap * sizeof *run->points);
                c->seqs = dt_xrealloc(c->seqs, run->cap * sizeof *c->seqs);
            }
            run->points[run->n] = (dt_tfevents_point_t){ev->step, dt_xstrdup(v->tag), v->value};
            c->seqs[run->n++] = c->seq++;
        } else if (v->kind == DT_TFEVENTS_TEXT) {
            size_t j = 0;
            while (j < run->n_texts && strcmp(run->text_tags[j], v->tag) != 0) j++;
            if (j == run->n_texts) {
                run->texts = dt_xrealloc(run->texts, (j + 1) * sizeof *run->texts);
                run->text_tags = dt_xrealloc(run->text_tags, (j + 1) * sizeof *run->text_tags);
                run->text_tags[j] = dt_xstrdup(v->tag);
                run->texts[j] = NULL;
                run->n_texts++;
            }
            free(run->texts[j]);
            run->texts[j] = dt_xstrdup(v->text);
        }
    }
    return DT_STATUS_OK;
}

static int cmp_point(const dt_tfevents_point_t *x, const dt_tfevents_point_t *y) {
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return strcmp(x->tag, y->tag);
}

typedef struct idx_point {
    dt_tfevents_point_t p;
    uint64_t seq;
} idx_point;

static int cmp_idx(const void *a, const void *b) {
    const idx_point *x = a, *y = b;
    int c = cmp_point(&x->p, &y->p);
    if (c) return c;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

dt_status_t dt_tfevents_load_dir(const char *dir, dt_tfevents_run_t *run) {
    memset(run, 0, sizeof *run);
    DIR *d = opendir(dir);
    if (!d) return dt_error(errno == ENOENT ? DT_STATUS_NOT_FOUND : DT_STATUS_IO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strstr(e->d_name, "tfevents")) continue;
        names = dt_xrealloc(names, (n + 1) * sizeof *names);
        names[n++] = dt_xstrdup(e->d_name);
    }
    closedir(d);
    if (n == 0) {
        free(names);
        return dt_error(DT_STATUS_NOT_FOUND, "%s: no TensorBoard event file (events.out.tfevents.*)", dir);
    }
    qsort(names, n, sizeof *names, cmp_name);
    load_ctx c = {.run = run};
    dt_status_t st = DT_STATUS_OK;
    for (size_t i = 0; i < n && st == DT_STATUS_OK; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        st = dt_tfevents_read_file(path, on_event, &c);
        run->n_files++;
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (st == DT_STATUS_OK && run->n > 0) { /* sort by (step, tag, write order); keep the last of each */
        idx_point *ip = dt_xmalloc(run->n * sizeof *ip);
        for (size_t i = 0; i < run->n; i++) ip[i] = (idx_point){run->points[i], c.seqs[i]};
        qsort(ip, run->n, sizeof *ip, cmp_idx);
        size_t k = 0;
        for (size_t i = 0; i < run->n; i++) {
            if (i + 1 < run->n && cmp_point(&ip[i].p, &ip[i + 1].p) == 0) {
                free(ip[i].p.tag); /* a later write of the same (step, tag) wins */
                continue;
            }
            run->points[k++] = ip[i].p;
        }
        run->n = k;
        free(ip);
    }
    free(c.seqs);
    if (st != DT_STATUS_OK) dt_tfevents_run_free(run);
    return st;
}

void dt_tfevents_run_free(dt_tfevents_run_t *run) {
    for (size_t i = 0; i < run->n; i++) free(run->points[i].tag);
    free(run->points);
    for (size_t i = 0; i < run->n_texts; i++) {
        free(run->texts[i]);
        free(run->text_tags[i]);
    }
    free(run->texts);
    free(run->text_tags);
    memset(run, 0, sizeof *run);
}
