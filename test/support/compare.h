// Helpers shared by the test suite: comparing tensors with eager and printing graphs on failure.
#pragma once

#include <tcap/graph.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace tcap::testing {

// allclose with a readable failure: max abs difference and where.
inline ::testing::AssertionResult close(const at::Tensor& actual, const at::Tensor& expected,
                                        double rtol = 1e-5, double atol = 1e-6) {
  if (!actual.defined() || !expected.defined()) {
    if (actual.defined() == expected.defined()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "one tensor is undefined";
  }
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " != " << expected.sizes();
  }
  if (actual.scalar_type() != expected.scalar_type()) {
    return ::testing::AssertionFailure() << "dtype " << actual.scalar_type() << " != "
                                         << expected.scalar_type();
  }
  if (at::allclose(actual, expected, rtol, atol, /*equal_nan=*/true)) return ::testing::AssertionSuccess();
  auto diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs();
  return ::testing::AssertionFailure() << "max abs diff " << diff.max().item<double>()
                                       << " (rtol " << rtol << ", atol " << atol << ")";
}

inline std::string dump(const ir::Graph& g) { return ir::to_string(g); }

// sum_k (outs[k] * weights[k]).sum() over the outputs that require grad (undefined when
// none does): one scalar whose backward gives every input a weighted gradient.
inline at::Tensor weighted_loss(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& weights) {
  at::Tensor loss;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!outs[k].requires_grad()) continue;
    at::Tensor term = (outs[k] * weights.at(k)).sum();
    loss = loss.defined() ? loss + term : term;
  }
  return loss;
}

// Each tensor's .grad (a copy; undefined where it has none), reset for the next backward.
inline std::vector<at::Tensor> take_grads(std::vector<at::Tensor>& in) {
  std::vector<at::Tensor> grads;
  for (auto& t : in) {
    grads.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
    if (t.grad().defined()) t.mutable_grad().reset();
  }
  return grads;
}

}  // namespace tcap::testing
