// Independent kernels next to each other launched as one (Note [Horizontal kernels],
// fuse/horizontal.cpp): which runs the pass forms on hand-built graphs, the launch's
// results against each kernel's own launch (bitwise: the same code on the same
// iterations) at 1 and 2 threads, a kernel of a run falling back to its ATen ops, and an
// optimizer step whose updates become one launch.
#include <tcap/compile.h>
#include <tcap/interpreter.h>
#include <tcap/train_step.h>

#include "fusion_checks.h"

#include "codegen/cpu_llvm/cpu_llvm.h"
#include "fuse/fusion.h"
#include "fuse/horizontal.h"
#include "ir/op_facts.h"
#include "runtime/fused_kernel.h"
#include "runtime/graph_executable.h"
#include "support/compare.h"
#include "support/log_capture.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace horizontal_test {

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace ir = tcap::ir;
namespace nn = torch::nn;
namespace optim = torch::optim;

ir::TensorMeta meta(std::vector<int64_t> sizes) {
  ir::TensorMeta m;
  m.dtype = at::kFloat;
  m.sizes = sizes;
  m.strides.assign(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) m.strides[d - 1] = m.strides[d] * sizes[d];
  return m;
}

// A tcap::fused node of kernel `id` reading `ins`; result i is a new version of
// ins[into[i]] where into[i] >= 0 (a write in place), else a fresh tensor.
std::vector<ir::ValueId> fused(ir::Graph& g, std::vector<ir::ValueId> ins, int64_t id, std::vector<int> into) {
  ir::Node n;
  n.kind = ir::NodeKind::Call;
  n.op = tcap::fuse::kFusedOp;
  n.args.push_back(ir::Arg::value_list(ins, false, "inputs"));
  n.args.push_back(ir::Arg::integer(id, "kernel"));
  const auto node = static_cast<ir::NodeId>(g.nodes().size());
  std::vector<ir::ValueId> outs;
  for (size_t i = 0; i < into.size(); ++i) {
    const ir::ValueId v = g.new_value(node, 0, static_cast<int>(i), meta({4}));
    if (into[i] >= 0) g.value(v).version_of = ins[static_cast<size_t>(into[i])];
    outs.push_back(v);
  }
  n.outputs.push_back(ir::Arg::value_list(outs, false));
  g.add_node(std::move(n));
  g.schemas()[tcap::fuse::kFusedOp] = tcap::fuse::kFusedSchema;
  return outs;
}

ir::Graph with_inputs(int count, std::vector<ir::ValueId>* ins) {
  ir::Graph g;
  for (int i = 0; i < count; ++i) ins->push_back(g.add_input(ir::InputKind::UserInput, "in" + std::to_string(i), meta({4})));
  return g;
}

void finish(ir::Graph& g, const std::vector<ir::ValueId>& outs) {
  g.set_outputs(outs, std::vector<std::string>(outs.size()), std::vector<ir::OutputKind>(outs.size(), ir::OutputKind::User));
  ir::verify(g);
}

// How many kernels each tcap::fused_horizontal node of g launches, in order.
std::vector<size_t> runs_of(const ir::Graph& g) {
  std::vector<size_t> runs;
  for (const auto& n : g.nodes()) {
    if (n.op == tcap::fuse::kHorizontalOp) runs.push_back(n.args[1].ints.size());
  }
  return runs;
}

// Four updates in place, each of its own parameter and state: one run, at the last one's
// place, the results in the kernels' order, versions kept.
TEST(HorizontalPass, IndependentUpdatesBecomeOneNode) {
  std::vector<ir::ValueId> in;
  ir::Graph g = with_inputs(8, &in);
  std::vector<ir::ValueId> outs;
  for (int p = 0; p < 4; ++p) {
    auto o = fused(g, {in[2 * p], in[2 * p + 1]}, 10 + p, {0, -1});
    outs.insert(outs.end(), o.begin(), o.end());
  }
  finish(g, outs);
  const auto r = tcap::fuse::horizontal_kernels(g);
  ASSERT_EQ(r.runs, 1);
  EXPECT_EQ(r.kernels, 4);
  EXPECT_EQ(runs_of(r.graph), std::vector<size_t>{4});
  const ir::Node* h = nullptr;
  for (const auto& n : r.graph.nodes()) {
    if (n.op == tcap::fuse::kHorizontalOp) h = &n;
  }
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->args[1].ints, (std::vector<int64_t>{10, 11, 12, 13}));
  EXPECT_EQ(h->args[2].ints, (std::vector<int64_t>{2, 2, 2, 2}));
  ASSERT_EQ(h->outputs[0].values.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    const ir::Value& v = r.graph.value(h->outputs[0].values[i]);
    EXPECT_EQ(v.list_index, static_cast<int>(i));
    // Results 0, 2, 4, 6 write the parameters in place: versions of inputs 0, 2, 4, 6.
    if (i % 2 == 0) {
      EXPECT_EQ(v.version_of, h->args[0].values[i]);
    } else {
      EXPECT_EQ(v.version_of, ir::kNoValue);
    }
  }
  EXPECT_EQ(r.graph.output_values().size(), 8u);
}

// What stops a run: a kernel reading another's result (a new run starts), one writing what
// the run reads, one reading what the run writes, a node between, and a write into an
// input that shares its storage with another one.
TEST(HorizontalPass, DependentKernelsStartARunOfTheirOwn) {
  {  // reads the run's fresh result
    std::vector<ir::ValueId> in;
    ir::Graph g = with_inputs(3, &in);
    auto a = fused(g, {in[0]}, 1, {-1});
    auto b = fused(g, {a[0]}, 2, {-1});
    auto c = fused(g, {in[1]}, 3, {-1});
    finish(g, {b[0], c[0]});
    const auto r = tcap::fuse::horizontal_kernels(g);
    EXPECT_EQ(runs_of(r.graph), std::vector<size_t>{2}) << "kernels 2 and 3 only";
    EXPECT_NE(r.decisions.at(0).find("reads what the run before it writes"), std::string::npos) << r.decisions[0];
  }
  {  // writes an input the run reads
    std::vector<ir::ValueId> in;
    ir::Graph g = with_inputs(3, &in);
    auto a = fused(g, {in[0], in[1]}, 1, {-1});
    auto b = fused(g, {in[1], in[2]}, 2, {0});
    finish(g, {a[0], b[0]});
    const auto r = tcap::fuse::horizontal_kernels(g);
    EXPECT_EQ(r.runs, 0);
    EXPECT_NE(r.decisions.at(0).find("writes what the run before it reads"), std::string::npos) << r.decisions[0];
  }
  {  // reads an input the run writes
    std::vector<ir::ValueId> in;
    ir::Graph g = with_inputs(3, &in);
    auto a = fused(g, {in[0], in[1]}, 1, {0});
    auto b = fused(g, {in[0], in[2]}, 2, {-1});
    finish(g, {a[0], b[0]});
    EXPECT_EQ(tcap::fuse::horizontal_kernels(g).runs, 0);
  }
  {  // an ATen call between two kernels
    std::vector<ir::ValueId> in;
    ir::Graph g = with_inputs(3, &in);
    auto a = fused(g, {in[0]}, 1, {-1});
    const ir::ValueId s = g.add_call("aten::neg", "", {ir::Arg::value(in[1], "self")}, meta({4}));
    auto b = fused(g, {in[2]}, 2, {-1});
    finish(g, {a[0], s, b[0]});
    EXPECT_EQ(tcap::fuse::horizontal_kernels(g).runs, 0);
  }
  {  // a write into an input that shares its storage with another input
    std::vector<ir::ValueId> in;
    ir::Graph g = with_inputs(4, &in);
    g.meta()[ir::kInputsShareStorage] = ir::join_input_names({"in0", "in3"});
    auto a = fused(g, {in[0]}, 1, {0});
    auto b = fused(g, {in[1]}, 2, {0});
    auto c = fused(g, {in[2]}, 3, {0});
    finish(g, {a[0], b[0], c[0]});
    const auto r = tcap::fuse::horizontal_kernels(g);
    EXPECT_EQ(runs_of(r.graph), std::vector<size_t>{2}) << "kernels 2 and 3 only";
  }
}

class Horizontal : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!tcap::codegen::cpu_llvm::cpu_llvm_available(&why)) GTEST_SKIP() << why;
    threads_ = at::get_num_threads();
  }
  void TearDown() override {
    at::set_num_threads(threads_);
    ::unsetenv("TCAP_HORIZONTAL_KERNELS");
  }
  int threads_ = 1;
};

// Kernels of independent chains, compiled through fuse() with kernels of our own, and the
// fused graph then run kernel by kernel and as one launch (`horizontal`), at 1 and 2
// threads, over sizes that do and do not split over threads.
struct Compiled {
  ir::Graph fused;
  std::shared_ptr<tcap::runtime::KernelTable> kernels = std::make_shared<tcap::runtime::KernelTable>();
};

Compiled compile_chains(const std::function<Tensors(const Tensors&)>& fn, const Tensors& inputs) {
  auto c = std::make_shared<Compiled>();
  tcap::CompileOptions options;
  options.fw_compiler = [c](const ir::Graph& g) {
    tcap::fuse::FusionOptions o;
    o.compile = [c](const tcap::fuse::FusedGroup& fg, std::string*) {
      return tcap::testing::fusion::add_llvm_kernel(fg, c->kernels.get());
    };
    c->fused = tcap::fuse::fuse(g, o).graph;
    return tcap::runtime::interpreter_executable(c->fused, "chains", false, c->kernels);
  };
  auto f = tcap::compile(fn, options);
  (*f)(inputs);
  return *c;
}

Tensors chains(const Tensors& in) {
  Tensors out;
  for (size_t i = 0; i < in.size(); ++i) out.push_back((in[i] * (1.5 + static_cast<double>(i))).sin() + 0.25);
  return out;
}

TEST_F(Horizontal, OneLaunchGivesEachKernelsBits) {
  for (const std::vector<int64_t>& sizes : {std::vector<int64_t>{1, 35, 7}, std::vector<int64_t>{300001, 5, 70000}}) {
    Tensors in;
    for (int64_t n : sizes) in.push_back(torch::randn({n}));
    const Compiled c = compile_chains(chains, in);
    const auto r = tcap::fuse::horizontal_kernels(c.fused);
    ASSERT_EQ(runs_of(r.graph), std::vector<size_t>{sizes.size()}) << ir::to_string(c.fused);
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      Tensors fresh;
      for (int64_t n : sizes) fresh.push_back(torch::randn({n}));
      const Tensors apart = tcap::Interpreter(c.fused, false, c.kernels).run(fresh);
      const auto before = tcap::runtime::runtime_stats();
      const Tensors together = tcap::Interpreter(r.graph, false, c.kernels).run(fresh);
      const auto after = tcap::runtime::runtime_stats();
      EXPECT_EQ(after.horizontal_launches - before.horizontal_launches, 1);
      EXPECT_EQ(after.launches - before.launches, static_cast<int64_t>(sizes.size()));
      EXPECT_EQ(after.fallbacks, before.fallbacks);
      // The big sizes split over both threads; the small ones run on the calling thread.
      EXPECT_EQ(after.split_launches - before.split_launches, threads == 2 && sizes[0] > 1000 ? 1 : 0)
          << threads << " threads";
      const Tensors eager = chains(fresh);
      ASSERT_EQ(together.size(), sizes.size());
      for (size_t i = 0; i < sizes.size(); ++i) {
        EXPECT_TRUE(torch::equal(together[i], apart[i])) << "kernel " << i << ", " << threads << " threads";
        EXPECT_TRUE(close(together[i], eager[i], 1e-5, 1e-6)) << "kernel " << i;
      }
    }
  }
}

// A kernel of the run whose input has other strides than recorded runs its ATen ops (its
// guard, as a tcap::fused call's); the others still launch together.
TEST_F(Horizontal, AKernelWhoseInputDiffersFallsBackAlone) {
  const Tensors in{torch::randn({6, 5}), torch::randn({6, 5}), torch::randn({6, 5})};
  const Compiled c = compile_chains(chains, in);
  const auto r = tcap::fuse::horizontal_kernels(c.fused);
  ASSERT_EQ(runs_of(r.graph), std::vector<size_t>{3});
  const Tensors odd{torch::randn({6, 5}), torch::randn({5, 6}).t(), torch::randn({6, 5})};
  const auto before = tcap::runtime::runtime_stats();
  const Tensors got = tcap::Interpreter(r.graph, false, c.kernels).run(odd);
  const auto after = tcap::runtime::runtime_stats();
  EXPECT_EQ(after.fallbacks - before.fallbacks, 1);
  EXPECT_EQ(after.launches - before.launches, 2);
  const Tensors eager = chains(odd);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(close(got[i], eager[i], 1e-5, 1e-6)) << "kernel " << i;
}

// Parameters of odd shapes, a big one among them, and one of a single element.
struct Params : nn::Module {
  explicit Params(uint64_t seed) {
    torch::manual_seed(seed);
    const std::vector<std::vector<int64_t>> shapes{{33, 17}, {5}, {301, 1001}, {2, 3, 7}, {1}};
    for (size_t i = 0; i < shapes.size(); ++i) ps.push_back(register_parameter("p" + std::to_string(i), torch::randn(shapes[i])));
  }
  std::vector<at::Tensor> ps;
};

Tensors step_body(optim::Optimizer& opt, const std::vector<at::Tensor>& ps, const Tensors& xs) {
  opt.zero_grad();
  at::Tensor loss = (ps[0] * xs[0]).sum();
  for (size_t i = 1; i < ps.size(); ++i) loss = loss + (ps[i] * xs[i]).sin().sum();
  loss.backward();
  opt.step();
  return {loss.detach()};
}

// compile_step with Adam: each parameter's update is a kernel, and the five kernels are
// one launch per replay; the parameters are bitwise those of the same step with the pass
// off (TCAP_HORIZONTAL_KERNELS=0), at 1 and 2 threads, and eager's to rounding.
TEST_F(Horizontal, AnAdamStepUpdatesEveryParameterInOneLaunch) {
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    std::vector<std::shared_ptr<Params>> models{std::make_shared<Params>(7), std::make_shared<Params>(7),
                                                std::make_shared<Params>(7)};
    std::vector<std::unique_ptr<optim::Adam>> opts;
    for (auto& m : models) opts.push_back(std::make_unique<optim::Adam>(m->parameters(), optim::AdamOptions(1e-2).weight_decay(0.1)));
    std::vector<std::shared_ptr<tcap::CompiledStep>> steps;
    tcap::testing::LogCapture log("fusion");
    for (size_t k = 1; k < 3; ++k) {
      tcap::CompileOptions o;
      o.backend = tcap::Backend::Llvm;
      o.name = "horizontal_adam_" + std::to_string(k) + "_t" + std::to_string(threads);
      optim::Adam* opt = opts[k].get();
      Params* model = models[k].get();
      steps.push_back(tcap::compile_step(std::static_pointer_cast<nn::Module>(models[k]), *opt,
                                         [opt, model](const Tensors& in) { return step_body(*opt, model->ps, in); }, o));
    }
    for (int s = 0; s < 6; ++s) {
      Tensors xs;
      for (const auto& p : models[0]->ps) xs.push_back(torch::randn(p.sizes()));
      step_body(*opts[0], models[0]->ps, xs);
      const auto before = tcap::runtime::runtime_stats();
      (*steps[0])(xs);
      const auto after = tcap::runtime::runtime_stats();
      // The second step compiles (at its calls) with the pass off.
      ::setenv("TCAP_HORIZONTAL_KERNELS", "0", 1);
      (*steps[1])(xs);
      ::unsetenv("TCAP_HORIZONTAL_KERNELS");
      if (steps[0]->last_call().kind == tcap::CompiledStep::Call::Kind::Replayed) {
        EXPECT_GE(after.horizontal_launches - before.horizontal_launches, 1) << "step " << s;
      }
      for (size_t i = 0; i < models[0]->ps.size(); ++i) {
        ASSERT_TRUE(torch::equal(models[1]->ps[i], models[2]->ps[i]))
            << "step " << s << " parameter " << i << ", " << threads << " threads";
        ASSERT_TRUE(close(models[1]->ps[i], models[0]->ps[i], 1e-5, 1e-6)) << "step " << s << " parameter " << i;
      }
    }
    EXPECT_GE(steps[0]->stats().replays, 3);
    // The five updates (and maybe kernels of the backward before them) in one run.
    int longest = 0;
    const std::string text = log.text(), what = "one launch for ";
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
      longest = std::max(longest, std::atoi(text.c_str() + at + what.size()));
    }
    EXPECT_GE(longest, 5) << text;
  }
}

}  // namespace horizontal_test
