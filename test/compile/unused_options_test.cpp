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

TEST(UnusedOptions, CompileStepRefusesBwCompilerAndModules) {
  auto model = torch::nn::Linear(3, 2);
  torch::optim::SGD opt(model->parameters(), 0.1);
  auto step = [model](const Tensors& in) mutable { return Tensors{model->forward(in[0]).sum()}; };
  auto make = [&](const tcap::CompileOptions& o) { tcap::compile_step(model.ptr(), opt, step, o); };
  tcap::CompileOptions bw;
  bw.bw_compiler = identity_compiler;
  expect_refused([&] { make(bw); }, "bw_compiler");
  tcap::CompileOptions mods;
  mods.modules = {model.ptr()};
  expect_refused([&] { make(mods); }, "modules");
  // The step's one graph takes fw_compiler, and CUDA graphs (Note [Host scalars as graph inputs]).
  tcap::CompileOptions used;
  used.fused_optimizers = true;
  used.fw_compiler = identity_compiler;
  used.cuda_graphs = true;
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

// A misspelt backend name is refused where it is written, before any front door sees it;
// each backend is written either way.
TEST(UnusedOptions, UnknownBackendNameIsRefusedWhereItIsWritten) {
  tcap::CompileOptions o;
  expect_refused([&] { o.backend = "llvmm"; }, "'llvmm'");
  expect_refused([&] { o.backend = std::string("Eager"); }, "eager, llvm, cuda, auto");
  EXPECT_EQ(o.backend, tcap::Backend::Eager);  // unchanged by the refused names
  for (const char* name : {"eager", "llvm", "cuda", "auto"}) {
    o.backend = name;
    EXPECT_STREQ(o.backend.name(), name);
  }
  EXPECT_EQ(tcap::Backend("llvm"), tcap::Backend::Llvm);
  EXPECT_NE(tcap::Backend("cuda"), tcap::Backend::Llvm);
  EXPECT_TRUE(tcap::Backend(tcap::Backend::Auto).available());
  EXPECT_TRUE(tcap::Backend(tcap::Backend::Eager).available());
  std::string why;
  if (!tcap::Backend(tcap::Backend::Cuda).available(&why)) {
    EXPECT_FALSE(why.empty());
  }
}

}  // namespace
