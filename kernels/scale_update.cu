// scale_update.cu: Apex's loss-scale update (apex_api.md §4.3) on the device, so the host
// never reads the scale, the counter or the overflow flag to update them.
//
// One thread does the work (launch with any shape; only thread 0 of block 0 acts). `scale` is
// the scaler's float64 scale, `unskipped` its int64 clean-step counter, `found_inf` the
// overflow flag (> 0: overflow), `skip` receives should_skip as one byte (a torch.bool).
// min_loss_scale == 0 means no floor; dynamic == 0 is Apex's static scaler.
#include "amp_math.cuh"

extern "C" __global__ void amp_update_scale(double* scale, long long* unskipped,
                                            const float* found_inf, unsigned char* skip,
                                            int dynamic, double min_loss_scale,
                                            double max_loss_scale, long long scale_window) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    double s = *scale;
    long long u = *unskipped;
    const bool found = dynamic != 0 && found_inf[0] > 0.0f;
    const bool should_skip = amp_update_scale(s, u, found, dynamic != 0, min_loss_scale,
                                              max_loss_scale, scale_window);
    *scale = s;
    *unskipped = u;
    *skip = should_skip ? 1 : 0;
}
