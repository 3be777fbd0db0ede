// Note [GEMMs through oneDNN] (runtime/onednn_gemm.cpp, fuse/onednn_gemms.cpp): the
// operator against at::mm / at::addmm over operand layouts, the rewrite with its choice
// forced both ways (which products qualify, the graph it makes, its values through the
// interpreter), and training through the llvm backend against eager whichever way this
// machine's measurement decides.
//
// Tolerances: float32 sums of k products in another order than MKL's: rtol 1e-5, atol
// 2e-6 * k on entries of size up to about sqrt(k) (inputs of unit variance).
#include "fusion_checks.h"

#include "fuse/onednn_gemms.h"
#include "runtime/onednn_gemm.h"
#include "support/log_capture.h"

#include <tcap/capture.h>

#include <ATen/core/dispatch/Dispatcher.h>

using namespace tcap::testing::fusion;

namespace {

at::Tensor onednn_mm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                     c10::string_view activation = "none") {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("tcap::onednn_mm", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                         c10::string_view)>();
  return op.call(a, b, bias, activation);
}

bool onednn() { return tcap::runtime::onednn_gemm_available(); }

TEST(OneDnnGemms, TheOperatorMatchesMmInEveryLayout) {
  if (!onednn()) GTEST_SKIP() << "LibTorch without oneDNN";
  const int64_t m = 67, k = 129, n = 33;
  const at::Tensor a = torch::randn({m, k}), at_ = torch::randn({k, m}).t(), b = torch::randn({k, n}),
                   bt = torch::randn({n, k}).t(), bias = torch::randn({n});
  for (const auto& [x, y] : std::vector<std::pair<at::Tensor, at::Tensor>>{{a, b}, {at_, b}, {a, bt}, {at_, bt}}) {
    EXPECT_TRUE(close(onednn_mm(x, y, std::nullopt), at::mm(x, y), 1e-5, 2e-6 * k));
    EXPECT_TRUE(close(onednn_mm(x, y, bias), at::addmm(bias, x, y), 1e-5, 2e-6 * k));
    // The ReLU inside the product: the bits of the product's ReLU (Note [ReLU inside the product]).
    EXPECT_TRUE(torch::equal(onednn_mm(x, y, bias, "relu"), at::relu(onednn_mm(x, y, bias))));
    EXPECT_TRUE(torch::equal(onednn_mm(x, y, std::nullopt, "relu"), at::relu(onednn_mm(x, y, std::nullopt))));
  }
  EXPECT_THROW(onednn_mm(a, b, bias, "gelu"), c10::Error);  // not an activation it takes
  // A column slice of a wider matrix (row stride larger than its width).
  const at::Tensor wide = torch::randn({m, 2 * k}).narrow(1, 3, k);
  EXPECT_TRUE(close(onednn_mm(wide, b, bias), at::addmm(bias, wide, b), 1e-5, 2e-6 * k));
  EXPECT_THROW(onednn_mm(a, a, std::nullopt), c10::Error);  // sizes that cannot be multiplied
}

// Products whose rows round up to the same power of two share one measurement: a dynamic
// entry's new batch sizes are not each measured.
TEST(OneDnnGemms, AClassOfShapesIsMeasuredOnce) {
  if (!onednn()) GTEST_SKIP() << "LibTorch without oneDNN";
  auto times = [](int64_t m, std::vector<int64_t> a_strides) {
    std::pair<double, double> t;
    tcap::runtime::onednn_gemm_is_faster({m, 131, 257, std::move(a_strides), {257, 1}, true}, &t.first, &t.second);
    return t;
  };
  const auto first = times(300, {131, 1});
  EXPECT_GT(first.first, 0);
  EXPECT_EQ(times(400, {131, 1}), first);  // rows 257..512: the same class
  EXPECT_EQ(times(511, {300, 1}), first);  // a wider row stride: the same layout
}

// The graph of y = relu(x @ w1.t() + b1) @ w2 + mm(x, w3) in float64 and float32, the
// rewrite run with a chooser that says yes, or no.
tcap::ir::Graph products_graph(bool f64, int64_t rows) {
  auto fn = [](const Tensors& in) {
    at::Tensor h = torch::relu(torch::addmm(in[2], in[0], in[1].t()));
    return Tensors{torch::mm(h, in[3]), torch::addmm(in[2].unsqueeze(0), in[0], in[1].t()),
                   torch::addmm(in[2], in[0], in[1].t(), /*beta=*/2)};
  };
  const auto t = f64 ? torch::kDouble : torch::kFloat;
  torch::NoGradGuard no_grad;
  return captured_forward(fn, [&](tcap::CompiledFunction& f) {
    f({torch::randn({rows, 256}, t), torch::randn({256, 256}, t), torch::randn({256}, t), torch::randn({256, 256}, t)});
  });
}

int count_ops(const tcap::ir::Graph& g, const std::string& op) {
  int c = 0;
  for (const auto& n : g.nodes()) c += n.op == op;
  return c;
}

TEST(OneDnnGemms, TheRewriteTakesWhatTheChooserAcceptsAndKeepsValues) {
  if (!onednn()) GTEST_SKIP() << "LibTorch without oneDNN";
  const tcap::ir::Graph g = products_graph(false, 512);
  ASSERT_GT(g.nodes().size(), 0u);
  std::vector<std::string> asked;
  auto yes = [&](int64_t m, int64_t k, int64_t n, const std::vector<int64_t>&, const std::vector<int64_t>& bs, bool bias,
                 std::string* why) {
    asked.push_back(std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) + (bias ? "+b" : "") +
                    (bs[0] == 1 ? " bt" : ""));
    *why = "forced";
    return true;
  };
  tcap::fuse::Decomposed d = tcap::fuse::gemms_through_onednn(g, yes);
  // The addmm with a one-row bias and the mm qualify; the [1, n] self and beta = 2 do not.
  EXPECT_EQ(d.count, 2) << tcap::ir::to_string(g);
  EXPECT_EQ(asked, (std::vector<std::string>{"512x256x256+b bt", "512x256x256"}));
  ASSERT_EQ(d.decisions.size(), 4u);
  EXPECT_NE(d.decisions[2].find("stays ATen's: its self is not one row of bias"), std::string::npos) << d.decisions[2];
  EXPECT_NE(d.decisions[3].find("stays ATen's: beta or alpha is not 1"), std::string::npos) << d.decisions[3];
  EXPECT_EQ(count_ops(d.graph, "tcap::onednn_mm"), 2);
  // The rewritten graph computes what the captured one does.
  const Tensors in{torch::randn({512, 256}), torch::randn({256, 256}), torch::randn({256}), torch::randn({256, 256})};
  const Tensors want = tcap::Interpreter(g).run(in), got = tcap::Interpreter(d.graph).run(in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(close(got[i], want[i], 1e-5, 2e-6 * 256 * 16)) << i;
  // A chooser that says no leaves the graph; float64 and small products are not asked.
  auto no = [](int64_t, int64_t, int64_t, const std::vector<int64_t>&, const std::vector<int64_t>&, bool, std::string* why) {
    *why = "measured slower";
    return false;
  };
  EXPECT_EQ(tcap::fuse::gemms_through_onednn(g, no).count, 0);
  asked.clear();
  EXPECT_EQ(tcap::fuse::gemms_through_onednn(products_graph(true, 512), yes).count, 0);
  EXPECT_EQ(tcap::fuse::gemms_through_onednn(products_graph(false, 16), yes).count, 0);  // 2^20 multiply-adds
  EXPECT_TRUE(asked.empty());
}

// Note [ReLU inside the product]: a ReLU that alone reads a product (directly, or through
// the view a Linear over a 3-d input makes) goes inside it; one whose product has another
// reader stays after it; and the measurement's no keeps it after.
TEST(OneDnnGemms, AReluThatAloneReadsAProductGoesInsideIt) {
  if (!onednn()) GTEST_SKIP() << "LibTorch without oneDNN";
  auto fn = [](const Tensors& in) {
    at::Tensor p = torch::mm(in[3], in[1].t());
    return Tensors{torch::relu(torch::nn::functional::linear(in[0], in[1], in[2])), torch::relu(torch::mm(in[3], in[4])),
                   torch::relu(p), p};
  };
  auto inputs = [] {
    return Tensors{torch::randn({8, 64, 256}), torch::randn({256, 256}), torch::randn({256}), torch::randn({512, 256}),
                   torch::randn({256, 256})};
  };
  tcap::ir::Graph g;
  {
    torch::NoGradGuard no_grad;
    g = captured_forward(fn, [&](tcap::CompiledFunction& f) { f(inputs()); });
  }
  auto yes = [](int64_t, int64_t, int64_t, const std::vector<int64_t>&, const std::vector<int64_t>&, bool, std::string* why) {
    *why = "forced";
    return true;
  };
  auto no = [](int64_t, int64_t, int64_t, const std::vector<int64_t>&, const std::vector<int64_t>&, bool, std::string* why) {
    *why = "forced";
    return false;
  };
  tcap::fuse::Decomposed d = tcap::fuse::relu_inside_gemms(g, yes, yes);
  std::string decisions;
  for (const auto& line : d.decisions) decisions += line + "\n";
  ASSERT_EQ(d.count, 2) << tcap::ir::to_string(g) << decisions;
  EXPECT_EQ(count_ops(d.graph, "tcap::onednn_mm"), 2);
  EXPECT_EQ(count_ops(d.graph, "aten::relu"), 1) << tcap::ir::to_string(d.graph);
  int inside = 0, other_readers = 0;
  for (const auto& line : d.decisions) {
    inside += line.find("runs inside tcap::onednn_mm") != std::string::npos;
    other_readers += line.find("has other readers") != std::string::npos;
  }
  EXPECT_EQ(inside, 2);
  EXPECT_EQ(other_readers, 1);
  const Tensors in = inputs();
  const Tensors want = fn(in), got = tcap::Interpreter(d.graph).run(in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].sizes(), want[i].sizes()) << i;
    EXPECT_TRUE(close(got[i], want[i], 1e-5, 2e-6 * 256 * 16)) << i;
  }
  // The product through oneDNN but the ReLU measured slower inside, or the product ATen's.
  tcap::fuse::Decomposed kept = tcap::fuse::relu_inside_gemms(g, yes, no);
  EXPECT_EQ(kept.count, 0);
  EXPECT_NE(kept.decisions.at(0).find("measured slower inside"), std::string::npos) << kept.decisions[0];
  EXPECT_EQ(tcap::fuse::relu_inside_gemms(g, no, yes).count, 0);
}

// Training a two-layer MLP big enough to qualify through the llvm backend against eager:
// whichever way this machine's measurement decides, the decision is logged and the values
// agree.
TEST(OneDnnGemms, TrainingThroughTheLlvmBackendMatchesEager) {
  if (!tcap::Backend(tcap::Backend::Llvm).available()) GTEST_SKIP() << "LLVM backend not available";
  for (bool relu : {false, true}) {
    SCOPED_TRACE(relu ? "relu" : "gelu");
    torch::manual_seed(3);
    auto make = [relu] {
      torch::nn::Sequential s(torch::nn::Linear(256, 512));
      if (relu) {
        s->push_back(torch::nn::ReLU());
      } else {
        s->push_back(torch::nn::GELU());
      }
      s->push_back(torch::nn::Linear(512, 128));
      return s;
    };
    auto model = make(), ref = make();
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      torch::NoGradGuard ng;
      ref->parameters()[i].copy_(model->parameters()[i]);
    }
    tcap::CompileOptions o;
    o.backend = tcap::Backend::Llvm;
    o.name = relu ? "onednn_mlp_relu" : "onednn_mlp";
    auto f = tcap::compile([&](const Tensors& in) { return Tensors{model->forward(in[0])}; }, o);
    tcap::testing::LogCapture log("fusion");
    for (int step = 0; step < 3; ++step) {
      // The ReLU model over a 3-d input: its Linear is mm, _unsafe_view and the bias's add_.
      const at::Tensor x = relu ? torch::randn({24, 16, 256}) : torch::randn({384, 256});
      const at::Tensor got = (*f)({x})[0], want = ref->forward(x);
      EXPECT_TRUE(close(got, want, 1e-4, 1e-4)) << step;
      got.pow(2).mean().backward();
      want.pow(2).mean().backward();
      for (size_t i = 0; i < model->parameters().size(); ++i) {
        EXPECT_TRUE(close(model->parameters()[i].grad(), ref->parameters()[i].grad(), 1e-4, 1e-5)) << step << " " << i;
        model->parameters()[i].mutable_grad().reset();
        ref->parameters()[i].mutable_grad().reset();
      }
    }
    EXPECT_GE(f->stats().replays, 2);
    if (onednn()) {
      EXPECT_GE(log.count("runs as tcap::onednn_mm") + log.count("stays ATen's: ["), relu ? 1 : 2) << log.text();
      // The ReLU's decision, whichever way it measured (its product may also stay ATen's).
      if (relu) {
        EXPECT_GE(log.count("(aten::relu) runs inside") + log.count("(aten::relu) stays after its product: the product") +
                      log.count("(aten::relu) stays after its product: measured"),
                  1)
            << log.text();
      }
    }
  }
}

// The measurement runs ATen ops at compile time; a capture alive around the compile (a
// compiled function first called inside a CaptureGuard) records none of them.
TEST(OneDnnGemms, TheMeasurementIsNotRecordedByACaptureAroundIt) {
  if (!onednn() || !tcap::Backend(tcap::Backend::Llvm).available()) GTEST_SKIP() << "needs oneDNN and LLVM";
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  o.name = "onednn_inside_capture";
  // A class of shapes no other test measures, so that this compile measures it.
  auto f = tcap::compile([](const Tensors& in) { return Tensors{torch::mm(in[0], in[1]).relu()}; }, o);
  const at::Tensor a = torch::randn({515, 259}), b = torch::randn({259, 263});
  torch::NoGradGuard no_grad;
  tcap::testing::LogCapture log("fusion");
  tcap::ir::Graph outer;
  {
    tcap::CaptureGuard cap;
    cap.input(a, "a");
    cap.input(b, "b");
    at::Tensor y;
    for (int i = 0; i < 3; ++i) y = (*f)({a, b})[0];
    cap.output(y, "y");
    cap.stop();
    outer = cap.graph();
  }
  EXPECT_GE(log.count("[515, 259] @ [259, 263]: its class measured"), 1) << log.text();
  for (const auto& n : outer.nodes()) {
    EXPECT_NE(n.op, "aten::randn") << tcap::ir::to_string(outer);
    EXPECT_NE(n.op, "aten::normal_") << tcap::ir::to_string(outer);
    EXPECT_NE(n.op, "aten::as_strided") << tcap::ir::to_string(outer);
  }
  EXPECT_TRUE(close((*f)({a, b})[0], torch::mm(a, b).relu(), 1e-5, 2e-6 * 259));
}

}  // namespace
