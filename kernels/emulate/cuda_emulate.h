// cuda_emulate.h: just enough of CUDA to build kernels/*.cu with g++ -std=c++20 and run them on
// the host, for the tests (tests/kernels/). Include it before any kernel source.
//
// Modelled:
//   * __global__ / __device__ / __host__ as nothing, __shared__ as `static` (one copy, shared by
//     the threads of a block; blocks run one after another, so that is per block);
//   * dim3, threadIdx / blockIdx (thread_local, set per emulated thread), blockDim / gridDim;
//   * amp_emu::launch(grid, block, body): for each block, one std::thread per CUDA thread, all
//     started together, and __syncthreads() as std::barrier::arrive_and_wait() among them, so
//     a missing __syncthreads is a real data race (ThreadSanitizer reports it);
//   * atomicExch / atomicAdd on float and int, atomicMax on int, via std::atomic_ref;
//   * __half and __nv_bfloat16 as 16-bit storage with software conversions: widening is exact;
//     narrowing rounds to nearest even, keeps subnormals, overflows to inf, and turns any NaN
//     into the canonical NaN 0x7FFF that the GPU's cvt.rn.f16.f32 / cvt.rn.bf16.f32 produce.
//     (torch on the CPU keeps NaN payloads in some code paths and not in others, so the tests
//     compare NaN-ness, not NaN payloads.)
// Not modelled, so the kernels must not use them: warp shuffles and votes, cooperative groups,
// vector types (half2, float4), fast-math intrinsics, dynamic shared memory, 2D/3D blocks
// beyond what launch() sets (x only).
#pragma once

#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

inline thread_local dim3 threadIdx{0, 0, 0};
inline thread_local dim3 blockIdx{0, 0, 0};
inline dim3 blockDim{1, 1, 1};
inline dim3 gridDim{1, 1, 1};

namespace amp_emu {

inline std::barrier<>* block_barrier = nullptr;

// Run `body` as a CUDA kernel launch <<<grid, block>>> (x dimensions only).
template <typename Body>
void launch(unsigned grid, unsigned block, Body&& body) {
    gridDim = dim3(grid);
    blockDim = dim3(block);
    for (unsigned b = 0; b < grid; ++b) {
        std::barrier<> barrier(static_cast<std::ptrdiff_t>(block));
        block_barrier = &barrier;
        std::vector<std::thread> threads;
        threads.reserve(block);
        for (unsigned t = 0; t < block; ++t) {
            threads.emplace_back([&body, b, t] {
                blockIdx = dim3(b);
                threadIdx = dim3(t);
                body();
            });
        }
        for (auto& thread : threads) {
            thread.join();
        }
        block_barrier = nullptr;
    }
}

inline std::uint32_t float_bits(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

inline float bits_float(std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// Round the integer `value / 2**shift` to nearest, ties to even (0 < shift < 32).
inline std::uint32_t shift_rne(std::uint32_t value, unsigned shift) {
    const std::uint32_t q = value >> shift;
    const std::uint32_t rem = value & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

}  // namespace amp_emu

inline void __syncthreads() { amp_emu::block_barrier->arrive_and_wait(); }

// -- atomics ------------------------------------------------------------------------------------
inline float atomicExch(float* address, float value) {
    return std::atomic_ref<float>(*address).exchange(value);
}
inline int atomicExch(int* address, int value) { return std::atomic_ref<int>(*address).exchange(value); }
inline float atomicAdd(float* address, float value) {
    return std::atomic_ref<float>(*address).fetch_add(value);
}
inline int atomicAdd(int* address, int value) { return std::atomic_ref<int>(*address).fetch_add(value); }
inline int atomicMax(int* address, int value) {
    std::atomic_ref<int> ref(*address);
    int old = ref.load();
    while (old < value && !ref.compare_exchange_weak(old, value)) {
    }
    return old;
}

// -- half and bfloat16 ------------------------------------------------------------------------
struct __half {
    std::uint16_t __x;
};

struct __nv_bfloat16 {
    std::uint16_t __x;
};

inline float __half2float(__half h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h.__x & 0x8000u) << 16;
    const std::uint32_t exp = (h.__x >> 10) & 0x1Fu;
    std::uint32_t mant = h.__x & 0x3FFu;
    if (exp == 0x1Fu) {
        return mant == 0 ? amp_emu::bits_float(sign | 0x7F800000u) : amp_emu::bits_float(0x7FFFFFFFu);
    }
    if (exp == 0) {
        if (mant == 0) {
            return amp_emu::bits_float(sign);
        }
        // subnormal: mant * 2**-24, normalised into a float (exact)
        std::uint32_t e = 113;  // biased float exponent of 2**-14
        while ((mant & 0x400u) == 0) {
            mant <<= 1;
            --e;
        }
        mant &= 0x3FFu;
        return amp_emu::bits_float(sign | (e << 23) | (mant << 13));
    }
    return amp_emu::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline __half __float2half_rn(float f) {
    const std::uint32_t u = amp_emu::float_bits(f);
    const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t a = u & 0x7FFFFFFFu;
    __half h;
    if (a > 0x7F800000u) {  // NaN
        h.__x = 0x7FFFu;
    } else if (a >= 0x477FF000u) {  // >= 65520 (65504 + half an ulp, ties to even go up): inf
        h.__x = static_cast<std::uint16_t>(sign | 0x7C00u);
    } else if (a >= 0x38800000u) {  // normal half: rebias the exponent, round 13 bits away
        h.__x = static_cast<std::uint16_t>(sign | amp_emu::shift_rne(a - 0x38000000u, 13));
    } else if (a > 0x33000000u) {  // (2**-25, 2**-14): a subnormal half, maybe rounding up
        const std::uint32_t exp = a >> 23;
        const std::uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
        h.__x = static_cast<std::uint16_t>(sign | amp_emu::shift_rne(mant, 126u - exp));
    } else {  // <= 2**-25 (a tie at 2**-25 goes to the even 0)
        h.__x = sign;
    }
    return h;
}

inline float __bfloat162float(__nv_bfloat16 b) {
    return amp_emu::bits_float(static_cast<std::uint32_t>(b.__x) << 16);
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    const std::uint32_t u = amp_emu::float_bits(f);
    __nv_bfloat16 b;
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        b.__x = 0x7FFFu;
    } else {
        b.__x = static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
    return b;
}
