// The tolerances of the size tests against eager: the eager backend runs the same kernels
// (rtol 1e-5, atol 1e-6), llvm may reorder sums (rtol 1e-4, atol 1e-5).
#pragma once

#include <string>

namespace tcap::testing {

inline double rtol_of(const std::string& backend) { return backend == "eager" ? 1e-5 : 1e-4; }
inline double atol_of(const std::string& backend) { return backend == "eager" ? 1e-6 : 1e-5; }

}  // namespace tcap::testing
