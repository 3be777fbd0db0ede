// The one place tcap reads torch::nn::Module's own tables (parameters, buffers,
// submodules) in place. Module::parameters(false), buffers(false) and children() copy
// their table's values into a new vector on every call (and named_parameters(false) the
// whole table, names and hash index); compiled modules and steps read the tables on every
// call, and for a small model those copies were a measurable share of a replay. The
// tables are not public (parameters_ is protected, buffers_ and children_ private):
// module_tables.cpp reaches them through member pointers, so a LibTorch upgrade that
// renames or retypes them breaks the build there, not in the callers.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <vector>

namespace tcap::cache {

// Appends m's own (not its submodules') defined parameters, or buffers, in registration
// order: the tensors m.parameters(false) / m.buffers(false) return, without their copy.
void append_own_tensors(const torch::nn::Module& m, bool buffers, std::vector<at::Tensor>& out);

// m's own parameter (or buffer) table, undefined entries included.
const torch::OrderedDict<std::string, at::Tensor>& own_tensor_table(const torch::nn::Module& m, bool buffers);

// m's direct submodules in registration order (m.children()), without their copy.
const torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>& children_of(const torch::nn::Module& m);

}  // namespace tcap::cache
