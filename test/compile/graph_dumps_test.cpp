// One dump for every front door (cache::dump_graphs): with TCAP_DUMP_DIR set (or
// CompileOptions::dump_dir), tcap::compile writes its entry's joint, forward and backward
// graphs, compile_step its step graph, compiled autograd its backward graph, each a graph
// JSON that loads back; a folder that cannot be written costs the dump, never the call.
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/graph_json.h>
#include <tcap/train_step.h>

#include "support/compare.h"
#include "support/logging.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <stdlib.h>

namespace {

using Tensors = std::vector<at::Tensor>;
namespace fs = std::filesystem;
using tcap::testing::close;

// A fresh folder, named in TCAP_DUMP_DIR while the scope lives.
struct DumpDir {
  DumpDir() {
    char templ[] = "/tmp/tcap_dumps_XXXXXX";
    EXPECT_NE(::mkdtemp(templ), nullptr);
    path = templ;
    setenv("TCAP_DUMP_DIR", path.c_str(), 1);
    tcap::reload_config_for_testing();
  }
  ~DumpDir() {
    unsetenv("TCAP_DUMP_DIR");
    tcap::reload_config_for_testing();
    // Not std::filesystem::remove_all: libtorch.so exports a copy of it that crashes when
    // called from here (LibTorch 2.11 wheel).
    EXPECT_EQ(std::system(("rm -rf '" + path + "'").c_str()), 0);
  }
  // The graph dumped as `file`, loaded back (it must exist and parse).
  tcap::ir::Graph load(const std::string& file) const {
    EXPECT_TRUE(fs::exists(path + "/" + file)) << file;
    return tcap::ir::load_json(path + "/" + file);
  }
  std::string path;
};

TEST(GraphDumps, EveryFrontDoorDumpsItsEntriesGraphs) {
  DumpDir dir;
  torch::manual_seed(0);
  torch::nn::Linear lin(4, 3);

  tcap::CompileOptions fo;
  fo.name = "dumped_fn";
  auto f = tcap::compile(lin.ptr(), [&](const Tensors& in) { return Tensors{torch::tanh(lin->forward(in[0]))}; }, fo);
  for (int call = 0; call < 2; ++call) f(torch::randn({5, 4}))[0].sum().backward();
  EXPECT_GT(dir.load("dumped_fn.0.joint.json").num_calls(), 0u);
  EXPECT_GT(dir.load("dumped_fn.0.forward.json").num_calls(), 0u);
  EXPECT_GT(dir.load("dumped_fn.0.backward.json").num_calls(), 0u);

  torch::optim::SGD opt(lin->parameters(), 0.1);
  tcap::CompileOptions so;
  so.name = "dumped_step";
  auto step = tcap::compile_step(
      lin, opt,
      [&](const Tensors& in) {
        opt.zero_grad();
        auto loss = lin->forward(in[0]).pow(2).mean();
        loss.backward();
        opt.step();
        return Tensors{loss.detach()};
      },
      so);
  for (int call = 0; call < 3; ++call) (*step)({torch::randn({5, 4})});
  bool step_dumped = false;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("dumped_step.step", 0) == 0 && e.path().extension() == ".json" &&
        name.find("fused") == std::string::npos) {
      step_dumped = step_dumped || tcap::ir::load_json(e.path().string()).num_calls() > 0;
    }
  }
  EXPECT_TRUE(step_dumped) << "compile_step's graph";

  tcap::CompiledAutogradOptions co;
  co.compile.name = "dumped_ca";
  {
    tcap::CompiledAutogradGuard guard(co);
    for (int call = 0; call < 2; ++call) lin->forward(torch::randn({5, 4})).sum().backward();
  }
  EXPECT_GT(dir.load("dumped_ca.ca0.backward.json").num_calls(), 0u) << "compiled autograd honours TCAP_DUMP_DIR";
}

TEST(GraphDumps, AFolderThatCannotBeWrittenCostsTheDumpNotTheCall) {
  tcap::CompileOptions o;
  o.name = "undumpable";
  o.dump_dir = "/proc/tcap_cannot_write_here";
  auto f = tcap::compile([](const Tensors& in) { return Tensors{torch::sin(in[0]) * 2}; }, o);
  for (int call = 0; call < 3; ++call) {
    const at::Tensor x = torch::randn({3, 4});
    EXPECT_TRUE(close(f(x)[0], torch::sin(x) * 2, 1e-5, 1e-6));
  }
  EXPECT_EQ(f->stats().replays, 2);
  EXPECT_EQ(f->eager_reason(), "");
}

}  // namespace
