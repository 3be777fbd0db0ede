// Module state changed between calls (Note [Module state guards]): a submodule replaced, an
// activation swapped, the options of LibTorch's modules (Dropout p and inplace,
// BatchNorm momentum, eps and track_running_stats, LayerNorm eps, Conv stride, an LSTM's
// dropout, MultiheadAttention's dropout), a nested submodule's training flag. Every call
// must give eager's loss, parameters, gradients and buffers, in every mode and backend.
#include "soundness/soundness.h"

namespace tcap::soundness {
namespace {

// Linear -> BatchNorm1d -> Dropout -> activation -> LayerNorm -> Linear.
struct MlpNet : Net {
  MlpNet() {
    fc1 = register_module("fc1", nn::Linear(6, 8));
    bn = register_module("bn", nn::BatchNorm1d(8));
    act = nn::AnyModule(nn::ReLU());
    register_module("act", act.ptr());
    drop = register_module("drop", nn::Dropout(0.25));
    ln = register_module("ln", nn::LayerNorm(nn::LayerNormOptions({8})));
    fc2 = register_module("fc2", nn::Linear(8, 3));
  }
  at::Tensor run(const at::Tensor& x) override {
    return fc2(ln(act.forward(drop(bn(fc1(x))))));  // dropout where it may run in place
  }
  nn::Linear fc1{nullptr}, fc2{nullptr};
  nn::BatchNorm1d bn{nullptr};
  nn::AnyModule act;
  nn::Dropout drop{nullptr};
  nn::LayerNorm ln{nullptr};
};

// Conv2d -> mean over the image -> Linear.
struct ConvNet : Net {
  ConvNet() {
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(2, 4, 3)));
    fc = register_module("fc", nn::Linear(4, 3));
  }
  at::Tensor run(const at::Tensor& x) override { return fc(conv(x.view({5, 2, 6, 6})).mean({2, 3})); }
  nn::Conv2d conv{nullptr};
  nn::Linear fc{nullptr};
};

// A two-layer LSTM (dropout between its layers) -> Linear of the last step.
struct LstmNet : Net {
  LstmNet() {
    lstm = register_module("lstm", nn::LSTM(nn::LSTMOptions(3, 5).num_layers(2).dropout(0.2)));
    fc = register_module("fc", nn::Linear(5, 3));
  }
  at::Tensor run(const at::Tensor& x) override { return fc(std::get<0>(lstm(x.view({2, 5, 3}))).select(0, 1)); }
  nn::LSTM lstm{nullptr};
  nn::Linear fc{nullptr};
};

// Self-attention over 3 tokens of 6 features -> Linear of the first token.
struct AttnNet : Net {
  AttnNet() {
    attn = register_module("attn", nn::MultiheadAttention(nn::MultiheadAttentionOptions(6, 2).dropout(0.1)));
    fc = register_module("fc", nn::Linear(6, 3));
  }
  at::Tensor run(const at::Tensor& x) override {
    auto seq = x.view({5, 3, 2}).repeat({1, 1, 3}).transpose(0, 1);  // [3 tokens, 5 batch, 6]
    return fc(std::get<0>(attn(seq, seq, seq)).select(0, 0));
  }
  nn::MultiheadAttention attn{nullptr};
  nn::Linear fc{nullptr};
};

struct Change {
  const char* name;
  std::function<std::shared_ptr<Net>()> make;
  std::function<void(Net&)> change;  // applied to the compiled model and to its twin alike
  int64_t features = 6;
};

template <class N>
std::function<void(Net&)> on(std::function<void(N&)> f) {
  return [f](Net& n) { f(static_cast<N&>(n)); };
}
template <class N>
std::function<std::shared_ptr<Net>()> make() {
  return [] { return std::make_shared<N>(); };
}

const Change kChanges[] = {
    {"ReplaceSubmodule", make<MlpNet>(), on<MlpNet>([](MlpNet& m) {
       torch::manual_seed(42);  // the same new weights in the model and its twin
       m.fc2 = m.replace_module("fc2", nn::Linear(8, 3));
     })},
    {"SwapActivation", make<MlpNet>(), on<MlpNet>([](MlpNet& m) {
       m.act = nn::AnyModule(nn::Tanh());
       m.replace_module("act", m.act.ptr());
     })},
    {"DropoutP", make<MlpNet>(), on<MlpNet>([](MlpNet& m) { m.drop->options.p(0.6); })},
    {"DropoutInplace", make<MlpNet>(), on<MlpNet>([](MlpNet& m) { m.drop->options.inplace(true); })},
    {"BatchNormMomentum", make<MlpNet>(), on<MlpNet>([](MlpNet& m) { m.bn->options.momentum(0.7); })},
    {"BatchNormEps", make<MlpNet>(), on<MlpNet>([](MlpNet& m) { m.bn->options.eps(0.5); })},
    {"BatchNormTrackRunningStats", make<MlpNet>(),
     on<MlpNet>([](MlpNet& m) { m.bn->options.track_running_stats(false); })},
    {"LayerNormEps", make<MlpNet>(), on<MlpNet>([](MlpNet& m) { m.ln->options.eps(0.3); })},
    {"NestedEval", make<MlpNet>(), on<MlpNet>([](MlpNet& m) { m.bn->eval(); })},
    {"DropoutEval", make<MlpNet>(), on<MlpNet>([](MlpNet& m) { m.drop->eval(); })},
    {"WholeModelEval", make<MlpNet>(), on<MlpNet>([](MlpNet& m) { m.eval(); })},
    {"ConvStride", make<ConvNet>(), on<ConvNet>([](ConvNet& m) { m.conv->options.stride(2); }), 72},
    {"ConvPadding", make<ConvNet>(), on<ConvNet>([](ConvNet& m) { m.conv->options.padding(1); }), 72},
    {"LstmDropout", make<LstmNet>(), on<LstmNet>([](LstmNet& m) { m.lstm->options.dropout(0.7); })},
    {"AttentionDropout", make<AttnNet>(), on<AttnNet>([](AttnNet& m) { m.attn->options.dropout(0.5); })},
};

using ChangeParam = std::tuple<Change, Mode, std::string>;

class ModuleState : public ::testing::TestWithParam<ChangeParam> {};

TEST_P(ModuleState, ChangedStateGivesEagersAnswer) {
  const auto& [c, mode, backend] = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  torch::manual_seed(0);
  std::shared_ptr<Net> net = c.make();
  torch::manual_seed(0);
  std::shared_ptr<Net> twin = c.make();
  Runner compiled(mode, net, backend, /*compiled=*/true);
  Runner eager(mode, twin, backend, /*compiled=*/false);
  const Tol tol = tolerance(backend);
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  const int calls = mode == Mode::CompileStep ? 10 : 7, change_at = mode == Mode::CompileStep ? 5 : 3;
  int captures_before = 0;
  for (int i = 0; i < calls; ++i) {
    if (i == change_at) {
      captures_before = compiled.captures();
      c.change(*net);
      c.change(*twin);
    }
    auto x = torch::randn({5, c.features});
    auto y = torch::randn({5, 3});
    torch::manual_seed(1000 + i);  // the same dropout masks in both
    auto loss = compiled.call(x, y);
    torch::manual_seed(1000 + i);
    auto ref = eager.call(x, y);
    ASSERT_TRUE(tcap::testing::close(loss, ref, tol.rtol, tol.atol)) << c.name << " call " << i;
    ASSERT_TRUE(same_state(*net, *twin, tol)) << c.name << " call " << i;
  }
  if (mode != Mode::CompiledAutograd) {
    EXPECT_GT(compiled.captures(), captures_before) << c.name << ": the change was not noticed (no recapture)";
  }
}

std::string change_name(const ::testing::TestParamInfo<ChangeParam>& info) {
  const auto& [c, mode, backend] = info.param;
  return std::string(c.name) + "_" + mode_name(mode) + "_" + backend;
}

INSTANTIATE_TEST_SUITE_P(Soundness, ModuleState,
                         ::testing::Combine(::testing::ValuesIn(kChanges),
                                            ::testing::Values(Mode::Compile, Mode::CompileFn, Mode::CompileStep,
                                                              Mode::CompiledAutograd),
                                            ::testing::Values(std::string("eager"), std::string("llvm"))),
                         change_name);

}  // namespace
}  // namespace tcap::soundness
