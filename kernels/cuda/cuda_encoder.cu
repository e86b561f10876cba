/*
 * cuda_encoder.cu - token + position embedding on the GPU: encoder_forward and a
 * deterministic encoder_backward (kernels.h).
 *
 * Forward: one thread per 16 bytes of output (8 bf16 or 4 fp32 channels) when C
 * and the pointers allow it, else one thread per channel.
 *
 * Backward, dwte: several positions may hold the same token, and their rows of
 * dout must be summed into dwte in a fixed order. Float atomics would add them in
 * whatever order the hardware schedules, so instead the positions are grouped by
 * token on the device and each group is summed in position order:
 *   1. count positions per hash bucket (token & (HBUCKETS-1)) with integer
 *      atomics (exact, so order-free);
 *   2. exclusive scan of the counts -> each bucket's start (one block);
 *   3. scatter each position into its bucket (slots in arbitrary order);
 *   4. rank each position inside its bucket by the key (token, position) and write
 *      it at start + rank: the buckets are now sorted by token, then position;
 *   5. one block per run of equal tokens (a run head is where the token changes)
 *      and per 128 channels: each thread sums its channel over the run in position
 *      order in fp32, then adds the sum to dwte once.
 * Steps 1-4 touch ints only (B*T positions and their tokens, plus 3 x 64K bucket
 * counters); step 4 costs each position its bucket's size, so sum over tokens of
 * count^2 compares: for GPT-2 text with B*T = 16K the largest runs (" the", ",",
 * ".") hold a few hundred positions, i.e. a few million compares spread over 16K
 * threads, reading (position, token) pairs that the threads of a bucket share in
 * L1: tens of microseconds. Step 5 reads dout once (B*T*C elements) and writes
 * each touched dwte row once; a thread walks its run 8 positions per step with the
 * loads of a step independent, so a run of r positions costs ~3 r/8 memory
 * latencies (~40 us for r = 600 at ~0.5 us per chain), overlapped with the other
 * runs. The grid has B*T x C/128 blocks; those not at a run head exit at once.
 * The worst case (every position the same token) degrades to one run of B*T and
 * (B*T)^2 compares: correct, a few milliseconds instead of tens of microseconds.
 * Tokens need not be < HBUCKETS: two tokens sharing a bucket are kept apart by the
 * (token, position) sort. V is not an argument of the op, hence the hash rather
 * than a table of V counters. Ids < 0 (tensor parallelism: another rank's
 * vocabulary row, (T-1)/T of the positions) take no part: steps 1-4 skip them, so
 * the sorted positions are a prefix of `sorted` and its tail stays -1, which step 5
 * skips (one bucket of all of them would cost (B*T)^2 compares every backward).
 *
 * Backward, dwpe: dwpe[t, c] += sum over b of dout[b, t, c], b in order, one thread
 * per (t, c). With positions (kernels.h: pos, packed sequences) position p is row p
 * of every document: one block lists the document starts (rows where pos is 0) in
 * row order, then one thread per (p, c) walks that list and adds row s + p of each
 * document long enough (pos[s + p] == p), in fp32, in row order, into dwpe once.
 * A thread costs one step per document: documents of a few hundred rows make this
 * cheap; B*T documents of one row (every pos 0) is the slow end, B*T steps each.
 */
#include "kernels/cuda/cuda_layers.cuh"

#define HBUCKETS 65536 /* power of two; > GPT-2's 50257 tokens, so no sharing there */
#define SCAN_THREADS 256
#define RUN_UNROLL 8

/* ---- forward ------------------------------------------------------------- */

template <typename S, int N>
__global__ void encoder_forward_kernel(S *out, const int *inp, const S *wte, const S *wpe,
                                       const int *pos, int BT, int T, int C) {
    int per_row = C / N;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)BT * per_row) return;
    int bt = (int)(i / per_row), c = (int)(i % per_row) * N;
    int t = pos ? pos[bt] : bt % T, tok = inp[bt];
    dt_vec<S, N> e;
    if (tok >= 0) e = dt_vec_ld<S, N>(wte + (size_t)tok * C + c);
    else /* another rank's vocabulary row (tensor parallelism) */
        for (int k = 0; k < N; k++) e.v[k] = dt_st<S>(0.0f);
    if (!wpe) { /* no position table: the token's row */
        dt_vec_st<S, N>(out + (size_t)bt * C + c, e);
        return;
    }
    dt_vec<S, N> p = dt_vec_ld<S, N>(wpe + (size_t)t * C + c);
    dt_vec<S, N> o;
    for (int k = 0; k < N; k++) o.v[k] = dt_st<S>(dt_ld(e.v[k]) + dt_ld(p.v[k]));
    dt_vec_st<S, N>(out + (size_t)bt * C + c, o);
}

template <typename S>
static void encoder_forward(dt_device_t *dev, void *out, const int *inp, const void *wte,
                            const void *wpe, const int *pos, int B, int T, int C) {
    constexpr int W = dt_vec_width<S>();
    int vec = C % W == 0 && dt_cuda_aligned16(out) && dt_cuda_aligned16(wte) &&
              dt_cuda_aligned16(wpe);
    void (*kernel)(S *, const int *, const S *, const S *, const int *, int, int, int) =
        vec ? encoder_forward_kernel<S, W> : encoder_forward_kernel<S, 1>;
    size_t items = (size_t)B * T * (vec ? C / W : C);
    DT_LAUNCH(kernel, dt_blocks(items, 256), 256, 0, dt_cuda_stream(dev))
    ((S *)out, inp, (const S *)wte, (const S *)wpe, pos, B * T, T, C);
    DT_CUDA_LAUNCHED(dev);
}

/* ---- backward: grouping positions by token -------------------------------- */

__global__ void encoder_fill_kernel(int *x, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

__global__ void encoder_count_kernel(int *count, const int *inp, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && inp[i] >= 0) atomicAdd(&count[inp[i] & (HBUCKETS - 1)], 1);
}

/* One block of SCAN_THREADS: start[h] = sum of count[0..h). */
__global__ void encoder_scan_kernel(int *start, const int *count) {
    __shared__ int part[SCAN_THREADS];
    const int per = HBUCKETS / SCAN_THREADS;
    int tid = threadIdx.x, base = tid * per;
    int sum = 0;
    for (int i = 0; i < per; i++) sum += count[base + i];
    part[tid] = sum;
    __syncthreads();
    if (tid == 0) {
        int run = 0;
        for (int i = 0; i < SCAN_THREADS; i++) {
            int c = part[i];
            part[i] = run;
            run += c;
        }
    }
    __syncthreads();
    int run = part[tid];
    for (int i = 0; i < per; i++) {
        start[base + i] = run;
        run += count[base + i];
    }
}

/* bucket holds (position, token) pairs, so that ranking reads no token by index. */
__global__ void encoder_scatter_kernel(int2 *bucket, int *cursor, const int *start, const int *inp,
                                       int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int tok = inp[i], h = tok & (HBUCKETS - 1);
    if (tok < 0) return;
    bucket[start[h] + atomicAdd(&cursor[h], 1)] = make_int2(i, tok);
}

/* Position i goes to start + (number of positions of its bucket ordered before it
 * by (token, position)). Keys are distinct, so the ranks are a permutation. */
__global__ void encoder_rank_kernel(int *sorted, const int2 *bucket, const int *start,
                                    const int *count, const int *inp, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int tok = inp[i], h = tok & (HBUCKETS - 1);
    if (tok < 0) return;
    int s0 = start[h], m = count[h], rank = 0;
    for (int k = 0; k < m; k++) {
        int2 e = bucket[s0 + k]; /* (position, token) */
        rank += e.y < tok || (e.y == tok && e.x < i);
    }
    sorted[s0 + rank] = i;
}

/* blockIdx.x: an index s into sorted; blockIdx.y: a slice of blockDim.x channels.
 * Only the block at the head of a run of equal tokens works. */
template <typename S>
__global__ void encoder_dwte_kernel(S *dwte, const S *dout, const int *sorted, const int *inp,
                                    int n, int C) {
    int s = blockIdx.x;
    if (sorted[s] < 0) return; /* past the sorted prefix: ids < 0 */
    int tok = inp[sorted[s]];
    if (s > 0 && inp[sorted[s - 1]] == tok) return;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    /* RUN_UNROLL positions per step: their indices, tokens and rows are loaded
     * independently (one memory latency each per step, not per position); the
     * additions stay in position order. The run is contiguous in sorted, so the
     * first position of another token ends it. */
    float acc = 0.0f;
    for (int r = s; r < n; r += RUN_UNROLL) {
        int pos[RUN_UNROLL];
        bool in[RUN_UNROLL];
        for (int k = 0; k < RUN_UNROLL; k++) pos[k] = r + k < n ? sorted[r + k] : -1;
        for (int k = 0; k < RUN_UNROLL; k++) in[k] = pos[k] >= 0 && inp[pos[k]] == tok;
        float d[RUN_UNROLL];
        for (int k = 0; k < RUN_UNROLL; k++) d[k] = in[k] ? dt_ld(dout[(size_t)pos[k] * C + c]) : 0.0f;
        for (int k = 0; k < RUN_UNROLL; k++)
            if (in[k]) acc += d[k];
        if (!in[RUN_UNROLL - 1]) break;
    }
    S *w = dwte + (size_t)tok * C + c;
    *w = dt_st<S>(dt_ld(*w) + acc);
}

template <typename S>
__global__ void encoder_dwpe_kernel(S *dwpe, const S *dout, int B, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t TC = (size_t)T * C;
    if (i >= TC) return;
    float acc = dt_ld(dwpe[i]);
    for (int b = 0; b < B; b++) acc += dt_ld(dout[(size_t)b * TC + i]);
    dwpe[i] = dt_st<S>(acc);
}

/* One block of SCAN_THREADS over the n rows' positions: starts[0] = the number of
 * documents, starts[1 ..] their first rows in row order. Each thread takes a
 * contiguous run of rows; the runs' counts are scanned in thread order. */
__global__ void encoder_doc_starts_kernel(int *starts, const int *pos, int n) {
    __shared__ int part[SCAN_THREADS];
    int tid = threadIdx.x, per = (n + SCAN_THREADS - 1) / SCAN_THREADS;
    int r0 = min(tid * per, n), r1 = min(r0 + per, n), cnt = 0;
    for (int r = r0; r < r1; r++) cnt += pos[r] == 0;
    part[tid] = cnt;
    __syncthreads();
    if (tid == 0) {
        int run = 0;
        for (int i = 0; i < SCAN_THREADS; i++) {
            int c = part[i];
            part[i] = run;
            run += c;
        }
        starts[0] = run;
    }
    __syncthreads();
    int k = part[tid];
    for (int r = r0; r < r1; r++)
        if (pos[r] == 0) starts[1 + k++] = r;
}

/* One thread per (p, c) of dwpe's first T rows: row s + p of every document s that
 * reaches it, in document order. */
template <typename S>
__global__ void encoder_dwpe_pos_kernel(S *dwpe, const S *dout, const int *pos, const int *starts, int n, int T,
                                        int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    int p = (int)(i / C), c = (int)(i % C), nd = starts[0];
    float acc = dt_ld(dwpe[i]);
    for (int d = 0; d < nd; d++) {
        int r = starts[1 + d] + p;
        if (r < n && pos[r] == p) acc += dt_ld(dout[(size_t)r * C + c]);
    }
    dwpe[i] = dt_st<S>(acc);
}

template <typename S>
static void encoder_backward(dt_device_t *dev, void *dwte, void *dwpe, const void *dout,
                             const int *inp, const int *pos, int B, int T, int C) {
    cudaStream_t st = dt_cuda_stream(dev);
    int n = B * T;
    if (dwpe && pos && n > 0) {
        int *starts = (int *)dt_cuda_layer_scratch(dev, sizeof(int) * ((size_t)n + 1), __func__);
        if (!starts) return;
        DT_LAUNCH(encoder_doc_starts_kernel, 1, SCAN_THREADS, 0, st)(starts, pos, n);
        DT_CUDA_LAUNCHED(dev);
        size_t TC = (size_t)T * C;
        DT_LAUNCH(encoder_dwpe_pos_kernel<S>, dt_blocks(TC, 256), 256, 0, st)
        ((S *)dwpe, (const S *)dout, pos, starts, n, T, C);
        DT_CUDA_LAUNCHED(dev);
    } else if (dwpe) {
        size_t TC = (size_t)T * C;
        DT_LAUNCH(encoder_dwpe_kernel<S>, dt_blocks(TC, 256), 256, 0, st)
        ((S *)dwpe, (const S *)dout, B, T, C);
        DT_CUDA_LAUNCHED(dev);
    }
    if (!dwte || n == 0) return;
    /* scratch: count, cursor, start (HBUCKETS ints each), sorted (n ints), bucket
     * (n int2, 8-byte aligned: HBUCKETS * 3 + n is even when n is, else padded) */
    size_t ints = 3 * (size_t)HBUCKETS + (size_t)n + (n & 1);
    int *count = (int *)dt_cuda_layer_scratch(dev, sizeof(int) * ints + sizeof(int2) * (size_t)n,
                                              __func__);
    if (!count) return;
    int *cursor = count + HBUCKETS, *start = cursor + HBUCKETS, *sorted = start + HBUCKETS;
    int2 *bucket = (int2 *)(count + ints);

    DT_LAUNCH(encoder_fill_kernel, dt_blocks(2 * HBUCKETS, 256), 256, 0, st)(count, 2 * HBUCKETS, 0);
    DT_CUDA_LAUNCHED(dev);
    DT_LAUNCH(encoder_fill_kernel, dt_blocks(n, 256), 256, 0, st)(sorted, n, -1);
    DT_CUDA_LAUNCHED(dev);
    DT_LAUNCH(encoder_count_kernel, dt_blocks(n, 256), 256, 0, st)(count, inp, n);
    DT_CUDA_LAUNCHED(dev);
    DT_LAUNCH(encoder_scan_kernel, 1, SCAN_THREADS, 0, st)(start, count);
    DT_CUDA_LAUNCHED(dev);
    DT_LAUNCH(encoder_scatter_kernel, dt_blocks(n, 256), 256, 0, st)(bucket, cursor, start, inp, n);
    DT_CUDA_LAUNCHED(dev);
    DT_LAUNCH(encoder_rank_kernel, dt_blocks(n, 256), 256, 0, st)(sorted, bucket, start, count, inp, n);
    DT_CUDA_LAUNCHED(dev);
    dim3 grid((unsigned)n, dt_blocks(C, 128));
    DT_LAUNCH(encoder_dwte_kernel<S>, grid, 128, 0, st)
    ((S *)dwte, (const S *)dout, sorted, inp, n, C);
    DT_CUDA_LAUNCHED(dev);
}

void dt_cuda_fill_encoder_ops(dt_ops_t *ops, dt_dtype_t dtype) {
    if (dtype == DT_DTYPE_BF16) {
        ops->encoder_forward = encoder_forward<dt_bf16>;
        ops->encoder_backward = encoder_backward<dt_bf16>;
    } else {
        ops->encoder_forward = encoder_forward<float>;
        ops->encoder_backward = encoder_backward<float>;
    }
}
