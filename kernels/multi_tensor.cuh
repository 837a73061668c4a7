// multi_tensor.cuh: one launch for a whole list of tensors, as Apex's multi_tensor_apply does,
// but with the tensor list in a device-side table instead of kernel arguments (so any number
// of tensors fits one launch), and a block-wide sum with a fixed order.
//
// The table is one int64 array that amp_shim/engine/cuda.py builds (and caches) for `n` tensors
// and `arity` operands per tensor (e.g. 2 for "model grad -> master grad"):
//
//   [0, arity*n)               ptr[k*n + i]   address of operand k of tensor i
//   [arity*n, +n)              numel[i]       elements of tensor i (all operands alike)
//   [(arity+1)*n, +n+1)        chunk_off[i]   first chunk of tensor i; chunk_off[n] = nchunks
//   [(arity+2)*n+1, +n)        meta[i]        bits 0-3: element type code (AMP_F32/F16/BF16) of
//                                             operand 0, bits 4-7: of operand 1, bit 8: a flag
//                                             (unscale_to_fp32: accumulate into the master)
//
// A chunk is `chunk_size` consecutive elements of one tensor (the last one of a tensor may be
// shorter; a tensor with no elements has no chunk). Blocks take chunks grid-stride
// (chunk = blockIdx.x, blockIdx.x + gridDim.x, ...), so any grid size covers the work, and
// within a chunk thread t handles elements t, t + blockDim.x, ... . A chunk's tensor is found by
// binary search in chunk_off.
#pragma once

#include "amp_math.cuh"
#include "amp_types.cuh"

#define AMP_MAX_BLOCK 1024
#define AMP_META_ACCUMULATE 0x100

struct AmpTable {
    const long long* t;
    int n;
    int arity;

    AMP_HD long long ptr(int k, int i) const { return t[(long long)k * n + i]; }
    AMP_HD long long numel(int i) const { return t[(long long)arity * n + i]; }
    AMP_HD long long chunk_off(int i) const { return t[(long long)(arity + 1) * n + i]; }
    AMP_HD long long meta(int i) const { return t[(long long)(arity + 2) * n + 1 + i]; }
    AMP_HD int dtype(int i, int k) const { return (int)((meta(i) >> (4 * k)) & 0xF); }
    AMP_HD bool flag(int i) const { return (meta(i) & AMP_META_ACCUMULATE) != 0; }

    template <typename T> AMP_HD T* operand(int k, int i) const {
        return reinterpret_cast<T*>(ptr(k, i));
    }
};

struct AmpChunk {
    int tensor;       // index into the table
    long long begin;  // first element of the chunk in that tensor
    long long end;    // one past its last element
};

// The chunk with global index c (0 <= c < nchunks): tensor i with chunk_off[i] <= c <
// chunk_off[i+1] (unique, since empty tensors have chunk_off[i] == chunk_off[i+1]).
AMP_HD AmpChunk amp_chunk(const AmpTable& tab, long long c, long long chunk_size) {
    int lo = 0;
    int hi = tab.n;  // invariant: chunk_off[lo] <= c < chunk_off[hi]
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        if (tab.chunk_off(mid) <= c) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    AmpChunk chunk;
    chunk.tensor = lo;
    chunk.begin = (c - tab.chunk_off(lo)) * chunk_size;
    const long long end = chunk.begin + chunk_size;
    const long long numel = tab.numel(lo);
    chunk.end = end < numel ? end : numel;
    return chunk;
}

// The sum of `v` over the block, in a fixed order, returned to every thread; every thread of
// the block must call it (it synchronises). Order, for B = blockDim.x and P the largest power of
// two <= B: s[t] = v of thread t; then s[t] += s[t + P] for t < B - P; then for h = P/2, P/4,
// ..., 1: s[t] += s[t + h] for t < h; the result is s[0]. Each += is one float32 rounding.
__device__ inline float amp_block_sum(float v) {
    __shared__ float s[AMP_MAX_BLOCK];
    const unsigned t = threadIdx.x;
    const unsigned b = blockDim.x;
    unsigned p = 1;
    while (p * 2 <= b) {
        p *= 2;
    }
    s[t] = v;
    __syncthreads();
    if (t + p < b) {
        s[t] = amp_add_rn(s[t], s[t + p]);
    }
    __syncthreads();
    for (unsigned h = p / 2; h > 0; h /= 2) {
        if (t < h) {
            s[t] = amp_add_rn(s[t], s[t + h]);
        }
        __syncthreads();
    }
    const float total = s[0];
    __syncthreads();  // nobody may overwrite s before every thread has read s[0]
    return total;
}

// Set the launch's non-finite flag (a float the caller zeroed, or left at 1 from an earlier
// overflow) once per thread that saw a non-finite input. Atomic, so concurrent stores of the
// same value are race-free also in the host emulation. A null flag is not written.
__device__ inline void amp_set_flag(float* found_inf, bool non_finite) {
    if (non_finite && found_inf != nullptr) {
        atomicExch(found_inf, 1.0f);
    }
}
