/*
 * agent.c - one node's agent: store, rendezvous, workers, logs, signals,
 * restarts and the failure summary (see agent.h for the spawning design).
 *
 * A run is a sequence of rounds (attempts). Each round: join the rendezvous
 * (multi-node), spawn the workers, then run the libuv loop until the round is
 * over: every worker exited 0 and every node passed the exit barrier; or a worker
 * failed / another node asked to stop / a node was lost (stop the group, then
 * restart or summarise); or a signal arrived (forward, wait the grace period,
 * SIGKILL what is left, exit 128+N).
 */
#define _GNU_SOURCE
#include "runtime/launch/agent.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "rendezvous/store.h"
#include "runtime/launch/logpipe.h"
#include "runtime/launch/rdzv.h"

extern char **environ;

/* Stop reasons that start with this tag come from an agent ended by a signal: the
 * others stop too and do not restart (that node is going away). */
#define SIGNAL_STOP_TAG "signal: "

static const int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
#define N_FWD ((int)(sizeof forwarded_signals / sizeof forwarded_signals[0]))

typedef enum phase {
    PHASE_RUNNING = 0, /* workers running */
    PHASE_BARRIER,     /* local workers all exited 0; waiting for the other nodes */
    PHASE_STOPPING,    /* stopping the group (failure or signal) */
    PHASE_OVER,        /* round over */
} phase_t;

typedef enum outcome {
    OUTCOME_SUCCESS = 0,
    OUTCOME_FAILED,     /* a worker here or elsewhere failed, or a node was lost */
    OUTCOME_SIGNAL,     /* the agent got a signal */
    OUTCOME_STORE_LOST, /* the store (node 0) stopped answering */
} outcome_t;

struct agent;

typedef struct worker {
    struct agent *ag;
    int local_rank, rank;
    pid_t pid;
    int exited;
    int wstatus;
    int signaled_by_agent; /* we sent it a signal while it ran */
    int reaped_seq;        /* order within one SIGCHLD batch, 0 when handled */
    double end_wall;
    uv_pipe_t pipe[2];     /* [0] stdout, [1] stderr */
    int pipe_open[2];
    dt_logpipe_t lp[2];
    int file_fd[2];
    char error_file[PATH_MAX];
} worker_t;

/* One failure, local or read back from the store. */
typedef struct failure {
    double time;
    char host[128];
    int rank, local_rank;
    long pid;
    int exitcode; /* torchrun's convention: -N for signal N */
    int lost;     /* the node stopped heartbeating */
    char error_file[PATH_MAX];
    char *message;
} failure_t;

typedef struct agent {
    const dt_launch_spec_t *spec;
    uv_loop_t loop;
    uv_signal_t sig[N_FWD];
    uv_signal_t sigchld;
    uv_timer_t tick, grace;
    int signals_on;

    char host[128];
    char *run_dir;
    int run_dir_tmp;
    char *prog_path;
    char **argv;
    const char *title;

    dt_store_server_t *server;
    dt_rdzv_t *rz;
    int is_host;
    char master_addr[256];
    int master_port;

    int restart_count;
    int joined_once; /* the first join looks for a round in progress */
    int nnodes, node_rank, base_rank, world_size;

    worker_t *w;
    int nw, running;
    phase_t phase;
    outcome_t outcome;
    int signo, sigint_count;
    char stop_note[512];
    int no_restart;     /* the group cannot be restarted (spawn failure, a signalled node) */
    failure_t *fails;
    int nfails;
    char readbuf[65536];
} agent_t;

/* ---- small helpers ------------------------------------------------------ */

dt_status_t dt_agent_find_program(const char *name, char **path) {
    if (strchr(name, '/')) {
        if (access(name, X_OK) != 0)
            return dt_error(DT_STATUS_NOT_FOUND, "cannot run '%s': %s", name, strerror(errno));
        *path = dt_xstrdup(name);
        return DT_STATUS_OK;
    }
    const char *p = getenv("PATH");
    if (!p || !*p) p = "/usr/local/bin:/usr/bin:/bin";
    while (*p) {
        const char *c = strchr(p, ':');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        char cand[PATH_MAX];
        snprintf(cand, sizeof cand, "%.*s/%s", (int)(len ? len : 1), len ? p : ".", name);
        struct stat sb;
        if (stat(cand, &sb) == 0 && S_ISREG(sb.st_mode) && access(cand, X_OK) == 0) {
            *path = dt_xstrdup(cand);
            return DT_STATUS_OK;
        }
        p += len + (c ? 1 : 0);
    }
    return dt_error(DT_STATUS_NOT_FOUND, "cannot run '%s': not found in PATH", name);
}

static int mkdir_p(const char *path) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    remove(path);
    return 0;
}

static void iso_time(double wall, char *buf, size_t len) {
    time_t t = (time_t)wall;
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, len, "%Y-%m-%d_%H:%M:%S", &tm);
}

static const char *signame(int sig) {
    static char buf[16];
    const char *ab = sigabbrev_np(sig);
    if (!ab) return "<N/A>";
    snprintf(buf, sizeof buf, "SIG%s", ab);
    return buf;
}

/* Signals each running worker's process group (the worker itself if it left it). */
static void signal_workers(agent_t *ag, int sig) {
    for (int i = 0; i < ag->nw; i++) {
        worker_t *w = &ag->w[i];
        if (w->pid <= 0 || w->exited) continue;
        if (kill(-w->pid, sig) != 0) kill(w->pid, sig);
        w->signaled_by_agent = 1;
    }
}

/* ---- the worker environment --------------------------------------------- */

static const char *const managed_vars[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "DTRUN_RUN_DIR",
    "DTRUN_LOG_DIR", "DTRUN_NNODES", "DTRUN_HOST", "DTRUN_AGENT_PID", "DTRUN_PROGRESS_TTY", NULL};

static int is_managed(const char *kv) {
    for (const char *const *m = managed_vars; *m; m++) {
        size_t n = strlen(*m);
        if (!strncmp(kv, *m, n) && kv[n] == '=') return 1;
    }
    return 0;
}

/* environ without the variables we set, plus ours; freed with free_env. */
static char **build_env(agent_t *ag, const worker_t *w) {
    const dt_launch_spec_t *sp = ag->spec;
    size_t n = 0;
    for (char **e = environ; *e; e++) n++;
    char **env = dt_xcalloc(n + 32, sizeof *env);
    size_t o = 0;
    for (char **e = environ; *e; e++)
        if (!is_managed(*e)) env[o++] = dt_xstrdup(*e);
#define ADD(...)                                                             \
    do {                                                                     \
        char b_[PATH_MAX + 64];                                              \
        snprintf(b_, sizeof b_, __VA_ARGS__);                                \
        env[o++] = dt_xstrdup(b_);                                           \
    } while (0)
    ADD("RANK=%d", w->rank);
    ADD("LOCAL_RANK=%d", w->local_rank);
    ADD("GROUP_RANK=%d", ag->node_rank);
    ADD("ROLE_RANK=%d", w->rank);
    ADD("ROLE_NAME=default");
    ADD("LOCAL_WORLD_SIZE=%d", ag->nw);
    ADD("WORLD_SIZE=%d", ag->world_size);
    ADD("GROUP_WORLD_SIZE=%d", ag->nnodes);
    ADD("ROLE_WORLD_SIZE=%d", ag->world_size);
    ADD("MASTER_ADDR=%s", ag->master_addr);
    ADD("MASTER_PORT=%d", ag->master_port);
    ADD("TORCHELASTIC_RESTART_COUNT=%d", ag->restart_count);
    ADD("TORCHELASTIC_MAX_RESTARTS=%d", sp->max_restarts);
    ADD("TORCHELASTIC_RUN_ID=%s", sp->rdzv_id);
    ADD("TORCHELASTIC_USE_AGENT_STORE=True");
    ADD("TORCHELASTIC_ERROR_FILE=%s", w->error_file);
    if (!getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")) ADD("TORCH_NCCL_ASYNC_ERROR_HANDLING=1");
    if (!getenv("OMP_NUM_THREADS") && ag->nw > 1) ADD("OMP_NUM_THREADS=1");
    ADD("DTRUN_RUN_DIR=%s", ag->run_dir);
    if (sp->log_dir) ADD("DTRUN_LOG_DIR=%s", sp->log_dir);
    ADD("DTRUN_NNODES=%d", ag->nnodes);
    ADD("DTRUN_HOST=%s", ag->host);
    ADD("DTRUN_AGENT_PID=%d", (int)getpid());
    /* The console is a terminal: the trainer may draw a live progress line. */
    if (isatty(STDOUT_FILENO)) ADD("DTRUN_PROGRESS_TTY=%d", 1);
#undef ADD
    env[o] = NULL;
    return env;
}

static void free_env(char **env) {
    for (char **e = env; e && *e; e++) free(*e);
    free(env);
}

/* ---- output pipes -------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    worker_t *w = h->data;
    *buf = uv_buf_init(w->ag->readbuf, sizeof w->ag->readbuf);
}

static void on_pipe_closed(uv_handle_t *h) { (void)h; }

static void close_pipe(worker_t *w, int s) {
    if (!w->pipe_open[s]) return;
    dt_logpipe_flush(&w->lp[s]);
    uv_close((uv_handle_t *)&w->pipe[s], on_pipe_closed);
    w->pipe_open[s] = 0;
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
    worker_t *w = st->data;
    int s = st == (uv_stream_t *)&w->pipe[1];
    if (n > 0) dt_logpipe_feed(&w->lp[s], buf->base, (size_t)n);
    else if (n < 0) close_pipe(w, s); /* EOF or error */
}

/* After the worker exited: read what is left without blocking, then close. */
static void drain_pipes(worker_t *w) {
    for (int s = 0; s < 2; s++) {
        if (!w->pipe_open[s]) continue;
        uv_os_fd_t fd;
        if (uv_fileno((uv_handle_t *)&w->pipe[s], &fd) == 0) {
            for (;;) {
                ssize_t n = read(fd, w->ag->readbuf, sizeof w->ag->readbuf);
                if (n > 0) {
                    dt_logpipe_feed(&w->lp[s], w->ag->readbuf, (size_t)n);
                    continue;
                }
                if (n < 0 && errno == EINTR) continue;
                break;
            }
        }
        close_pipe(w, s);
    }
}

/* ---- spawning ------------------------------------------------------------ */

static dt_status_t open_log_file(agent_t *ag, worker_t *w, const char *dir, int s) {
    const dt_launch_spec_t *sp = ag->spec;
    int bit = s ? DT_STD_ERR : DT_STD_OUT;
    w->file_fd[s] = -1;
    if (!((dt_launch_spec_tee(sp, w->local_rank) | dt_launch_spec_redirects(sp, w->local_rank)) & bit))
        return DT_STATUS_OK;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s.log", dir, s ? "stderr" : "stdout");
    w->file_fd[s] = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0644);
    if (w->file_fd[s] < 0)
        return dt_error(dt_status_from_errno(errno), "cannot create log file %s: %s", path,
                        strerror(errno));
    return DT_STATUS_OK;
}

static dt_status_t spawn_worker(agent_t *ag, worker_t *w) {
    const dt_launch_spec_t *sp = ag->spec;
    char dir[PATH_MAX - 64];
    if (snprintf(dir, sizeof dir, "%s/attempt_%d/%d", ag->run_dir, ag->restart_count, w->rank) >=
        (int)sizeof dir)
        return dt_error(DT_STATUS_INVALID, "run directory path too long: %s", ag->run_dir);
    if (mkdir_p(dir) != 0)
        return dt_error(DT_STATUS_IO, "cannot create %s: %s", dir, strerror(errno));
    snprintf(w->error_file, sizeof w->error_file, "%s/error.json", dir);
    unlink(w->error_file);
    DT_CHECK(open_log_file(ag, w, dir, 0));
    DT_CHECK(open_log_file(ag, w, dir, 1));

    char prefix[160];
    if (ag->nnodes > 1) snprintf(prefix, sizeof prefix, "[%s rank%d]:", ag->host, w->rank);
    else snprintf(prefix, sizeof prefix, "[rank%d]:", w->rank);
    for (int s = 0; s < 2; s++) {
        int bit = s ? DT_STD_ERR : DT_STD_OUT;
        int con = (dt_launch_spec_redirects(sp, w->local_rank) & bit) ||
                          !dt_launch_spec_console(sp, w->local_rank)
                      ? -1
                      : (s ? STDERR_FILENO : STDOUT_FILENO);
        dt_logpipe_init(&w->lp[s], prefix, con, w->file_fd[s]);
    }

    int fds[2][2] = {{-1, -1}, {-1, -1}};
    if (pipe2(fds[0], O_CLOEXEC) != 0 || pipe2(fds[1], O_CLOEXEC) != 0) {
        int e = errno;
        for (int s = 0; s < 2; s++)
            for (int k = 0; k < 2; k++)
                if (fds[s][k] >= 0) close(fds[s][k]);
        return dt_error(dt_status_from_errno(e), "pipe: %s", strerror(e));
    }
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    char **env = build_env(ag, w);
    pid_t agent_pid = getpid();

    /* Block signals across fork so that no libuv handler runs in the child. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0) {
        /* Child: async-signal-safe calls only. */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        for (int i = 0; i < N_FWD; i++) sigaction(forwarded_signals[i], &dfl, NULL);
        sigaction(SIGCHLD, &dfl, NULL);
        sigaction(SIGPIPE, &dfl, NULL);
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != agent_pid) _exit(128 + SIGKILL); /* the agent died before prctl */
        if (devnull >= 0) dup2(devnull, STDIN_FILENO);
        dup2(fds[0][1], STDOUT_FILENO);
        dup2(fds[1][1], STDERR_FILENO);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execve(ag->prog_path, ag->argv, env);
        static const char msg[] = "dtrun: exec of the worker program failed\n";
        ssize_t wr = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)wr;
        _exit(127);
    }
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    free_env(env);
    if (devnull >= 0) close(devnull);
    close(fds[0][1]);
    close(fds[1][1]);
    if (pid < 0) {
        close(fds[0][0]);
        close(fds[1][0]);
        return dt_error(dt_status_from_errno(fork_errno), "fork: %s", strerror(fork_errno));
    }
    setpgid(pid, pid); /* both sides, so that a signal right away finds the group */
    w->pid = pid;
    ag->running++;
    for (int s = 0; s < 2; s++) {
        uv_pipe_init(&ag->loop, &w->pipe[s], 0);
        w->pipe[s].data = w;
        uv_pipe_open(&w->pipe[s], fds[s][0]);
        w->pipe_open[s] = 1;
        uv_read_start((uv_stream_t *)&w->pipe[s], on_alloc, on_read);
    }
    return DT_STATUS_OK;
}

/* ---- failures and the summary ------------------------------------------- */

/* Reads TORCHELASTIC_ERROR_FILE as torchrun's @record writes it. */
static char *read_error_file(const char *path, double *ts) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *buf = dt_xmalloc(1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *out = NULL;
    cJSON *root = cJSON_Parse(buf);
    if (!root) {
        out = n ? dt_xstrdup(buf) : NULL; /* not JSON: show the text */
        free(buf);
        return out;
    }
    cJSON *msg = cJSON_GetObjectItem(root, "message");
    if (cJSON_IsString(msg)) {
        out = dt_xstrdup(msg->valuestring);
        cJSON *t = cJSON_GetObjectItem(root, "timestamp");
        if (cJSON_IsNumber(t)) *ts = t->valuedouble;
        else if (cJSON_IsString(t)) *ts = atof(t->valuestring);
    } else if (cJSON_IsObject(msg)) {
        cJSON *extra = cJSON_GetObjectItem(msg, "extraInfo");
        cJSON *cs = extra ? cJSON_GetObjectItem(extra, "py_callstack") : NULL;
        cJSON *m = cJSON_GetObjectItem(msg, "message");
        cJSON *t = extra ? cJSON_GetObjectItem(extra, "timestamp") : NULL;
        if (cJSON_IsString(cs)) out = dt_xstrdup(cs->valuestring);
        else if (cJSON_IsString(m)) out = dt_xstrdup(m->valuestring);
        if (cJSON_IsString(t)) *ts = atof(t->valuestring);
        else if (cJSON_IsNumber(t)) *ts = t->valuedouble;
    }
    cJSON_Delete(root);
    free(buf);
    return out;
}

static void add_failure(agent_t *ag, const failure_t *f) {
    ag->fails = dt_xrealloc(ag->fails, (size_t)(ag->nfails + 1) * sizeof *ag->fails);
    ag->fails[ag->nfails++] = *f;
}

static failure_t worker_failure(agent_t *ag, worker_t *w) {
    failure_t f;
    memset(&f, 0, sizeof f);
    f.time = w->end_wall;
    snprintf(f.host, sizeof f.host, "%s", ag->host);
    f.rank = w->rank;
    f.local_rank = w->local_rank;
    f.pid = w->pid;
    f.exitcode = WIFSIGNALED(w->wstatus) ? -WTERMSIG(w->wstatus) : WEXITSTATUS(w->wstatus);
    double ts = 0;
    char *msg = read_error_file(w->error_file, &ts);
    if (msg) {
        snprintf(f.error_file, sizeof f.error_file, "%s", w->error_file);
        if (ts > 0) f.time = ts;
    } else {
        snprintf(f.error_file, sizeof f.error_file, "<N/A>");
    }
    char tail[DT_LOGPIPE_TAIL_LINES * DT_LOGPIPE_TAIL_WIDTH + 16];
    dt_logpipe_tail(&w->lp[1], tail, sizeof tail);
    char head[256] = "";
    if (f.exitcode < 0)
        snprintf(head, sizeof head, "Signal %d (%s) received by PID %ld", -f.exitcode,
                 signame(-f.exitcode), f.pid);
    size_t len = strlen(head) + strlen(tail) + (msg ? strlen(msg) : 0) + 64;
    f.message = dt_xmalloc(len);
    if (msg) snprintf(f.message, len, "%s", msg);
    else if (tail[0]) snprintf(f.message, len, "%s%slast lines of stderr:\n%s", head,
                               head[0] ? "\n" : "", tail);
    else if (head[0]) snprintf(f.message, len, "%s", head);
    else snprintf(f.message, len, "<no error file, no stderr output>");
    free(msg);
    return f;
}

static char *failure_json(const failure_t *f) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "time", f->time);
    cJSON_AddStringToObject(o, "host", f->host);
    cJSON_AddNumberToObject(o, "rank", f->rank);
    cJSON_AddNumberToObject(o, "local_rank", f->local_rank);
    cJSON_AddNumberToObject(o, "pid", (double)f->pid);
    cJSON_AddNumberToObject(o, "exitcode", f->exitcode);
    cJSON_AddBoolToObject(o, "lost", f->lost);
    cJSON_AddStringToObject(o, "error_file", f->error_file);
    cJSON_AddStringToObject(o, "message", f->message ? f->message : "");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    size_t n = strlen(s);
    char *line = dt_xmalloc(n + 2);
    memcpy(line, s, n);
    line[n] = '\n';
    line[n + 1] = '\0';
    cJSON_free(s);
    return line;
}

static int parse_failures(const char *jsonl, failure_t **out) {
    int n = 0;
    failure_t *fs = NULL;
    const char *p = jsonl;
    while (p && *p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char *line = dt_xmalloc(len + 1);
        memcpy(line, p, len);
        line[len] = '\0';
        cJSON *o = cJSON_Parse(line);
        free(line);
        if (o) {
            failure_t f;
            memset(&f, 0, sizeof f);
            cJSON *v;
            if ((v = cJSON_GetObjectItem(o, "time")) && cJSON_IsNumber(v)) f.time = v->valuedouble;
            if ((v = cJSON_GetObjectItem(o, "host")) && cJSON_IsString(v))
                snprintf(f.host, sizeof f.host, "%s", v->valuestring);
            if ((v = cJSON_GetObjectItem(o, "rank")) && cJSON_IsNumber(v)) f.rank = v->valueint;
            if ((v = cJSON_GetObjectItem(o, "local_rank")) && cJSON_IsNumber(v)) f.local_rank = v->valueint;
            if ((v = cJSON_GetObjectItem(o, "pid")) && cJSON_IsNumber(v)) f.pid = (long)v->valuedouble;
            if ((v = cJSON_GetObjectItem(o, "exitcode")) && cJSON_IsNumber(v)) f.exitcode = v->valueint;
            f.lost = cJSON_IsTrue(cJSON_GetObjectItem(o, "lost"));
            if ((v = cJSON_GetObjectItem(o, "error_file")) && cJSON_IsString(v))
                snprintf(f.error_file, sizeof f.error_file, "%s", v->valuestring);
            if ((v = cJSON_GetObjectItem(o, "message")) && cJSON_IsString(v))
                f.message = dt_xstrdup(v->valuestring);
            cJSON_Delete(o);
            fs = dt_xrealloc(fs, (size_t)(n + 1) * sizeof *fs);
            fs[n++] = f;
        }
        p = nl ? nl + 1 : NULL;
    }
    *out = fs;
    return n;
}

/* Appends s to a growing buffer. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf_t;

static void sb_add(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf_t *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        b->cap = (b->cap + (size_t)n + 1) * 2;
        b->p = dt_xrealloc(b->p, b->cap);
    }
}

static void format_failure(sbuf_t *b, int idx, const failure_t *f) {
    char t[64];
    iso_time(f->time, t, sizeof t);
    sb_add(b, "[%d]:\n  time      : %s\n  host      : %s\n  rank      : %d (local_rank: %d)\n",
           idx, t, f->host, f->rank, f->local_rank);
    if (f->lost) sb_add(b, "  exitcode  : <N/A> (node lost)\n");
    else if (f->exitcode < 0)
        sb_add(b, "  exitcode  : %d (pid: %ld) (%s)\n", f->exitcode, f->pid, signame(-f->exitcode));
    else sb_add(b, "  exitcode  : %d (pid: %ld)\n", f->exitcode, f->pid);
    sb_add(b, "  error_file: %s\n  traceback : ", f->error_file);
    const char *m = f->message ? f->message : "<N/A>";
    size_t mlen = strlen(m);
    while (mlen && m[mlen - 1] == '\n') mlen--;
    for (size_t i = 0; i < mlen; i++) {
        if (m[i] == '\n') sb_add(b, "\n  ");
        else sb_add(b, "%c", m[i]);
    }
    sb_add(b, "\n");
}

/* torchrun's ChildFailedError.format_msg layout: title, "Failures:" (the others),
 * "Root Cause (first observed failure):". */
static void print_summary(agent_t *ag, failure_t *fs, int n) {
    if (n == 0) return;
    int root = 0;
    for (int i = 1; i < n; i++)
        if (fs[i].time < fs[root].time) root = i;
    sbuf_t others = {0}, rootb = {0};
    int idx = 0;
    for (int i = 0; i < n; i++) {
        if (i == root) continue;
        format_failure(&others, ++idx, &fs[i]);
    }
    format_failure(&rootb, 0, &fs[root]);
    char title[300];
    snprintf(title, sizeof title, "%s FAILED", ag->title);
    size_t width = strlen(title);
    const char *bufs[] = {others.p, rootb.p};
    for (int k = 0; k < 2; k++) {
        const char *p = bufs[k];
        while (p && *p) {
            const char *nl = strchr(p, '\n');
            size_t l = nl ? (size_t)(nl - p) : strlen(p);
            if (l > width) width = l;
            p = nl ? nl + 1 : NULL;
        }
    }
    if (width > 60) width = 60;
    char border[61], section[61];
    memset(border, '=', width);
    border[width] = '\0';
    memset(section, '-', width);
    section[width] = '\0';
    sbuf_t out = {0};
    sb_add(&out, "\n%s\n%s\n%s\nFailures:\n%s%s\nRoot Cause (first observed failure):\n%s%s\n",
           border, title, section, others.p ? others.p : "  <NO_OTHER_FAILURES>\n", section,
           rootb.p, border);
    ssize_t wr = write(STDERR_FILENO, out.p, out.len);
    (void)wr;
    free(out.p);
    free(others.p);
    free(rootb.p);
}

/* ---- the round's state machine ------------------------------------------- */

static void stop_group(agent_t *ag, int sig, outcome_t why) {
    if (ag->phase == PHASE_STOPPING || ag->phase == PHASE_OVER) return;
    ag->outcome = why;
    ag->phase = PHASE_STOPPING;
    if (ag->running == 0) {
        ag->phase = PHASE_OVER;
        return;
    }
    signal_workers(ag, sig);
}

static void on_grace(uv_timer_t *t) {
    agent_t *ag = t->data;
    if (ag->running > 0) {
        DT_LOG_WARN("%d worker(s) still running %.0f s after the stop signal: SIGKILL",
                    ag->running, ag->spec->shutdown_timeout_s);
        signal_workers(ag, SIGKILL);
    }
}

static void begin_stop(agent_t *ag, int sig, outcome_t why) {
    if (ag->phase == PHASE_STOPPING || ag->phase == PHASE_OVER) return;
    stop_group(ag, sig, why);
    if (ag->phase == PHASE_STOPPING)
        uv_timer_start(&ag->grace, on_grace, (uint64_t)(ag->spec->shutdown_timeout_s * 1000), 0);
}

static void local_failure(agent_t *ag, worker_t *w) {
    failure_t f = worker_failure(ag, w);
    if (ag->rz) {
        char *line = failure_json(&f);
        dt_status_t st = dt_rdzv_post_failures(ag->rz, line);
        free(line);
        char reason[256];
        snprintf(reason, sizeof reason, "rank %d on %s failed", w->rank, ag->host);
        if (st == DT_STATUS_OK) st = dt_rdzv_request_stop(ag->rz, reason, NULL);
        if (st != DT_STATUS_OK) DT_LOG_WARN("%s", dt_error_detail());
    }
    add_failure(ag, &f);
    if (ag->phase == PHASE_RUNNING || ag->phase == PHASE_BARRIER) {
        DT_LOG_INFO("rank %d (pid %d) failed; stopping the group", w->rank, (int)w->pid);
        begin_stop(ag, SIGTERM, OUTCOME_FAILED);
    }
}

/* w was reaped (w->exited, w->wstatus set by on_sigchld). */
static void worker_exited(agent_t *ag, worker_t *w) {
    int status = w->wstatus;
    ag->running--;
    drain_pipes(w);
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && !w->signaled_by_agent) local_failure(ag, w);
    if (ag->running > 0) return;
    uv_timer_stop(&ag->grace);
    if (ag->phase == PHASE_STOPPING) {
        ag->phase = PHASE_OVER;
    } else if (ag->phase == PHASE_RUNNING) {
        ag->outcome = OUTCOME_SUCCESS;
        if (ag->rz) {
            dt_status_t st = dt_rdzv_mark_done(ag->rz);
            if (st != DT_STATUS_OK) {
                DT_LOG_ERROR("%s", dt_error_detail());
                ag->outcome = OUTCOME_STORE_LOST;
                ag->phase = PHASE_OVER;
                return;
            }
            ag->phase = PHASE_BARRIER;
        } else {
            ag->phase = PHASE_OVER;
        }
    }
}

static void on_sigchld(uv_signal_t *h, int signum) {
    (void)signum;
    agent_t *ag = h->data;
    /* Reap everything first: workers that failed together are all reported as
     * failures, and a reaped pid is never signalled again. */
    int n = 0;
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) break;
        for (int i = 0; i < ag->nw; i++) {
            worker_t *w = &ag->w[i];
            if (w->pid != pid || w->exited) continue;
            w->exited = 1;
            w->wstatus = status;
            w->end_wall = dt_wall_s();
            w->reaped_seq = ++n;
        }
    }
    for (int k = 1; k <= n; k++)
        for (int i = 0; i < ag->nw; i++)
            if (ag->w[i].reaped_seq == k) {
                ag->w[i].reaped_seq = 0;
                worker_exited(ag, &ag->w[i]);
            }
}

static void on_signal(uv_signal_t *h, int signum) {
    agent_t *ag = h->data;
    if (ag->phase == PHASE_STOPPING && ag->outcome == OUTCOME_SIGNAL && signum == SIGINT) {
        /* The second Ctrl-C: no more grace. */
        DT_LOG_WARN("second SIGINT: killing the workers now");
        signal_workers(ag, SIGKILL);
        return;
    }
    if (ag->phase == PHASE_STOPPING && ag->outcome == OUTCOME_SIGNAL) {
        signal_workers(ag, signum);
        return;
    }
    DT_LOG_WARN("received %s: forwarding it to %d worker(s), SIGKILL after %.0f s",
                signame(signum), ag->running, ag->spec->shutdown_timeout_s);
    ag->signo = signum;
    if (ag->phase == PHASE_STOPPING) { /* already stopping after a failure */
        ag->outcome = OUTCOME_SIGNAL;
        signal_workers(ag, signum);
        return;
    }
    if (ag->rz) {
        char reason[200];
        snprintf(reason, sizeof reason, "%sthe agent on %s received %s", SIGNAL_STOP_TAG, ag->host,
                 signame(signum));
        dt_rdzv_request_stop(ag->rz, reason, NULL);
    }
    ag->phase = PHASE_RUNNING; /* from the barrier too */
    begin_stop(ag, signum, OUTCOME_SIGNAL);
}

/* Multi-node: heartbeats, stop requests from other agents, the exit barrier. */
static void on_tick(uv_timer_t *t) {
    agent_t *ag = t->data;
    if (!ag->rz || ag->phase == PHASE_OVER) return;
    dt_status_t st;
    if (ag->phase == PHASE_BARRIER) {
        int all = 0;
        st = dt_rdzv_barrier_check(ag->rz, &all);
        if (st == DT_STATUS_OK && all) {
            ag->phase = PHASE_OVER;
            return;
        }
    }
    dt_rdzv_event_t ev;
    int lost = -1;
    st = dt_rdzv_tick(ag->rz, &ev, &lost);
    if (st != DT_STATUS_OK) {
        snprintf(ag->stop_note, sizeof ag->stop_note, "%s", dt_error_detail());
        DT_LOG_ERROR("%s", ag->stop_note);
        if (ag->phase == PHASE_BARRIER) ag->phase = PHASE_RUNNING;
        begin_stop(ag, SIGTERM, OUTCOME_STORE_LOST);
        return;
    }
    if (ev == DT_RDZV_EVENT_NONE || ag->phase == PHASE_STOPPING) return;
    if (ev == DT_RDZV_EVENT_STOP) {
        char *reason = NULL;
        dt_rdzv_stop_reason(ag->rz, &reason);
        const char *r = reason ? reason : "stop requested";
        if (!strncmp(r, SIGNAL_STOP_TAG, strlen(SIGNAL_STOP_TAG))) {
            r += strlen(SIGNAL_STOP_TAG);
            ag->no_restart = 1;
        }
        snprintf(ag->stop_note, sizeof ag->stop_note, "%s", r);
        free(reason);
        DT_LOG_INFO("group stop: %s", ag->stop_note);
    } else {
        const dt_rdzv_node_t *nd = &ag->rz->nodes[lost];
        char reason[300];
        snprintf(reason, sizeof reason, "node %d (%s) lost: no heartbeat for %.1f s", lost,
                 nd->host, 3 * ag->rz->heartbeat_s);
        int won = 0;
        if (dt_rdzv_declare_lost(ag->rz, reason, &won) == DT_STATUS_OK && won) {
            sbuf_t b = {0};
            for (int r = 0; r < nd->nproc; r++) {
                failure_t f;
                memset(&f, 0, sizeof f);
                f.time = dt_wall_s();
                snprintf(f.host, sizeof f.host, "%s", nd->host);
                f.rank = nd->base_rank + r;
                f.local_rank = r;
                f.lost = 1;
                snprintf(f.error_file, sizeof f.error_file, "<N/A>");
                f.message = reason;
                char *line = failure_json(&f);
                sb_add(&b, "%s", line);
                free(line);
            }
            if (b.p) dt_rdzv_post_failures(ag->rz, b.p);
            free(b.p);
        }
        snprintf(ag->stop_note, sizeof ag->stop_note, "%s", reason);
        DT_LOG_ERROR("%s", reason);
    }
    if (ag->phase == PHASE_BARRIER) ag->phase = PHASE_RUNNING;
    begin_stop(ag, SIGTERM, OUTCOME_FAILED);
}

static void signals_start(agent_t *ag) {
    if (ag->signals_on) return;
    for (int i = 0; i < N_FWD; i++) uv_signal_start(&ag->sig[i], on_signal, forwarded_signals[i]);
    ag->signals_on = 1;
}

/* During a blocking rendezvous no worker runs: default dispositions end the agent. */
static void signals_stop(agent_t *ag) {
    if (!ag->signals_on) return;
    for (int i = 0; i < N_FWD; i++) uv_signal_stop(&ag->sig[i]);
    ag->signals_on = 0;
}

/* Runs one round's workers until the round is over. */
static dt_status_t run_round(agent_t *ag) {
    ag->phase = PHASE_RUNNING;
    ag->outcome = OUTCOME_SUCCESS;
    ag->running = 0;
    ag->stop_note[0] = '\0';
    ag->no_restart = 0;
    for (int i = 0; i < ag->nw; i++) {
        worker_t *w = &ag->w[i];
        memset(w, 0, sizeof *w);
        w->ag = ag;
        w->local_rank = i;
        w->rank = ag->base_rank + i;
        w->file_fd[0] = w->file_fd[1] = -1;
    }
    signals_start(ag);
    dt_status_t st = DT_STATUS_OK;
    for (int i = 0; i < ag->nw; i++) {
        st = spawn_worker(ag, &ag->w[i]);
        if (st != DT_STATUS_OK) {
            snprintf(ag->stop_note, sizeof ag->stop_note, "cannot start local rank %d on %s: %s",
                     i, ag->host, dt_error_detail());
            DT_LOG_ERROR("%s", ag->stop_note);
            if (ag->rz) dt_rdzv_request_stop(ag->rz, ag->stop_note, NULL);
            ag->no_restart = 1;
            begin_stop(ag, SIGKILL, OUTCOME_FAILED);
            break;
        }
    }
    if (ag->rz) {
        uint64_t ms = (uint64_t)(ag->spec->monitor_interval_s * 1000);
        if (ms == 0) ms = 1;
        uv_timer_start(&ag->tick, on_tick, ms, ms);
    }
    while (ag->phase != PHASE_OVER) uv_run(&ag->loop, UV_RUN_ONCE);
    uv_timer_stop(&ag->tick);
    uv_timer_stop(&ag->grace);
    for (int i = 0; i < ag->nw; i++) {
        worker_t *w = &ag->w[i];
        drain_pipes(w);
        dt_logpipe_free(&w->lp[0]);
        dt_logpipe_free(&w->lp[1]);
        for (int s = 0; s < 2; s++)
            if (w->file_fd[s] >= 0) close(w->file_fd[s]);
    }
    uv_run(&ag->loop, UV_RUN_NOWAIT); /* finish the pipe closes */
    return st;
}

/* ---- set-up and the run ---------------------------------------------------- */

static int exit_code_for(dt_status_t st) {
    if (st == DT_STATUS_USAGE || st == DT_STATUS_CONFIG || st == DT_STATUS_INVALID) return 2;
    return 3;
}

static dt_status_t setup_store(agent_t *ag) {
    const dt_launch_spec_t *sp = ag->spec;
    const char *host = sp->endpoint_host ? sp->endpoint_host : "127.0.0.1";
    snprintf(ag->master_addr, sizeof ag->master_addr, "%s", host);
    int multi = sp->nnodes_max > 1;
    if (!multi || sp->node_rank == 0) ag->is_host = 1;
    else if (sp->node_rank < 0 && sp->local_addr) ag->is_host = !strcmp(sp->local_addr, host);
    else if (sp->node_rank < 0) ag->is_host = -1; /* whoever binds the endpoint first */

    if (ag->is_host != 0) {
        dt_status_t st = dt_store_server_start(host, sp->endpoint_port, &ag->server);
        if (st != DT_STATUS_OK) {
            if (ag->is_host == -1) {
                ag->is_host = 0; /* another agent holds the endpoint: join it */
                dt_error_clear();
            } else {
                return dt_error(DT_STATUS_RENDEZVOUS, "cannot host the store on %s:%d: %s",
                                host, sp->endpoint_port, dt_error_detail());
            }
        } else {
            ag->is_host = 1;
        }
    }
    ag->master_port = ag->server ? dt_store_server_port(ag->server) : sp->endpoint_port;
    if (ag->server)
        DT_LOG_DEBUG("store listening on %s:%d", host, ag->master_port);
    if (multi)
        DT_CHECK(dt_rdzv_connect(host, ag->master_port, sp->rdzv_id, sp->nnodes_min,
                                 sp->nnodes_max, sp->join_timeout_s, sp->last_call_s,
                                 sp->heartbeat_s, &ag->rz));
    return DT_STATUS_OK;
}

static dt_status_t join_round(agent_t *ag) {
    const dt_launch_spec_t *sp = ag->spec;
    if (!ag->rz) {
        ag->nnodes = 1;
        ag->node_rank = 0;
        ag->base_rank = 0;
        ag->world_size = sp->nproc_per_node;
        return DT_STATUS_OK;
    }
    signals_stop(ag);
    double t0 = dt_now_s();
    if (ag->restart_count == 0 && ag->is_host != 1 && !ag->joined_once) {
        /* Returning to a run in progress: join the round the others are in. */
        int r = dt_rdzv_latest_round(ag->rz);
        if (r > 0) {
            DT_LOG_INFO("the run is in rendezvous round %d: joining it (restart count %d)", r, r);
            ag->restart_count = r;
        }
    }
    ag->joined_once = 1;
    DT_CHECK(dt_rdzv_join(ag->rz, ag->restart_count, sp->node_rank, ag->is_host == 1,
                           sp->nproc_per_node, ag->host));
    ag->nnodes = ag->rz->nnodes;
    ag->node_rank = ag->rz->node_rank;
    ag->base_rank = ag->rz->base_rank;
    ag->world_size = ag->rz->world_size;
    ag->rz->last_hb = 0;
    DT_LOG_INFO("rendezvous round %d: node %d of %d, ranks %d-%d of %d (%.0f ms)",
                ag->restart_count, ag->node_rank, ag->nnodes, ag->base_rank,
                ag->base_rank + sp->nproc_per_node - 1, ag->world_size, (dt_now_s() - t0) * 1e3);
    return DT_STATUS_OK;
}

static void free_failures(failure_t *fs, int n) {
    for (int i = 0; i < n; i++) free(fs[i].message);
    free(fs);
}

int dt_agent_run(const dt_launch_spec_t *sp, char **argv, int argc) {
    agent_t *ag = dt_xcalloc(1, sizeof *ag);
    int code = 1;
    dt_status_t st;
    ag->spec = sp;
    ag->argv = argv;
    const char *slash = strrchr(argv[0], '/');
    ag->title = slash ? slash + 1 : argv[0];
    (void)argc;
    if (sp->local_addr) snprintf(ag->host, sizeof ag->host, "%s", sp->local_addr);
    else if (gethostname(ag->host, sizeof ag->host) != 0) snprintf(ag->host, sizeof ag->host, "localhost");
    ag->host[sizeof ag->host - 1] = '\0';

    st = dt_agent_find_program(argv[0], &ag->prog_path);
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun: error: %s (nothing was started)\n", dt_error_detail());
        code = 2;
        goto out_free_agent;
    }
    if (sp->log_dir) {
        char d[PATH_MAX - 128];
        snprintf(d, sizeof d, "%s/%s", sp->log_dir, sp->rdzv_id);
        if (mkdir_p(d) != 0) {
            fprintf(stderr, "dtrun: error: cannot create --log_dir %s: %s (nothing was started)\n",
                    d, strerror(errno));
            code = 2;
            goto out_free_agent;
        }
        ag->run_dir = dt_xstrdup(d);
    } else {
        char tmpl[] = "/tmp/dtrun-run-XXXXXX";
        if (!mkdtemp(tmpl)) {
            fprintf(stderr, "dtrun: error: cannot create a run directory in /tmp: %s\n",
                    strerror(errno));
            code = 1;
            goto out_free_agent;
        }
        ag->run_dir = dt_xstrdup(tmpl);
        /* Without --log_dir the run directory holds only the error files, unless
         * --redirects/--tee asked for files: then keep it and say where. */
        int files = sp->redirects_all | sp->tee_all;
        for (int i = 0; i < sp->nproc_per_node && i < DT_LAUNCH_MAX_LOCAL_RANKS; i++)
            files |= dt_launch_spec_redirects(sp, i) | dt_launch_spec_tee(sp, i);
        ag->run_dir_tmp = !files;
        if (files) DT_LOG_INFO("per-rank log files in %s (no --log_dir given)", ag->run_dir);
    }
    ag->nw = sp->nproc_per_node;
    ag->w = dt_xcalloc((size_t)ag->nw, sizeof *ag->w);

    if (!getenv("OMP_NUM_THREADS") && ag->nw > 1)
        DT_LOG_WARN("\n*****************************************\n"
                    "Setting OMP_NUM_THREADS environment variable for each process to be 1 in "
                    "default, to avoid your system being overloaded, please further tune the "
                    "variable for optimal performance in your application as needed. \n"
                    "*****************************************");

    uv_loop_init(&ag->loop);
    for (int i = 0; i < N_FWD; i++) {
        uv_signal_init(&ag->loop, &ag->sig[i]);
        ag->sig[i].data = ag;
    }
    uv_signal_init(&ag->loop, &ag->sigchld);
    ag->sigchld.data = ag;
    uv_signal_start(&ag->sigchld, on_sigchld, SIGCHLD);
    uv_timer_init(&ag->loop, &ag->tick);
    uv_timer_init(&ag->loop, &ag->grace);
    ag->tick.data = ag->grace.data = ag;
    signal(SIGPIPE, SIG_IGN);

    st = setup_store(ag);
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun: error: %s\n", dt_error_detail());
        code = exit_code_for(st);
        goto out_close_loop;
    }

    for (;;) {
        st = join_round(ag);
        if (st != DT_STATUS_OK) {
            fprintf(stderr, "dtrun: error: %s\n", dt_error_detail());
            code = exit_code_for(st);
            break;
        }
        run_round(ag);
        if (ag->outcome == OUTCOME_SUCCESS) {
            code = 0;
            break;
        }
        if (ag->outcome == OUTCOME_SIGNAL) {
            code = 128 + ag->signo;
            break;
        }
        if (ag->outcome == OUTCOME_STORE_LOST) {
            fprintf(stderr, "dtrun: error: %s\n", ag->stop_note[0] ? ag->stop_note : dt_error_detail());
            code = 3;
            break;
        }
        /* OUTCOME_FAILED */
        if (ag->restart_count < sp->max_restarts && !ag->no_restart) {
            ag->restart_count++;
            DT_LOG_WARN("restarting the workers (restart %d of %d)", ag->restart_count,
                        sp->max_restarts);
            free_failures(ag->fails, ag->nfails);
            ag->fails = NULL;
            ag->nfails = 0;
            continue;
        }
        /* Every node's failures when there is a store, else this node's. */
        int printed = 0;
        if (ag->rz) {
            char *jsonl = NULL;
            if (dt_rdzv_get_failures(ag->rz, &jsonl) == DT_STATUS_OK && jsonl && *jsonl) {
                failure_t *remote = NULL;
                int nr = parse_failures(jsonl, &remote);
                if (nr > 0) print_summary(ag, remote, nr);
                printed = nr > 0;
                free_failures(remote, nr);
            }
            free(jsonl);
        }
        if (!printed && ag->nfails > 0) {
            print_summary(ag, ag->fails, ag->nfails);
            printed = 1;
        }
        if (!printed && ag->stop_note[0])
            fprintf(stderr, "dtrun: the group was stopped: %s\n", ag->stop_note);
        code = 1;
        break;
    }
    if (ag->rz) dt_rdzv_leave(ag->rz, ag->is_host == 1, 10);

out_close_loop:
    signals_stop(ag);
    uv_signal_stop(&ag->sigchld);
    uv_close((uv_handle_t *)&ag->sigchld, NULL);
    for (int i = 0; i < N_FWD; i++) uv_close((uv_handle_t *)&ag->sig[i], NULL);
    uv_close((uv_handle_t *)&ag->tick, NULL);
    uv_close((uv_handle_t *)&ag->grace, NULL);
    uv_run(&ag->loop, UV_RUN_DEFAULT);
    uv_loop_close(&ag->loop);
    dt_rdzv_close(ag->rz);
    dt_store_server_stop(ag->server);
out_free_agent:
    if (ag->run_dir && ag->run_dir_tmp) nftw(ag->run_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(ag->run_dir);
    free(ag->prog_path);
    free_failures(ag->fails, ag->nfails);
    free(ag->w);
    free(ag);
    return code;
}
