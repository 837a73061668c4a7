// host_launch.cpp: the kernels/*.cu sources built for the host (g++ -std=c++20 -shared) on top
// of cuda_emulate.h, with a C entry point shaped like cuLaunchKernel so that Python (ctypes)
// launches them as CuPy would on a GPU: a kernel name, grid and block sizes, and an array of
// pointers to the argument values.
//
//   int amp_emu_launch(const char* name, unsigned grid, unsigned block, void** args)
//       0 on success, -1 for an unknown kernel, -2 for a block size outside 1..1024 or grid 0.
//   int amp_emu_kernel_arg_sizes(const char* name, int* out, int capacity)
//       the byte size of each kernel parameter (for checking what a caller passes).
//   const char* amp_emu_kernels(void)   the kernel names, comma-separated.
//   void amp_emu_{half,bf16}_{to,from}_float(...)   the emulated conversions, for the tests.
#include "cuda_emulate.h"

#include <cstring>
#include <string>
#include <utility>

#include "../unscale.cu"
#include "../master.cu"
#include "../norm.cu"
#include "../scale_update.cu"

namespace {

template <typename... P, std::size_t... I>
void call_kernel(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<P*>(args[I])...);
}

template <typename... P>
void launch_kernel(void (*kernel)(P...), unsigned grid, unsigned block, void** args) {
    amp_emu::launch(grid, block, [&] { call_kernel(kernel, args, std::index_sequence_for<P...>{}); });
}

template <typename... P>
int arg_sizes(void (*)(P...), int* out, int capacity) {
    const int sizes[] = {static_cast<int>(sizeof(P))..., 0};
    const int count = static_cast<int>(sizeof...(P));
    for (int i = 0; i < count && i < capacity; ++i) {
        out[i] = sizes[i];
    }
    return count;
}

struct Entry {
    const char* name;
    void (*launch)(unsigned, unsigned, void**);
    int (*sizes)(int*, int);
};

#define AMP_EMU_KERNEL(k)                                                       \
    Entry {                                                                     \
        #k, [](unsigned g, unsigned b, void** a) { launch_kernel(&k, g, b, a); }, \
            [](int* out, int capacity) { return arg_sizes(&k, out, capacity); }   \
    }

const Entry kKernels[] = {
    AMP_EMU_KERNEL(amp_mt_unscale),
    AMP_EMU_KERNEL(amp_mt_unscale_add),
    AMP_EMU_KERNEL(amp_mt_unscale_to_fp32),
    AMP_EMU_KERNEL(amp_mt_copy),
    AMP_EMU_KERNEL(amp_mt_unscale_norm),
    AMP_EMU_KERNEL(amp_mt_scaled_norm),
    AMP_EMU_KERNEL(amp_norm_finalize),
    AMP_EMU_KERNEL(amp_mt_clip_scale),
    AMP_EMU_KERNEL(amp_update_scale),
};

}  // namespace

extern "C" int amp_emu_launch(const char* name, unsigned grid, unsigned block, void** args) {
    if (grid == 0 || block == 0 || block > AMP_MAX_BLOCK) {
        return -2;
    }
    for (const Entry& entry : kKernels) {
        if (std::strcmp(entry.name, name) == 0) {
            entry.launch(grid, block, args);
            return 0;
        }
    }
    return -1;
}

// The byte size of each parameter of kernel `name` into out[0..capacity); returns the
// parameter count, or -1 for an unknown kernel. Lets the caller check that the values it passes
// have the sizes the kernel reads, as a GPU launch would need.
extern "C" int amp_emu_kernel_arg_sizes(const char* name, int* out, int capacity) {
    for (const Entry& entry : kKernels) {
        if (std::strcmp(entry.name, name) == 0) {
            return entry.sizes(out, capacity);
        }
    }
    return -1;
}

extern "C" const char* amp_emu_kernels() {
    static const std::string names = [] {
        std::string out;
        for (const Entry& entry : kKernels) {
            if (!out.empty()) {
                out += ",";
            }
            out += entry.name;
        }
        return out;
    }();
    return names.c_str();
}

extern "C" void amp_emu_half_to_float(const std::uint16_t* in, float* out, long long n) {
    for (long long i = 0; i < n; ++i) {
        out[i] = __half2float(__half{in[i]});
    }
}

extern "C" void amp_emu_half_from_float(const float* in, std::uint16_t* out, long long n) {
    for (long long i = 0; i < n; ++i) {
        out[i] = __float2half_rn(in[i]).__x;
    }
}

extern "C" void amp_emu_bf16_to_float(const std::uint16_t* in, float* out, long long n) {
    for (long long i = 0; i < n; ++i) {
        out[i] = __bfloat162float(__nv_bfloat16{in[i]});
    }
}

extern "C" void amp_emu_bf16_from_float(const float* in, std::uint16_t* out, long long n) {
    for (long long i = 0; i < n; ++i) {
        out[i] = __float2bfloat16_rn(in[i]).__x;
    }
}
