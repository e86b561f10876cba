/*
 * test_cuemu_blas.cu - the emulated cuBLASLt and cuBLAS against a naive double
 * loop: transposes, odd sizes, padding, batches, epilogues (bias, GELU and its
 * backward), the Lt API's validation, and the v2 GEMMs (test_cuemu.cuh).
 */
#include "tests/cuemu/test_cuemu.cuh"

/* ---- cuBLASLt and cuBLAS against a naive double loop ---------------------------------------------- */
struct mat_t {
    cudaDataType type;
    int rows, cols, ld, batch;
    long long stride;
    std::vector<float> h; /* host values, exactly representable in `type` */
    void *d = nullptr;
};

static size_t tsize(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }
static float round_to(cudaDataType t, float v) { return t == CUDA_R_16BF ? __bfloat162float(__float2bfloat16(v)) : v; }

/* A batch of column-major matrices with random values (or poison-like NaN in the padding). */
static void mat_init(mat_t &m, cudaDataType t, int rows, int cols, int ld, int batch, long long stride, bool fill) {
    m.type = t;
    m.rows = rows;
    m.cols = cols;
    m.ld = ld;
    m.batch = batch;
    m.stride = stride;
    size_t n = batch ? (size_t)((batch - 1) * stride + (long long)(cols - 1) * ld + rows) : 0;
    m.h.assign(n, NAN); /* padding between columns and batches is NaN: it must never be read */
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < cols; j++)
            for (int i = 0; i < rows; i++) m.h[(size_t)(b * stride + (long long)j * ld + i)] = fill ? round_to(t, frand()) : NAN;
    CK(cudaMalloc(&m.d, n * tsize(t)));
    if (t == CUDA_R_16BF) {
        std::vector<__nv_bfloat16> hb(n);
        for (size_t i = 0; i < n; i++) hb[i] = __float2bfloat16(m.h[i]);
        CK(cudaMemcpy(m.d, hb.data(), n * 2, cudaMemcpyHostToDevice));
    } else {
        CK(cudaMemcpy(m.d, m.h.data(), n * 4, cudaMemcpyHostToDevice));
    }
}

static std::vector<float> mat_download(const void *d, cudaDataType t, size_t n) {
    std::vector<float> out(n);
    if (t == CUDA_R_16BF) {
        std::vector<__nv_bfloat16> hb(n);
        CK(cudaMemcpy(hb.data(), d, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) out[i] = __bfloat162float(hb[i]);
    } else {
        CK(cudaMemcpy(out.data(), d, n * 4, cudaMemcpyDeviceToHost));
    }
    return out;
}

static double gelu_ref(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double dgelu_ref(double x) {
    double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

static void expect_close(float got, double ref, cudaDataType t, double scale, const char *what, int i, int j, int b) {
    double tol = t == CUDA_R_16BF ? 2e-3 * scale + 8e-3 * fabs(ref) : 2e-5 * scale + 2e-5 * fabs(ref);
    cr_assert(fabs((double)got - ref) <= tol, "%s (%d,%d) batch %d: got %.7g, expected %.7g (tol %.2g)", what, i, j, b,
              got, ref, tol);
}

struct lt_case {
    bool ta, tb;
    int m, n, k, pad; /* pad: extra leading-dimension rows */
    int batch;
    cudaDataType ab, cd;
    cublasLtEpilogue_t epi;
    float alpha, beta;
};

/* Runs one cublasLtMatmul and checks D (and bias / aux outputs) against doubles. Returns
 * false when the library does not support the case (real GPU only). */
static bool run_lt_case(const lt_case &c) {
    const int arows = c.ta ? c.k : c.m, acols = c.ta ? c.m : c.k;
    const int brows = c.tb ? c.n : c.k, bcols = c.tb ? c.k : c.n;
    const int lda = arows + c.pad, ldb = brows + c.pad, ldc = c.m + c.pad;
    const long long sa = (long long)lda * acols + 3, sb = (long long)ldb * bcols + 5, sc = (long long)ldc * c.n + 7;
    mat_t A, B, C, D;
    mat_init(A, c.ab, arows, acols, lda, c.batch, sa, true);
    mat_init(B, c.ab, brows, bcols, ldb, c.batch, sb, true);
    mat_init(C, c.cd, c.m, c.n, ldc, c.batch, sc, c.beta != 0.0f);
    mat_init(D, c.cd, c.m, c.n, ldc, c.batch, sc, false);
    const uint32_t e = c.epi;
    const bool bias_in = e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
                         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS;
    const bool bias_out = e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
    const bool aux_out = e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool aux_in = e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    const int bias_len = e == CUBLASLT_EPILOGUE_BGRADB ? c.n : c.m;
    const int aux_ld = (c.m + 7) / 8 * 8 + 8;
    mat_t bias, aux;
    if (bias_in || bias_out) mat_init(bias, c.cd, bias_len, 1, bias_len, 1, bias_len, bias_in);
    if (aux_in || aux_out) mat_init(aux, c.cd, c.m, c.n, aux_ld, 1, (long long)aux_ld * c.n, aux_in);

    cublasLtHandle_t lt;
    CKB(cublasLtCreate(&lt));
    cublasLtMatmulDesc_t desc;
    CKB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    if (bias.d) CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias.d, sizeof bias.d));
    if (aux.d) {
        int64_t ald = aux_ld;
        CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux.d, sizeof aux.d));
        CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ald, sizeof ald));
    }
    cublasLtMatrixLayout_t la, lb, lc;
    CKB(cublasLtMatrixLayoutCreate(&la, c.ab, arows, acols, lda));
    CKB(cublasLtMatrixLayoutCreate(&lb, c.ab, brows, bcols, ldb));
    CKB(cublasLtMatrixLayoutCreate(&lc, c.cd, c.m, c.n, ldc));
    if (c.batch > 1) {
        int32_t bc = c.batch;
        int64_t s[3] = {sa, sb, sc};
        cublasLtMatrixLayout_t ls[3] = {la, lb, lc};
        for (int i = 0; i < 3; i++) {
            CKB(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
            CKB(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s[i], sizeof s[i]));
        }
    }
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws_bytes = 32u << 20;
    void *ws = nullptr;
    CK(cudaMalloc(&ws, ws_bytes));
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t heur;
    int nres = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heur, &nres);
    bool ran = false;
#ifdef DT_CUEMU
    cr_assert_eq(hs, CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(nres, 1);
#endif
    cublasStatus_t ms = CUBLAS_STATUS_NOT_SUPPORTED;
    if (hs == CUBLAS_STATUS_SUCCESS && nres > 0)
        ms = cublasLtMatmul(lt, desc, &c.alpha, A.d, la, B.d, lb, &c.beta, C.d, lc, D.d, lc, &heur.algo, ws, ws_bytes, 0);
#ifdef DT_CUEMU
    cr_assert_eq(ms, CUBLAS_STATUS_SUCCESS);
#else
    /* A real library may decline a layout (odd leading dimensions or strides): skipped. */
    cr_assert(ms == CUBLAS_STATUS_SUCCESS || ms == CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul: status %d", (int)ms);
#endif
    if (ms == CUBLAS_STATUS_SUCCESS) {
        CK(cudaDeviceSynchronize());
        ran = true;
        std::vector<float> d = mat_download(D.d, c.cd, D.h.size());
        std::vector<float> bo = bias_out ? mat_download(bias.d, c.cd, bias.h.size()) : std::vector<float>();
        std::vector<float> ao = aux_out ? mat_download(aux.d, c.cd, aux.h.size()) : std::vector<float>();
        for (int b = 0; b < c.batch; b++) {
            std::vector<double> bg(c.m, 0.0);
            for (int j = 0; j < c.n; j++)
                for (int i = 0; i < c.m; i++) {
                    double acc = 0, scale = 0;
                    for (int kk = 0; kk < c.k; kk++) {
                        double av = c.ta ? A.h[b * sa + (long long)i * lda + kk] : A.h[b * sa + (long long)kk * lda + i];
                        double bv = c.tb ? B.h[b * sb + (long long)kk * ldb + j] : B.h[b * sb + (long long)j * ldb + kk];
                        acc += av * bv;
                        scale += fabs(av * bv);
                    }
                    double v = c.alpha * acc;
                    if (c.beta != 0.0f) v += c.beta * C.h[b * sc + (long long)j * ldc + i];
                    if (bias_in) v += bias.h[i];
                    if (aux_out) expect_close(ao[(size_t)j * aux_ld + i], v, c.cd, scale + 1, "aux", i, j, b);
                    if (e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS) v = v > 0 ? v : 0;
                    if (e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || aux_out) v = gelu_ref(v);
                    if (aux_in) v *= dgelu_ref(aux.h[(size_t)j * aux_ld + i]);
                    bg[i] += v;
                    expect_close(d[b * sc + (long long)j * ldc + i], v, c.cd, scale + 1, "D", i, j, b);
                }
            if (e == CUBLASLT_EPILOGUE_DGELU_BGRAD)
                for (int i = 0; i < c.m; i++) expect_close(bo[i], bg[i], c.cd, c.n * 2.0, "bias grad", i, 0, b);
        }
        if (e == CUBLASLT_EPILOGUE_BGRADA)
            for (int i = 0; i < c.m; i++) {
                double s = 0;
                for (int kk = 0; kk < c.k; kk++) s += c.ta ? A.h[(long long)i * lda + kk] : A.h[(long long)kk * lda + i];
                expect_close(bo[i], s, c.cd, c.k, "bgrada", i, 0, 0);
            }
        if (e == CUBLASLT_EPILOGUE_BGRADB)
            for (int j = 0; j < c.n; j++) {
                double s = 0;
                for (int kk = 0; kk < c.k; kk++) s += c.tb ? B.h[(long long)kk * ldb + j] : B.h[(long long)j * ldb + kk];
                expect_close(bo[j], s, c.cd, c.k, "bgradb", j, 0, 0);
            }
        /* Padding between columns and batches of D is never written. */
        for (size_t i = 0; i < d.size(); i++) {
            long long b = (long long)i / sc, r = (long long)i % sc;
            bool inside = b < c.batch && r < (long long)ldc * c.n && r % ldc < c.m;
            if (!inside) cr_assert(isnan(d[i]), "D element %zu outside the matrices was written", i);
        }
    } else {
        fprintf(stderr, "cuBLASLt on this GPU does not support: ta %d tb %d %dx%dx%d pad %d batch %d types %d/%d "
                        "epilogue %d (heuristic %d, matmul %d)\n",
                c.ta, c.tb, c.m, c.n, c.k, c.pad, c.batch, (int)c.ab, (int)c.cd, (int)c.epi, (int)hs, (int)ms);
    }
    cudaFree(ws);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    for (mat_t *mm : {&A, &B, &C, &D, &bias, &aux})
        if (mm->d) cudaFree(mm->d);
    return ran;
}

/* Every case runs in the emulator; a real library may decline odd layouts (skipped). */
static void expect_ran(int ran, int total) {
#ifdef DT_CUEMU
    cr_assert_eq(ran, total);
#else
    cr_assert_gt(ran, 0, "cuBLASLt ran none of the %d cases", total);
#endif
}

Test(cuemu_blas, lt_transposes_odd_sizes_padding) {
    const cudaDataType types[2][2] = {{CUDA_R_32F, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF}};
    int ran = 0, total = 0;
    for (int ty = 0; ty < 2; ty++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                lt_case c = {ta != 0, tb != 0, 37, 23, 29, 0, 1, types[ty][0], types[ty][1], CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 0.0f};
                ran += run_lt_case(c);
                c.pad = 5; /* lda > rows */
                c.alpha = 0.5f;
                c.beta = -1.5f;
                ran += run_lt_case(c);
                total += 2;
            }
    lt_case mixed = {true, false, 16, 9, 40, 3, 1, CUDA_R_16BF, CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 1.0f};
    ran += run_lt_case(mixed); /* bf16 inputs with fp32 output */
    expect_ran(ran, total + 1);
}

Test(cuemu_blas, lt_batched_strided) {
    lt_case c = {false, true, 13, 17, 8, 2, 4, CUDA_R_32F, CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 0.0f};
    int ran = run_lt_case(c);
    c.ab = c.cd = CUDA_R_16BF;
    c.ta = true;
    ran += run_lt_case(c);
    c.pad = 0; /* 16-byte aligned columns; the batch strides stay odd */
    c.m = c.k = 16;
    ran += run_lt_case(c);
    expect_ran(ran, 3);
}

Test(cuemu_blas, lt_epilogues) {
    const cublasLtEpilogue_t epis[] = {CUBLASLT_EPILOGUE_RELU,     CUBLASLT_EPILOGUE_BIAS,          CUBLASLT_EPILOGUE_RELU_BIAS,
                                       CUBLASLT_EPILOGUE_GELU,     CUBLASLT_EPILOGUE_GELU_BIAS,     CUBLASLT_EPILOGUE_GELU_AUX,
                                       CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_DGELU_BGRAD,
                                       CUBLASLT_EPILOGUE_BGRADA,   CUBLASLT_EPILOGUE_BGRADB};
    int ran = 0, total = 0;
    for (cublasLtEpilogue_t e : epis)
        for (int ty = 0; ty < 2; ty++) {
            cudaDataType t = ty ? CUDA_R_16BF : CUDA_R_32F;
            /* The layouts llm.c uses: forward T/N, backward data N/N, backward weights N/T. */
            bool ta = e == CUBLASLT_EPILOGUE_BGRADA || e <= CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
            bool tb = e == CUBLASLT_EPILOGUE_BGRADB;
            lt_case c = {ta, tb, 24, 19, 33, 0, 1, t, t, e, 1.0f, 0.0f};
            total++;
            ran += run_lt_case(c);
        }
    expect_ran(ran, total);
}

Test(cuemu_blas, lt_validation) {
    cublasLtHandle_t lt;
    CKB(cublasLtCreate(&lt));
    cublasLtMatmulDesc_t desc;
    CKB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    float *a, *b, *d;
    CK(cudaMalloc(&a, 64 * 64 * 4));
    CK(cudaMalloc(&b, 64 * 64 * 4));
    CK(cudaMalloc(&d, 64 * 64 * 4));
    cublasLtMatrixLayout_t la, lb, ld, lbad, l16;
    CKB(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 8, 8, 8));
    CKB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 8, 8, 8));
    CKB(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 8, 8, 8));
    CKB(cublasLtMatrixLayoutCreate(&lbad, CUDA_R_32F, 8, 8, 4)); /* ld < rows */
    CKB(cublasLtMatrixLayoutCreate(&l16, CUDA_R_16BF, 8, 8, 8));
    float one = 1.0f, zero = 0.0f;
    CKB(cublasLtMatmul(lt, desc, &one, a, la, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0));
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, a, lbad, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE, "ld < rows");
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, a, l16, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_SUPPORTED, "A bf16 with B fp32");
    cr_assert_eq(cublasLtMatmul(NULL, desc, &one, a, la, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_INITIALIZED);
#ifdef DT_CUEMU
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, NULL, la, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE, "null A");
    cublasLtMatrixLayout_t lbig;
    CKB(cublasLtMatrixLayoutCreate(&lbig, CUDA_R_32F, 8, 8, 1000)); /* spans past the 16 KiB buffer */
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, a, lbig, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE, "A read past its buffer");
    int32_t row = CUBLASLT_ORDER_ROW;
    CKB(cublasLtMatrixLayoutSetAttribute(lbig, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row));
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, a, lbig, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_SUPPORTED, "row-major order");
    cublasLtMatrixLayoutDestroy(lbig);
    uint32_t e = CUBLASLT_EPILOGUE_GELU_AUX;
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, a, la, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE, "GELU_AUX without an aux pointer");
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, 2), CUBLAS_STATUS_INVALID_VALUE,
                 "attribute of the wrong size");
    e = CUBLASLT_EPILOGUE_DEFAULT;
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    /* An algorithm chosen for 256-byte alignment refuses a pointer 4 bytes in; one chosen
     * with MIN_ALIGNMENT_A_BYTES = 4 takes it. */
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    uint32_t a256 = 256;
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a256, sizeof a256));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CKB(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &found));
    cr_assert_eq(found, 1);
    CKB(cublasLtMatmul(lt, desc, &one, a, la, b, lb, &zero, d, ld, d, ld, &heur.algo, NULL, 0, 0));
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, a + 1, la, b, lb, &zero, d, ld, d, ld, &heur.algo, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_SUPPORTED, "A 4 bytes off an algorithm's 256-byte alignment");
    uint32_t four = 4;
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &four, sizeof four));
    CKB(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &found));
    CKB(cublasLtMatmul(lt, desc, &one, a + 1, la, b, lb, &zero, d, ld, d, ld, &heur.algo, NULL, 0, 0));
    cublasLtMatmulPreferenceDestroy(pref);
#endif
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatrixLayoutDestroy(lbad);
    cublasLtMatrixLayoutDestroy(l16);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    cr_assert_str_eq(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
    cudaFree(a); cudaFree(b); cudaFree(d);
}

/* cuBLAS v2: GemmStridedBatchedEx / GemmEx / Sgemm / GemmBatchedEx (C = alpha op(A) op(B) + beta C in place). */
static void run_v2_case(cublasHandle_t h, bool ta, bool tb, int m, int n, int k, int pad, int batch, cudaDataType ab,
                        cudaDataType cd, float alpha, float beta, int api) {
    const int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    const int lda = arows + pad, ldb = brows + pad, ldc = m + pad;
    const long long sa = (long long)lda * acols + 1, sb = (long long)ldb * bcols, sc = (long long)ldc * n + 2;
    mat_t A, B, C;
    mat_init(A, ab, arows, acols, lda, batch, sa, true);
    mat_init(B, ab, brows, bcols, ldb, batch, sb, true);
    mat_init(C, cd, m, n, ldc, batch, sc, beta != 0.0f);
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (api == 0)
        CKB(cublasGemmStridedBatchedEx(h, oa, ob, m, n, k, &alpha, A.d, ab, lda, sa, B.d, ab, ldb, sb, &beta, C.d, cd,
                                       ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else if (api == 1)
        CKB(cublasGemmEx(h, oa, ob, m, n, k, &alpha, A.d, ab, lda, B.d, ab, ldb, &beta, C.d, cd, ldc, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT));
    else if (api == 2)
        CKB(cublasSgemm(h, oa, ob, m, n, k, &alpha, (const float *)A.d, lda, (const float *)B.d, ldb, &beta,
                        (float *)C.d, ldc));
    else { /* GemmBatchedEx: the same members through device arrays of pointers, last member first */
        std::vector<void *> ptrs(3 * (size_t)batch);
        for (int b = 0; b < batch; b++) {
            int at = batch - 1 - b;
            ptrs[at] = (char *)A.d + b * sa * (long long)tsize(ab);
            ptrs[batch + at] = (char *)B.d + b * sb * (long long)tsize(ab);
            ptrs[2 * batch + at] = (char *)C.d + b * sc * (long long)tsize(cd);
        }
        void **dp;
        CK(cudaMalloc(&dp, ptrs.size() * sizeof(void *)));
        CK(cudaMemcpy(dp, ptrs.data(), ptrs.size() * sizeof(void *), cudaMemcpyHostToDevice));
        CKB(cublasGemmBatchedEx(h, oa, ob, m, n, k, &alpha, (const void *const *)dp, ab, lda,
                                (const void *const *)(dp + batch), ab, ldb, &beta, dp + 2 * batch, cd, ldc, batch,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        CK(cudaDeviceSynchronize());
        cudaFree(dp);
    }
    CK(cudaDeviceSynchronize());
    std::vector<float> c = mat_download(C.d, cd, C.h.size());
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double acc = 0, scale = 0;
                for (int kk = 0; kk < k; kk++) {
                    double av = ta ? A.h[b * sa + (long long)i * lda + kk] : A.h[b * sa + (long long)kk * lda + i];
                    double bv = tb ? B.h[b * sb + (long long)kk * ldb + j] : B.h[b * sb + (long long)j * ldb + kk];
                    acc += av * bv;
                    scale += fabs(av * bv);
                }
                double v = alpha * acc + (beta != 0.0f ? beta * C.h[b * sc + (long long)j * ldc + i] : 0.0);
                expect_close(c[b * sc + (long long)j * ldc + i], v, cd, scale + 1, "C", i, j, b);
            }
    cudaFree(A.d); cudaFree(B.d); cudaFree(C.d);
}

Test(cuemu_blas, v2_gemm_strided_batched_gemmex_sgemm) {
    cublasHandle_t h;
    CKB(cublasCreate(&h));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    CKB(cublasSetStream(h, s));
    CKB(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            run_v2_case(h, ta, tb, 11, 7, 13, 0, 3, CUDA_R_32F, CUDA_R_32F, 1.0f, 0.0f, 0);
            run_v2_case(h, ta, tb, 11, 7, 13, 2, 3, CUDA_R_16BF, CUDA_R_16BF, 0.125f, 0.5f, 0);
            run_v2_case(h, ta, tb, 16, 5, 3, 1, 1, CUDA_R_16BF, CUDA_R_32F, 1.0f, 1.0f, 1);
            run_v2_case(h, ta, tb, 9, 10, 17, 3, 1, CUDA_R_32F, CUDA_R_32F, -2.0f, 0.25f, 2);
            run_v2_case(h, ta, tb, 11, 7, 13, 2, 3, CUDA_R_16BF, CUDA_R_16BF, 0.125f, 0.5f, 3);
            run_v2_case(h, ta, tb, 9, 10, 17, 1, 4, CUDA_R_32F, CUDA_R_32F, -2.0f, 0.25f, 3);
        }
    float *a, one = 1.0f;
    CK(cudaMalloc(&a, 64 * 4));
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a, CUDA_R_32F, 4, a, CUDA_R_32F, 8, &one, a,
                              CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_INVALID_VALUE, "lda < m");
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 8, 8, &one, a, CUDA_R_32F, 8, a, CUDA_R_32F, 8, &one, a,
                              CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_INVALID_VALUE, "m < 0");
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a, CUDA_R_32F, 8, a, CUDA_R_32F, 8, &one, a,
                              CUDA_R_16BF, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_NOT_SUPPORTED, "fp32 inputs with a bf16 output");
#ifdef DT_CUEMU
    { /* the emulator's batched-pointer checks: arrays on the host, two members with one C */
        float *c2;
        CK(cudaMalloc(&c2, 128 * 4));
        const void *hostp[2] = {a, a};
        void *hostc[2] = {c2, c2 + 64};
        void **dp;
        CK(cudaMalloc(&dp, 6 * sizeof(void *)));
        cr_assert_eq(cublasGemmBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, hostp, CUDA_R_32F, 8, hostp,
                                         CUDA_R_32F, 8, &one, hostc, CUDA_R_32F, 8, 2, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_INVALID_VALUE, "pointer arrays on the host");
        void *same[6] = {a, a, a, a, c2, c2};
        CK(cudaMemcpy(dp, same, sizeof same, cudaMemcpyHostToDevice));
        cr_assert_eq(cublasGemmBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, (const void *const *)dp,
                                         CUDA_R_32F, 8, (const void *const *)(dp + 2), CUDA_R_32F, 8, &one, dp + 4,
                                         CUDA_R_32F, 8, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_INVALID_VALUE, "two members write one C");
        cudaFree(dp);
        cudaFree(c2);
    }
#endif
    cudaFree(a);
    CKB(cublasDestroy(h));
    CK(cudaStreamDestroy(s));
    cr_assert_str_eq(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
}
