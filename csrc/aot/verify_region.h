// Verified calls of tcap::compile functions (verify mode; Note [Verifying a compiled
// region] in verify_region.cpp).
#pragma once

#include "aot/region_entry.h"
#include "aot/replay_function.h"

#include <tcap/compile.h>
#include <tcap/stance.h>

#include <functional>
#include <memory>
#include <vector>

namespace tcap::aot {

// The function's own code run eagerly on the call's inputs, or, given `leaves`, on those
// instead of the call's first leaves->size() inputs.
using EagerRun = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>* leaves)>;

// Replays `served` (the entry serving this call; `guarded` is the entry whose guards hit,
// the same one unless `served` is a specialization of it) on `primals`, runs `run_eager`
// (the function's own code on the same inputs) with the same random numbers and written
// buffers, compares outputs and written buffers, and returns the compiled outputs, whose
// backward compares gradients too. A difference is reported per `v` (VerifyError, or a
// warning and eager's outputs). `num_inputs`: how many of the primals are the call's own
// inputs (the others are module tensors and held tensors).
std::vector<at::Tensor> verified_call(const std::shared_ptr<const RegionEntry>& served, const RegionEntry& guarded,
                                      const std::vector<at::Tensor>& primals, size_t num_inputs,
                                      const EagerRun& run_eager, const CompileOptions& options, const VerifyOptions& v);

// A verified call's backward: compares `compiled` (one gradient per primal) with eager's
// gradients of v's eager outputs for the `incoming` gradients, reports a difference per
// v.options, and returns eager's gradients, which are handed on.
torch::autograd::variable_list verified_gradients(RegionVerify& v, const torch::autograd::variable_list& incoming,
                                                  torch::autograd::variable_list compiled);

// What a mismatch of `e` is most likely due to (its contract: docs/compile.md, "What a
// replay re-reads and what it freezes").
std::string likely_cause(const RegionEntry& e, const CompileOptions& options);

}  // namespace tcap::aot
