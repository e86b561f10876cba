/*
 * status.c - names, messages and the per-thread failure detail of dt_status_t.
 */
#include "common/status.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const char *const status_names[] = {
#define DT_STATUS_NAME_(name, msg) #name,
    DT_STATUS_MAP(DT_STATUS_NAME_)
#undef DT_STATUS_NAME_
};

static const char *const status_msgs[] = {
#define DT_STATUS_MSG_(name, msg) msg,
    DT_STATUS_MAP(DT_STATUS_MSG_)
#undef DT_STATUS_MSG_
};

static _Thread_local char error_detail[1024];

const char *dt_status_name(dt_status_t st) {
    if ((unsigned)st >= DT_STATUS_COUNT_) return "UNKNOWN";
    return status_names[st];
}

const char *dt_strerror(dt_status_t st) {
    if ((unsigned)st >= DT_STATUS_COUNT_) return "unknown status";
    return status_msgs[st];
}

/* Formats into a temporary first: an argument may be dt_error_detail() itself
 * (the buffer being written), which vsnprintf straight into it would garble. */
dt_status_t dt_verror(dt_status_t st, const char *fmt, va_list ap) {
    char tmp[sizeof error_detail];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    memcpy(error_detail, tmp, sizeof error_detail);
    return st;
}

dt_status_t dt_error_prefix(dt_status_t st, const char *fmt, ...) {
    char prefix[sizeof error_detail], tmp[sizeof error_detail];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    size_t n = strlen(prefix);
    memcpy(tmp, prefix, n + 1);
    if (error_detail[0] && n + 2 < sizeof tmp) { /* "PREFIX: DETAIL", cut to the buffer */
        memcpy(tmp + n, ": ", 2);
        size_t room = sizeof tmp - n - 3, d = strnlen(error_detail, room);
        memcpy(tmp + n + 2, error_detail, d);
        tmp[n + 2 + d] = '\0';
    }
    memcpy(error_detail, tmp, sizeof error_detail);
    return st;
}

dt_status_t dt_error(dt_status_t st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dt_verror(st, fmt, ap);
    va_end(ap);
    return st;
}

const char *dt_error_detail(void) { return error_detail; }

void dt_error_clear(void) { error_detail[0] = '\0'; }

dt_status_t dt_status_from_errno(int err) {
    switch (err) {
    case 0: return DT_STATUS_OK;
    case EAGAIN:
    case ETIMEDOUT: return DT_STATUS_TIMEOUT;
    case ENOMEM: return DT_STATUS_NOMEM;
    case EINVAL: return DT_STATUS_INVALID;
    case ENOENT: return DT_STATUS_NOT_FOUND;
    case ECONNREFUSED: return DT_STATUS_REFUSED;
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN: return DT_STATUS_CLOSED;
    case ECANCELED: return DT_STATUS_CANCELED;
    case EIO:
    case ENOSPC:
    case EROFS:
    case EDQUOT: return DT_STATUS_IO;
    default: return DT_STATUS_SYS;
    }
}

dt_exit_t dt_status_exit_code(dt_status_t st) {
    switch (st) {
    case DT_STATUS_OK: return DT_EXIT_OK;
    case DT_STATUS_USAGE:
    case DT_STATUS_CONFIG:
    case DT_STATUS_INVALID:
    case DT_STATUS_FORMAT:
    case DT_STATUS_NOT_FOUND: return DT_EXIT_USAGE;
    case DT_STATUS_RENDEZVOUS:
    case DT_STATUS_TIMEOUT:
    case DT_STATUS_CLOSED:
    case DT_STATUS_REFUSED:
    case DT_STATUS_PROTOCOL: return DT_EXIT_NETWORK;
    default: return DT_EXIT_FAILED;
    }
}
