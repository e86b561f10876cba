/*
 * spawn.c - starting one worker: torchrun's environment, fork + execve with the
 * death signal set (see agent.h for why not uv_spawn) in a process group of its
 * own that the guardian watches (orphans.c), the stdout/stderr pipes
 * fed line by line to the console and the per-rank log files (logpipe.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/gpuinfo.h" /* defines: dt_gpuinfo_count */
#include "common/mem.h"
#include "common/meminfo.h"
#include "common/torchenv.h" /* defines: DT_STOP_GROUP_FAILURE */
#include "runtime/launch/agent_impl.h"

extern char **environ;

const int dt_agent_forwarded_signals[DT_AGENT_N_FWD] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

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


void dt_agent_signal_workers(agent_t *ag, int sig) {
    for (int i = 0; i < ag->nw; i++) {
        worker_t *w = &ag->w[i];
        if (w->pid <= 0 || w->group_gone) continue;
        int to_group = kill(-w->pid, sig) == 0;
        if (w->exited) {
            /* An empty group is not signalled again: its id may be reused. */
            if (!to_group) w->group_gone = 1;
            continue;
        }
        if (!to_group) kill(w->pid, sig);
        /* a stopped worker (SIGSTOP) takes the signal only once continued */
        if (sig != SIGKILL && sig != SIGCONT && kill(-w->pid, SIGCONT) != 0) kill(w->pid, SIGCONT);
        w->signaled_by_agent = 1;
    }
}

void dt_agent_signal_group_failure(agent_t *ag) {
    union sigval v = {.sival_int = DT_STOP_GROUP_FAILURE};
    for (int i = 0; i < ag->nw; i++) {
        worker_t *w = &ag->w[i];
        if (w->pid > 0 && !w->exited && !w->group_gone) sigqueue(w->pid, SIGTERM, v);
    }
}

/* ---- the worker environment --------------------------------------------- */

static const char *const managed_vars[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "DTRUN_RUN_DIR",
    "DTRUN_LOG_DIR", "DTRUN_NNODES", "DTRUN_HOST", "DTRUN_AGENT_PID", "DTRUN_PROGRESS_TTY",
    "DTRUN_ELASTIC", "DTRUN_RESIZE_FILE", "DTRUN_LAUNCH_ID", DT_MEMINFO_NODE_ENV,
    DT_STORE_TOKEN_ENV, NULL};

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
    if (dt_agent_elastic(ag)) { /* the trainer keeps the global batch and obeys resizes (elastic.c) */
        char flag[PATH_MAX];
        dt_agent_elastic_flag_path(ag, flag, sizeof flag);
        ADD("DTRUN_ELASTIC=%d:%d", sp->nnodes_min, sp->nnodes_max);
        ADD("DTRUN_RESIZE_FILE=%s", flag);
    }
    /* The memory check's host figure, sampled once for the round (common/meminfo.h). */
    if (sp->mode == DT_LAUNCH_MODE_CONFIG && ag->node_mem_what)
        ADD("%s=%.0f %s", DT_MEMINFO_NODE_ENV, ag->node_mem, ag->node_mem_what);
    int gpu = dt_pf_gpu_run(sp) && dt_gpuinfo_count() > 0;
    /* The communicator's health check before the first step (train_preflight.c): on a
     * multi-node or GPU run of the built-in trainer, unless --no-preflight; a value the
     * user set is kept (a single-node CPU run may ask for it too). */
    if ((sp->mode == DT_LAUNCH_MODE_CONFIG || sp->check_only) && !sp->no_preflight && !ag->preflight_off &&
        ag->world_size > 1 && !getenv(DT_PREFLIGHT_COMM_ENV) && (ag->nnodes > 1 || gpu || sp->check_only))
        ADD("%s=%d,%d,%g", DT_PREFLIGHT_COMM_ENV, gpu ? 32 << 20 : 1 << 20, gpu ? 5 : 3, sp->preflight_min_busbw);
    ADD("DTRUN_HOST=%s", ag->host);
    if (ag->launch_id[0]) ADD("DTRUN_LAUNCH_ID=%s", ag->launch_id);
    ADD("DTRUN_AGENT_PID=%d", (int)getpid());
    /* Built-in workers prove they hold the token with it (the path, not the secret). */
    if (sp->have_token) ADD("%s=%s", DT_STORE_TOKEN_ENV, sp->token_file);
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

void dt_agent_drain_pipes(worker_t *w) {
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
    w->file_fd[s] = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND | O_NOFOLLOW, 0644);
    if (w->file_fd[s] < 0)
        return dt_error(dt_status_from_errno(errno), "cannot create log file %s: %s", path,
                        strerror(errno));
    return DT_STATUS_OK;
}

dt_status_t dt_agent_spawn_worker(agent_t *ag, worker_t *w) {
    const dt_launch_spec_t *sp = ag->spec;
    char dir[PATH_MAX - 64];
    if (snprintf(dir, sizeof dir, "%s/attempt_%d/%d", ag->run_dir, ag->restart_count, w->rank) >=
        (int)sizeof dir)
        return dt_error(DT_STATUS_INVALID, "run directory path too long: %s", ag->run_dir);
    DT_CHECK(dt_fs_mkdir_p(dir));
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
        for (int i = 0; i < DT_AGENT_N_FWD; i++) sigaction(dt_agent_forwarded_signals[i], &dfl, NULL);
        sigaction(SIGCHLD, &dfl, NULL);
        sigaction(SIGPIPE, &dfl, NULL);
        setpgid(0, 0);
        if (ag->nofile.rlim_cur) setrlimit(RLIMIT_NOFILE, &ag->nofile); /* not the store's raised limit */
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
    dt_agent_orphans_watch(ag, pid);
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
