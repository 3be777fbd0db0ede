// Note [Options a front door does not use]: every front door refuses, when it is made, the
// CompileOptions fields it would otherwise ignore, naming the field; the fields it uses
// are accepted.
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/train_step.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

using Tensors = std::vector<at::Tensor>;

void expect_refused(const std::function<void()>& make, const std::string& field) {
  try {
    make();
    ADD_FAILURE() << "accepted; expected a refusal naming " << field;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(field), std::string::npos) << e.what_without_backtrace();
  }
}

tcap::Executable identity_compiler(const tcap::ir::Graph& g) { return tcap::eager_backend(g); }

TEST(UnusedOptions, CompileRefusesFusedOptimizers) {
  tcap::CompileOptions o;
  o.fused_optimizers = true;
  expect_refused([&] { tcap::compile([](const Tensors& in) { return Tensors{in[0] * 2}; }, o); }, "fused_optimizers");
  tcap::CompileOptions used;
  used.fw_compiler = identity_compiler;
  used.bw_compiler = identity_compiler;
  EXPECT_NO_THROW(tcap::compile([](const Tensors& in) { return Tensors{in[0] * 2}; }, used));
}

TEST(UnusedOptions, CompileStepRefusesCompilersCudaGraphsAndModules) {
  auto model = torch::nn::Linear(3, 2);
  torch::optim::SGD opt(model->parameters(), 0.1);
  auto step = [model](const Tensors& in) mutable { return Tensors{model->forward(in[0]).sum()}; };
  auto make = [&](const tcap::CompileOptions& o) { tcap::compile_step(model.ptr(), opt, step, o); };
  tcap::CompileOptions fw;
  fw.fw_compiler = identity_compiler;
  expect_refused([&] { make(fw); }, "fw_compiler");
  tcap::CompileOptions bw;
  bw.bw_compiler = identity_compiler;
  expect_refused([&] { make(bw); }, "bw_compiler");
  tcap::CompileOptions graphs;
  graphs.cuda_graphs = true;
  expect_refused([&] { make(graphs); }, "cuda_graphs");
  tcap::CompileOptions mods;
  mods.modules = {model.ptr()};
  expect_refused([&] { make(mods); }, "modules");
  tcap::CompileOptions used;
  used.fused_optimizers = true;
  EXPECT_NO_THROW(make(used));
}

TEST(UnusedOptions, CompiledAutogradRefusesForwardOptions) {
  tcap::CompileOptions fw;
  fw.fw_compiler = identity_compiler;
  expect_refused([&] { tcap::CompiledAutogradGuard guard(fw); }, "fw_compiler");
  tcap::CompileOptions fused;
  fused.fused_optimizers = true;
  expect_refused([&] { tcap::CompiledAutogradGuard guard(fused); }, "fused_optimizers");
  tcap::CompileOptions mods;
  mods.modules = {torch::nn::Linear(2, 2).ptr()};
  expect_refused([&] { tcap::CompiledAutogradGuard guard(mods); }, "modules");
  tcap::CompileOptions used;
  used.bw_compiler = identity_compiler;
  used.name = "unused_options_bw";
  EXPECT_NO_THROW(tcap::CompiledAutogradGuard guard(used));
}

// A misspelt backend is refused when the front door is made, not after a capture.
TEST(UnusedOptions, UnknownBackendIsRefusedByEveryFrontDoor) {
  tcap::CompileOptions o;
  o.backend = "llvmm";
  expect_refused([&] { tcap::compile([](const Tensors& in) { return Tensors{in[0] * 2}; }, o); }, "'llvmm'");
  auto model = torch::nn::Linear(3, 2);
  torch::optim::SGD opt(model->parameters(), 0.1);
  expect_refused(
      [&] {
        tcap::compile_step(model.ptr(), opt, [model](const Tensors& in) mutable { return Tensors{model->forward(in[0]).sum()}; },
                           o);
      },
      "'llvmm'");
  expect_refused([&] { tcap::CompiledAutogradGuard guard(o); }, "'llvmm'");
}

}  // namespace
