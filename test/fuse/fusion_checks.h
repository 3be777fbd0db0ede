// What the fusion tests share (fusion_test.cpp, fusion_rules_test.cpp): the graph compilers
// that record what the fusion pass found, the tolerances of fused kernels against eager
// (fusion_test.cpp's header says why), the comparison with eager of a function's values
// and gradients, and the fixture that skips without LLVM.
#pragma once

#include <tcap/compile.h>
#include <tcap/interpreter.h>

#include "codegen/cpu_llvm/cpu_llvm.h"
#include "fuse/fusion.h"
#include "fuse/lowering.h"
#include "ir/op_facts.h"
#include "runtime/fused_kernel.h"
#include "support/compare.h"
#include "support/logging.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <regex>
#include <set>
#include <stdexcept>
#include <thread>
#include <filesystem>
#include <functional>
#include <cstdlib>
#include <unistd.h>
#include <limits>
#include <string>
#include <vector>


namespace tcap::testing::fusion {

using Tensors = std::vector<at::Tensor>;
using Fn = std::function<Tensors(const Tensors&)>;

using tcap::testing::close;
using tcap::testing::take_grads;
using tcap::testing::weighted_loss;

// Groups found by the fusion pass in the forward and backward graphs of fn's first entry.
struct Seen {
  std::vector<tcap::fuse::FusionResult> results;  // forward, then backward
};

inline tcap::GraphCompiler spy(Seen* seen) {
  return [seen](const tcap::ir::Graph& g) {
    tcap::fuse::FusionOptions o;
    std::atomic<int64_t> next{1000000};  // compile runs on several threads
    o.compile = [&](const tcap::fuse::FusedGroup&, std::string*) { return next.fetch_add(1); };
    seen->results.push_back(tcap::fuse::fuse(g, o));
    return tcap::llvm_backend(g);
  };
}

// Options whose forward and backward compilers record what the fusion pass found (the
// function's name left at its default unless given).
inline tcap::CompileOptions spied(Seen* seen, const std::string& name = {}) {
  tcap::CompileOptions options;
  if (!name.empty()) options.name = name;
  options.fw_compiler = spy(seen);
  options.bw_compiler = spy(seen);
  return options;
}

// The forward graph tcap::compile hands its compiler for fn's first entry (the compiled
// graph runs the eager backend), after the calls `calls` makes with it.
inline tcap::ir::Graph captured_forward(const Fn& fn, const std::function<void(tcap::CompiledFunction&)>& calls) {
  tcap::CompileOptions options;
  tcap::ir::Graph captured;
  options.fw_compiler = [&captured](const tcap::ir::Graph& g) {
    captured = g;
    return tcap::eager_backend(g);
  };
  auto f = tcap::compile(fn, options);
  calls(*f);
  return captured;
}

struct Tol {
  double rtol, atol;
};

inline Tol tol_for(at::ScalarType t) {
  if (t == at::kDouble) return {1e-9, 1e-11};
  return {1e-4, 1e-5};
}

// bfloat16 is not compared with eager directly: eager rounds to bfloat16 after every op and
// can land further from the exact result than a fused kernel that computes in float32 and
// rounds once, by more than any fixed tolerance (seen: 0.036 eager vs 0.015 fused). Instead
// both are measured against the same computation in float64, and the compiled result must
// be no further from it than eager is, plus
//   kBf16Rounding * |exact|: up to two bfloat16 roundings of the element (a compiled graph
//     stores an intermediate between kernels, then rounds the result), and
//   kBf16Rounding / 2 * max |exact|: one rounding of terms as large as the tensor's largest
//     that cancel in the element (seen: exact 0.00014 from gradient terms near 0.25).
inline constexpr double kBf16Rounding = 1.0 / 128;

inline ::testing::AssertionResult no_worse_than_eager(const at::Tensor& got, const at::Tensor& eager,
                                               const at::Tensor& exact) {
  if (!got.defined() || !eager.defined()) {
    if (got.defined() == eager.defined()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "one tensor is undefined";
  }
  if (got.sizes() != exact.sizes() || got.scalar_type() != eager.scalar_type()) {
    return ::testing::AssertionFailure() << "shape/dtype " << got.sizes() << " " << got.scalar_type() << " vs "
                                         << exact.sizes() << " " << eager.scalar_type();
  }
  const auto g = got.detach().to(at::kDouble), e = eager.detach().to(at::kDouble), x = exact.detach();
  const auto err = (g - x).abs(), eager_err = (e - x).abs();
  const double scale = x.numel() ? x.abs().nan_to_num(0, 0, 0).max().item<double>() : 0.0;
  const auto bound = eager_err + kBf16Rounding * x.abs() + kBf16Rounding / 2 * scale;
  const auto nan_ok = g.isnan() == x.isnan();
  const auto bad = (err > bound).logical_and(x.isnan().logical_not()).logical_or(nan_ok.logical_not());
  if (!bad.any().item<bool>()) return ::testing::AssertionSuccess();
  const auto excess = (err - bound).nan_to_num(1e9).flatten();
  const int64_t i = excess.argmax().item<int64_t>();
  return ::testing::AssertionFailure() << "compiled " << g.flatten()[i].item<double>() << " is "
                                       << err.flatten()[i].item<double>() << " from the float64 result "
                                       << x.flatten()[i].item<double>() << "; eager ("
                                       << e.flatten()[i].item<double>() << ") is " << eager_err.flatten()[i].item<double>()
                                       << " from it (index " << i << ")";
}

// Calls a compiled fn three times on fresh inputs (first call captures) and checks outputs
// and input gradients against eager; checks generated kernels ran and none fell back.
// bf16_fused_output: a bfloat16 output computed by a chain of several ops in one kernel,
// whose mean error against float64 must be below eager's.
inline void check_against_eager(const std::string& name, const Fn& fn, const std::function<Tensors()>& make_inputs,
                         at::ScalarType dtype, bool expect_kernels = true, int bf16_fused_output = -1) {
  SCOPED_TRACE(name);
  const Tol tol = tol_for(dtype);
  tcap::CompileOptions options;
  options.name = name;
  options.backend = "llvm";
  auto f = tcap::compile(fn, options);
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE("call " + std::to_string(call + 1));
    Tensors in = make_inputs();
    const auto before = tcap::runtime::runtime_stats();
    Tensors out = (*f)(in);
    Tensors weights;
    for (const auto& o : out) weights.push_back(torch::randn(o.sizes(), o.options().requires_grad(false)));
    if (at::Tensor loss = weighted_loss(out, weights); loss.defined()) loss.backward();
    const auto after = tcap::runtime::runtime_stats();
    Tensors got_grads = take_grads(in);
    ASSERT_EQ(f->eager_reason(), "");
    if (call > 0) {
      EXPECT_GE(f->stats().replays, call);
      if (expect_kernels) {
        EXPECT_GT(after.launches, before.launches) << "no fused kernel ran";
      }
      EXPECT_EQ(after.fallbacks, before.fallbacks) << "a fused kernel ran its ATen fallback";
    }
    Tensors ref = fn(in);
    ASSERT_EQ(ref.size(), out.size());
    if (at::Tensor loss = weighted_loss(ref, weights); loss.defined()) loss.backward();
    const Tensors want_grads = take_grads(in);
    // bfloat16: the same computation in float64 (see no_worse_than_eager).
    Tensors exact, exact_grads;
    if (dtype == at::kBFloat16) {
      Tensors in64;
      for (const auto& t : in) in64.push_back(t.detach().to(at::kDouble).requires_grad_(t.requires_grad()));
      exact = fn(in64);
      Tensors weights64;
      for (const auto& w : weights) weights64.push_back(w.to(at::kDouble));
      if (at::Tensor loss = weighted_loss(exact, weights64); loss.defined()) loss.backward();
      for (auto& t : in64) exact_grads.push_back(t.grad());
    }
    for (size_t k = 0; k < out.size(); ++k) {
      if (dtype == at::kBFloat16) {
        EXPECT_TRUE(no_worse_than_eager(out[k], ref[k], exact[k])) << "output " << k;
        if (call > 0 && bf16_fused_output == static_cast<int>(k)) {
          // Rounding once must show on average: across the tensor the fused result is
          // closer to float64 than eager's op-by-op rounding.
          const double fused_err = (out[k].detach().to(at::kDouble) - exact[k]).abs().mean().item<double>();
          const double eager_err = (ref[k].detach().to(at::kDouble) - exact[k]).abs().mean().item<double>();
          EXPECT_LT(fused_err, eager_err) << "output " << k << " mean error vs float64";
        }
      } else {
        EXPECT_TRUE(close(out[k].detach(), ref[k].detach(), tol.rtol, tol.atol)) << "output " << k;
      }
      EXPECT_EQ(out[k].sizes(), ref[k].sizes());
      EXPECT_EQ(out[k].strides(), ref[k].strides()) << "output " << k << " layout differs from eager";
    }
    for (size_t k = 0; k < in.size(); ++k) {
      if (dtype == at::kBFloat16) {
        EXPECT_TRUE(no_worse_than_eager(got_grads[k], want_grads[k], exact_grads[k])) << "grad of input " << k;
      } else {
        EXPECT_TRUE(close(got_grads[k], want_grads[k], tol.rtol, tol.atol)) << "grad of input " << k;
      }
    }
  }
}

inline at::Tensor leaf(at::Tensor t) { return t.detach().requires_grad_(true); }

// Group fg's kernel compiled by the cpu_llvm backend now and added to *table, the fused
// graph's kernel table; its place there. What a FusionOptions::compile of a test returns.
inline int64_t add_llvm_kernel(const tcap::fuse::FusedGroup& fg, tcap::runtime::KernelTable* table) {
  auto k = std::make_shared<tcap::runtime::FusedKernel>();
  k->name = fg.name;
  k->kernel = fg.kernel;
  auto code = std::make_shared<tcap::runtime::CpuCode>();
  code->main = tcap::codegen::cpu_llvm::compile_cpu_kernel(fg.kernel);
  k->compiled = std::move(code);
  k->inputs = fg.input_metas;
  k->outputs = fg.output_metas;
  k->fallback = fg.fallback;
  return table->add(std::move(k));
}

class Fusion : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!tcap::codegen::cpu_llvm::cpu_llvm_available(&why)) GTEST_SKIP() << why;
  }
};

}  // namespace tcap::testing::fusion
