// Guard pieces shared by tcap::compile and tcap::compile_step.
#pragma once

#include <ATen/autocast_mode.h>

namespace tcap::aot {

// Autocast state (CPU and CUDA, enabled and dtype) when a graph was captured.
struct AutocastSig {
  bool cpu = false, cuda = false;
  c10::ScalarType cpu_dtype = c10::kBFloat16, cuda_dtype = c10::kHalf;
  static AutocastSig now() {
    AutocastSig a;
    a.cpu = at::autocast::is_autocast_enabled(at::kCPU);
    a.cuda = at::autocast::is_autocast_enabled(at::kCUDA);
    if (a.cpu) a.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    if (a.cuda) a.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    return a;
  }
  bool operator==(const AutocastSig& o) const {
    return cpu == o.cpu && cuda == o.cuda && (!cpu || cpu_dtype == o.cpu_dtype) &&
           (!cuda || cuda_dtype == o.cuda_dtype);
  }
};

}  // namespace tcap::aot
