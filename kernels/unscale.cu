// unscale.cu: multi-tensor unscale with the non-finite flag, in place, for fp32, fp16 and bf16
// gradients in one launch (each tensor's type is in the table), and unscale-and-add of stashed
// gradients (Apex's axpby, apex_api.md §3.3).
//
// Common arguments (see multi_tensor.cuh for the table): `table`, `n` tensors, `nchunks`,
// `chunk_size`; `inv_scale` points to one float on the device (1/scale, so the host never reads
// the scale); `found_inf` to one float that is set to 1.0f if any checked input is inf or NaN
// and never cleared. Any grid and block shape works (block <= 1024).
#include "amp_math.cuh"
#include "multi_tensor.cuh"

// One chunk of amp_mt_unscale, for the tensor's element type T.
struct AmpUnscaleChunk {
    const AmpTable& tab;
    const AmpChunk& ch;
    float inv;
    bool& non_finite;

    template <typename Tag> __device__ void operator()(Tag) const {
        typedef typename Tag::type T;
        T* x = tab.operand<T>(0, ch.tensor);
        for (long long i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
            x[i] = amp_from_float<T>(amp_unscale(amp_to_float(x[i]), inv, non_finite));
        }
    }
};

// grads[i] = grads[i] * inv_scale, rounded to the gradient's type; flag non-finite inputs.
// Bit for bit torch._amp_foreach_non_finite_check_and_unscale_. Table: arity 1.
extern "C" __global__ void amp_mt_unscale(const long long* table, int n, long long nchunks,
                                          long long chunk_size, const float* inv_scale,
                                          float* found_inf) {
    const AmpTable tab{table, n, 1};
    const float inv = *inv_scale;
    bool non_finite = false;
    for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
        const AmpChunk ch = amp_chunk(tab, c, chunk_size);
        amp_visit(tab.dtype(ch.tensor, 0), AmpUnscaleChunk{tab, ch, inv, non_finite});
    }
    amp_set_flag(found_inf, non_finite);
}

// One chunk of amp_mt_unscale_add, for gradient type T and stash type U.
struct AmpUnscaleAddChunk {
    const AmpTable& tab;
    const AmpChunk& ch;
    float inv;
    bool& non_finite;

    template <typename TagT, typename TagU> __device__ void operator()(TagT, TagU) const {
        typedef typename TagT::type T;
        typedef typename TagU::type U;
        T* x = tab.operand<T>(0, ch.tensor);
        const U* y = tab.operand<U>(1, ch.tensor);
        for (long long i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
            const float unscaled = amp_round_to<T>(amp_unscale(amp_to_float(x[i]), inv, non_finite));
            x[i] = amp_from_float<T>(amp_add_rn(unscaled, amp_to_float(y[i])));
        }
    }
};

// grads[i] = round_T(round_T(grads[i] * inv_scale) + stashed[i]): Apex's multi_tensor_axpby
// with arg_to_check = 0, with the torch path's roundings (unscale_ stores the unscaled value in
// the gradient's type T, then _foreach_add_ adds the stash, of type U, in float). Apex's nvcc
// build of axpby may fuse the multiply and the add into one FMA; both engine paths round twice.
// Only the incoming gradients are checked: a non-finite stash propagates without setting the
// flag. Table: arity 2 (grads, stashed).
// `inv_scale` may be null (1.0, a plain add) and `found_inf` null (no check).
extern "C" __global__ void amp_mt_unscale_add(const long long* table, int n, long long nchunks,
                                              long long chunk_size, const float* inv_scale,
                                              float* found_inf) {
    const AmpTable tab{table, n, 2};
    const float inv = inv_scale != nullptr ? *inv_scale : 1.0f;
    bool non_finite = false;
    for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
        const AmpChunk ch = amp_chunk(tab, c, chunk_size);
        amp_visit2(tab.dtype(ch.tensor, 0), tab.dtype(ch.tensor, 1),
                   AmpUnscaleAddChunk{tab, ch, inv, non_finite});
    }
    amp_set_flag(found_inf, non_finite);
}
