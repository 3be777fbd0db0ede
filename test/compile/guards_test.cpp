// Guards and the cache: each guard kind triggers exactly one recompile; the cache size
// limit falls back to eager; values read on the host are guards; what cannot be compiled
// runs eagerly with a reason; a user fw_compiler can rewrite the forward graph.
//
// Tolerances: the eager backend runs the same kernels as eager, rtol 1e-5, atol 1e-6.
#include <tcap/compile.h>

#include "support/compare.h"
#include "support/log_capture.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;

namespace {

Tensors fn(const Tensors& in) { return {torch::tanh(in[0] * 2 + 1).sum(0)}; }

// Calls f twice with inputs made by make(); the first may compile, the second must replay.
void twice(tcap::CompiledFunction& f, const std::function<at::Tensor()>& make, bool backward = true) {
  for (int i = 0; i < 2; ++i) {
    auto x = make();
    auto out = f({x});
    auto ref = fn({x.detach()});
    EXPECT_TRUE(close(out[0], ref[0], 1e-5, 1e-6));
    if (backward && out[0].requires_grad()) out[0].sum().backward();
  }
}

struct GuardCase {
  const char* name;
  std::function<at::Tensor()> first, second;
  std::function<void(bool)> mode;  // set a global mode for the second shape (true) or reset (false)
};

class Guard : public ::testing::TestWithParam<GuardCase> {};

TEST_P(Guard, TriggersExactlyOneRecompile) {
  const auto& c = GetParam();
  auto f = tcap::compile(fn);
  twice(*f, c.first);
  EXPECT_EQ(f->stats().recompiles, 0);
  if (c.mode) c.mode(true);
  twice(*f, c.second, /*backward=*/at::GradMode::is_enabled());
  if (c.mode) c.mode(false);
  EXPECT_EQ(f->stats().recompiles, 1) << c.name;
  EXPECT_EQ(f->eager_reason(), "");
  // Both entries still hit.
  twice(*f, c.first);
  EXPECT_EQ(f->stats().recompiles, 1) << c.name;
}

at::Tensor rg(at::Tensor t) { return t.requires_grad_(true); }

INSTANTIATE_TEST_SUITE_P(
    Kinds, Guard,
    ::testing::Values(
        GuardCase{"shape", [] { return rg(torch::randn({4, 5})); }, [] { return rg(torch::randn({6, 5})); }, {}},
        GuardCase{"dtype", [] { return rg(torch::randn({4, 5})); },
                  [] { return rg(torch::randn({4, 5}, torch::kDouble)); }, {}},
        GuardCase{"strides", [] { return rg(torch::randn({4, 5})); },
                  [] { return torch::randn({5, 4}).t().requires_grad_(true); }, {}},
        GuardCase{"requires_grad", [] { return rg(torch::randn({4, 5})); }, [] { return torch::randn({4, 5}); }, {}},
        GuardCase{"grad_mode", [] { return rg(torch::randn({4, 5})); }, [] { return rg(torch::randn({4, 5})); },
                  [](bool on) { at::GradMode::set_enabled(!on); }},
        GuardCase{"autocast", [] { return rg(torch::randn({4, 5})); }, [] { return rg(torch::randn({4, 5})); },
                  [](bool on) { at::autocast::set_autocast_enabled(at::kCPU, on); }}),
    [](const auto& info) { return std::string(info.param.name); });

// The default dtype is global state: torch::ones() and Python-style scalars follow it, so
// an entry captured under float never serves a call made under double.
TEST(Cache, DefaultDtypeIsGuarded) {
  auto add_ones = [](const Tensors& in) { return Tensors{in[0] + torch::ones({in[0].size(0)})}; };
  auto f = tcap::compile(add_ones);
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 6; ++i) {
    const bool dbl = i >= 2 && i < 4;
    if (dbl) torch::set_default_dtype(caffe2::TypeMeta::Make<double>());
    auto x = torch::randn({5}, torch::kFloat);
    auto out = f->forward(x);
    auto ref = add_ones({x})[0];
    torch::set_default_dtype(caffe2::TypeMeta::Make<float>());
    EXPECT_EQ(out.scalar_type(), ref.scalar_type()) << "call " << i;
    EXPECT_TRUE(close(out, ref)) << "call " << i;
  }
  EXPECT_EQ(f->stats().captures, 2);  // once under float, once under double
  EXPECT_GE(f->stats().replays, 3);
}

// A compiled module gathers its submodules' own parameters and buffers on every call
// (aot/module_tables.h): undefined ones are skipped, as parameters() skips them, and a
// buffer registered after the capture is an input the entry did not see: one recompile,
// and the new buffer's value is used.
struct LateBuffer : torch::nn::Module {
  LateBuffer() {
    fc = register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(3, 4).bias(false)));
    register_buffer("unset", at::Tensor());
    scale = register_buffer("scale", torch::full({4}, 2.0));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = fc->forward(x) * scale;
    return shift.defined() ? y + shift : y;
  }
  torch::nn::Linear fc{nullptr};
  at::Tensor scale, shift;
};

TEST(Cache, ModuleTensorsAreGatheredEveryCall) {
  auto model = std::make_shared<LateBuffer>();
  tcap::CompileOptions o;
  o.name = "late_buffer";
  std::weak_ptr<LateBuffer> weak = model;
  auto f = tcap::compile(model, [weak](const Tensors& in) { return Tensors{weak.lock()->forward(in[0])}; }, o);
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 6; ++i) {
    if (i == 3) model->shift = model->register_buffer("shift", torch::randn({4}));
    auto x = torch::randn({5, 3});
    EXPECT_TRUE(close(f->forward(x), model->forward(x), 1e-5, 1e-6)) << "call " << i;
  }
  EXPECT_EQ(f->stats().captures, 2);
  EXPECT_EQ(f->stats().replays, 4);
}

TEST(Cache, LimitFallsBackToEager) {
  tcap::CompileOptions o;
  o.cache_size_limit = 2;
  o.dynamic = false;  // every shape is its own entry
  auto f = tcap::compile(fn, o);
  for (int64_t rows : {3, 4, 5, 6}) {
    auto x = torch::randn({rows, 5}, torch::requires_grad());
    auto out = (*f)({x});
    EXPECT_TRUE(close(out[0], fn({x})[0]));
    out[0].sum().backward();
  }
  EXPECT_EQ(f->stats().compiles, 2);
  EXPECT_NE(f->eager_reason().find("cache size limit"), std::string::npos) << f->eager_reason();
  // Still right, and the compiled entries are no longer used.
  auto x = torch::randn({3, 5}, torch::requires_grad());
  EXPECT_TRUE(close((*f)({x})[0], fn({x})[0]));
}

// Note [The failing guard first]: a lookup passes an entry whose last failing guard fails
// again, and still finds the entry that fits when that guard holds. Three entries that
// differ in a tensor guard (dtype, requires_grad) and one in the global state (grad mode),
// called in an order where each entry's last failing guard holds again for a later call:
// every call after the captures replays the entry it fits (no capture more), with eager's
// values, and a recompile still names the first entry's failure.
TEST(Cache, ALookupChecksTheFailingGuardFirstAndStillFindsItsEntry) {
  tcap::CompileOptions o;
  o.name = "failing_guard_first";
  o.dynamic = false;
  auto f = tcap::compile(fn, o);
  struct Call {
    at::ScalarType dtype;
    bool requires_grad;
    bool grad_mode;
  };
  const std::vector<Call> kinds = {{at::kFloat, false, true}, {at::kDouble, false, true}, {at::kFloat, true, true},
                                   {at::kDouble, false, false}};
  auto call = [&](const Call& c) {
    c10::AutoGradMode mode(c.grad_mode);
    auto x = torch::randn({3, 5}, at::TensorOptions().dtype(c.dtype).requires_grad(c.requires_grad));
    auto out = (*f)({x});
    EXPECT_TRUE(close(out[0], fn({x.detach()})[0], 1e-5, 1e-6));
    if (out[0].requires_grad()) out[0].sum().backward();
  };
  for (const auto& c : kinds) call(c);  // four captures
  EXPECT_EQ(f->stats().captures, 4);
  // Each kind after every other, so that each entry's last failing guard is a different
  // guard from the one the next call differs in.
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < kinds.size(); ++i) {
      call(kinds[(i * 3 + static_cast<size_t>(round)) % kinds.size()]);
      call(kinds[(kinds.size() - 1 - i + static_cast<size_t>(round)) % kinds.size()]);
    }
  }
  const auto s = f->stats();
  EXPECT_EQ(s.captures, 4) << "a call was not served by the entry it fits";
  EXPECT_EQ(s.replays, 24);
  tcap::testing::LogCapture log("recompiles");
  call({at::kHalf, false, true});
  EXPECT_NE(log.text().find("recompiling (entry 4"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("changed dtype: float32 -> float16"), std::string::npos)
      << "the first entry's failure: " << log.text();
}

// Note [Dynamic sizes] in cache/dynamic_sizes.h.
TEST(Dynamic, ChangedBatchDimIsMadeDynamic) {
  auto flat = [](const Tensors& in) {
    auto x = in[0];
    return Tensors{torch::relu(x.view({x.size(0), -1})).matmul(in[1]).reshape({x.size(0) * 2, -1}).sigmoid()};
  };
  auto f = tcap::compile(flat);
  auto w = torch::randn({12, 6}, torch::requires_grad());
  for (int64_t batch : {4, 8, 12, 5, 12, 16}) {
    auto x = torch::randn({batch, 3, 4}, torch::requires_grad());
    auto out = (*f)({x, w});
    out[0].pow(2).sum().backward();
    auto gx = x.grad().clone(), gw = w.grad().clone();
    x.mutable_grad().reset();
    w.mutable_grad().reset();
    auto ref = flat({x, w});
    ref[0].pow(2).sum().backward();
    EXPECT_TRUE(close(out[0], ref[0])) << "batch " << batch;
    EXPECT_TRUE(close(gx, x.grad())) << "batch " << batch;
    EXPECT_TRUE(close(gw, w.grad())) << "batch " << batch;
    w.mutable_grad().reset();
  }
  // Sizes 4 and 8 were captured; 12, 5 and 16 were specialized from the dynamic entry,
  // which took the place of the static one at 4 (Note [A dynamic entry takes the place
  // of the static one]).
  EXPECT_EQ(f->stats().captures, 2);
  EXPECT_EQ(f->stats().recompiles, 1);
  EXPECT_EQ(f->eager_reason(), "");
  auto es = f->entries();
  ASSERT_EQ(es.size(), 1u);
  EXPECT_NE(es[0].guards[0].find("[s0, 3, 4]"), std::string::npos) << es[0].guards[0];
}

TEST(Dynamic, SizeUsedAsAFloatStaysStatic) {
  auto mean0 = [](const Tensors& in) { return Tensors{in[0].sum(0) / static_cast<double>(in[0].size(0))}; };
  auto f = tcap::compile(mean0);
  for (int64_t batch : {4, 8, 12}) {
    auto x = torch::randn({batch, 3}, torch::requires_grad());
    auto out = (*f)({x});
    EXPECT_TRUE(close(out[0], x.mean(0))) << "batch " << batch;
    out[0].sum().backward();
    EXPECT_TRUE(close(x.grad(), torch::full({batch, 3}, 1.0 / batch))) << "batch " << batch;
  }
  EXPECT_EQ(f->stats().captures, 3);  // every batch size recaptured: 1/size is a host value
}

// The seed's data-dependent branch: the value read by item() is a guard.
Tensors branchy(const Tensors& in) {
  if (in[0].sum().item<float>() > 0) return {in[0] * 2};
  return {in[0] - 10};
}

TEST(HostValues, ItemGivesTheRightBranchForBothSigns) {
  auto f = tcap::compile(branchy);
  for (int i = 0; i < 12; ++i) {
    const float sign = i % 2 ? -1.f : 1.f;
    auto x = (torch::rand({3, 4}) + 0.1) * sign;
    x.requires_grad_(true);
    auto out = (*f)({x});
    const auto expect = sign > 0 ? x.detach() * 2 : x.detach() - 10;
    EXPECT_TRUE(close(out[0], expect)) << "call " << i;
    out[0].sum().backward();
    EXPECT_TRUE(close(x.grad(), torch::full({3, 4}, sign > 0 ? 2.f : 1.f))) << "call " << i;
  }
}

TEST(HostValues, SameValueReplays) {
  auto f = tcap::compile(branchy);
  auto x = torch::ones({3, 4}, torch::requires_grad());
  for (int i = 0; i < 4; ++i) (*f)({x})[0].sum().backward();
  EXPECT_EQ(f->stats().compiles, 1);
  EXPECT_GE(f->stats().replays, 2);
  auto es = f->entries();
  ASSERT_EQ(es.size(), 1u);
  bool has_host_guard = false;
  for (const auto& g : es[0].guards) has_host_guard = has_host_guard || g.find("host value") != std::string::npos;
  EXPECT_TRUE(has_host_guard);
}

// Note [Sizes that come from values]: nonzero's result size is a guard of the entry,
// checked as each replay runs it; masks with as many entries set replay, others do not.
TEST(Guards, SizesFromValuesAreGuarded) {
  auto nz = [](const Tensors& in) { return Tensors{in[0].index_select(0, torch::nonzero(in[1]).squeeze(1)) * 3}; };
  auto f = tcap::compile(nz);
  const std::vector<std::vector<int64_t>> masks = {{1, 0, 1, 0, 0, 1}, {0, 1, 1, 0, 1, 0}, {1, 1, 0, 0, 0, 1},
                                                   {1, 1, 1, 1, 0, 0}, {0, 0, 1, 1, 0, 1}};
  for (const auto& mv : masks) {
    auto x = torch::randn({6, 2}, torch::requires_grad());
    auto m = torch::tensor(mv);
    auto out = (*f)({x, m});
    out[0].pow(2).sum().backward();
    auto gx = x.grad().clone();
    x.mutable_grad().reset();
    auto want = nz({x, m});
    want[0].pow(2).sum().backward();
    EXPECT_TRUE(close(out[0], want[0]));
    EXPECT_TRUE(close(gx, x.grad()));
  }
  EXPECT_EQ(f->eager_reason(), "");
  EXPECT_GE(f->stats().replays, 3);
  bool guarded = false;
  for (const auto& e : f->entries()) {
    for (const auto& g : e.guards) guarded = guarded || g.find("sizes of the results of aten::nonzero") != std::string::npos;
  }
  EXPECT_TRUE(guarded);
}

// An op whose output shape depends on values without LibTorch's tag (found by the check
// at capture, Note [Output shapes that depend on values]) keeps the function eager.
TEST(Fallback, UntaggedDataDependentShapeRunsEagerly) {
  auto packed = [](const Tensors& in) {
    return Tensors{torch::nn::utils::rnn::pack_padded_sequence(in[0], in[1], true, false).data() * 3};
  };
  auto f = tcap::compile(packed);
  for (const auto& lengths : std::vector<std::vector<int64_t>>{{3, 5}, {4, 4}, {2, 6}}) {
    auto x = torch::randn({2, 6, 3});
    auto len = torch::tensor(lengths);
    auto out = (*f)({x, len});
    EXPECT_TRUE(close(out[0], packed({x, len})[0]));
  }
  EXPECT_NE(f->eager_reason().find("aten::_pack_padded_sequence has a data-dependent output shape"), std::string::npos)
      << f->eager_reason();
  EXPECT_EQ(f->stats().compiles, 0);
}

TEST(Fallback, HookRegisteredInsideRunsEagerly) {
  int calls = 0;
  auto hooked = [&calls](const Tensors& in) {
    auto h = in[0] * 2;
    h.register_hook([&calls](at::Tensor g) {
      ++calls;
      return g * 3;
    });
    return Tensors{h.sin()};
  };
  auto f = tcap::compile(hooked);
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({4}, torch::requires_grad());
    (*f)({x})[0].sum().backward();
    EXPECT_TRUE(close(x.grad(), (x * 2).cos().detach() * 6));
  }
  EXPECT_EQ(calls, 3);
  EXPECT_NE(f->eager_reason().find("hook"), std::string::npos) << f->eager_reason();
}

TEST(Fallback, InPlaceOnInputThatRequiresGradRunsEagerly) {
  auto inplace = [](const Tensors& in) {
    auto h = in[0] * 1;  // a non-leaf copy would be fine; writing the input itself is not
    in[0].mul_(2);
    return Tensors{(in[0] + h).sin()};
  };
  auto f = tcap::compile(inplace);
  for (int i = 0; i < 3; ++i) {
    auto leaf = torch::randn({5}, torch::requires_grad());
    auto x = leaf * 1;  // non-leaf input, written in place by the function
    auto out = (*f)({x});
    auto leaf2 = leaf.detach().clone().requires_grad_(true);
    auto x2 = leaf2 * 1;
    auto ref = inplace({x2});
    EXPECT_TRUE(close(out[0], ref[0]));
    out[0].sum().backward();
    ref[0].sum().backward();
    EXPECT_TRUE(close(leaf.grad(), leaf2.grad())) << "call " << i;
  }
  EXPECT_NE(f->eager_reason().find("writes in place into input"), std::string::npos) << f->eager_reason();
}

// The seed's custom backend: a fw_compiler that deletes dropout from the forward graph.
TEST(CustomBackend, FwCompilerDeletesDropout) {
  torch::manual_seed(0);
  torch::nn::Linear linear(100, 3);
  torch::nn::Dropout dropout(0.3);
  auto model = [&](const Tensors& in) { return Tensors{dropout(linear(in[0]))}; };
  int compiled_graphs = 0;
  tcap::CompileOptions o;
  o.fw_compiler = [&](const tcap::ir::Graph& g) {
    ++compiled_graphs;
    tcap::ir::Graph h = g;
    // CPU dropout is recorded as empty_like -> bernoulli_ -> div_ -> mul(x, mask):
    // route the mul's users to x, then drop what nothing reads.
    for (const auto& n : g.nodes()) {
      if (n.op != "aten::bernoulli_") continue;
      const auto mask = n.outputs.back().values.at(0);
      for (tcap::ir::NodeId user_id : g.users(mask)) {
        for (tcap::ir::NodeId mul_id : g.users(g.node(user_id).outputs.at(0).values.at(0))) {
          const auto& mul = g.node(mul_id);
          if (mul.op != "aten::mul") continue;
          h.replace_all_uses_with(mul.outputs.at(0).values.at(0), mul.args.at(0).values.at(0));
        }
      }
    }
    return tcap::eager_backend(tcap::eliminate_dead_code(h));
  };
  auto f = tcap::compile(model, o);
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({10, 100});
    auto out = (*f)({x});
    if (i == 0) continue;  // the capture call runs eagerly, with dropout
    EXPECT_TRUE(close(out[0], linear(x))) << "call " << i;
  }
  EXPECT_EQ(compiled_graphs, 1);
  EXPECT_EQ(f->stats().replays, 2);
}

}  // namespace
