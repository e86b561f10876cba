/*
 * test_comm_nccl.c - the NCCL communicator on a GPU machine (make gpu-tests):
 * world size 1 through the store, every op on device buffers against the host
 * result; the watchdog (comm_watchdog.h) aborting an op that cannot complete
 * while nobody waits for it. Compiles everywhere CUDA is installed; needs a GPU
 * to run (scripts/gpu_check.sh runs each test as its own row).
 */
#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#include "rendezvous/store.h"
#include "runtime/comm/comm.h"

#ifdef DT_USE_CUDA
#include <cuda_runtime.h>

/* An NCCL communicator of world size 1 on GPU 0 through a store on a free loopback
 * port (skips the test without a CUDA device); timeout_s 0: the default. */
static dt_comm_t *open_world_1(const char *run_id, double timeout_s, dt_store_server_t **srv) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) cr_skip_test("no CUDA device");
    cr_assert_eq(dt_store_server_start("127.0.0.1", 0, srv), DT_STATUS_OK);
    dt_comm_config_t cfg = {.store_host = "127.0.0.1", .store_port = dt_store_server_port(*srv), .run_id = run_id,
                            .world_size = 1, .local_world_size = 1, .backend = DT_COMM_BACKEND_NCCL, .device = 0,
                            .timeout_s = timeout_s};
    dt_comm_t *c = NULL;
    cr_assert_eq(dt_comm_init(&cfg, &c), DT_STATUS_OK, "%s", dt_error_detail());
    return c;
}

Test(comm_nccl, every_op_world_1_on_device) {
    dt_store_server_t *srv = NULL;
    dt_comm_t *c = open_world_1("gpu", 0.0, &srv);
    enum { N = 1000003 };
    float *h = malloc(N * sizeof(float)), *back = malloc(2 * N * sizeof(float));
    for (int i = 0; i < N; i++) h[i] = (float)(i % 97) * 0.25f;
    float *d_in, *d_out;
    cr_assert_eq(cudaMalloc((void **)&d_in, N * sizeof(float)), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&d_out, N * sizeof(float)), cudaSuccess);
    cudaMemcpy(d_in, h, N * sizeof(float), cudaMemcpyHostToDevice);
    dt_comm_req_t req;
    cr_assert_eq(dt_comm_all_reduce_async(c, d_in, d_out, N, DT_COMM_F32, DT_COMM_AVG, &req), DT_STATUS_OK);
    cr_assert_eq(dt_comm_wait(&req), DT_STATUS_OK, "%s", dt_error_detail());
    cudaMemcpy(back, d_out, N * sizeof(float), cudaMemcpyDeviceToHost);
    cr_assert_eq(memcmp(back, h, N * sizeof(float)), 0);
    cr_assert_eq(dt_comm_reduce_scatter(c, d_in, d_out, N, DT_COMM_F32, DT_COMM_SUM), DT_STATUS_OK, "%s",
                 dt_error_detail());
    cr_assert_eq(dt_comm_all_gather(c, d_in, d_out, N, DT_COMM_F32), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_comm_broadcast(c, d_out, N, DT_COMM_F32, 0), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_comm_barrier(c), DT_STATUS_OK, "%s", dt_error_detail());
    cudaMemcpy(back, d_out, N * sizeof(float), cudaMemcpyDeviceToHost);
    cr_assert_eq(memcmp(back, h, N * sizeof(float)), 0);
    cudaFree(d_in);
    cudaFree(d_out);
    free(h);
    free(back);
    dt_comm_free(c);
    dt_store_server_stop(srv);
}

/* A host function on the legacy default stream: everything queued there after it,
 * and so the communicator's next op (it waits for an event recorded on that stream,
 * comm_nccl.c), stays pending for its duration, as behind a kernel that hangs. */
static void CUDART_CB stall_stream(void *secs) { sleep(*(unsigned *)secs); }

/* The watchdog's own path: an op stalled past comm.timeout_s (1 s) while this
 * thread does not wait in dt_comm_wait (so the waiter's hang detector never runs);
 * the watchdog's thread aborts the NCCL communicator (ncclCommAbort); the op then
 * fails naming the watchdog and the timeout, and later ops fail at once. */
Test(comm_nccl, watchdog_aborts_an_op_stalled_past_the_timeout) {
    dt_store_server_t *srv = NULL;
    dt_comm_t *c = open_world_1("gpuwd", 1.0, &srv);
    enum { N = 4096 };
    float *d_in, *d_out;
    cr_assert_eq(cudaMalloc((void **)&d_in, N * sizeof(float)), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&d_out, N * sizeof(float)), cudaSuccess);
    cr_assert_eq(cudaMemset(d_in, 0, N * sizeof(float)), cudaSuccess);
    /* an op that completes first: the communicator works */
    cr_assert_eq(dt_comm_all_reduce(c, d_in, d_out, N, DT_COMM_F32, DT_COMM_SUM), DT_STATUS_OK, "%s",
                 dt_error_detail());
    static unsigned stall_s = 4;
    cr_assert_eq(cudaLaunchHostFunc(cudaStreamLegacy, stall_stream, &stall_s), cudaSuccess);
    dt_comm_req_t req;
    cr_assert_eq(dt_comm_all_reduce_async(c, d_in, d_out, N, DT_COMM_F32, DT_COMM_SUM, &req), DT_STATUS_OK, "%s",
                 dt_error_detail());
    sleep(3); /* nobody waits: only the watchdog's thread can notice (it looks every 0.1 s) */
    dt_status_t st = dt_comm_wait(&req);
    const char *d = dt_error_detail();
    cr_assert_neq(st, DT_STATUS_OK, "the stalled op completed: the watchdog did not abort it");
    cr_assert(strstr(d, "watchdog") && strstr(d, "did not complete") && strstr(d, "comm.timeout_s 1.0"),
              "status %d: %s", st, d);
    st = dt_comm_all_reduce(c, d_in, d_out, N, DT_COMM_F32, DT_COMM_SUM);
    cr_assert_neq(st, DT_STATUS_OK, "an op after the abort succeeded");
    cr_assert(strstr(dt_error_detail(), "watchdog"), "after the abort: %s", dt_error_detail());
    cudaError_t e = cudaDeviceSynchronize(); /* the stall ends; the device is still usable */
    cr_assert_eq(e, cudaSuccess, "after the stall and the abort: %s", cudaGetErrorString(e));
    cudaFree(d_in);
    cudaFree(d_out);
    dt_comm_free(c);
    dt_store_server_stop(srv);
}
#else
Test(comm_nccl, not_built) { cr_skip_test("built without CUDA"); }
#endif
