/*
 * agent.c - one node's agent: the store, the rendezvous and the round's state
 * machine (see agent.h for the spawning design; spawn.c starts the workers and
 * carries their output, failure.c reads and reports their failures).
 *
 * A run is a sequence of rounds (attempts). Each round: join the rendezvous
 * (multi-node), spawn the workers, then run the libuv loop until the round is
 * over: every worker exited 0 and every node passed the exit barrier; or a worker
 * failed / another node asked to stop / a node was lost (stop the group, then
 * restart or summarise); or a signal arrived (forward, wait the grace period,
 * SIGKILL what is left, exit 128+N).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/gpuinfo.h" /* defines: dt_gpuinfo_count */
#include "common/log.h"
#include "common/rng.h" /* defines: dt_random_bytes */
#include "common/mem.h"
#include "common/meminfo.h"
#include "runtime/launch/agent_impl.h"

/* ---- the round's state machine ------------------------------------------- */

/* How the workers are stopped: a preemption (a signal to this agent or to another
 * node's) lets them save; a failure (a worker here or elsewhere, a lost node or
 * store) stops them without the save, which would wait for the failed rank. */
typedef enum stop_kind { STOP_SAVE = 0, STOP_NO_SAVE } stop_kind_t;

static void stop_group(agent_t *ag, int sig, outcome_t why, stop_kind_t kind) {
    if (ag->phase == PHASE_STOPPING || ag->phase == PHASE_OVER) return;
    ag->outcome = why;
    ag->phase = PHASE_STOPPING;
    if (ag->running == 0) {
        ag->phase = PHASE_OVER;
        return;
    }
    if (kind == STOP_NO_SAVE && sig == SIGTERM) dt_agent_signal_group_failure(ag);
    dt_agent_signal_workers(ag, sig);
}

static void on_grace(uv_timer_t *t) {
    agent_t *ag = t->data;
    if (ag->running > 0) {
        DT_LOG_WARN("%d worker(s) still running %.0f s after the stop signal: SIGKILL",
                    ag->running, ag->spec->shutdown_timeout_s);
        dt_agent_signal_workers(ag, SIGKILL);
    }
}

static void begin_stop(agent_t *ag, int sig, outcome_t why, stop_kind_t kind) {
    if (ag->phase == PHASE_STOPPING || ag->phase == PHASE_OVER) return;
    stop_group(ag, sig, why, kind);
    if (ag->phase == PHASE_STOPPING)
        uv_timer_start(&ag->grace, on_grace, (uint64_t)(ag->spec->shutdown_timeout_s * 1000), 0);
}

static void local_failure(agent_t *ag, worker_t *w) {
    char why[160];
    snprintf(why, sizeof why, "rank %d on %s failed", w->rank, ag->host);
    failure_t f = dt_agent_worker_failure(ag, w);
    /* a refused config (exit 2, before any step) leaves no collective to look for */
    int refused = f.exitcode == DT_EXIT_USAGE && ag->spec->mode == DT_LAUNCH_MODE_CONFIG;
    if (!refused) dt_agent_flight_collect(ag, why);
    if (ag->rz) {
        char *line = dt_agent_failure_json(&f);
        dt_status_t st = dt_rdzv_post_failures(ag->rz, line);
        free(line);
        char reason[256];
        snprintf(reason, sizeof reason, "rank %d on %s failed", w->rank, ag->host);
        if (st == DT_STATUS_OK) st = dt_rdzv_request_stop(ag->rz, reason, NULL);
        if (st != DT_STATUS_OK) DT_LOG_WARN("%s", dt_error_detail());
    }
    dt_agent_add_failure(ag, &f);
    if (ag->phase == PHASE_RUNNING || ag->phase == PHASE_BARRIER) {
        if (!refused) DT_LOG_INFO("rank %d (pid %d) failed; stopping the group", w->rank, (int)w->pid);
        begin_stop(ag, SIGTERM, OUTCOME_FAILED, STOP_NO_SAVE);
    }
}

/* w was reaped (w->exited, w->wstatus set by on_sigchld). */
static void worker_exited(agent_t *ag, worker_t *w) {
    int status = w->wstatus;
    ag->running--;
    dt_agent_drain_pipes(w);
    int ok = (WIFEXITED(status) && WEXITSTATUS(status) == 0) || dt_agent_elastic_exit(ag, status);
    if (!ok && !w->signaled_by_agent) local_failure(ag, w);
    if (ag->running > 0) return;
    uv_timer_stop(&ag->grace);
    if (ag->phase == PHASE_STOPPING) {
        ag->phase = PHASE_OVER;
    } else if (ag->phase == PHASE_RUNNING && ag->resize_exit) {
        ag->outcome = OUTCOME_RESIZE; /* no exit barrier: every node re-rendezvous */
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
            dt_agent_orphans_reaped(ag, w);
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
        dt_agent_signal_workers(ag, SIGKILL);
        return;
    }
    if (ag->phase == PHASE_STOPPING && ag->outcome == OUTCOME_SIGNAL) {
        dt_agent_signal_workers(ag, signum);
        return;
    }
    DT_LOG_WARN("received %s: forwarding it to %d worker(s), SIGKILL after %.0f s",
                dt_agent_signame(signum), ag->running, ag->spec->shutdown_timeout_s);
    ag->signo = signum;
    if (ag->phase == PHASE_STOPPING) { /* already stopping after a failure */
        ag->outcome = OUTCOME_SIGNAL;
        dt_agent_signal_workers(ag, signum);
        return;
    }
    if (ag->rz) {
        char reason[200];
        snprintf(reason, sizeof reason, "%sthe agent on %s received %s", SIGNAL_STOP_TAG, ag->host,
                 dt_agent_signame(signum));
        dt_rdzv_request_stop(ag->rz, reason, NULL);
    }
    ag->phase = PHASE_RUNNING; /* from the barrier too */
    begin_stop(ag, signum, OUTCOME_SIGNAL, STOP_SAVE);
}

/* Multi-node: heartbeats, stop requests from other agents, the exit barrier. */
static void on_tick(uv_timer_t *t) {
    agent_t *ag = t->data;
    if (ag->phase == PHASE_RUNNING) dt_agent_flight_poll(ag);
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
        /* stopping after the loss already: said once (the first error, which says why:
         * later ones only find the connection unusable), not every tick of the stop */
        if (ag->phase == PHASE_STOPPING &&
            (ag->outcome == OUTCOME_STORE_LOST || !strcmp(ag->stop_note, dt_error_detail())))
            return;
        snprintf(ag->stop_note, sizeof ag->stop_note, "%s", dt_error_detail());
        DT_LOG_ERROR("%s", ag->stop_note);
        if (ag->phase == PHASE_BARRIER) ag->phase = PHASE_RUNNING;
        begin_stop(ag, SIGTERM, OUTCOME_STORE_LOST, STOP_NO_SAVE);
        return;
    }
    if (ev == DT_RDZV_EVENT_RESIZE && ag->phase == PHASE_RUNNING) dt_agent_elastic_request(ag);
    if (ev == DT_RDZV_EVENT_NONE || ev == DT_RDZV_EVENT_RESIZE || ag->phase == PHASE_STOPPING) return;
    stop_kind_t kind = STOP_NO_SAVE;
    if (ev == DT_RDZV_EVENT_STOP) {
        char *reason = NULL;
        dt_rdzv_stop_reason(ag->rz, &reason);
        const char *r = reason ? reason : "stop requested";
        if (!strncmp(r, SIGNAL_STOP_TAG, strlen(SIGNAL_STOP_TAG))) {
            /* another node's agent was signalled: a preemption there, every rank
             * must reach its save */
            r += strlen(SIGNAL_STOP_TAG);
            ag->no_restart = 1;
            kind = STOP_SAVE;
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
            char *lines = dt_agent_lost_node_failures(nd, reason);
            if (lines) dt_rdzv_post_failures(ag->rz, lines);
            free(lines);
        }
        snprintf(ag->stop_note, sizeof ag->stop_note, "%s", reason);
        DT_LOG_ERROR("%s", reason);
    }
    if (ag->phase == PHASE_BARRIER) ag->phase = PHASE_RUNNING;
    dt_agent_flight_collect(ag, ag->stop_note);
    begin_stop(ag, SIGTERM, OUTCOME_FAILED, kind);
}

static void signals_start(agent_t *ag) {
    if (ag->signals_on) return;
    for (int i = 0; i < DT_AGENT_N_FWD; i++) uv_signal_start(&ag->sig[i], on_signal, dt_agent_forwarded_signals[i]);
    ag->signals_on = 1;
}

/* During a blocking rendezvous no worker runs: default dispositions end the agent. */
static void signals_stop(agent_t *ag) {
    if (!ag->signals_on) return;
    for (int i = 0; i < DT_AGENT_N_FWD; i++) uv_signal_stop(&ag->sig[i]);
    ag->signals_on = 0;
}

/* Runs one round's workers until the round is over. */
static dt_status_t run_round(agent_t *ag) {
    ag->phase = PHASE_RUNNING;
    ag->outcome = OUTCOME_SUCCESS;
    ag->running = 0;
    ag->stop_note[0] = '\0';
    ag->no_restart = 0;
    ag->resize_exit = 0;
    for (int i = 0; i < ag->nw; i++) {
        worker_t *w = &ag->w[i];
        memset(w, 0, sizeof *w);
        w->ag = ag;
        w->local_rank = i;
        w->rank = ag->base_rank + i;
        w->file_fd[0] = w->file_fd[1] = -1;
    }
    signals_start(ag);
    /* one sample of the host's memory for all of this round's workers (spawn.c) */
    ag->node_mem = ag->spec->mode == DT_LAUNCH_MODE_CONFIG ? dt_meminfo_host_available(&ag->node_mem_what) : 0;
    if (ag->node_mem <= 0) ag->node_mem_what = NULL;
    dt_status_t st = DT_STATUS_OK;
    for (int i = 0; i < ag->nw; i++) {
        st = dt_agent_spawn_worker(ag, &ag->w[i]);
        if (st != DT_STATUS_OK) {
            snprintf(ag->stop_note, sizeof ag->stop_note, "cannot start local rank %d on %s: %s",
                     i, ag->host, dt_error_detail());
            DT_LOG_ERROR("%s", ag->stop_note);
            if (ag->rz) dt_rdzv_request_stop(ag->rz, ag->stop_note, NULL);
            ag->no_restart = 1;
            begin_stop(ag, SIGKILL, OUTCOME_FAILED, STOP_NO_SAVE);
            break;
        }
    }
    if (ag->rz || ag->server) { /* one node: the tick answers `dtrun debug dump` */
        uint64_t ms = (uint64_t)(ag->spec->monitor_interval_s * 1000);
        if (ms == 0) ms = 1;
        uv_timer_start(&ag->tick, on_tick, ms, ms);
    }
    while (ag->phase != PHASE_OVER) uv_run(&ag->loop, UV_RUN_ONCE);
    uv_timer_stop(&ag->tick);
    uv_timer_stop(&ag->grace);
    for (int i = 0; i < ag->nw; i++) {
        worker_t *w = &ag->w[i];
        dt_agent_drain_pipes(w);
        dt_logpipe_free(&w->lp[0]);
        dt_logpipe_free(&w->lp[1]);
        for (int s = 0; s < 2; s++)
            if (w->file_fd[s] >= 0) close(w->file_fd[s]);
    }
    uv_run(&ag->loop, UV_RUN_NOWAIT); /* finish the pipe closes */
    dt_agent_orphans_sweep(ag);
    return st;
}

/* ---- set-up and the run ---------------------------------------------------- */

/* The store and the rendezvous fail by the network, unless what was given is wrong. */
static dt_exit_t rendezvous_exit_code(dt_status_t st) {
    dt_exit_t code = dt_status_exit_code(st);
    return code == DT_EXIT_FAILED ? DT_EXIT_NETWORK : code;
}

/* The store host's name must resolve. A name that does not resolve yet is waited
 * for until join_timeout, with a line at once and every DTRUN_WAIT_REPORT_S: on
 * Kubernetes a headless service's name (a JobSet's or a PyTorchJob's pod 0) appears
 * only once that pod runs, and every pod starts at its own pace. Other resolver
 * errors fail at once with the resolver's words. */
static dt_status_t wait_resolves(const char *host, double timeout_s) {
    double start = dt_now_s(), every = dt_wait_report_s(), next = 0;
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
        struct addrinfo *ai = NULL;
        int gr = getaddrinfo(host, NULL, &hints, &ai);
        if (ai) freeaddrinfo(ai);
        if (gr == 0) {
            if (next > 0) DT_LOG_INFO("rendezvous host '%s' resolves now (after %.1f s)", host, dt_now_s() - start);
            return DT_STATUS_OK;
        }
        int later = gr == EAI_NONAME || gr == EAI_AGAIN || gr == EAI_FAIL || (gr == EAI_SYSTEM && errno == EINTR);
#ifdef EAI_NODATA
        later = later || gr == EAI_NODATA;
#endif
        const char *why = gr == EAI_SYSTEM ? strerror(errno) : gai_strerror(gr);
        double waited = dt_now_s() - start;
        if (!later)
            return dt_error(DT_STATUS_RENDEZVOUS, "cannot resolve the rendezvous host '%s': %s", host, why);
        if (waited >= timeout_s)
            return dt_error(DT_STATUS_RENDEZVOUS,
                            "cannot resolve the rendezvous host '%s' within %.0f s (join_timeout): %s", host,
                            timeout_s, why);
        if (waited >= next) {
            DT_LOG_WARN("rendezvous host '%s' does not resolve yet (%s): retrying until join_timeout (%.0f s of "
                        "%.0f s; a Kubernetes headless service's name appears once its pod runs)",
                        host, why, waited, timeout_s);
            next = waited + every;
        }
        dt_sleep_ms(200);
    }
}

/* How long an agent whose --node_rank no round can take looks for the store, to
 * tell the other nodes why (they exit 2 too) before it exits 2 alone. */
#define AGENT_BAD_RANK_WAIT_S 10.0

static dt_status_t setup_store(agent_t *ag) {
    const dt_launch_spec_t *sp = ag->spec;
    const char *host = sp->endpoint_host ? sp->endpoint_host : "127.0.0.1";
    DT_CHECK(wait_resolves(host, sp->join_timeout_s));
    snprintf(ag->master_addr, sizeof ag->master_addr, "%s", host);
    int multi = sp->nnodes_max > 1;
    if (!multi || sp->node_rank == 0) ag->is_host = 1;
    else if (sp->node_rank < 0 && sp->local_addr) ag->is_host = !strcmp(sp->local_addr, host);
    else if (sp->node_rank < 0) ag->is_host = -1; /* whoever binds the endpoint first */

    if (ag->is_host != 0) {
        /* A token keeps strangers out; --exec workers (torch's client cannot
         * authenticate) are let in from the addresses of the nodes that joined. */
        const char *bind = sp->bind_host ? sp->bind_host : host;
        dt_status_t st = dt_store_server_start_auth(bind, sp->endpoint_port,
                                                    sp->have_token ? &sp->token : NULL,
                                                    sp->mode == DT_LAUNCH_MODE_EXEC, &ag->server);
        if (st != DT_STATUS_OK) {
            if (ag->is_host == -1) {
                ag->is_host = 0; /* another agent holds the endpoint: join it */
                dt_error_clear();
            } else {
                char why[1024]; /* the detail is dt_error's own buffer: copy it first */
                snprintf(why, sizeof why, "%s", dt_error_detail());
                return dt_error(DT_STATUS_RENDEZVOUS, "cannot host the store on %s:%d: %s",
                                bind, sp->endpoint_port, why);
            }
        } else {
            ag->is_host = 1;
        }
    }
    ag->master_port = ag->server ? dt_store_server_port(ag->server) : sp->endpoint_port;
    if (ag->server)
        DT_LOG_DEBUG("store listening on %s:%d", host, ag->master_port);
    if (ag->server && sp->have_token && !multi) {
        /* One node: its own authenticated connection is what lets its --exec
         * workers, which cannot authenticate, in from this address. */
        dt_store_t *self = NULL;
        DT_CHECK(dt_store_connect_auth(host, ag->master_port, sp->join_timeout_s, &sp->token,
                                       &self));
        dt_store_close(self);
    }
    const dt_store_token_t *token = sp->have_token ? &sp->token : NULL;
    if (multi && sp->node_rank >= sp->nnodes_max) {
        /* No round can take this node: say so to the others through the store when it
         * answers soon (dt_rdzv_join posts it), else exit 2 alone. */
        double wait = sp->join_timeout_s < AGENT_BAD_RANK_WAIT_S ? sp->join_timeout_s : AGENT_BAD_RANK_WAIT_S;
        if (dt_rdzv_connect(host, ag->master_port, token, sp->rdzv_id, sp->nnodes_min, sp->nnodes_max, wait,
                            sp->last_call_s, sp->heartbeat_s, &ag->rz) != DT_STATUS_OK)
            return dt_error(DT_STATUS_USAGE,
                            "--node_rank %d is out of range for --nnodes %d (node ranks 0 to %d); "
                            "no store answered at %s:%d within %.0f s to tell the other nodes",
                            sp->node_rank, sp->nnodes_max, sp->nnodes_max - 1, host, ag->master_port, wait);
    } else if (multi) {
        DT_CHECK(dt_rdzv_connect(host, ag->master_port, token, sp->rdzv_id, sp->nnodes_min, sp->nnodes_max,
                                 sp->join_timeout_s, sp->last_call_s, sp->heartbeat_s, &ag->rz));
    }
    return DT_STATUS_OK;
}

/* This launch's id: random on one node; on several, the first agent's (compare-and-set
 * under the run's key: every node gets the same). The trainer names its run by it, so
 * that a restart of the same launch finds its own checkpoints (train_ckpt.c). */
static dt_status_t launch_id(agent_t *ag) {
    if (ag->launch_id[0]) return DT_STATUS_OK;
    uint64_t x = 0;
    if (dt_random_bytes(&x, sizeof x) != DT_STATUS_OK) x = (uint64_t)(dt_now_s() * 1e9) ^ ((uint64_t)getpid() << 40);
    char mine[17];
    snprintf(mine, sizeof mine, "%016llx", (unsigned long long)x);
    if (!ag->rz) {
        memcpy(ag->launch_id, mine, sizeof mine);
        return DT_STATUS_OK;
    }
    char key[300];
    snprintf(key, sizeof key, "/dtrun/%s/launch_id", ag->rz->run_id);
    void *val = NULL;
    size_t len = 0;
    DT_CHECK(dt_store_compare_set(ag->rz->store, key, "", 0, mine, 16, &val, &len));
    if (len == 16 && strspn(val, "0123456789abcdef") >= 16) memcpy(ag->launch_id, val, 16);
    else memcpy(ag->launch_id, mine, 16); /* (a foreign value: this node's own) */
    ag->launch_id[16] = '\0';
    free(val);
    return DT_STATUS_OK;
}

static dt_status_t join_round(agent_t *ag) {
    const dt_launch_spec_t *sp = ag->spec;
    if (!ag->rz) {
        ag->nnodes = 1;
        ag->node_rank = 0;
        ag->base_rank = 0;
        ag->world_size = sp->nproc_per_node;
        DT_CHECK(launch_id(ag));
        /* one node: nothing to agree on; `dtrun check` still shows this node's row, and
         * a GPU run's GPUs are checked (preflight_gpu.c) */
        int gpu = !sp->no_preflight && dt_pf_gpu_run(sp) && dt_gpuinfo_count() > 0;
        return sp->check_only || gpu ? dt_agent_preflight(ag) : DT_STATUS_OK;
    }
    signals_stop(ag);
    double t0 = dt_now_s();
    if (ag->restart_count == 0 && ag->is_host != 1 && !ag->joined_once) {
        /* Returning to a run in progress: join the round the others are in. */
        int r = 0;
        DT_CHECK(dt_rdzv_latest_round(ag->rz, &r));
        if (r > 0) {
            DT_LOG_INFO("the run is in rendezvous round %d: joining it (restart count %d)", r, r);
            ag->restart_count = r;
        }
    }
    ag->joined_once = 1;
    DT_CHECK(dt_rdzv_join(ag->rz, ag->restart_count, sp->node_rank, ag->is_host == 1,
                           sp->nproc_per_node, ag->host));
    if (ag->rz->round > ag->restart_count) { /* admitted after waiting: the others resized */
        ag->resizes += ag->rz->round - ag->restart_count;
        ag->restart_count = ag->rz->round;
    }
    DT_CHECK(launch_id(ag));
    ag->nnodes = ag->rz->nnodes;
    ag->node_rank = ag->rz->node_rank;
    ag->base_rank = ag->rz->base_rank;
    ag->world_size = ag->rz->world_size;
    ag->rz->last_hb = 0;
    DT_LOG_INFO("rendezvous round %d: node %d of %d, ranks %d-%d of %d (%.0f ms)",
                ag->restart_count, ag->node_rank, ag->nnodes, ag->base_rank,
                ag->base_rank + sp->nproc_per_node - 1, ag->world_size, (dt_now_s() - t0) * 1e3);
    /* before any worker: the nodes agree and every pair connects (preflight.c) */
    if (sp->no_preflight) {
        /* the others learn it from this node's record, and skip the checks too */
        DT_CHECK(dt_agent_preflight_skip(ag));
    } else {
        DT_CHECK(dt_agent_preflight(ag));
        /* heartbeats are watched from the end of the preflight, which sent none */
        double now = dt_now_s();
        for (int i = 0; i < ag->rz->nnodes; i++) ag->rz->hb_changed[i] = now;
    }
    return DT_STATUS_OK;
}


int dt_agent_run(const dt_launch_spec_t *sp, char **argv, int argc) {
    agent_t *ag = dt_xcalloc(1, sizeof *ag);
    ag->guard_fd = ag->guard_done_fd = -1;
    int code = DT_EXIT_FAILED;
    dt_status_t st;
    ag->spec = sp;
    ag->argv = argv;
    const char *slash = argv ? strrchr(argv[0], '/') : NULL;
    ag->title = slash ? slash + 1 : argv ? argv[0] : "check";
    (void)argc;
    if (sp->local_addr) snprintf(ag->host, sizeof ag->host, "%s", sp->local_addr);
    else if (gethostname(ag->host, sizeof ag->host) != 0) snprintf(ag->host, sizeof ag->host, "localhost");
    ag->host[sizeof ag->host - 1] = '\0';

    st = argv ? dt_agent_find_program(argv[0], &ag->prog_path) : DT_STATUS_OK; /* none: check */
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun: error: %s (nothing was started)\n", dt_error_detail());
        code = DT_EXIT_USAGE;
        goto out_free_agent;
    }
    if (sp->log_dir) {
        char d[PATH_MAX - 128];
        snprintf(d, sizeof d, "%s/%s", sp->log_dir, sp->rdzv_id);
        if (dt_fs_mkdir_p(d) != DT_STATUS_OK) {
            fprintf(stderr, "dtrun: error: --log_dir: %s (nothing was started)\n", dt_error_detail());
            code = DT_EXIT_USAGE;
            goto out_free_agent;
        }
        ag->run_dir = dt_xstrdup(d);
    } else {
        const char *tmp = getenv("TMPDIR"); /* as mktemp(1) */
        if (!tmp || !*tmp) tmp = "/tmp";
        char tmpl[PATH_MAX];
        snprintf(tmpl, sizeof tmpl, "%s/dtrun-run-XXXXXX", tmp);
        if (!mkdtemp(tmpl)) {
            fprintf(stderr, "dtrun: error: cannot create a run directory in %s (TMPDIR): %s\n", tmp,
                    strerror(errno));
            code = DT_EXIT_FAILED;
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

    /* spawn.c sets OMP_NUM_THREADS=1 for every worker when it is unset and several
     * share the node (docs/interface.md). Say so for a program of the user's; dtrun's own
     * workers size their threads from the config and need no notice. */
    if (sp->mode == DT_LAUNCH_MODE_EXEC && !getenv("OMP_NUM_THREADS") && ag->nw > 1)
        DT_LOG_WARN("OMP_NUM_THREADS is not set: the %d workers on this node each get "
                    "OMP_NUM_THREADS=1 so that they do not oversubscribe the cores; set it to "
                    "give each more threads", ag->nw);

    /* Before the loop, the store's thread and its sockets: the guardian is forked. */
    dt_agent_orphans_init(ag);
    uv_loop_init(&ag->loop);
    for (int i = 0; i < DT_AGENT_N_FWD; i++) {
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
    getrlimit(RLIMIT_NOFILE, &ag->nofile); /* before the store raises it */

    st = setup_store(ag);
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun: error: %s\n", dt_error_detail());
        code = rendezvous_exit_code(st);
        goto out_close_loop;
    }

    for (;;) {
        st = join_round(ag);
        if (st != DT_STATUS_OK) {
            fprintf(stderr, "dtrun: error: %s\n", dt_error_detail());
            code = rendezvous_exit_code(st);
            break;
        }
        if (sp->check_only && ag->world_size < 2) { /* `dtrun check`: the preflight passed, no worker */
            code = DT_EXIT_OK;
            break;
        }
        run_round(ag);
        if (ag->outcome == OUTCOME_SUCCESS) {
            code = DT_EXIT_OK;
            break;
        }
        if (ag->outcome == OUTCOME_SIGNAL) {
            code = 128 + ag->signo;
            break;
        }
        if (ag->outcome == OUTCOME_STORE_LOST) {
            fprintf(stderr, "dtrun: error: %s\n", ag->stop_note[0] ? ag->stop_note : dt_error_detail());
            code = DT_EXIT_NETWORK;
            break;
        }
        if (ag->outcome == OUTCOME_RESIZE) { /* not a failure: --max_restarts is not used up */
            ag->restart_count++;
            ag->resizes++;
            DT_LOG_INFO("elastic: the workers stopped at a checkpoint for a resize: re-rendezvous (round %d)",
                        ag->restart_count);
            continue;
        }
        /* OUTCOME_FAILED */
        int first = sp->mode == DT_LAUNCH_MODE_CONFIG || sp->check_only ? dt_agent_failure_first_exit(ag) : -1;
        if (first == DT_EXIT_USAGE || first == DT_EXIT_PREFLIGHT) { /* no restart: exit 2, or 3 */
            if (first == DT_EXIT_USAGE) dt_agent_report_refusal(ag);
            else dt_agent_report_failures(ag);
            code = first == DT_EXIT_USAGE ? DT_EXIT_USAGE : DT_EXIT_NETWORK;
            break;
        }
        if (ag->restart_count - ag->resizes < sp->max_restarts && !ag->no_restart) {
            ag->restart_count++;
            DT_LOG_WARN("restarting the workers (restart %d of %d)", ag->restart_count - ag->resizes,
                        sp->max_restarts);
            dt_agent_failures_free(ag->fails, ag->nfails);
            ag->fails = NULL;
            ag->nfails = 0;
            continue;
        }
        dt_agent_report_failures(ag);
        code = DT_EXIT_FAILED;
        break;
    }
    if (ag->rz) dt_rdzv_leave(ag->rz, ag->is_host == 1, 10);

out_close_loop:
    signals_stop(ag);
    uv_signal_stop(&ag->sigchld);
    uv_close((uv_handle_t *)&ag->sigchld, NULL);
    for (int i = 0; i < DT_AGENT_N_FWD; i++) uv_close((uv_handle_t *)&ag->sig[i], NULL);
    uv_close((uv_handle_t *)&ag->tick, NULL);
    uv_close((uv_handle_t *)&ag->grace, NULL);
    uv_run(&ag->loop, UV_RUN_DEFAULT);
    uv_loop_close(&ag->loop);
    dt_rdzv_close(ag->rz);
    dt_store_server_stop(ag->server);
    dt_agent_orphans_end(ag);
    dt_agent_flight_free(ag);
out_free_agent:
    if (ag->run_dir && ag->run_dir_tmp && dt_fs_rm_rf(ag->run_dir) != DT_STATUS_OK)
        DT_LOG_WARN("%s", dt_error_detail());
    free(ag->run_dir);
    free(ag->prog_path);
    dt_agent_failures_free(ag->fails, ag->nfails);
    free(ag->w);
    free(ag);
    return code;
}

