// A ThreadSanitizer driver for the emulated kernels (test_reduction_is_race_free_under_tsan.py).
//
//   tsan_driver kernels   run the norm reduction (amp_mt_unscale_norm, amp_norm_finalize,
//                         amp_mt_scaled_norm, amp_mt_clip_scale) and amp_mt_unscale on fp32, fp16
//                         and bf16 tensors, several grid/block shapes; print the norm
//   tsan_driver racy      a block sum with its __syncthreads removed: the positive control,
//                         which ThreadSanitizer must report
#include "../../kernels/emulate/host_launch.cpp"

#include <cstdio>
#include <vector>

extern "C" __global__ void racy_block_sum(const float* in, float* out) {
    __shared__ float s[64];
    s[threadIdx.x] = in[threadIdx.x];
    // missing: __syncthreads();
    for (unsigned h = blockDim.x / 2; h > 0; h /= 2) {
        if (threadIdx.x < h) {
            s[threadIdx.x] += s[threadIdx.x + h];
        }
        // missing: __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[0] = s[0];
    }
}

static int run(const char* name, unsigned grid, unsigned block, std::vector<void*> args) {
    const int rc = amp_emu_launch(name, grid, block, args.data());
    if (rc != 0) {
        std::fprintf(stderr, "launch %s failed: %d\n", name, rc);
    }
    return rc;
}

int main(int argc, char** argv) {
    if (argc > 1 && std::string(argv[1]) == "racy") {
        std::vector<float> in(64, 1.0f);
        float out = 0.0f;
        amp_emu::launch(1, 64, [&] { racy_block_sum(in.data(), &out); });
        std::printf("racy sum %g\n", out);
        return 0;
    }
    const long long n_f = 300, n_h = 130, n_b = 77;
    std::vector<float> f(n_f);
    std::vector<__half> h(n_h);
    std::vector<__nv_bfloat16> b(n_b);
    for (long long i = 0; i < n_f; ++i) f[i] = (float)((i % 17) - 8) * 0.25f;
    for (long long i = 0; i < n_h; ++i) h[i] = __float2half_rn((float)((i % 13) - 6));
    for (long long i = 0; i < n_b; ++i) b[i] = __float2bfloat16_rn((float)((i % 11) - 5) * 0.5f);
    const long long chunk = 32;
    const long long numel[3] = {n_f, n_h, n_b};
    std::vector<long long> table;
    table.push_back((long long)f.data());
    table.push_back((long long)h.data());
    table.push_back((long long)b.data());
    for (long long x : numel) table.push_back(x);
    long long off = 0;
    table.push_back(0);
    for (long long x : numel) {
        off += (x + chunk - 1) / chunk;
        table.push_back(off);
    }
    table.push_back(AMP_F32);
    table.push_back(AMP_F16);
    table.push_back(AMP_BF16);
    const long long nchunks = off;
    int n = 3;
    float inv = 0.5f, found = 0.0f, norm = 0.0f, max_norm = 1.0f, eps = 1e-6f;
    std::vector<float> partial(nchunks);
    const long long* tp = table.data();
    float* pp = partial.data();
    const float* invp = &inv;
    float* foundp = &found;
    float* normp = &norm;
    const float* normc = &norm;
    float* nullf = nullptr;
    long long nch = nchunks, chk = chunk;
    const unsigned shapes[][2] = {{1, 64}, {3, 48}, {16, 32}, {2, 7}};
    for (const auto& shape : shapes) {
        const unsigned grid = shape[0], block = shape[1];
        if (run("amp_mt_unscale_norm", grid, block, {&tp, &n, &nch, &chk, &invp, &foundp, &pp})) return 1;
        if (run("amp_norm_finalize", 1, block, {&pp, &nch, &normp})) return 1;
        std::printf("norm %.9g (grid %u, block %u)\n", norm, grid, block);
        if (run("amp_mt_scaled_norm", grid, block, {&tp, &n, &nch, &chk, &invp, &foundp, &pp})) return 1;
        if (run("amp_norm_finalize", 1, block, {&pp, &nch, &normp})) return 1;
        if (run("amp_mt_clip_scale", grid, block, {&tp, &n, &nch, &chk, &normc, &max_norm, &eps, &invp})) return 1;
        if (run("amp_mt_unscale", grid, block, {&tp, &n, &nch, &chk, &invp, &foundp})) return 1;
        if (run("amp_mt_clip_scale", grid, block, {&tp, &n, &nch, &chk, &normc, &max_norm, &eps, &nullf})) return 1;
    }
    return 0;
}
