#include "autograd/autograd_shim.h"

namespace tcap::ca {
namespace {

// An explicit instantiation may name a private member ([temp.spec.general]), which is how
// is_saved_output reads SavedVariable::is_output_.
struct SavedVariableIsOutput {
  using type = bool torch::autograd::SavedVariable::*;
  friend type member(SavedVariableIsOutput);
};
template <class Tag, typename Tag::type M>
struct Expose {
  friend typename Tag::type member(Tag) { return M; }
};
template struct Expose<SavedVariableIsOutput, &torch::autograd::SavedVariable::is_output_>;

}  // namespace

bool is_saved_output(const torch::autograd::SavedVariable& sv) { return sv.*member(SavedVariableIsOutput{}); }

}  // namespace tcap::ca
