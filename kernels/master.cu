// master.cu: the O2 master-weight paths, one launch each.
//
//   amp_mt_unscale_to_fp32: fp16/bf16 (or fp32) model grads -> fp32 master grads, unscaled,
//                           written, or accumulated into a master grad that already exists
//                           (per tensor: the table's meta flag); the flag checks the incoming
//                           model grads only (Apex's axpby with arg_to_check = 0);
//   amp_mt_copy:            dst = src with a cast (fp32 masters -> fp16/bf16 model params),
//                           any of the 3 x 3 type pairs; same type: the bits are copied.
//
// Arguments as in unscale.cu; tables have arity 2.
#include "amp_math.cuh"
#include "multi_tensor.cuh"

struct AmpToFp32Chunk {
    const AmpTable& tab;
    const AmpChunk& ch;
    float inv;
    bool& non_finite;

    template <typename Tag> __device__ void operator()(Tag) const {
        typedef typename Tag::type T;
        const T* grad = tab.operand<T>(0, ch.tensor);
        float* master = tab.operand<float>(1, ch.tensor);
        const bool accumulate = tab.flag(ch.tensor);
        for (long long i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
            const float fresh = amp_unscale(amp_to_float(grad[i]), inv, non_finite);
            master[i] = accumulate ? amp_add_rn(master[i], fresh) : fresh;
        }
    }
};

// master[i] = grad[i] * inv_scale             (meta flag clear: the master grad is new)
// master[i] = master[i] + grad[i] * inv_scale (meta flag set: accumulate)
// As the torch path: grad.to(float32), unscale in float32, then master.add_(fresh).
// Table: operand 0 = model grads (type code T), operand 1 = fp32 master grads.
extern "C" __global__ void amp_mt_unscale_to_fp32(const long long* table, int n,
                                                  long long nchunks, long long chunk_size,
                                                  const float* inv_scale, float* found_inf) {
    const AmpTable tab{table, n, 2};
    const float inv = *inv_scale;
    bool non_finite = false;
    for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
        const AmpChunk ch = amp_chunk(tab, c, chunk_size);
        amp_visit(tab.dtype(ch.tensor, 0), AmpToFp32Chunk{tab, ch, inv, non_finite});
    }
    amp_set_flag(found_inf, non_finite);
}

struct AmpCopyChunk {
    const AmpTable& tab;
    const AmpChunk& ch;

    template <typename TagT, typename TagU> __device__ void operator()(TagT, TagU) const {
        typedef typename TagT::type T;
        typedef typename TagU::type U;
        T* dst = tab.operand<T>(0, ch.tensor);
        const U* src = tab.operand<U>(1, ch.tensor);
        for (long long i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
            if constexpr (AmpSame<T, U>::value) {
                dst[i] = src[i];
            } else {
                dst[i] = amp_from_float<T>(amp_to_float(src[i]));
            }
        }
    }
};

// dst[i] = src[i], converted through float with round to nearest even (torch's copy_ /
// _foreach_copy_); a same-type copy moves the bits. Table: operand 0 = dst, operand 1 = src.
extern "C" __global__ void amp_mt_copy(const long long* table, int n, long long nchunks,
                                       long long chunk_size) {
    const AmpTable tab{table, n, 2};
    for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
        const AmpChunk ch = amp_chunk(tab, c, chunk_size);
        amp_visit2(tab.dtype(ch.tensor, 0), tab.dtype(ch.tensor, 1), AmpCopyChunk{tab, ch});
    }
}
