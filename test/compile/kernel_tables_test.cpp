// Note [A compiled graph owns its kernels] (runtime/fused_kernel.h): a compiled graph's
// fused nodes name kernels by their place in the graph's own table. A fused graph runs
// only with that table (a dump of one refuses to run alone, naming the node), and a
// replay recorded by another capture records the ATen ops each kernel stands for, so the
// outer graph can be compiled, dumped and replayed on its own and agrees with eager.
#include <tcap/compile.h>
#include <tcap/graph_json.h>
#include <tcap/interpreter.h>
#include <tcap/train_step.h>

#include "runtime/fused_kernel.h"
#include "support/backends.h"
#include "support/compare.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <stdlib.h>

namespace {

using Tensors = std::vector<at::Tensor>;
using tcap::testing::close;
namespace fs = std::filesystem;

int fused_nodes(const tcap::ir::Graph& g) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node.op == "tcap::fused" || node.op == "tcap::fused_horizontal";
  return n;
}

Tensors inner_fn(const Tensors& in) { return {(in[0] * 1.5).sin() * in[0] + in[1].tanh()}; }

// The graph TCAP_DUMP_DIR's `*.fused.json` holds names kernels of a table it does not
// carry: the interpreter refuses it without one, and with a table too short, naming the
// node; the graph dumped before fusion replays alone and agrees with eager.
TEST(KernelTables, AFusedGraphRunsOnlyWithItsOwnTable) {
  TCAP_SKIP_WITHOUT_BACKEND("llvm");
  char templ[] = "/tmp/tcap_tables_XXXXXX";
  ASSERT_NE(::mkdtemp(templ), nullptr);
  const std::string dir = templ;
  tcap::CompileOptions o;
  o.name = "tables";
  o.backend = tcap::Backend::Llvm;
  o.dump_dir = dir;
  auto f = tcap::compile(inner_fn, o);
  const Tensors in{torch::randn({5, 7}), torch::randn({5, 7})};
  for (int call = 0; call < 2; ++call) EXPECT_TRUE(close((*f)(in)[0], inner_fn(in)[0], 1e-5, 1e-6));
  std::vector<std::string> fused_files, plain_forward;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(".fused.json") != std::string::npos) fused_files.push_back(e.path().string());
  }
  ASSERT_FALSE(fused_files.empty()) << "no fused graph dumped in " << dir;
  for (const auto& file : fused_files) {
    const tcap::ir::Graph g = tcap::ir::load_json(file);
    if (fused_nodes(g) == 0) continue;
    try {
      tcap::Interpreter run(g);
      ADD_FAILURE() << file << " was accepted without its kernel table";
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      EXPECT_NE(what.find("kernel table"), std::string::npos) << what;
      EXPECT_NE(what.find("node %"), std::string::npos) << "the error names the node: " << what;
    }
    try {
      tcap::Interpreter run(g, /*differentiable=*/false, std::make_shared<tcap::runtime::KernelTable>());
      ADD_FAILURE() << file << " was accepted with an empty kernel table";
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      EXPECT_NE(what.find("holds none there (0 places)"), std::string::npos) << what;
    }
  }
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
}

// An llvm-compiled function called inside another compiled function, whose capture sees
// the inner replay. The outer function agrees with eager in values and gradients over
// fresh inputs. (It runs eagerly, with the reason logged: the inner function's region
// hooks the autograd node of its input, which a compiled replay of the outer one would
// not call. What such a capture records of the kernels is checked where it compiles:
// compile_step below and compiled autograd, CompiledAutograd.RegionKernelsAreRecordedAsTheirOps.)
TEST(KernelTables, ACompiledFunctionInsideAnotherAgreesWithEager) {
  TCAP_SKIP_WITHOUT_BACKEND("llvm");
  for (const char* outer_backend : {"eager", "llvm"}) {
    tcap::CompileOptions io;
    io.name = std::string("inner_") + outer_backend;
    io.backend = tcap::Backend::Llvm;
    auto inner = tcap::compile(inner_fn, io);
    // The inner function replays (its kernels run) before the outer one captures it.
    for (int i = 0; i < 2; ++i) (*inner)({torch::randn({6, 9}), torch::randn({6, 9})});
    const auto launches = tcap::runtime::runtime_stats().launches;
    (*inner)({torch::randn({6, 9}), torch::randn({6, 9})});
    ASSERT_GT(tcap::runtime::runtime_stats().launches, launches) << "the inner function runs no generated kernel";
    auto outer_fn = [&](const Tensors& in) {
      const at::Tensor h = (*inner)({in[0], in[1]})[0];
      return Tensors{(h * in[1]).exp().sum(1)};
    };
    auto eager_fn = [](const Tensors& in) {
      const at::Tensor h = inner_fn({in[0], in[1]})[0];
      return Tensors{(h * in[1]).exp().sum(1)};
    };
    tcap::CompileOptions oo;
    oo.name = std::string("outer_") + outer_backend;
    oo.backend = outer_backend;
    auto outer = tcap::compile(outer_fn, oo);
    for (int call = 0; call < 4; ++call) {
      const Tensors a{torch::randn({6, 9}, torch::requires_grad()), torch::randn({6, 9}, torch::requires_grad())};
      const Tensors b{a[0].detach().clone().requires_grad_(true), a[1].detach().clone().requires_grad_(true)};
      const at::Tensor got = (*outer)(a)[0];
      const at::Tensor want = eager_fn(b)[0];
      ASSERT_TRUE(close(got, want, 1e-5, 1e-6)) << outer_backend << " call " << call;
      got.sum().backward();
      want.sum().backward();
      for (int i = 0; i < 2; ++i) {
        ASSERT_TRUE(close(a[i].grad(), b[i].grad(), 1e-4, 1e-5)) << outer_backend << " call " << call << " grad " << i;
      }
    }
    for (const auto& e : outer->entries()) EXPECT_EQ(fused_nodes(e.joint.graph), 0);
  }
}

// compile_step records a step whose model calls an llvm-compiled function: it trains as
// eager does (loss and parameters over several steps), and its step graph holds the
// ATen ops of the inner function's kernels, no node naming one of them.
TEST(KernelTables, AStepCallingACompiledFunctionTrainsAsEager) {
  TCAP_SKIP_WITHOUT_BACKEND("llvm");
  torch::manual_seed(3);
  torch::nn::Linear lin(9, 5), twin(9, 5);
  {
    torch::NoGradGuard ng;
    twin->weight.copy_(lin->weight);
    twin->bias.copy_(lin->bias);
  }
  tcap::CompileOptions io;
  io.name = "step_inner";
  io.backend = tcap::Backend::Llvm;
  auto inner = tcap::compile(inner_fn, io);
  torch::optim::SGD opt(lin->parameters(), 0.05), twin_opt(twin->parameters(), 0.05);
  auto body = [&](const Tensors& in) {
    opt.zero_grad();
    const at::Tensor h = (*inner)({lin(in[0]), in[1]})[0];
    at::Tensor loss = h.pow(2).mean();
    loss.backward();
    opt.step();
    return Tensors{loss.detach()};
  };
  tcap::CompileOptions so;
  so.name = "step_outer";
  so.backend = tcap::Backend::Llvm;
  auto step = tcap::compile_step(lin, opt, body, so);
  int replayed_in_captures = 0;  // inner replays (kernels run) while the step recorded them
  for (int s = 0; s < 5; ++s) {
    const Tensors in{torch::randn({4, 9}), torch::randn({4, 5})};
    const auto before = inner->stats();
    const at::Tensor loss = (*step)(in)[0];
    if (step->last_call().kind != tcap::CompiledStep::Call::Kind::Replayed) {
      replayed_in_captures += inner->stats().replays - before.replays;
    }
    twin_opt.zero_grad();
    at::Tensor want = inner_fn({twin(in[0]), in[1]})[0].pow(2).mean();
    want.backward();
    twin_opt.step();
    ASSERT_TRUE(close(loss, want.detach(), 1e-5, 1e-6)) << "step " << s;
    ASSERT_TRUE(close(lin->weight, twin->weight, 1e-5, 1e-6)) << "step " << s;
    ASSERT_TRUE(close(lin->bias, twin->bias, 1e-5, 1e-6)) << "step " << s;
  }
  EXPECT_GE(step->stats().replays, 1);
  EXPECT_GE(replayed_in_captures, 1) << "no capture of the step recorded a replay of the inner function";
  ASSERT_NE(step->graph(), nullptr);
  EXPECT_EQ(fused_nodes(*step->graph()), 0) << tcap::ir::to_string(*step->graph());
}

}  // namespace
