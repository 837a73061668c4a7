// unscale.cu: in-place unscale of one float32 buffer with the non-finite flag
// (torch._amp_foreach_non_finite_check_and_unscale_ on a single fp32 tensor).
//
// Launch with any grid/block shape: a grid-stride loop covers n elements. `found_inf` points
// to one float that the caller zeroes beforehand; it is set to 1.0f if any input element is
// inf or NaN and never cleared. Each thread stores the flag at most once, atomically, so
// concurrent stores of the same value are race-free also in the host emulation.
#include "amp_math.cuh"

extern "C" __global__ void amp_unscale_f32(float* data, long n, float inv_scale, float* found_inf) {
    bool non_finite = false;
    const long stride = (long)blockDim.x * (long)gridDim.x;
    for (long i = (long)blockIdx.x * (long)blockDim.x + (long)threadIdx.x; i < n; i += stride) {
        data[i] = amp_unscale(data[i], inv_scale, non_finite);
    }
    if (non_finite) {
        atomicExch(found_inf, 1.0f);
    }
}
