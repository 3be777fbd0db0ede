// Alias meaning (in-place, out=, views), factory and RNG ops, and captured graphs
// through JSON: a loaded graph equals the captured one and replays like eager.
#include <tcap/capture.h>
#include <tcap/graph_json.h>
#include <tcap/interpreter.h>

#include "support/compare.h"

#include <torch/torch.h>

using tcap::testing::close;
using tcap::testing::dump;
namespace ir = tcap::ir;

namespace {

const ir::Node& find_call(const ir::Graph& g, const std::string& qualified) {
  for (const auto& n : g.nodes()) {
    if (n.kind == ir::NodeKind::Call && n.qualified_op() == qualified) return n;
  }
  throw std::runtime_error("no " + qualified + " in\n" + dump(g));
}

}  // namespace

TEST(Alias, InPlaceOutAndViewsKeepTheirMeaning) {
  auto x = torch::randn({4, 6});
  auto out = torch::empty({4, 6});
  tcap::CaptureGuard cap;
  cap.input(x, "x");
  cap.input(out, "out");
  auto a = x * 2;
  auto v = a.narrow(1, 1, 3);   // a view of a
  v.mul_(3);                    // writes a through the view
  torch::add_out(out, a, x);    // out= op
  auto s = a.sum();
  cap.output(s, "s");
  cap.output(out, "out_result");
  cap.stop();
  const auto g = cap.graph();
  ir::verify(g);
  const auto& narrow = find_call(g, "aten::slice.Tensor");
  const auto& mul_ = find_call(g, "aten::mul_.Scalar");
  const auto& add_out = find_call(g, "aten::add.out");
  const auto a_id = find_call(g, "aten::mul.Scalar").outputs[0].values[0];
  EXPECT_EQ(g.value(narrow.outputs[0].values[0]).view_of, a_id) << dump(g);
  EXPECT_EQ(g.value(mul_.outputs[0].values[0]).version_of, narrow.outputs[0].values[0]) << dump(g);
  const auto out_id = g.node(g.input_nodes().at(1)).outputs[0].values[0];
  EXPECT_EQ(g.value(add_out.outputs[0].values[0]).version_of, out_id) << dump(g);
  // Replay on fresh buffers reproduces the aliasing effects.
  auto x2 = torch::randn({4, 6});
  auto out2 = torch::empty({4, 6});
  auto res = tcap::interpret(g, {x2, out2});
  auto a2 = x2 * 2;
  a2.narrow(1, 1, 3).mul_(3);
  EXPECT_TRUE(close(res[0], a2.sum()));
  EXPECT_TRUE(close(res[1], a2 + x2));
  EXPECT_TRUE(close(out2, a2 + x2)) << "the out= buffer passed in is written";
}

TEST(Alias, FactoryAndRandomOpsAreRecorded) {
  tcap::CaptureGuard cap;
  torch::manual_seed(7);
  auto z = torch::zeros({3, 5}, torch::kFloat64);
  auto r = torch::randn({3, 5}, torch::kFloat64);
  auto y = z + r;
  cap.output(y, "y");
  cap.stop();
  const auto g = cap.graph();
  EXPECT_EQ(g.input_nodes().size(), 0u) << dump(g);
  const auto& randn = find_call(g, "aten::randn");
  bool has_dtype = false;
  for (const auto& a : randn.args) has_dtype = has_dtype || (a.kind == ir::ArgKind::ScalarType && a.i == static_cast<int64_t>(at::kDouble));
  EXPECT_TRUE(has_dtype) << dump(g);
  torch::manual_seed(7);
  auto res = tcap::interpret(g, {});
  EXPECT_TRUE(close(res[0], y)) << "same seed, same numbers";
}

TEST(Json, CapturedTrainingStepRoundTripsAndReplays) {
  torch::manual_seed(11);
  torch::nn::Sequential model(torch::nn::Linear(7, 9), torch::nn::GELU(), torch::nn::LayerNorm(torch::nn::LayerNormOptions({9})),
                              torch::nn::Linear(9, 3));
  auto x = torch::randn({5, 7});
  auto target = torch::randint(0, 3, {5});
  tcap::CaptureGuard cap;
  cap.register_module(*model);
  cap.input(x, "x");
  cap.input(target, "target");
  auto loss = torch::cross_entropy_loss(model->forward(x), target);
  cap.output(loss, "loss");
  loss.backward();
  cap.stop();
  const auto g = cap.graph();
  const std::string text = ir::to_json_string(g);
  const ir::Graph loaded = ir::from_json_string(text);
  EXPECT_TRUE(loaded == g) << dump(g) << "\n---\n" << dump(loaded);
  EXPECT_EQ(ir::to_json_string(loaded), text);
  // The loaded graph replays on fresh inputs like eager.
  auto x2 = torch::randn({5, 7});
  auto t2 = torch::randint(0, 3, {5});
  std::vector<at::Tensor> in;
  auto params = model->named_parameters();
  for (auto id : loaded.input_nodes()) {
    const auto& n = loaded.node(id);
    in.push_back(n.name == "x" ? x2 : n.name == "target" ? t2 : params[n.name].detach().clone());
  }
  auto res = tcap::interpret(loaded, in);
  model->zero_grad();
  auto loss2 = torch::cross_entropy_loss(model->forward(x2), t2);
  loss2.backward();
  EXPECT_TRUE(close(res[0], loss2, 1e-4, 1e-5));
  const auto* out = loaded.output_node();
  for (size_t k = 1; k < res.size(); ++k) {
    EXPECT_TRUE(close(res[k], params[out->output_names[k]].grad(), 1e-4, 1e-5)) << out->output_names[k];
  }
}

TEST(Json, UnknownOperatorFailsClearlyAtReplay) {
  auto x = torch::randn({3});
  tcap::CaptureGuard cap;
  cap.input(x, "x");
  auto y = x.exp();
  cap.output(y);
  cap.stop();
  auto g = cap.graph();
  for (const auto& n : g.nodes()) {
    if (n.kind == ir::NodeKind::Call) g.edit_node(n.id, [](ir::Node& m) { m.op = "aten::no_such_op"; });
  }
  try {
    tcap::Interpreter interp(g);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("aten::no_such_op"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not found"), std::string::npos) << e.what();
  }
}

TEST(Alias, WrappedScalarIsAConstantNotAnOp) {
  auto x = torch::randn({3, 4});
  at::Tensor s = c10::scalar_to_tensor(c10::Scalar(2.5));
  s.unsafeGetTensorImpl()->set_wrapped_number(true);
  tcap::CaptureGuard cap;
  cap.input(x, "x");
  auto y = at::mul(x, s);
  cap.output(y, "y");
  cap.stop();
  const auto g = cap.graph();
  ASSERT_EQ(g.num_calls(), 1u) << dump(g);
  const auto& mul = find_call(g, "aten::mul.Tensor");
  EXPECT_EQ(mul.args[1].kind, ir::ArgKind::WrappedScalar) << dump(g);
  EXPECT_DOUBLE_EQ(mul.args[1].d, 2.5);
  auto x2 = torch::randn({3, 4});
  EXPECT_TRUE(close(tcap::interpret(g, {x2})[0], x2 * 2.5));
}

TEST(Alias, UnrecordedWriteMakesAFreshInput) {
  auto x = torch::randn({3});
  const auto x_before = x.clone();
  tcap::CaptureGuard cap;
  cap.input(x, "x");
  auto y = x * 2;
  {
    // A write the recorder does not see (its key is off): the version counter moves.
    c10::impl::ExcludeDispatchKeyGuard hidden(c10::parseDispatchKey(tcap::capture_dispatch_key()));
    x.add_(1);
  }
  auto z = x * 3;
  cap.output(y, "y");
  cap.output(z, "z");
  cap.stop();
  const auto g = cap.graph();
  // The graph does not pretend the second read of x is the first one.
  ASSERT_EQ(g.input_nodes().size(), 2u) << dump(g);
  EXPECT_EQ(g.node(g.input_nodes()[1]).input_kind, ir::InputKind::Constant) << dump(g);
  // Input 0 is x as first read, input 1 is x after the hidden write.
  auto res = tcap::interpret(g, {x_before, x});
  EXPECT_TRUE(close(res[0], y));
  EXPECT_TRUE(close(res[1], z));
}
