// The variants of a compile workload (bench/workloads_compile.cpp, Note [What a compile
// workload measures]): one step per variant, how close a replay must come to eager, and
// the variants' rows; the workloads themselves are in workloads_compile_list.cpp.
#pragma once

#include "workloads.h"

#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tcap::bench::compile_workloads {

using Tensors = std::vector<at::Tensor>;

// One variant's step. See Note [What a compile workload measures].
struct Step {
  std::string what;                                   // "coscos/tcap_eager", for messages
  std::function<at::Tensor()> forward;                // the timed call
  std::function<at::Tensor(const at::Tensor&)> loss;  // untimed, eager
  Tensors leaves;                                     // what the backward writes .grad of
  std::shared_ptr<tcap::CompiledFunction> compiled;   // tcap variants only
  std::shared_ptr<tcap::CompiledAutogradOptions> ca;  // compiled-autograd variants only
};

// How close a replay must come to eager, elementwise:
//   |got - want| <= atol * max|want| + rtol * |want|.
// atol is relative to the tensor's largest magnitude, so one tolerance fits an output of
// order 1 and the grads of a mean over 16M elements (order 1e-8, where any absolute atol
// would accept anything).
struct Tolerance {
  double rtol;
  double atol;
};
// Pointwise and tiny workloads: a fused backend may round differently, by a few ulp.
constexpr Tolerance kPointwiseTol{1e-5, 1e-6};
// Big matmuls and reductions (K = 4096): a backend may sum in another order.
constexpr Tolerance kMatmulTol{1e-4, 1e-5};

// Builds the step of one variant: options is null for eager.
using MakeStep = std::function<Step(const tcap::CompileOptions* options)>;
using Loss = std::function<at::Tensor(const at::Tensor&)>;

// A step calling fn(inputs)[0]: eagerly (options == nullptr) or through tcap::compile.
inline Step function_step(Tensors (*fn)(const Tensors&), Tensors inputs, Tensors leaves, Loss loss,
                   const tcap::CompileOptions* options) {
  Step s;
  s.leaves = std::move(leaves);
  s.loss = std::move(loss);
  if (!options) {
    s.forward = [fn, inputs] { return fn(inputs)[0]; };
  } else {
    s.compiled = tcap::compile(fn, *options);
    s.forward = [f = s.compiled.get(), inputs] { return (*f)(inputs)[0]; };
  }
  return s;
}

// A step calling module->forward(x): eagerly (options == nullptr) or through
// tcap::compile(module); the leaves are the module's parameters.
template <class M>
Step module_step(M module, at::Tensor x, Loss loss, const tcap::CompileOptions* options) {
  Step s;
  s.leaves = module->parameters();
  s.loss = std::move(loss);
  if (!options) {
    s.forward = [module, x]() mutable { return module->forward(x); };
  } else {
    s.compiled = tcap::compile(module, *options);
    // The compiled function holds the module weakly: the step keeps it alive.
    s.forward = [f = s.compiled.get(), module, x] { return f->forward(x); };
  }
  return s;
}

// The variants of workload `workload` (Note [What a compile workload measures]), each step
// made by make_step, checked against eager within `tol`.
std::vector<Variant> make_variants(const std::string& workload, const Options& opts, Tolerance tol,
                                   const MakeStep& make_step);
// The bwd_ratio and GEMM-floor ratios of a workload's records.
void derive_bwd_ratio(std::vector<Record>& records);

}  // namespace tcap::bench::compile_workloads
