// Extern ATen ops the interpreter calls unboxed, below the dispatcher (Note [Unboxed
// extern calls] in unboxed_calls.cpp), as Inductor's C++ wrapper calls `at::cpu::`
// functions through its C shims: the CPU kernel itself, its arguments converted once when
// the interpreter is built (floats and Scalars read from the prepared stack per call). Ops
// without an adapter here, and calls the adapter's checks refuse, go through the
// dispatcher as before (as AOTInductor's proxy executor does for ops without a shim).
#pragma once

#include <tcap/graph.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <functional>
#include <memory>
#include <vector>

namespace tcap::interp {

class UnboxedCall {
 public:
  using Env = std::vector<at::Tensor>;  // the interpreter's tensors, by value id
  // Reads the node's tensors from env and its float and Scalar constants from `prepared`
  // (the node's prepared stack, where the interpreter writes each run's host scalars).
  using Body = std::function<std::vector<at::Tensor>(const Env&, const torch::jit::Stack& prepared)>;
  UnboxedCall(Body body, std::vector<ir::ValueId> tensors) : body_(std::move(body)), tensors_(std::move(tensors)) {}

  // Whether the kernel may be called directly on this run's tensors: every tensor it reads
  // is defined and a plain dense CPU tensor (no conjugate or negative bit, no wrapper or
  // mode key: the key set of a fresh CPU tensor). Else the dispatcher must see the call.
  bool accepts(const Env& env) const;
  // The op's results, in schema order (none for an op that returns nothing).
  std::vector<at::Tensor> run(const Env& env, const torch::jit::Stack& prepared) const;

 private:
  Body body_;
  std::vector<ir::ValueId> tensors_;  // every tensor argument, lists and optionals included
};

// The unboxed call of node n (its operator `op`, its constant arguments built in
// `prepared` as Note [Prepared argument stacks] has them), or null: no adapter for the
// operator, or this LibTorch registers its CPU kernel elsewhere than the adapter expects.
std::unique_ptr<UnboxedCall> make_unboxed_call(const ir::Node& n, const c10::OperatorHandle& op,
                                               const torch::jit::Stack& prepared);

// Tests: turns unboxed calls off (true) or on for interpreters built afterwards; the
// number of unboxed calls made in this process.
void disable_unboxed_calls_for_testing(bool off);
int64_t unboxed_calls_made();

}  // namespace tcap::interp
