// Ordinary programs that used to fall back:
//  * a word language model trained with truncated backpropagation through time (the
//    word_language_model example's loop): each step narrows a long token tensor, so the
//    saved token views sit at a new storage offset every step, and the last chunk is
//    shorter. Under compiled autograd every step used to recapture until the cache limit;
//  * the same model's loop with gradient clipping inside compile_step: LibTorch's
//    clip_grad_norm_ reads the norm on the host every step (a guard that never holds
//    twice); tcap::clip_grad_norm_ returns it as a tensor and the step compiles;
//  * a DCGAN written as two compiled steps, the discriminator's step returning the
//    generator's images, the generator's step backpropagating into them through the
//    discriminator its own optimizer step has just changed.
// Each runs against an eager twin from the same weights; tolerances as soundness.h says.
#include "soundness/soundness.h"

#include "programs/gan.h"
#include "support/log_capture.h"

namespace tcap::soundness {
namespace {

constexpr int64_t kVocab = 40, kTokens = 100, kBatch = 3, kBptt = 8;

struct WordLmImpl : nn::Module {
  WordLmImpl() {
    encoder = register_module("encoder", nn::Embedding(kVocab, 10));
    lstm = register_module("lstm", nn::LSTM(nn::LSTMOptions(10, 16).num_layers(2)));
    decoder = register_module("decoder", nn::Linear(16, kVocab));
  }
  std::tuple<at::Tensor, std::tuple<at::Tensor, at::Tensor>> forward(const at::Tensor& ids,
                                                                     std::tuple<at::Tensor, at::Tensor> hidden) {
    auto [out, h] = lstm(encoder(ids), hidden);
    return {decoder(out), h};
  }
  nn::Embedding encoder{nullptr};
  nn::LSTM lstm{nullptr};
  nn::Linear decoder{nullptr};
};
TORCH_MODULE(WordLm);

std::tuple<at::Tensor, at::Tensor> zero_hidden() { return {torch::zeros({2, kBatch, 16}), torch::zeros({2, kBatch, 16})}; }

// One BPTT chunk: loss over the next tokens, backward (by `backward`), clip, SGD by hand as
// the example does.
at::Tensor bptt_chunk(WordLm& m, const at::Tensor& data, int64_t i, std::tuple<at::Tensor, at::Tensor>& hidden,
                      const std::function<void(const at::Tensor&)>& backward) {
  const int64_t seq = std::min(kBptt, kTokens - 1 - i);
  auto input = data.narrow(0, i, seq);
  auto target = data.narrow(0, i + 1, seq);
  hidden = {std::get<0>(hidden).detach(), std::get<1>(hidden).detach()};  // repackage
  m->zero_grad();
  auto [logits, h] = m->forward(input, hidden);
  hidden = h;
  auto loss = torch::cross_entropy_loss(logits.view({-1, kVocab}), target.reshape(-1));
  backward(loss);
  torch::nn::utils::clip_grad_norm_(m->parameters(), 0.25);
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) p.add_(p.grad(), -0.5);
  return loss;
}

class LanguageModel : public ::testing::TestWithParam<std::string> {};

TEST_P(LanguageModel, TruncatedBackpropagationCompilesUnderCompiledAutograd) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  tcap::reset_compiled_autograd();
  torch::manual_seed(0);
  WordLm m;
  torch::manual_seed(0);
  WordLm twin;
  auto data = torch::randint(0, kVocab, {kTokens, kBatch});
  CompileOptions o;
  o.backend = backend;
  o.name = "bptt_" + backend;
  const Tol tol = tolerance(backend);
  tcap::StanceGuard strict(tcap::Stance::Default, /*error_on_fallback=*/true);
  tcap::testing::LogCapture logs("recompiles,compiled_autograd");
  int steps = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    auto hidden = zero_hidden(), hidden_twin = zero_hidden();
    for (int64_t i = 0; i < kTokens - 1; i += kBptt, ++steps) {
      auto loss = bptt_chunk(m, data, i, hidden, [&](const at::Tensor& l) {
        tcap::CompiledAutogradGuard ca(o);
        l.backward();
      });
      auto ref = bptt_chunk(twin, data, i, hidden_twin, [](const at::Tensor& l) { l.backward(); });
      ASSERT_TRUE(tcap::testing::close(loss, ref, tol.rtol, tol.atol)) << "epoch " << epoch << " chunk at " << i;
      auto pb = twin->named_parameters();
      for (const auto& item : m->named_parameters()) {
        ASSERT_TRUE(tcap::testing::close(item.value(), pb[item.key()], tol.rtol, tol.atol)) << item.key() << " at " << i;
      }
    }
  }
  tcap::CompiledAutogradGuard probe(o);
  const auto s = probe.stats();
  EXPECT_GE(s.replays, steps * 8 / 10) << s.replays << " of " << steps << " backwards compiled; captures " << s.captures
                                    << "\n" << logs.text();
  EXPECT_LE(s.captures, 3) << logs.text();
}

// The same loop as one compiled step with the clipping inside.
struct ClipStep {
  ClipStep(uint64_t seed, bool tcap_clip) : tcap_clip(tcap_clip) {
    torch::manual_seed(seed);
    m = WordLm();
    opt = std::make_unique<torch::optim::SGD>(m->parameters(), 0.5);
  }
  at::Tensor body(const at::Tensor& input, const at::Tensor& target) {
    opt->zero_grad();
    auto [logits, h] = m->forward(input, zero_hidden());
    auto loss = torch::cross_entropy_loss(logits.view({-1, kVocab}), target.reshape(-1));
    loss.backward();
    if (tcap_clip) tcap::clip_grad_norm_(m->parameters(), 0.25);
    else torch::nn::utils::clip_grad_norm_(m->parameters(), 0.25);
    opt->step();
    return loss;
  }
  bool tcap_clip;
  WordLm m{nullptr};
  std::unique_ptr<torch::optim::SGD> opt;
};

TEST_P(LanguageModel, GradientClippingInsideACompiledStep) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  auto data = torch::randint(0, kVocab, {kTokens, kBatch});
  const Tol tol = tolerance(backend);
  for (const bool tcap_clip : {false, true}) {
    ClipStep a(0, tcap_clip), twin(0, /*tcap_clip=*/false);  // the twin clips with LibTorch's
    CompileOptions o;
    o.backend = backend;
    auto step = tcap::compile_step(a.m.ptr(), *a.opt,
                                   [&](const Tensors& in) { return Tensors{a.body(in[0], in[1])}; }, o);
    tcap::testing::LogCapture logs("graph_breaks");
    int steps = 0;
    for (int64_t i = 0; i + kBptt < kTokens; i += kBptt, ++steps) {
      auto input = data.narrow(0, i, kBptt), target = data.narrow(0, i + 1, kBptt);
      auto loss = (*step)({input, target})[0];
      auto ref = twin.body(input, target);
      ASSERT_TRUE(tcap::testing::close(loss, ref, tol.rtol, tol.atol)) << "tcap_clip " << tcap_clip << " at " << i;
      auto pb = twin.m->named_parameters();
      for (const auto& item : a.m->named_parameters()) {
        ASSERT_TRUE(tcap::testing::close(item.value(), pb[item.key()], tol.rtol, tol.atol)) << item.key() << " at " << i;
      }
    }
    if (tcap_clip) {
      EXPECT_GE(step->stats().replays, steps - 4) << step->eager_reason() << "\n" << logs.text();
      EXPECT_EQ(step->eager_reason(), "");
    } else {
      // LibTorch's returns the norm through item(): eager, and the log says what to use.
      EXPECT_EQ(step->stats().replays, 0);
      EXPECT_NE(step->eager_reason().find("tcap::clip_grad_norm_"), std::string::npos) << step->eager_reason();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Soundness, LanguageModel, ::testing::Values(std::string("eager"), std::string("llvm")));

// The DCGAN of test/programs/gan.h written as two steps.
struct TwoStepDcgan {
  explicit TwoStepDcgan(uint64_t seed) {
    torch::manual_seed(seed);
    gen = programs::gan::Generator();
    disc = programs::gan::discriminator();
    g_opt = std::make_unique<torch::optim::Adam>(gen->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
    d_opt = std::make_unique<torch::optim::Adam>(disc->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  }
  // The discriminator's update; returns its loss and the generator's images (with history).
  Tensors d_step(const at::Tensor& real, const at::Tensor& noise) {
    d_opt->zero_grad();
    auto fake = gen->forward(noise);
    auto d_loss = torch::binary_cross_entropy_with_logits(disc->forward(real), torch::full({real.size(0), 1}, 0.9)) +
                  torch::binary_cross_entropy_with_logits(disc->forward(fake.detach()), torch::zeros({real.size(0), 1}));
    d_loss.backward();
    d_opt->step();
    return {d_loss, fake};
  }
  // The generator's update through the (just updated) discriminator.
  at::Tensor g_step(const at::Tensor& fake) {
    g_opt->zero_grad();
    auto g_loss = torch::binary_cross_entropy_with_logits(disc->forward(fake), torch::ones({fake.size(0), 1}));
    g_loss.backward();
    g_opt->step();
    return g_loss;
  }
  programs::gan::Generator gen{nullptr};
  nn::Sequential disc{nullptr};
  std::unique_ptr<torch::optim::Adam> g_opt, d_opt;
};

class Dcgan : public ::testing::TestWithParam<std::string> {};

TEST_P(Dcgan, TwoCompiledStepsMatchEager) {
  const std::string backend = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  TwoStepDcgan a(12), b(12);
  CompileOptions o;
  o.backend = backend;
  auto d = tcap::compile_step({a.gen.ptr(), a.disc.ptr()}, {*a.d_opt},
                              [&](const Tensors& in) { return a.d_step(in[0], in[1]); }, o);
  auto g = tcap::compile_step({a.gen.ptr(), a.disc.ptr()}, {*a.g_opt},
                              [&](const Tensors& in) { return Tensors{a.g_step(in[0])}; }, o);
  const Tol tol = tolerance(backend);
  tcap::testing::LogCapture logs("graph_breaks");
  for (int i = 0; i < 12; ++i) {
    auto real = torch::rand({8, 1, 16, 16}) * 2 - 1;
    auto noise = torch::randn({8, programs::gan::kNoise, 1, 1});
    auto out = (*d)({real, noise});
    auto g_loss = (*g)({out[1]})[0];
    auto ref = b.d_step(real, noise);
    auto g_ref = b.g_step(ref[1]);
    ASSERT_TRUE(tcap::testing::close(out[0], ref[0], tol.rtol, tol.atol)) << "d_loss step " << i;
    ASSERT_TRUE(tcap::testing::close(g_loss, g_ref, tol.rtol, tol.atol)) << "g_loss step " << i;
  }
  auto pb = b.gen->named_parameters();
  for (const auto& item : a.gen->named_parameters()) {
    EXPECT_TRUE(tcap::testing::close(item.value(), pb[item.key()], tol.rtol, tol.atol)) << item.key();
  }
  EXPECT_GE(d->stats().replays, 7) << d->eager_reason() << "\n" << logs.text();
  EXPECT_GE(g->stats().replays, 5) << g->eager_reason() << "\n" << logs.text();
}

INSTANTIATE_TEST_SUITE_P(Soundness, Dcgan, ::testing::Values(std::string("eager"), std::string("llvm")));

}  // namespace
}  // namespace tcap::soundness
