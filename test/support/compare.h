// Helpers shared by the test suite: comparing tensors with eager and printing graphs on failure.
#pragma once

#include <tcap/graph.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>

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

}  // namespace tcap::testing
