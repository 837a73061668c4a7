// amp_types.cuh: the gradient element types (fp32, fp16, bf16), their run-time codes and the
// conversions to and from float that every kernel goes through.
//
// On the device the types and conversions are CUDA's (<cuda_fp16.h>, <cuda_bf16.h>; NVRTC needs
// `-I <nvidia-cuda-runtime-cu12>/include`). In the host emulation, kernels/emulate/cuda_emulate.h
// is included first and defines software `__half` / `__nv_bfloat16` with the same conversion
// functions (round to nearest even, subnormals kept).
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

#include "amp_math.cuh"

// Run-time element-type codes, as amp_shim/engine/cuda.py writes them into the tensor table.
#define AMP_F32 0
#define AMP_F16 1
#define AMP_BF16 2

// Widening to float is exact for all three types.
AMP_HD float amp_to_float(float x) { return x; }
AMP_HD float amp_to_float(__half x) { return __half2float(x); }
AMP_HD float amp_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Narrowing from float rounds to nearest even (overflow to inf), as torch's casts do.
template <typename T> struct AmpFromFloat;
template <> struct AmpFromFloat<float> {
    static AMP_HD float get(float v) { return v; }
};
template <> struct AmpFromFloat<__half> {
    static AMP_HD __half get(float v) { return __float2half_rn(v); }
};
template <> struct AmpFromFloat<__nv_bfloat16> {
    static AMP_HD __nv_bfloat16 get(float v) { return __float2bfloat16_rn(v); }
};
template <typename T> AMP_HD T amp_from_float(float v) { return AmpFromFloat<T>::get(v); }

// Round a float to T's precision and widen it back: the value torch would hold in between two
// ops on a T tensor.
template <typename T> AMP_HD float amp_round_to(float v) { return amp_to_float(amp_from_float<T>(v)); }

template <typename A, typename B> struct AmpSame { static constexpr bool value = false; };
template <typename A> struct AmpSame<A, A> { static constexpr bool value = true; };

// A value standing for an element type, passed to a visitor's templated operator().
template <typename T> struct AmpType { typedef T type; };

// Call op(AmpType<T>{}) for the element type that `code` names; unknown codes do nothing (the
// Python side only writes the three codes above). `op` is a function object whose
// `template <typename Tag> __device__ void operator()(Tag) const` does the work: NVRTC accepts
// no lambdas in device code without extra flags, and functors compile the same everywhere.
template <typename Op> __device__ inline void amp_visit(int code, const Op& op) {
    switch (code) {
        case AMP_F32: op(AmpType<float>{}); break;
        case AMP_F16: op(AmpType<__half>{}); break;
        case AMP_BF16: op(AmpType<__nv_bfloat16>{}); break;
        default: break;
    }
}

template <typename Op, typename TagA> struct AmpBindFirst {
    const Op& op;
    template <typename TagB> __device__ void operator()(TagB tag_b) const { op(TagA{}, tag_b); }
};

template <typename Op> struct AmpVisitSecond {
    const Op& op;
    int code_b;
    template <typename TagA> __device__ void operator()(TagA) const {
        amp_visit(code_b, AmpBindFirst<Op, TagA>{op});
    }
};

// Both operands' types, op(AmpType<T>{}, AmpType<U>{}): the 3 x 3 instantiations.
template <typename Op> __device__ inline void amp_visit2(int code_a, int code_b, const Op& op) {
    amp_visit(code_a, AmpVisitSecond<Op>{op, code_b});
}
