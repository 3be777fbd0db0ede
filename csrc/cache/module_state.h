// The state of the modules a compiled function or step was given, as its guards see it
// (DESIGN.md D11): the trees, each module's training flag and the options of LibTorch's
// own module types.
//
// Note [Module state guards]
// A module's graph depends on more than its parameters and buffers (which are inputs of
// every graph, so an optimizer's in-place update needs no recompile):
//   * the module tree: which submodules there are, in which order, and which objects they
//     are. `model->replace_module("fc", nn::Linear(...))` or a ReLU swapped for a Tanh
//     changes what the forward computes, and parameters alone cannot tell (a Tanh has
//     none);
//   * every module's training flag (Dropout, BatchNorm);
//   * the options of LibTorch's module types: `dropout->options.p(0.2)`,
//     `bn->options.momentum(0.5)`, `conv->options.stride(2)` change the ops recorded,
//     or their arguments, without touching a tensor.
// Each call reads all three from the live modules (ModuleView, in place through the
// module tables, without copying a table) and compares them with what the entry was
// captured at: a difference recaptures, naming the module by its path. Options are read
// per module type from a table of LibTorch's types: an options struct that is trivially
// copyable (Dropout's, BatchNorm's, Conv's, MultiheadAttention's, most) is compared as
// its bytes; the others (vectors, strings, tensors, functions inside) by their fields
// where listed, else by the module's pretty_print(). The table is LibTorch's, not a
// choice: a test (module_options_coverage_test.cpp) reads the pinned LibTorch's headers
// and fails when a module type with an options struct, or a field of a struct read by
// fields, is not covered. What a user-defined module keeps in
// members of its own (a float, a flag) is not seen: it is the function's closure, under
// the contract of docs/compile.md ("What a replay re-reads and what it freezes").
// Modules are compared by address and type, and never kept alive by an entry: a module
// freed and another made at the same address with the same type is read like any other
// (its parameters, flags and options are the live ones).
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace tcap::cache {

// What one call sees of its modules: every module of the roots' trees in preorder (the
// order Module::modules() and named_parameters() walk them: a module, then each child's
// tree in registration order), with its type, training flag and options digest.
struct ModuleView {
  std::vector<const torch::nn::Module*> modules;
  std::vector<const std::type_info*> types;
  std::vector<uint8_t> training;
  std::string options;                 // the options digests of all modules, concatenated
  std::vector<uint32_t> options_end;   // per module: where its digest ends in `options`
  std::vector<std::string> paths;      // per module, only when read with names ("fc1", "" for a root)

  void clear();
  size_t size() const { return modules.size(); }
  // Appends the defined parameters (or buffers) of every viewed module: the order of
  // named_parameters(true) / named_buffers(true) over the roots.
  void append_tensors(bool buffers, std::vector<at::Tensor>& out) const;
  // The same, with their dotted names ("fc1.weight"; this view must have been read with
  // names).
  void append_named_tensors(bool buffers, std::vector<at::Tensor>& out, std::vector<std::string>& names) const;
  // "" when `now` is the same state, else what changed, naming the module by this view's
  // path (this view must have been read with names).
  std::string mismatch(const ModuleView& now) const;
  // Readable guards ("module 'fc' torch::nn::Linear, training, options ...").
  std::vector<std::string> describe() const;
};

// Reads the trees of `roots` into `v` (reusing its buffers); paths only `with_names`.
void read_modules(const std::vector<std::shared_ptr<torch::nn::Module>>& roots, ModuleView& v, bool with_names);

// The options digest of one module (empty for types without options): what the guards
// compare. Exposed for tests.
std::string options_digest(const torch::nn::Module& m);

// What the guards cover, for the test that compares it with the pinned LibTorch's headers
// (every module type with an options struct, every field of the structs read by fields):
// the module types whose options are read ("Linear", "Embedding"), and per type read by
// fields, the fields read (empty for a struct read whole by a reader of its own).
std::vector<std::string> module_types_read();
std::vector<std::pair<std::string, std::vector<std::string>>> option_fields_read();

}  // namespace tcap::cache
