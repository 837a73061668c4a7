// norm.cu: unscaling fused with the global L2 norm, and the clip that uses it.
//
// torch's unscale_ followed by clip_grad_norm_ passes over the gradient bytes 5 times: unscale
// (read + write), norm (read), scale by the clip coefficient (read + write). Two pipelines save
// passes:
//   4 passes: amp_mt_unscale_norm (unscale in place and sum the squares of the unscaled values:
//             read + write), then amp_mt_clip_scale with no inv_scale (read + write);
//   3 passes: amp_mt_scaled_norm (the norm of grad * inv_scale, computed from the still-scaled
//             grads and flagging non-finite ones: read), then amp_mt_clip_scale with inv_scale,
//             which multiplies by min(1, max_norm / (norm + eps)) * inv_scale (read + write).
// Both norm kernels write one float32 partial sum of squares per chunk; amp_norm_finalize
// reduces them and takes the square root.
//
// Summation order (deterministic: it depends only on chunk_size, the partial kernels' block
// size B and the finalize kernel's block size F, never on the grid size or on timing):
//   1. in chunk c, thread t sums v*v for the chunk's elements t, t + B, t + 2B, ... in that
//      order, starting from 0.0f (float32, one rounding per multiply and per add);
//   2. the B thread sums are added with amp_block_sum's fixed tree -> partial[c];
//   3. amp_norm_finalize: thread t of its one block sums partial[t], partial[t + F], ... in
//      order, the F sums go through the same tree, and the result is sqrtf (correctly rounded).
// tests/kernels/reference.py reproduces this order with float32 torch ops, and the tests
// compare the emulated kernels to it bit for bit.
#include "amp_math.cuh"
#include "multi_tensor.cuh"

// One chunk of amp_mt_unscale_norm (store = true) or amp_mt_scaled_norm (store = false): this
// thread's share of the chunk's sum of squares, into `acc`.
template <bool store> struct AmpNormChunk {
    const AmpTable& tab;
    const AmpChunk& ch;
    float inv;
    bool& non_finite;
    float& acc;

    template <typename Tag> __device__ void operator()(Tag) const {
        typedef typename Tag::type T;
        T* x = tab.operand<T>(0, ch.tensor);
        for (long long i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
            float v = amp_unscale(amp_to_float(x[i]), inv, non_finite);
            if constexpr (store) {
                const T stored = amp_from_float<T>(v);
                x[i] = stored;
                v = amp_to_float(stored);
            }
            acc = amp_add_rn(acc, amp_mul_rn(v, v));
        }
    }
};

struct AmpClipChunk {
    const AmpTable& tab;
    const AmpChunk& ch;
    float factor;

    template <typename Tag> __device__ void operator()(Tag) const {
        typedef typename Tag::type T;
        T* x = tab.operand<T>(0, ch.tensor);
        for (long long i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
            x[i] = amp_from_float<T>(amp_mul_rn(amp_to_float(x[i]), factor));
        }
    }
};

// In place: grads[i] = round_T(grads[i] * inv_scale) (as amp_mt_unscale, flag included), and
// partial[c] = sum over chunk c of the stored unscaled values squared. Table: arity 1.
extern "C" __global__ void amp_mt_unscale_norm(const long long* table, int n, long long nchunks,
                                               long long chunk_size, const float* inv_scale,
                                               float* found_inf, float* partial) {
    const AmpTable tab{table, n, 1};
    const float inv = *inv_scale;
    bool non_finite = false;
    for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
        const AmpChunk ch = amp_chunk(tab, c, chunk_size);
        float acc = 0.0f;
        amp_visit(tab.dtype(ch.tensor, 0), AmpNormChunk<true>{tab, ch, inv, non_finite, acc});
        const float sum = amp_block_sum(acc);
        if (threadIdx.x == 0) {
            partial[c] = sum;
        }
    }
    amp_set_flag(found_inf, non_finite);
}

// Read only: partial[c] = sum over chunk c of (grad * inv_scale)^2, the unscaled value in
// float32 (not rounded to the gradient's type), flagging non-finite grads. Table: arity 1.
extern "C" __global__ void amp_mt_scaled_norm(const long long* table, int n, long long nchunks,
                                              long long chunk_size, const float* inv_scale,
                                              float* found_inf, float* partial) {
    const AmpTable tab{table, n, 1};
    const float inv = *inv_scale;
    bool non_finite = false;
    for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
        const AmpChunk ch = amp_chunk(tab, c, chunk_size);
        float acc = 0.0f;
        amp_visit(tab.dtype(ch.tensor, 0), AmpNormChunk<false>{tab, ch, inv, non_finite, acc});
        const float sum = amp_block_sum(acc);
        if (threadIdx.x == 0) {
            partial[c] = sum;
        }
    }
    amp_set_flag(found_inf, non_finite);
}

// norm[0] = sqrt(sum of partial[0 .. nchunks)); 0 when nchunks == 0. Launch with ONE block
// (the block size is part of the summation order); other blocks return at once.
extern "C" __global__ void amp_norm_finalize(const float* partial, long long nchunks, float* norm) {
    if (blockIdx.x != 0) {
        return;
    }
    float acc = 0.0f;
    for (long long c = threadIdx.x; c < nchunks; c += blockDim.x) {
        acc = amp_add_rn(acc, partial[c]);
    }
    const float total = amp_block_sum(acc);
    if (threadIdx.x == 0) {
        norm[0] = amp_sqrt_rn(total);
    }
}

// grads[i] = round_T(grads[i] * factor), factor = amp_clip_coef(*norm, max_norm, eps), times
// *inv_scale when inv_scale is not null (float32, one rounding). With a null inv_scale this is
// torch.nn.utils.clip_grad_norm_'s final _foreach_mul_ bit for bit. Table: arity 1.
extern "C" __global__ void amp_mt_clip_scale(const long long* table, int n, long long nchunks,
                                             long long chunk_size, const float* norm,
                                             float max_norm, float eps, const float* inv_scale) {
    const AmpTable tab{table, n, 1};
    float factor = amp_clip_coef(*norm, max_norm, eps);
    if (inv_scale != nullptr) {
        factor = amp_mul_rn(factor, *inv_scale);
    }
    for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
        const AmpChunk ch = amp_chunk(tab, c, chunk_size);
        amp_visit(tab.dtype(ch.tensor, 0), AmpClipChunk{tab, ch, factor});
    }
}
