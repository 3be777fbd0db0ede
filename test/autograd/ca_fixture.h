// What the compiled autograd tests share: options by name and backend, a fixture that
// resets compiled autograd's caches, and a count of a graph's hook nodes.
#pragma once

#include <tcap/compiled_autograd.h>
#include <tcap/compile.h>
#include <tcap/graph.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace tcap::testing {

inline tcap::CompileOptions opts(const std::string& name, const std::string& backend = "eager") {
  tcap::CompileOptions o;
  o.name = name;
  o.backend = backend;
  return o;
}

inline int count_call_hooks(const tcap::ir::Graph& g) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node.kind == tcap::ir::NodeKind::CallHook;
  return n;
}

class CompiledAutogradTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tcap::reset_compiled_autograd();
    torch::manual_seed(0);
  }
};

}  // namespace tcap::testing
