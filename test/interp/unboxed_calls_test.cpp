// Note [Unboxed extern calls]: the ops the interpreter calls unboxed give bit-for-bit what
// the dispatcher's boxed call gives, mutated inputs included; every adapted op of a
// captured training-step-like graph is called unboxed; tensors or modes the dispatcher
// must see (a conjugate view, a capture recording the run, autocast) take the boxed call;
// a scalar argument changed between runs is read afresh.
#include <tcap/capture.h>
#include <tcap/interpreter.h>

#include "interp/unboxed_calls.h"
#include "passes/scalar_inputs.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

namespace {

using Tensors = std::vector<at::Tensor>;

Tensors clones(const Tensors& ts) {
  Tensors out;
  for (const auto& t : ts) out.push_back(t.clone());
  return out;
}

// Runs g on copies of `inputs` with unboxed calls off, then on; returns (boxed, unboxed)
// results, each followed by the inputs as the run left them (in-place ops write them), and
// the number of unboxed calls the second run made.
struct Both {
  Tensors boxed, unboxed;
  int64_t unboxed_calls = 0;
};
Both run_both(const tcap::ir::Graph& g, const Tensors& inputs) {
  Both b;
  for (bool off : {true, false}) {
    tcap::interp::disable_unboxed_calls_for_testing(off);
    tcap::Interpreter interp(g);
    Tensors in = clones(inputs);
    const int64_t before = tcap::interp::unboxed_calls_made();
    Tensors out = interp.run(in);
    if (!off) b.unboxed_calls = tcap::interp::unboxed_calls_made() - before;
    out.insert(out.end(), in.begin(), in.end());
    (off ? b.boxed : b.unboxed) = out;
  }
  tcap::interp::disable_unboxed_calls_for_testing(false);
  return b;
}

void expect_bitwise_equal(const Both& b) {
  ASSERT_EQ(b.boxed.size(), b.unboxed.size());
  for (size_t k = 0; k < b.boxed.size(); ++k) {
    ASSERT_EQ(b.boxed[k].defined(), b.unboxed[k].defined()) << k;
    if (!b.boxed[k].defined()) continue;
    EXPECT_EQ(b.boxed[k].sizes(), b.unboxed[k].sizes()) << k;
    EXPECT_EQ(b.boxed[k].strides(), b.unboxed[k].strides()) << k;
    EXPECT_EQ(b.boxed[k].scalar_type(), b.unboxed[k].scalar_type()) << k;
    EXPECT_TRUE(b.boxed[k].equal(b.unboxed[k])) << "result " << k;
  }
}

const std::set<std::string> kAdapted = {
    "aten::mm", "aten::addmm", "aten::view", "aten::t", "aten::detach", "aten::ones_like", "aten::full",
    "aten::empty.memory_format", "aten::convolution", "aten::convolution_backward", "aten::max_pool2d_with_indices",
    "aten::max_pool2d_with_indices_backward", "aten::nll_loss_forward", "aten::nll_loss_backward", "aten::copy_",
    "aten::add_.Scalar", "aten::_fused_adam_", "aten::_fused_sgd_"};

int64_t adapted_nodes(const tcap::ir::Graph& g, std::set<std::string>* seen) {
  int64_t n = 0;
  for (const auto& node : g.nodes()) {
    if (node.kind != tcap::ir::NodeKind::Call || !kAdapted.count(node.qualified_op())) continue;
    seen->insert(node.qualified_op());
    ++n;
  }
  return n;
}

// A small CNN step by hand (odd sizes), under no_grad as compiled graphs run: every op the
// adapters cover, the multi-tensor optimizer updates writing their inputs.
TEST(UnboxedCalls, EveryAdaptedOpMatchesTheBoxedCall) {
  torch::NoGradGuard no_grad;
  Tensors in = {torch::randn({3, 2, 9, 7}),  torch::randn({5, 2, 3, 3}), torch::randn({5}),
                torch::randint(0, 4, {3}),   torch::randn({5 * 4 * 2, 4}), torch::randn({4}),
                torch::randn({5, 2, 3, 3}),  torch::randn({5, 2, 3, 3}), torch::randn({5, 2, 3, 3}).abs(),
                torch::full({}, 3.0),        torch::randn({4}),           torch::randn({4}),
                torch::randn({4})};
  tcap::CaptureGuard cap;
  const char* names[] = {"x", "w", "b", "target", "fc_w", "fc_b", "adam_p", "adam_m", "adam_v", "adam_step",
                         "sgd_p", "sgd_g", "sgd_buf"};
  for (size_t k = 0; k < in.size(); ++k) cap.input(in[k], names[k]);
  auto conv = at::convolution(in[0], in[1], in[2], {1, 1}, {1, 0}, {1, 1}, false, {0, 0}, 1);
  auto [pooled, idx] = at::max_pool2d_with_indices(conv, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false);
  auto flat = pooled.view({3, -1});
  auto logits = at::addmm(in[5], flat, in[4], 0.5, 2.0);
  auto [loss, total] = at::nll_loss_forward(at::log_softmax(logits, 1), in[3], {}, 1, -100);
  auto g_loss = at::ones_like(loss);
  auto g_logp = at::nll_loss_backward(g_loss, at::log_softmax(logits, 1), in[3], {}, 1, -100, total);
  auto g_flat = at::mm(g_logp, in[4].t());
  auto g_fc = at::mm(flat.t(), g_logp).detach();
  auto g_pooled = g_flat.view(pooled.sizes());
  auto g_conv = at::max_pool2d_with_indices_backward(g_pooled, conv, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false, idx);
  auto [g_x, g_w, g_b] = at::convolution_backward(g_conv, in[0], in[1], std::vector<int64_t>{5}, {1, 1}, {1, 0},
                                                  {1, 1}, false, {0, 0}, 1, {true, true, true});
  auto lr = at::full({}, 0.5);
  auto scratch = at::empty({4}, at::TensorOptions().dtype(at::kFloat));
  scratch.copy_(in[5]);
  scratch.add_(2.5, 0.5);
  at::_fused_adam_({in[6]}, {g_w}, {in[7]}, {in[8]}, {}, {in[9]}, 0.01, 0.9, 0.999, 0.0, 1e-8, false, false);
  at::_fused_sgd_({in[10]}, {in[11]}, {in[12]}, 0.0, 0.9, 0.1, 0.0, false, false, false);
  for (const auto& [t, name] : std::vector<std::pair<at::Tensor, const char*>>{
           {loss, "loss"}, {g_x, "g_x"}, {g_w, "g_w"}, {g_b, "g_b"}, {g_fc, "g_fc"}, {lr, "lr"}, {scratch, "scratch"}}) {
    cap.output(t, name);
  }
  cap.stop();
  const auto g = cap.graph();
  std::set<std::string> seen;
  const int64_t adapted = adapted_nodes(g, &seen);
  EXPECT_EQ(seen, kAdapted) << "the graph should hold every adapted op";
  Tensors fresh;
  for (const auto& t : in) fresh.push_back(t.dtype() == at::kLong ? torch::randint(0, 4, t.sizes()) : torch::randn_like(t));
  fresh[8] = fresh[8].abs();
  const Both b = run_both(g, fresh);
  expect_bitwise_equal(b);
  EXPECT_EQ(b.unboxed_calls, adapted);
}

// A conjugate view (its key set has the Conjugate key) must go through the dispatcher,
// which resolves the conjugation; the plain call next to it is still unboxed.
TEST(UnboxedCalls, AConjugateViewTakesTheDispatcher) {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({3, 4}, at::kComplexFloat), y = torch::randn({4, 2}, at::kComplexFloat);
  tcap::CaptureGuard cap;
  cap.input(x, "x");
  cap.input(y, "y");
  cap.output(at::mm(x, y), "xy");
  cap.stop();
  const auto g = cap.graph();
  tcap::Interpreter interp(g);
  const int64_t before = tcap::interp::unboxed_calls_made();
  auto plain = interp.run({x, y});
  EXPECT_EQ(tcap::interp::unboxed_calls_made(), before + 1);
  auto conj = interp.run({x.conj(), y});
  EXPECT_EQ(tcap::interp::unboxed_calls_made(), before + 1) << "the conjugate view was called unboxed";
  EXPECT_TRUE(conj[0].equal(at::mm(x.conj().resolve_conj(), y)));
  EXPECT_TRUE(plain[0].equal(at::mm(x, y)));
}

// A capture recording the replay, and autocast, must see every op: no unboxed call.
TEST(UnboxedCalls, ModesSeeEveryCall) {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({3, 4}), y = torch::randn({4, 2});
  tcap::ir::Graph g;
  {
    tcap::CaptureGuard cap;
    cap.input(x, "x");
    cap.input(y, "y");
    cap.output(at::mm(x, y).t(), "xy");
    cap.stop();
    g = cap.graph();
  }
  tcap::Interpreter interp(g);
  const int64_t before = tcap::interp::unboxed_calls_made();
  {
    tcap::CaptureGuard outer;
    outer.input(x, "x");
    outer.input(y, "y");
    auto out = interp.run({x, y});
    outer.output(out[0], "xy");
    outer.stop();
    EXPECT_EQ(tcap::interp::unboxed_calls_made(), before);
    int mms = 0;
    const auto recorded = outer.graph();
    for (const auto& n : recorded.nodes()) mms += n.op == "aten::mm";
    EXPECT_EQ(mms, 1) << "the outer capture did not see the replayed mm";
  }
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    auto out = interp.run({x, y});
    at::autocast::set_autocast_enabled(at::kCPU, false);
    EXPECT_EQ(tcap::interp::unboxed_calls_made(), before) << "an op was called unboxed with autocast on";
  }
  interp.run({x, y});
  EXPECT_EQ(tcap::interp::unboxed_calls_made(), before + 2);
}

// A float argument read from a host scalar input (compile_step's learning rates, Note
// [Host scalars as graph inputs]): the unboxed call reads each run's value, as the
// dispatcher's call does, and eager's result with that value.
TEST(UnboxedCalls, AHostScalarInputIsReadPerRun) {
  torch::NoGradGuard no_grad;
  Tensors in = {torch::randn({6}), torch::randn({6}), torch::zeros({6}), torch::zeros({6}), torch::full({}, 1.0)};
  tcap::CaptureGuard cap;
  const char* names[] = {"p", "g", "m", "v", "step"};
  for (size_t k = 0; k < in.size(); ++k) cap.input(in[k], names[k]);
  at::_fused_adam_({in[0]}, {in[1]}, {in[2]}, {in[3]}, {}, {in[4]}, 0.01, 0.9, 0.999, 0.0, 1e-8, false, false);
  cap.output(in[0], "p");
  cap.stop();
  const auto g = cap.graph();
  tcap::ir::NodeId adam = -1;
  for (const auto& n : g.nodes()) {
    if (n.op == "aten::_fused_adam_") adam = n.id;
  }
  ASSERT_GE(adam, 0);
  const auto h = tcap::passes::scalars_as_inputs(g, {{adam, 6, "lr"}});
  for (double lr : {0.25, 0.01}) {
    Tensors results;
    for (bool off : {true, false}) {
      tcap::interp::disable_unboxed_calls_for_testing(off);
      tcap::Interpreter interp(h);
      Tensors fresh = clones(in);
      fresh.push_back(tcap::passes::host_scalar_input(lr));
      const int64_t before = tcap::interp::unboxed_calls_made();
      results.push_back(interp.run(fresh)[0]);
      if (!off) {
        EXPECT_GT(tcap::interp::unboxed_calls_made(), before) << "the adam step was not called unboxed";
      }
    }
    tcap::interp::disable_unboxed_calls_for_testing(false);
    EXPECT_TRUE(results[0].equal(results[1])) << lr;
    Tensors eager = clones(in);
    at::_fused_adam_({eager[0]}, {eager[1]}, {eager[2]}, {eager[3]}, {}, {eager[4]}, lr, 0.9, 0.999, 0.0, 1e-8, false,
                     false);
    EXPECT_TRUE(results[1].equal(eager[0])) << "lr " << lr << ": not eager's result";
  }
}

}  // namespace
