// Note [Host scalars as graph inputs]: a scalar that changes between calls is a graph
// input. The pass that makes one, the interpreter that reads it (bit for bit what eager
// computes with the number), its JSON form, the fused backend around it, and compile_step,
// whose per-call scalars (a learning-rate schedule) now reach a user's compiler and CUDA
// graphs like any other input, and the fused kernels' parameters (Note [Kernel
// parameters]).
#include <tcap/capture.h>
#include <tcap/graph_json.h>
#include <tcap/interpreter.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include "compiler/pipeline.h"
#include "fuse/fusion.h"
#include "runtime/fused_kernel.h"
#include "passes/scalar_inputs.h"
#include "support/backends.h"
#include "support/compare.h"
#include "support/modules.h"

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <set>
#include <tuple>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;
namespace ir = tcap::ir;
namespace nn = torch::nn;

namespace {

// y = add(x, w, alpha=2.5) * 0.75 (a wrapped number), then addcdiv_(y, x, w, value=-0.5).
ir::Graph scalar_graph(const at::Tensor& x, const at::Tensor& w) {
  torch::NoGradGuard no_grad;
  tcap::CaptureGuard cap;
  cap.input(x, "x");
  cap.input(w, "w");
  auto y = at::add(x, w, 2.5) * 0.75;
  y.addcdiv_(x, w.abs() + 1, -0.5);
  cap.output(y, "y");
  cap.stop();
  return cap.graph();
}

at::Tensor eager_with_scalars(const at::Tensor& x, const at::Tensor& w, double alpha, double scale, double value) {
  torch::NoGradGuard no_grad;
  auto y = at::add(x, w, alpha) * scale;
  y.addcdiv_(x, w.abs() + 1, value);
  return y;
}

std::vector<tcap::passes::ScalarArg> scalar_args(const ir::Graph& g) {
  std::vector<tcap::passes::ScalarArg> args;
  for (const auto& n : g.nodes()) {
    if (n.op == "aten::add" && n.overload == "Tensor") args.push_back({n.id, 2, "alpha"});
    if (n.op == "aten::mul" && n.args.size() > 1 &&
        (n.args[1].kind == ir::ArgKind::Double || n.args[1].kind == ir::ArgKind::WrappedScalar)) {
      args.push_back({n.id, 1, "scale"});
    }
    if (n.op == "aten::addcdiv_") args.push_back({n.id, 3, "value"});
  }
  return args;
}

// What the fusion pass makes of g: the ATen calls left, the kernels' parameters, and
// the groups and decisions as text.
struct FusedOps {
  std::multiset<std::string> aten_calls;
  int params = 0;
  std::string text;
};
FusedOps fused_ops(const ir::Graph& g) {
  tcap::fuse::FusionOptions fo;
  std::atomic<int64_t> next{1};  // compile runs on several threads
  fo.compile = [&](const tcap::fuse::FusedGroup&, std::string*) { return next.fetch_add(1); };
  const tcap::fuse::FusionResult r = tcap::fuse::fuse(g, fo);
  FusedOps f;
  for (const auto& n : r.graph.nodes()) {
    if (n.kind == ir::NodeKind::Call && n.op != tcap::fuse::kFusedOp) f.aten_calls.insert(n.qualified_op());
  }
  f.text = r.explain();
  for (const auto& grp : r.groups) {
    for (const auto& b : grp.kernel.buffers) f.params += b.param;
    f.text += tcap::kir::to_string(grp.kernel);
  }
  return f;
}

// fn's graph on inputs `in` (named x0, x1, ...), with argument `arg` of its one `op` node a
// host scalar named `name`.
ir::Graph with_one_host_scalar(const Tensors& in, const std::function<at::Tensor(const Tensors&)>& fn,
                               const std::string& op, size_t arg, const std::string& name) {
  ir::Graph g;
  {
    torch::NoGradGuard no_grad;
    tcap::CaptureGuard cap;
    for (size_t k = 0; k < in.size(); ++k) cap.input(in[k], "x" + std::to_string(k));
    cap.output(fn(in), "y");
    cap.stop();
    g = cap.graph();
  }
  std::vector<tcap::passes::ScalarArg> args;
  for (const auto& n : g.nodes()) {
    if (n.op == op) args.push_back({n.id, arg, name});
  }
  EXPECT_EQ(args.size(), 1u) << ir::to_string(g);
  return tcap::passes::scalars_as_inputs(g, args);
}

TEST(HostScalarInputs, ThePassMakesInputsAndTheInterpreterReadsThemBitForBit) {
  auto x = torch::randn({5, 7}), w = torch::randn({7});  // w broadcasts
  const ir::Graph g = scalar_graph(x, w);
  const auto args = scalar_args(g);
  ASSERT_EQ(args.size(), 3u) << ir::to_string(g);
  const ir::Graph h = tcap::passes::scalars_as_inputs(g, args);
  ir::verify(h);
  const auto inputs = h.input_nodes();
  ASSERT_EQ(inputs.size(), 5u);
  for (size_t k = 2; k < 5; ++k) {
    EXPECT_EQ(h.node(inputs[k]).input_kind, ir::InputKind::HostScalar);
    EXPECT_EQ(h.node(inputs[k]).name, args[k - 2].name);
  }
  int readers = 0;
  for (const auto& n : h.nodes()) readers += tcap::ir::reads_host_scalar(h, n);
  EXPECT_EQ(readers, 3);
  // The JSON form keeps the kind.
  const ir::Graph back = ir::from_json_string(ir::to_json_string(h));
  EXPECT_EQ(back, h);
  EXPECT_NE(ir::to_json_string(h).find("host_scalar"), std::string::npos);
  // Several values, one interpreter: each run computes what eager computes with them.
  tcap::Interpreter interp(h);
  for (const auto& [alpha, scale, value] : std::vector<std::tuple<double, double, double>>{
           {2.5, 0.75, -0.5}, {-1.0, 3.0, 0.125}, {0.1, 1e-3, 7.0}}) {
    auto xs = torch::randn({5, 7}), ws = torch::randn({7});
    auto out = interp.run({xs, ws, tcap::passes::host_scalar_input(alpha), tcap::passes::host_scalar_input(scale),
                           tcap::passes::host_scalar_input(value)})[0];
    EXPECT_TRUE(out.equal(eager_with_scalars(xs, ws, alpha, scale, value))) << alpha << " " << scale << " " << value;
  }
}

TEST(HostScalarInputs, NotAScalarArgumentIsRefused) {
  auto x = torch::randn({3}), w = torch::randn({3});
  const ir::Graph g = scalar_graph(x, w);
  ir::NodeId add = -1;
  for (const auto& n : g.nodes()) {
    if (n.op == "aten::add") add = n.id;
  }
  ASSERT_GE(add, 0);
  EXPECT_THROW(tcap::passes::scalars_as_inputs(g, {{add, 0, "x"}}), c10::Error);  // a tensor argument
}

// Note [Kernel parameters]: a fused kernel takes the host scalars its ops read as
// parameters. add's alpha, the wrapped 0.75 and addcdiv_'s value join the kernel (addcdiv_
// made functional and written back in place: Note [In-place updates as kernels]). One
// kernel serves every value: no call runs the group's ATen ops instead.
TEST(HostScalarInputs, FusedKernelsTakeThemAsParameters) {
  TCAP_SKIP_WITHOUT_BACKEND("llvm");
  auto x = torch::randn({33, 17}), w = torch::randn({17});
  const ir::Graph g = scalar_graph(x, w);
  const ir::Graph h = tcap::passes::scalars_as_inputs(g, scalar_args(g));
  const FusedOps f = fused_ops(h);
  EXPECT_EQ(f.params, 3) << f.text;
  EXPECT_EQ(f.aten_calls.count("aten::add.Tensor"), 0u) << f.text;
  EXPECT_EQ(f.aten_calls.count("aten::mul.Tensor"), 0u) << f.text;
  EXPECT_EQ(f.aten_calls.count("aten::addcdiv_"), 0u) << f.text;
  EXPECT_EQ(f.aten_calls.count("aten::copy_"), 0u) << f.text;
  EXPECT_NE(f.text.find(" param f64 "), std::string::npos) << f.text;
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  tcap::Executable exe = tcap::compiler::compile_graph(h, o, "host_scalars");
  const auto before = tcap::runtime::runtime_stats();
  for (const auto& [alpha, scale, value] : std::vector<std::tuple<double, double, double>>{
           {2.5, 0.75, -0.5}, {-3.0, 1e-3, 0.25}, {0.1, -7.0, 4.0}}) {
    auto xs = torch::randn({33, 17}), ws = torch::randn({17});
    auto out = exe({xs, ws, tcap::passes::host_scalar_input(alpha), tcap::passes::host_scalar_input(scale),
                    tcap::passes::host_scalar_input(value)})[0];
    EXPECT_TRUE(close(out, eager_with_scalars(xs, ws, alpha, scale, value), 1e-5, 1e-6)) << alpha;
  }
  const auto after = tcap::runtime::runtime_stats();
  EXPECT_GE(after.launches - before.launches, 3);
  EXPECT_EQ(after.fallbacks, before.fallbacks);
}

// A lowering that needs the number as a constant (lerp picks one of two formulas by the
// weight) leaves its node to ATen, saying why; the ops around it are still fused.
TEST(HostScalarInputs, AReaderThatNeedsAConstantStaysAnATenCall) {
  TCAP_SKIP_WITHOUT_BACKEND("llvm");
  const ir::Graph h = with_one_host_scalar(
      {torch::randn({9, 5}), torch::randn({9, 5})}, [](const Tensors& t) { return at::lerp(t[0].cos(), t[1], 0.3).sin(); },
      "aten::lerp", 2, "weight");
  const FusedOps f = fused_ops(h);
  EXPECT_EQ(f.aten_calls.count("aten::lerp.Scalar"), 1u) << f.text;
  EXPECT_EQ(f.params, 0) << f.text;
  EXPECT_NE(f.text.find("is a host scalar, which its kernel would need as a constant"), std::string::npos) << f.text;
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  tcap::Executable exe = tcap::compiler::compile_graph(h, o, "lerp");
  for (double weight : {0.3, 0.8}) {  // both of eager's formulas
    auto xs = torch::randn({9, 5}), ws = torch::randn({9, 5});
    auto out = exe({xs, ws, tcap::passes::host_scalar_input(weight)})[0];
    EXPECT_TRUE(close(out, at::lerp(xs.cos(), ws, weight).sin(), 1e-5, 1e-6)) << weight;
  }
}

// A host scalar takes part in type promotion as the number it replaced: a 0-dim float
// tensor compared with it compares in float (ATen's result_type), not in double.
TEST(HostScalarInputs, AParameterPromotesAsANumber) {
  TCAP_SKIP_WITHOUT_BACKEND("llvm");
  const ir::Graph h = with_one_host_scalar({torch::full({}, 0.1f)}, [](const Tensors& t) { return t[0].gt(0.1); },
                                           "aten::gt", 1, "threshold");
  const FusedOps f = fused_ops(h);
  EXPECT_EQ(f.params, 1) << f.text;
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  tcap::Executable exe = tcap::compiler::compile_graph(h, o, "promotion");
  for (float xv : {0.1f, 0.2f, 0.05f}) {
    auto xs = torch::full({}, xv);
    auto out = exe({xs, tcap::passes::host_scalar_input(0.1)})[0];
    EXPECT_TRUE(out.equal(xs.gt(0.1))) << xv << ": " << out.item<bool>();  // 0.1f > 0.1 in double, not in float
  }
}

// BatchNorm in training: the fused backend decomposes it, so the nodes that read host
// scalars are asked about in the decomposed graph too. (No bias before it: its gradient is
// rounding noise around zero, which Adam amplifies; docs/compile.md.)
nn::Sequential schedule_mlp() {
  return nn::Sequential(nn::Linear(nn::LinearOptions(6, 10).bias(false)), nn::BatchNorm1d(10), nn::Tanh(),
                        nn::Linear(10, 2));
}

// The step, with a learning rate that changes every call, compiled with `options`; the
// weights and losses against an eager twin. Returns the step's stats.
tcap::CompileStats train_with_schedule(const tcap::CompileOptions& options, bool adam) {
  torch::manual_seed(4);
  auto model = schedule_mlp(), twin = schedule_mlp();
  tcap::testing::copy_params(*model, *twin);
  auto opt = tcap::testing::adam_or_sgd(adam, model->parameters(), 0.01);
  auto opt_twin = tcap::testing::adam_or_sgd(adam, twin->parameters(), 0.01);
  using tcap::testing::set_lr;
  auto body = tcap::testing::mse_step;
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  auto step = tcap::compile_step(model, *opt, [&](const Tensors& in) { return Tensors{body(model, *opt, in[0], in[1])}; },
                                 options);
  for (int i = 0; i < 10; ++i) {
    const double lr = 0.02 / (1.0 + i);  // a schedule: a new learning rate every step
    set_lr(*opt, lr);
    set_lr(*opt_twin, lr);
    auto x = torch::randn({7, 6}), y = torch::randn({7, 2});
    auto loss = (*step)({x, y})[0];
    EXPECT_TRUE(close(loss, body(twin, *opt_twin, x, y), 1e-4, 1e-5)) << "step " << i;
  }
  auto pt = twin->parameters();
  for (size_t k = 0; k < pt.size(); ++k) EXPECT_TRUE(close(model->parameters()[k], pt[k], 1e-4, 1e-5)) << k;
  return step->stats();
}

// Ten steps: the first runs eagerly and makes the optimizer's state (a new structure: the
// one recompile), the next two are captured and compared, the other seven replay, each
// with a learning rate of its own.
void expect_captured_then_replayed(const tcap::CompileStats& s, const std::string& what) {
  EXPECT_EQ(s.calls, 10) << what;
  EXPECT_EQ(s.captures, 3) << what;
  EXPECT_EQ(s.replays, 7) << what;
  EXPECT_EQ(s.recompiles, 1) << what;
}

TEST(HostScalarInputs, CompileStepHandsItsScalarsToAUsersCompiler) {
  for (bool adam : {false, true}) {
    int compiled = 0;
    int host_scalars = 0;
    tcap::CompileOptions o;
    o.fw_compiler = [&](const ir::Graph& g) {
      ++compiled;
      for (ir::NodeId id : g.input_nodes()) host_scalars += g.node(id).input_kind == ir::InputKind::HostScalar;
      return tcap::eager_backend(g);
    };
    const tcap::CompileStats s = train_with_schedule(o, adam);
    EXPECT_EQ(compiled, 1) << "adam " << adam << ": the schedule recompiled";
    EXPECT_GT(host_scalars, 0) << "adam " << adam << ": the learning rate is not an input";
    expect_captured_then_replayed(s, adam ? "adam" : "sgd");
  }
}

// Adam's bias corrections and the scheduled learning rate reach the step's kernels as
// parameters (sqrt(v) / sqrt(1 - beta2^t) is one kernel), and every replay launches them.
TEST(HostScalarInputs, CompileStepKernelsTakeTheStepsScalars) {
  TCAP_SKIP_WITHOUT_BACKEND("llvm");
  int params = 0;
  tcap::CompileOptions o;
  o.fw_compiler = [&](const ir::Graph& g) {
    params += fused_ops(g).params;
    return tcap::llvm_backend(g);
  };
  const auto before = tcap::runtime::runtime_stats();
  expect_captured_then_replayed(train_with_schedule(o, /*adam=*/true), "adam llvm");
  const auto after = tcap::runtime::runtime_stats();
  EXPECT_GT(params, 0);
  EXPECT_GT(after.launches, before.launches);
  EXPECT_EQ(after.fallbacks, before.fallbacks);
}

TEST(HostScalarInputs, CompileStepTakesCudaGraphsAndTheFusedBackend) {
  for (const char* backend : {"eager", "llvm"}) {
    if (!tcap::Backend(backend).available()) continue;
    tcap::CompileOptions o;
    o.backend = backend;
    o.cuda_graphs = true;  // CPU tensors: runs as usual (logged); on a GPU the graph decides
    expect_captured_then_replayed(train_with_schedule(o, /*adam=*/true), backend);
  }
}

}  // namespace
