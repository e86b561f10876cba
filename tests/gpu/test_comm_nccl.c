/*
 * test_comm_nccl.c - the NCCL communicator on a GPU machine (make gpu-tests):
 * world size 1 through the store, every op on device buffers against the host
 * result. Compiles everywhere CUDA is installed; needs a GPU to run.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "rendezvous/store.h"
#include "runtime/comm/comm.h"

#ifdef DT_USE_CUDA
#include <cuda_runtime.h>

Test(comm_nccl, every_op_world_1_on_device) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) cr_skip_test("no CUDA device");
    dt_store_server_t *srv = NULL;
    cr_assert_eq(dt_store_server_start("127.0.0.1", 0, &srv), DT_STATUS_OK);
    dt_comm_config_t cfg = {.store_host = "127.0.0.1", .store_port = dt_store_server_port(srv), .run_id = "gpu",
                            .world_size = 1, .local_world_size = 1, .backend = DT_COMM_BACKEND_NCCL, .device = 0};
    dt_comm_t *c = NULL;
    cr_assert_eq(dt_comm_init(&cfg, &c), DT_STATUS_OK, "%s", dt_error_detail());
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
#else
Test(comm_nccl, not_built) { cr_skip_test("built without CUDA"); }
#endif
