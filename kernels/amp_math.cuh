// amp_math.cuh: the per-element math of the amp_shim engine.
//
// Every function is `__host__ __device__` and header-only, so the CUDA kernels (compiled by
// NVRTC or nvcc) and the host emulation (the same sources built with g++) run one definition.
// Each one reproduces, bit for bit, the torch op that the engine uses when no kernel runs
// (amp_shim/engine/ops.py); that is what the tests compare.
//
// Rules for this file:
//   * no #include: NVRTC has no standard headers, and the host build needs none for this;
//   * IEEE-exact operations only: multiplies, adds, divides and square roots go through the
//     amp_*_rn helpers, which round once each and forbid fusing into an FMA on the device (one
//     rounding instead of two would change bits);
//   * compile without fast math (no --use_fast_math, -ftz=true, -ffast-math,
//     -ffinite-math-only): the finiteness test below and subnormal gradients depend on it.
#pragma once

#ifndef AMP_HD
#define AMP_HD __host__ __device__ inline
#endif

// -- primitives -------------------------------------------------------------------------------

// True for every finite x (subnormals included), false for +-inf and NaN: x - x is exactly 0
// for finite x and NaN otherwise. Same meaning as isfinite(), but needs no header on either
// side.
AMP_HD bool amp_isfinite(float x) { return (x - x) == 0.0f; }

// a * b, a + b, a / b and sqrt(a), each correctly rounded (round to nearest even), never
// contracted into an FMA with a neighbouring op and never replaced by an approximation.
AMP_HD float amp_mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

AMP_HD float amp_add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

AMP_HD float amp_div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

AMP_HD float amp_sqrt_rn(float a) {
#ifdef __CUDA_ARCH__
    return __fsqrt_rn(a);
#else
    return __builtin_sqrtf(a);  // SSE sqrtss: IEEE, correctly rounded
#endif
}

// -- unscaling --------------------------------------------------------------------------------

// One element of torch._amp_foreach_non_finite_check_and_unscale_ (Apex's multi_tensor_scale):
// `val` is the gradient read as float (fp16/bf16 widen exactly). The non-finite test is on the
// INPUT value: a finite input whose unscaled value overflows when stored back to fp16 is not
// flagged, as in torch. An inv_scale of exactly 1 returns the value untouched (torch's
// shortcut; it also keeps NaN payloads). `non_finite` is only ever set, never cleared.
AMP_HD float amp_unscale(float val, float inv_scale, bool& non_finite) {
    if (!amp_isfinite(val)) {
        non_finite = true;
    }
    return inv_scale == 1.0f ? val : amp_mul_rn(val, inv_scale);
}

// -- gradient clipping ------------------------------------------------------------------------

// torch.nn.utils.clip_grad_norm_'s coefficient, with torch's roundings:
//   clip_coef = max_norm / (total_norm + eps)      (Tensor.__rtruediv__: reciprocal, then *)
//   clip_coef_clamped = clamp(clip_coef, max=1.0)  (NaN stays NaN)
// max_norm and eps arrive rounded to float32, as torch rounds Python scalars for a float32
// tensor op.
AMP_HD float amp_clip_coef(float total_norm, float max_norm, float eps) {
    const float coef = amp_mul_rn(amp_div_rn(1.0f, amp_add_rn(total_norm, eps)), max_norm);
    return coef > 1.0f ? 1.0f : coef;
}

// -- the scale update -------------------------------------------------------------------------

// Apex's LossScaler.update_scale() (apex_api.md §4.3), as ops.update_scale_ computes it with
// torch ops on the scaler's float64 scale and int64 counter. Returns should_skip.
//   dynamic, overflow: halve, floored at min_loss_scale when it is non-zero (Apex tests the
//                      minimum for truthiness, so None and 0 both mean "no floor"); counter = 0;
//   dynamic, clean:    counter + 1;
//   then, dynamic:     when the counter equals scale_window, double, capped at max_loss_scale,
//                      and counter = 0 (equality, not >=: a counter loaded above the window
//                      never grows, in Apex as in GradScaler);
//   static:            the scale never changes, nothing is skipped, the counter still counts.
// The comparisons keep torch.clamp's NaN behaviour (a NaN scale stays NaN).
AMP_HD bool amp_update_scale(double& scale, long long& unskipped, bool found_inf, bool dynamic,
                             double min_loss_scale, double max_loss_scale,
                             long long scale_window) {
    if (!dynamic) {
        unskipped += 1;
        return false;
    }
    if (found_inf) {
        double halved = scale / 2.0;
        if (min_loss_scale != 0.0 && halved < min_loss_scale) {
            halved = min_loss_scale;
        }
        scale = halved;
        unskipped = 0;
    } else {
        unskipped += 1;
    }
    if (unskipped == scale_window) {
        double grown = scale * 2.0;
        scale = grown > max_loss_scale ? max_loss_scale : grown;
        unskipped = 0;
    }
    return found_inf;
}
