// The one place tcap reads torch::nn::Module's own tables of parameters and buffers in
// place. Module::parameters(false) and buffers(false) copy their table's values into a new
// vector on every call (and named_parameters(false) the whole table, names and hash index);
// a compiled module gathers its tensors on every call, and for a small model those copies
// were a measurable share of a replay. The tables are not public (parameters_ is protected,
// buffers_ private): module_tables.cpp reaches them through member pointers, so a LibTorch
// upgrade that renames or retypes them breaks the build there, not in the callers.
#pragma once

#include <torch/nn/module.h>

#include <vector>

namespace tcap::aot {

// Appends m's own (not its submodules') defined parameters, or buffers, in registration
// order: the tensors m.parameters(false) / m.buffers(false) return, without their copy.
void append_own_tensors(const torch::nn::Module& m, bool buffers, std::vector<at::Tensor>& out);

}  // namespace tcap::aot
