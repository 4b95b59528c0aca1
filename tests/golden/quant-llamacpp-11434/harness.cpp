// Cross-check harness (not part of keel): runs llama.cpp 11434's quantizers, dequantizers,
// activation quantizers and mul_mat (plain CPU buffer = vec_dot path; CPU_REPACK buffer =
// repacked gemv/gemm path) on inputs from a file, writing raw outputs.
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-alloc.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <string>
#include <vector>

static std::vector<char> slurp(const char * p) {
    FILE * f = fopen(p, "rb"); if (!f) { perror(p); exit(1); }
    fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    std::vector<char> v(n); if (fread(v.data(), 1, n, f) != (size_t) n) exit(1); fclose(f); return v;
}
static void dump(const std::string & p, const void * d, size_t n) {
    FILE * f = fopen(p.c_str(), "wb"); fwrite(d, 1, n, f); fclose(f);
}

static ggml_backend_buffer_type_t repack_buft(ggml_backend_t be) {
    ggml_backend_dev_t dev = ggml_backend_get_device(be);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * b = get(dev); b && *b; ++b) {
        if (std::string(ggml_backend_buft_name(*b)) == "CPU_REPACK") return *b;
    }
    return nullptr;
}

// y[c*rows_w + r] = W[r] . X[c]
static std::vector<float> matmul(ggml_backend_t be, ggml_backend_buffer_type_t wbuft, ggml_type t, const void * wq, int n, int rows_w, const float * xa, int rows_a) {
    ggml_init_params ip = { 4 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * wctx = ggml_init(ip);
    ggml_tensor * W = ggml_new_tensor_2d(wctx, t, n, rows_w);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, wbuft);
    ggml_backend_tensor_set(W, wq, 0, ggml_nbytes(W));
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * X = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, rows_a);
    ggml_tensor * Y = ggml_mul_mat(ctx, W, X);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, Y);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    ggml_backend_tensor_set(X, xa, 0, ggml_nbytes(X));
    if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); exit(1); }
    std::vector<float> y((size_t) rows_w * rows_a);
    ggml_backend_tensor_get(Y, y.data(), 0, y.size() * 4);
    ggml_backend_buffer_free(buf); ggml_backend_buffer_free(wbuf);
    ggml_free(ctx); ggml_free(wctx);
    return y;
}

int main(int argc, char ** argv) {
    if (argc < 3) { fprintf(stderr, "usage: harness IN OUTDIR [types...]\n"); return 1; }
    std::vector<char> in = slurp(argv[1]);
    uint32_t hdr[3]; memcpy(hdr, in.data(), 12);
    int n = hdr[0], rows_w = hdr[1], rows_a = hdr[2];
    const float * xw = (const float *) (in.data() + 12);
    const float * xa = xw + (size_t) n * rows_w;
    std::string out = argv[2];
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, 1);
    ggml_backend_buffer_type_t rp = repack_buft(be), plain = ggml_backend_cpu_buffer_type();
    fprintf(stderr, "repack buft: %s\n", rp ? "found" : "MISSING");
    const char * def[] = {"q4_0", "q8_0", "iq4_nl", "mxfp4", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"};
    std::vector<std::string> types;
    if (argc > 3) for (int i = 3; i < argc; ++i) types.push_back(argv[i]); else for (auto d : def) types.push_back(d);
    for (auto & name : types) {
        ggml_type t = GGML_TYPE_COUNT;
        for (int i = 0; i < GGML_TYPE_COUNT; ++i) { auto tr = ggml_get_type_traits((ggml_type) i); if (tr->type_name && name == tr->type_name) t = (ggml_type) i; }
        if (t == GGML_TYPE_COUNT) { fprintf(stderr, "unknown %s\n", name.c_str()); return 1; }
        size_t rs = ggml_row_size(t, n);
        std::vector<uint8_t> q(rs * rows_w);
        ggml_quantize_chunk(t, xw, q.data(), 0, rows_w, n, nullptr);
        dump(out + "/" + name + ".q", q.data(), q.size());
        std::vector<float> deq((size_t) n * rows_w);
        ggml_get_type_traits(t)->to_float(q.data(), deq.data(), (int64_t) n * rows_w);
        dump(out + "/" + name + ".deq", deq.data(), deq.size() * 4);
        ggml_type vt = ggml_get_type_traits_cpu(t)->vec_dot_type;
        std::vector<uint8_t> act(ggml_row_size(vt, n) * rows_a);
        for (int r = 0; r < rows_a; ++r) ggml_get_type_traits_cpu(vt)->from_float(xa + (size_t) r * n, act.data() + r * ggml_row_size(vt, n), n);
        dump(out + "/" + name + ".act", act.data(), act.size());
        bool can_repack = (t == GGML_TYPE_Q4_0 || t == GGML_TYPE_Q4_K || t == GGML_TYPE_IQ4_NL || t == GGML_TYPE_MXFP4 || t == GGML_TYPE_Q2_K);
        // Batches: the first b activation rows for each b in $BATCHES (default: all rows).
        std::vector<int> batches;
        if (const char * e = getenv("BATCHES")) { for (const char * p = e; *p; ) { batches.push_back(atoi(p)); while (*p && *p != ',') ++p; if (*p) ++p; } }
        else batches.push_back(rows_a);
        for (int b : batches) {
            std::string suf = getenv("BATCHES") ? "." + std::to_string(b) : "";
            auto yp = matmul(be, plain, t, q.data(), n, rows_w, xa, b);
            dump(out + "/" + name + ".y_plain" + suf, yp.data(), yp.size() * 4);
            if (can_repack && rp) {
                auto yr = matmul(be, rp, t, q.data(), n, rows_w, xa, b);
                dump(out + "/" + name + ".y_repack" + suf, yr.data(), yr.size() * 4);
            }
        }
        fprintf(stderr, "%s: vec_dot_type %s, %zu bytes/row%s\n", name.c_str(), ggml_type_name(vt), rs, can_repack ? ", repacked too" : "");
    }
    ggml_backend_free(be);
    return 0;
}
