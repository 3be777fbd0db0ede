// Verify mode's shared parts (include/tcap/stance.h, VerifyOptions; docs/compile.md,
// "Verify mode"): which calls to verify, the tolerance each backend keeps against eager,
// comparing one tensor, and reporting a difference. Each front door runs its own
// comparison (what a call produces differs between them).
//
// Note [Verify tolerances]
// The eager backend runs the kernels eager runs, on the same values, in the same order: its
// results are compared exactly (NaNs equal where both are NaN). The fused backends (llvm,
// cuda, a user's compiler) round differently: their own vector sin/cos/exp/erf (about 1.5
// ulp), reductions split and summed in another order, bfloat16/float16 chains computed in
// float32 and rounded once. They are compared with allclose: float64 rtol 1e-9 atol 1e-12,
// float32 rtol 1e-4 atol 1e-5, bfloat16/float16 rtol 1e-2 atol 1e-3; integers and bools
// exactly. The atol is scaled by the tensor's largest magnitude (eager's max |e|, when above
// 1): a sum reordered errs by about eps times the sum of its terms' magnitudes, not of its
// result, so an element near zero of a gradient whose entries reach 28 differs by ~2e-5 when
// the two sums cancel differently (seen: a compile_step .grad of a Linear after a submodule
// swap), while a value that is really wrong differs by the order of the values themselves.
// compile_step's fused optimizer updates (CompileOptions::fused_optimizers) are compared the
// same way.
#pragma once

#include <tcap/compile.h>
#include <tcap/stance.h>

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace tcap::cache {

struct Tolerance {
  bool exact = true;
  double rtol = 0, atol = 0;
};

// How the results of code compiled with `options` are compared with eager's, per dtype.
struct Tolerances {
  bool exact = true;  // the eager backend, no user compiler, no fused optimizer updates
  Tolerance of(c10::ScalarType t) const;
  static Tolerances for_options(const CompileOptions& options);
};

// "" when `compiled` matches `eager` (both undefined, or same shape, dtype and device, and
// values within `tol`), else how they differ ("a difference of 0.25 at [3, 1] ...": the
// element furthest outside the tolerance).
std::string compare_tensors(const at::Tensor& compiled, const at::Tensor& eager, const Tolerances& tol);

// The verify options a front door with `options` runs under now: CompileOptions::verify
// when set, else the thread's (StanceGuard), else the process's (TCAP_VERIFY, set_verify).
VerifyOptions verify_options_for(const CompileOptions& options);

// Counts one front door's replays and says which to verify (every `every`-th). Thread-safe.
class VerifyCounter {
 public:
  bool next(const VerifyOptions& v) {
    if (!v.on()) return false;
    return n_.fetch_add(1, std::memory_order_relaxed) % static_cast<uint64_t>(v.every) == 0;
  }

 private:
  std::atomic<uint64_t> n_{0};
};

// A verified call's result: "" when everything matched, else the first difference.
struct VerifyReport {
  std::string who;        // "'fn' entry 0", "step 'train' entry 1", "compiled autograd entry 3"
  std::string what;       // "output 0", "the gradient of 'fc.weight'", "buffer 'bn.running_mean'"
  std::string how;        // compare_tensors' words
  std::string likely;     // the likely cause, for this front door and entry
};

// Throws VerifyError, or warns with log_only; logs under `verify` either way.
void report_mismatch(const VerifyOptions& v, const VerifyReport& r);
// Logs a verified call that matched (under `verify`).
void report_match(const std::string& who, size_t compared);

}  // namespace tcap::cache
