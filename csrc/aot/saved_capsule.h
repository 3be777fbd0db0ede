// What a compiled region's autograd node keeps for its backward (Note [Saved tensors of a
// compiled region]), and the backward that recomputes the forward from it instead of
// running the compiled backward (recompute.cpp: Notes [What a recompute reads] and [A
// recompute that does not reproduce the forward]).
#pragma once

#include "aot/region_entry.h"
#include "aot/replay_function.h"

#include <torch/csrc/autograd/saved_variable.h>
#include <torch/custom_class.h>

#include <string>
#include <vector>

namespace tcap::aot {

// Note [Saved tensors of a compiled region]: what a ReplayFunction node keeps for its
// backward. The engine frees a built-in node's saved tensors one node at a time, as the
// backward moves up the graph; a compiled backward is one node, so a tensor saved in the
// context would live until the whole compiled backward returns (CppNode::apply holds the
// node's mutex, so release_variables() cannot be called from inside). So the saved values
// that are not outputs of the region (intermediates and primals) are kept here instead,
// and without retain_graph the backward moves them out and hands the executable the only
// references: it frees each at its last use, as the engine would (the peak memory of the
// backward is eager's, not eager's plus every saved tensor). The saved values that are
// outputs stay in the context's SavedVariables: holding an output here would be a
// reference cycle (output -> grad_fn -> context -> output). The checks SavedVariable
// makes are kept: an in-place change after the forward, and a second backward through
// a released node, are errors.
struct SavedCapsule : torch::CustomClassHolder {
  std::vector<at::Tensor> saved;      // per saved value; undefined where it is an output
  std::vector<uint32_t> versions;     // of `saved`, after the forward
  std::vector<size_t> in_context;     // the saved values kept by ctx->save_for_backward
  std::vector<at::Tensor> primals;    // for a backward that recomputes
  // Note [What a recompute reads]: the primals' versions after the forward, and copies of
  // the primals the forward writes (recompute_clones) made before it wrote them.
  std::vector<uint32_t> primal_versions;
  std::vector<at::Tensor> before_writes;  // per recompute_clones entry
  bool released = false;
  // Counts what the capsule holds of the entry's held tensors as tcap's own references
  // (Note [Held tensors]), so that a held tensor the program has replaced is not taken
  // for one it still uses while a backward is pending.
  cache::OwnRefsLease own_refs;

  void release() {
    released = true;
    std::vector<at::Tensor>().swap(saved);
    std::vector<at::Tensor>().swap(primals);
    std::vector<at::Tensor>().swap(before_writes);
    own_refs.release();
  }
  // The saved values in order, checked as SavedVariable::unpack checks; moved out when
  // `take` (the backward frees them), else copied. `from_context`: the values kept as
  // SavedVariables (in_context's), unpacked.
  std::vector<at::Tensor> unpack(const std::vector<at::Tensor>& from_context, const std::string& fn_name, bool take) {
    TORCH_CHECK(!released, torch::autograd::ERR_BACKWARD_TWICE);
    for (size_t k = 0; k < saved.size(); ++k) {
      if (!saved[k].defined()) continue;
      const uint32_t now = saved[k]._version();
      TORCH_CHECK(now == versions[k],
                  "one of the variables needed for gradient computation has been modified by an inplace operation: "
                  "saved tensor ", k, " of the compiled function '", fn_name, "' ([", saved[k].toString(), " ",
                  saved[k].sizes(), "]) is at version ", now, "; expected version ", versions[k], " instead.");
    }
    std::vector<at::Tensor> out;
    if (take) out.swap(saved);
    else out = saved;
    for (size_t j = 0; j < in_context.size(); ++j) out[in_context[j]] = from_context.at(j);
    if (take) release();
    return out;
  }
};

// Stops with eager's error for a saved tensor modified in place where a primal the
// recompute reads changed in place since the forward.
void check_recompute_reads(const RegionEntry& e, const SavedCapsule& capsule, const std::vector<at::Tensor>& primals,
                           const std::string& why);
// Gradients by recomputing e's forward from `primals` (the forward's written primals taken
// from the capsule's copies, the forward's RNG state restored when `rng` is given).
torch::autograd::variable_list recompute_backward(const RegionEntry& e, std::vector<at::Tensor> primals,
                                                  const SavedCapsule& capsule, const torch::autograd::variable_list& grads,
                                                  const RngStates* rng, bool create_graph,
                                                  std::vector<at::Tensor>* outputs);
// Stops with an error where the recompute's saved values (`outs` after the user outputs)
// differ from those the forward saved beyond the fused-kernel tolerance.
void check_recompute_reproduces(const RegionEntry& e, const SavedCapsule& capsule, const std::vector<at::Tensor>& outs,
                                const std::vector<at::Tensor>& from_context, const std::string& why);

}  // namespace tcap::aot
