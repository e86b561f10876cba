/*
 * status.h - the one status type of dtrun.
 *
 * Every fallible function returns dt_status_t. Codes from errno, libuv, CUDA and
 * NCCL are translated where they enter the project. A status carries a code; the
 * human detail of the most recent failure on this thread ("timed out after 30 s
 * waiting for keys a, b") is kept beside it, set with dt_error() and read with
 * dt_error_detail().
 */
#ifndef DT_COMMON_STATUS_H
#define DT_COMMON_STATUS_H

#include <stdarg.h>

/* X(name, message): the table drives the enum, dt_status_name and dt_strerror. */
#define DT_STATUS_MAP(X)                                                     \
    X(OK, "success")                                                         \
    X(INVALID, "invalid argument")                                           \
    X(NOMEM, "out of memory")                                                \
    X(IO, "input/output error")                                              \
    X(SYS, "system call failed")                                             \
    X(TIMEOUT, "timed out")                                                  \
    X(CLOSED, "connection closed")                                           \
    X(REFUSED, "connection refused")                                         \
    X(PROTOCOL, "protocol error")                                            \
    X(LIMIT, "limit exceeded")                                               \
    X(NOT_FOUND, "not found")                                                \
    X(CANCELED, "canceled")                                                  \
    X(CONFIG, "invalid configuration")                                       \
    X(USAGE, "invalid usage")                                                \
    X(FORMAT, "invalid file format")                                         \
    X(CHECKSUM, "checksum mismatch")                                         \
    X(MISMATCH, "mismatch between ranks or files")                           \
    X(UNSUPPORTED, "not supported")                                          \
    X(CUDA, "CUDA error")                                                    \
    X(NCCL, "NCCL error")                                                    \
    X(WORKER_FAILED, "worker failed")                                        \
    X(RENDEZVOUS, "rendezvous failed")

typedef enum dt_status {
#define DT_STATUS_ENUM_(name, msg) DT_STATUS_##name,
    DT_STATUS_MAP(DT_STATUS_ENUM_)
#undef DT_STATUS_ENUM_
    DT_STATUS_COUNT_
} dt_status_t;

/* "TIMEOUT" for DT_STATUS_TIMEOUT; "UNKNOWN" outside the table. */
const char *dt_status_name(dt_status_t st);
/* "timed out" for DT_STATUS_TIMEOUT. */
const char *dt_strerror(dt_status_t st);

/* Records a printf-style detail for this thread's latest failure and returns st,
 * so that `return dt_error(DT_STATUS_TIMEOUT, "waited %d s", s);` reads naturally. */
dt_status_t dt_error(dt_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
dt_status_t dt_verror(dt_status_t st, const char *fmt, va_list ap);
/* Puts "PREFIX: " before the detail already set (the reason of the call that just
 * failed) and returns st: `return dt_error_prefix(st, "tokenizer %s", path);`.
 * dt_error(st, "...: %s", dt_error_detail()) is safe too (dt_verror formats into
 * a temporary), but this says it without the self-reference. */
dt_status_t dt_error_prefix(dt_status_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The detail set by the last dt_error() on this thread ("" if none). */
const char *dt_error_detail(void);
void dt_error_clear(void);
/* Translates an errno value: EAGAIN/ETIMEDOUT -> TIMEOUT, ENOMEM -> NOMEM, ... */
dt_status_t dt_status_from_errno(int err);

/* Process exit codes (docs/interface.md "Exit codes"); 128+N for an end by signal N
 * is computed where the signal is known. */
typedef enum dt_exit {
    DT_EXIT_OK = 0,      /* success */
    DT_EXIT_FAILED = 1,  /* the job failed (a worker past --max_restarts, a hang) */
    DT_EXIT_USAGE = 2,   /* bad usage or config: nothing was started */
    DT_EXIT_NETWORK = 3, /* rendezvous or network failure (timeout, peer lost) */
    DT_EXIT_RESIZE = 75, /* a worker of an elastic run saved at a checkpoint boundary so that
                            the group re-rendezvous at a new size: not a failure */
    DT_EXIT_PREFLIGHT = 76, /* a worker's health check of the communicator failed before the first
                               step: the launcher exits 3 without restarting the group */
} dt_exit_t;

/* The exit code a failure of st ends a process with: OK 0; USAGE, CONFIG,
 * INVALID, FORMAT, NOT_FOUND (what the user gave is wrong) 2; RENDEZVOUS,
 * TIMEOUT, CLOSED, REFUSED, PROTOCOL (a peer or the store) 3; anything else 1. */
dt_exit_t dt_status_exit_code(dt_status_t st);

/* Return early on failure. */
#define DT_CHECK(call)                                                       \
    do {                                                                     \
        dt_status_t dt_check_st_ = (call);                                   \
        if (dt_check_st_ != DT_STATUS_OK) return dt_check_st_;               \
    } while (0)

/* On failure store the status in st and jump to label (which releases). */
#define DT_CHECK_GOTO(call, st, label)                                       \
    do {                                                                     \
        (st) = (call);                                                       \
        if ((st) != DT_STATUS_OK) goto label;                                \
    } while (0)

#endif /* DT_COMMON_STATUS_H */
