/*
 * log.c - leveled, prefixed, line-atomic logging.
 */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static int log_level = -1; /* -1: not initialised yet */
static char log_prefix[128] = "dtrun";

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

int dt_log_level_parse(const char *s) {
    if (!s) return -1;
    for (int i = 0; i <= DT_LOG_OFF; i++)
        if (strcasecmp(s, level_names[i]) == 0) return i;
    if (strcasecmp(s, "warning") == 0) return DT_LOG_WARN;
    return -1;
}

void dt_log_init(void) {
    int lvl = dt_log_level_parse(getenv("DTRUN_LOG_LEVEL"));
    log_level = lvl >= 0 ? lvl : DT_LOG_INFO;
}

void dt_log_set_level(dt_log_level_t level) { log_level = (int)level; }

dt_log_level_t dt_log_get_level(void) {
    if (log_level < 0) dt_log_init();
    return (dt_log_level_t)log_level;
}

void dt_log_set_prefix(const char *prefix) {
    snprintf(log_prefix, sizeof log_prefix, "%s", prefix ? prefix : "dtrun");
}

void dt_log(dt_log_level_t level, const char *fmt, ...) {
    if (log_level < 0) dt_log_init();
    if ((int)level < log_level || level >= DT_LOG_OFF) return;
    static const char *const tags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    char line[4096];
    int n = snprintf(line, sizeof line, "[%s] %s: ", log_prefix, tags[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0) m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2) len = sizeof line - 2;
    if (len == 0 || line[len - 1] != '\n') line[len++] = '\n';
    /* One write so that lines of concurrent writers never interleave. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
