// Note [Checking a new size] (csrc/cache/dynamic_sizes.h) on programs whose sizes vary: a
// transformer layer with varying sequence length under tcap::compile, and a token tagger
// trained on batches of varying length under compile_step and compiled autograd. Every call
// is compared with an eager twin (tolerances: size_tolerances.h).
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/train_step.h>

#include "support/backends.h"
#include "support/compare.h"
#include "support/log_capture.h"
#include "support/models.h"
#include "size_tolerances.h"

#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

namespace {

using tcap::testing::atol_of;
using tcap::testing::close;
using tcap::testing::LogCapture;
using tcap::testing::rtol_of;
using Tensors = std::vector<at::Tensor>;
namespace nn = torch::nn;

}  // namespace

namespace {

// MultiheadAttention reads equal(query, key) and equal(key, value) on the host: guards
// checked inline by every replay (Note [Host reads of a dynamic entry]), which no longer
// keep the entry static. The sequence length varies, the batch does not.
TEST(SizeChecks, TransformerLayerWithVaryingSequenceLength) {
  for (const char* backend : {"eager", "llvm"}) {
    if (!tcap::testing::backend_built(backend, nullptr)) continue;
    torch::manual_seed(11);
    auto opts = nn::TransformerEncoderLayerOptions(16, 4).dim_feedforward(32).dropout(0.0);
    nn::TransformerEncoderLayer layer(opts), twin(opts);
    tcap::testing::copy_parameters(*layer, *twin);
    tcap::CompileOptions o;
    o.backend = backend;
    LogCapture log("recompiles");
    auto f = tcap::compile(layer.ptr(), [&](const Tensors& in) { return Tensors{layer->forward(in[0])}; }, o);
    const std::vector<int64_t> lengths = {5, 9, 12, 12, 7, 7, 31, 31, 9, 20, 20, 3, 3};
    for (int64_t t : lengths) {
      auto x = torch::randn({t, 2, 16});
      auto out = (*f)({x})[0];
      auto ref = twin->forward(x);
      ASSERT_TRUE(close(out, ref, rtol_of(backend), atol_of(backend))) << backend << " length " << t << "\n"
                                                                        << log.text();
      out.pow(2).sum().backward();
      ref.pow(2).sum().backward();
      auto p = layer->parameters(), q = twin->parameters();
      for (size_t k = 0; k < p.size(); ++k) {
        EXPECT_TRUE(close(p[k].grad(), q[k].grad(), rtol_of(backend), 10 * atol_of(backend)))
            << backend << " length " << t << " parameter " << k;
      }
      layer->zero_grad();
      twin->zero_grad();
    }
    const auto st = f->stats();
    EXPECT_EQ(st.captures, 2) << backend << "\n" << log.text();
    EXPECT_GE(st.replays, 5) << backend << "\n" << log.text();
    EXPECT_EQ(f->eager_reason(), "") << backend;
  }
}

}  // namespace

namespace {

// A token tagger trained on batches of varying length: Embedding, Linear, LayerNorm, GELU,
// Linear, cross_entropy over flatten(0, 1). Its views take batch * length, which the walk
// of compiled autograd also reads as a size of its own: an integer two sizes explain
// alike, taken as the first and checked at every new length.
struct Tagger : nn::Module {
  Tagger()
      : emb(register_module("emb", nn::Embedding(50, 16))),
        fc1(register_module("fc1", nn::Linear(16, 24))),
        norm(register_module("norm", nn::LayerNorm(nn::LayerNormOptions({24})))),
        fc2(register_module("fc2", nn::Linear(24, 7))) {}
  at::Tensor forward(const at::Tensor& tokens) {
    return fc2->forward(torch::gelu(norm->forward(fc1->forward(emb->forward(tokens)))));
  }
  nn::Embedding emb;
  nn::Linear fc1;
  nn::LayerNorm norm;
  nn::Linear fc2;
};

at::Tensor tagger_loss(Tagger& m, const at::Tensor& tokens, const at::Tensor& tags) {
  return torch::cross_entropy_loss(m.forward(tokens).flatten(0, 1), tags.flatten(0, 1));
}

const std::vector<int64_t> kLengths = {12, 12, 12, 12, 17, 17, 17, 9, 9, 23, 23, 12, 30, 30, 17, 5, 5, 9};

TEST(SizeChecks, TaggerStepWithVaryingLength) {
  torch::manual_seed(21);
  auto model = std::make_shared<Tagger>(), twin = std::make_shared<Tagger>();
  tcap::testing::copy_parameters(*model, *twin);
  torch::optim::Adam opt(model->parameters(), 1e-2), opt_twin(twin->parameters(), 1e-2);
  auto body = [](Tagger& m, torch::optim::Adam& o, const at::Tensor& x, const at::Tensor& y) {
    o.zero_grad();
    auto loss = tagger_loss(m, x, y);
    loss.backward();
    o.step();
    return loss;
  };
  LogCapture log("recompiles");
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(*model, opt, in[0], in[1])}; });
  for (int64_t t : kLengths) {
    auto x = torch::randint(0, 50, {4, t});
    auto y = torch::randint(0, 7, {4, t});
    auto loss = (*step)({x, y})[0];
    ASSERT_TRUE(close(loss, body(*twin, opt_twin, x, y), 1e-4, 1e-5)) << "length " << t << "\n" << log.text();
  }
  auto p = model->parameters(), q = twin->parameters();
  for (size_t k = 0; k < p.size(); ++k) EXPECT_TRUE(close(p[k], q[k], 1e-4, 1e-5)) << "parameter " << k;
  const auto st = step->stats();
  EXPECT_GE(st.replays, 6) << log.text();
  EXPECT_LE(st.captures, 6) << log.text();
  EXPECT_EQ(log.count("takes the place of entry"), 1) << log.text();
}

TEST(SizeChecks, TaggerCompiledAutogradWithVaryingLength) {
  tcap::reset_compiled_autograd();
  torch::manual_seed(22);
  auto model = std::make_shared<Tagger>(), twin = std::make_shared<Tagger>();
  tcap::testing::copy_parameters(*model, *twin);
  tcap::CompileOptions o;
  o.name = "tagger_ca";
  LogCapture log("recompiles");
  for (int64_t t : kLengths) {
    auto x = torch::randint(0, 50, {4, t});
    auto y = torch::randint(0, 7, {4, t});
    {
      tcap::CompiledAutogradGuard ca(o);
      tagger_loss(*model, x, y).backward();
    }
    tagger_loss(*twin, x, y).backward();
    auto p = model->parameters(), q = twin->parameters();
    for (size_t k = 0; k < p.size(); ++k) {
      ASSERT_TRUE(close(p[k].grad(), q[k].grad(), 1e-5, 1e-6)) << "length " << t << " parameter " << k << "\n" << log.text();
    }
    model->zero_grad();
    twin->zero_grad();
  }
  tcap::CompiledAutogradGuard ca(o);
  EXPECT_GE(ca.stats().replays, 6) << log.text();
  EXPECT_LE(ca.stats().captures, 4) << log.text();
  // The dynamic entry took the place of the static one captured at 12 (Note [A dynamic
  // entry takes the place of the static one]); that entry's code serves 12 since.
  EXPECT_EQ(log.count("compiled autograd entry 1 takes the place of entry 0, whose sizes"), 1) << log.text();
}

}  // namespace

namespace {

// Greedy generation from a GPT-style decoder: token and position embeddings (positions
// from arange over the prefix length), a causal mask built from that length, a
// TransformerEncoderLayer, a norm and a head; each call takes the prefix one token longer
// than the last. Every length after the second is new: the entry goes dynamic at the
// second and checks each later length once (Note [Checking a new size]).
struct TinyGpt : nn::Module {
  static constexpr int64_t kVocab = 29, kWidth = 16, kMaxLength = 64;
  TinyGpt()
      : tok(register_module("tok", nn::Embedding(kVocab, kWidth))),
        pos(register_module("pos", nn::Embedding(kMaxLength, kWidth))),
        block(register_module("block", nn::TransformerEncoderLayer(
                                           nn::TransformerEncoderLayerOptions(kWidth, 2).dim_feedforward(32).dropout(0.0)))),
        norm(register_module("norm", nn::LayerNorm(nn::LayerNormOptions({kWidth})))),
        head(register_module("head", nn::Linear(kWidth, kVocab))) {}
  at::Tensor forward(const at::Tensor& tokens) {  // [batch, length] -> [batch, length, vocab]
    const int64_t t = tokens.size(1);
    auto x = tok->forward(tokens) + pos->forward(torch::arange(t, tokens.options()));
    auto mask = torch::full({t, t}, -std::numeric_limits<float>::infinity()).triu(1);
    x = block->forward(x.transpose(0, 1), mask).transpose(0, 1);
    return head->forward(norm->forward(x));
  }
  nn::Embedding tok, pos;
  nn::TransformerEncoderLayer block;
  nn::LayerNorm norm;
  nn::Linear head;
};

TEST(SizeChecks, GreedyGenerationFromADecoder) {
  for (const char* backend : {"eager", "llvm"}) {
    if (!tcap::testing::backend_built(backend, nullptr)) continue;
    torch::manual_seed(31);
    auto model = std::make_shared<TinyGpt>(), twin = std::make_shared<TinyGpt>();
    tcap::testing::copy_parameters(*model, *twin);
    model->eval();
    twin->eval();
    torch::NoGradGuard no_grad;
    tcap::CompileOptions o;
    o.backend = backend;
    o.name = std::string("gpt_") + backend;
    LogCapture log("recompiles");
    auto f = tcap::compile(model, [&](const Tensors& in) { return Tensors{model->forward(in[0])}; }, o);
    auto tokens = torch::randint(0, TinyGpt::kVocab, {2, 3});
    const int steps = 24;
    for (int i = 0; i < steps; ++i) {
      auto out = (*f)({tokens})[0];
      auto ref = twin->forward(tokens);
      ASSERT_TRUE(close(out, ref, rtol_of(backend), atol_of(backend)))
          << backend << " length " << tokens.size(1) << "\n" << log.text();
      auto next = ref.select(1, -1).argmax(-1, /*keepdim=*/true);
      tokens = torch::cat({tokens, next}, 1);
    }
    const auto st = f->stats();
    EXPECT_EQ(f->eager_reason(), "") << backend << "\n" << log.text();
    EXPECT_LE(st.captures, 2) << backend << "\n" << log.text();
    EXPECT_EQ(st.size_checks, steps - 2) << backend << "\n" << log.text();
    EXPECT_EQ(st.eager_calls, 0) << backend << "\n" << log.text();
  }
}

}  // namespace

namespace {

// Causal self-attention over a length that varies, written by hand as C++ users write it:
// heads split off by reshape and transpose, a mask built from the length, host code that
// branches on the length (the last six tokens kept above six, a scaling at multiples of
// three), positions from arange over the length, a mean over it. Lengths that take the
// same branches are one dynamic entry; a length that takes another branch is refused by
// its check capture and gets an entry of its own. Values and gradients against an eager
// twin at every call, both backends.
struct CausalText : nn::Module {
  CausalText() : proj(register_module("proj", nn::Linear(3, 8))), qkv(register_module("qkv", nn::Linear(8, 24))) {}
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), n = x.size(1);
    at::Tensor h = proj->forward(x.flatten(0, 1)).view({b, n, 8});
    auto parts = qkv->forward(h).chunk(3, -1);
    auto split = [&](const at::Tensor& t) { return t.reshape({b, n, 2, 4}).transpose(1, 2); };
    at::Tensor scores = split(parts[0]).matmul(split(parts[1]).transpose(-2, -1)) / 2.0;
    at::Tensor causal = torch::ones({n, n}, torch::kBool).triu(1);
    at::Tensor att = scores.masked_fill(causal, -1e9).softmax(-1).matmul(split(parts[2]));
    h = h + att.transpose(1, 2).reshape({b, n, 8});
    if (n > 6) h = h.narrow(1, n - 6, 6);
    if (n % 3 == 0) h = h * 0.75;
    h = h + (torch::arange(h.size(1), h.options()) * 0.125).unsqueeze(-1);
    return h.mean(1);
  }
  nn::Linear proj, qkv;
};

TEST(SizeChecks, CausalAttentionWithHostBranchesOnTheLength) {
  for (const char* backend : {"eager", "llvm"}) {
    if (!tcap::testing::backend_built(backend, nullptr)) continue;
    SCOPED_TRACE(backend);
    torch::manual_seed(5);
    auto model = std::make_shared<CausalText>(), twin = std::make_shared<CausalText>();
    tcap::testing::copy_parameters(*model, *twin);
    tcap::CompileOptions o;
    o.backend = backend;
    LogCapture log("recompiles");
    auto f = tcap::compile(model, [&](const Tensors& in) { return Tensors{model->forward(in[0])}; }, o);
    // 4, 5 and 2 take no branch; 8, 11, 10 and 7 keep six tokens; 3 and 6 scale; 9 and 12
    // do both. The last call's input is not contiguous.
    const std::vector<int64_t> lengths = {4, 5, 4, 5, 2, 2, 8, 8, 11, 11, 10, 7, 3, 3, 6, 6, 9, 9, 12, 12,
                                          4, 10, 6, 12, 2, 11, 7, 7};
    for (size_t c = 0; c < lengths.size(); ++c) {
      const int64_t n = lengths[c];
      auto x = c + 1 == lengths.size() ? torch::randn({3, 3, n}).transpose(1, 2) : torch::randn({3, n, 3});
      auto out = (*f)({x})[0];
      auto ref = twin->forward(x);
      ASSERT_TRUE(close(out, ref, rtol_of(backend), atol_of(backend))) << "call " << c << " length " << n << "\n"
                                                                        << log.text();
      out.pow(2).sum().backward();
      ref.pow(2).sum().backward();
      auto p = model->parameters(), q = twin->parameters();
      for (size_t k = 0; k < p.size(); ++k) {
        ASSERT_TRUE(close(p[k].grad(), q[k].grad(), rtol_of(backend), 10 * atol_of(backend)))
            << "call " << c << " length " << n << " parameter " << k << "\n"
            << log.text();
      }
      model->zero_grad();
      twin->zero_grad();
    }
    // The user's code runs once per new length (Note [One check capture for every
    // dynamic entry]): two captures per branch taken, the second of which makes a dynamic
    // entry that takes the place of the first's static one (Note [A dynamic entry takes
    // the place of the static one]), and one for the non-contiguous input: 9 captures and
    // 5 entries. The other first calls at a length (2, 8, 11, 10, 7, 3, 6, 9, 12) are one
    // check capture each, whatever the number of dynamic entries that compare it.
    const auto st = f->stats();
    EXPECT_EQ(st.captures, 9) << log.text();
    EXPECT_EQ(st.size_checks, 9) << log.text();
    EXPECT_GE(st.replays, 8) << log.text();
    EXPECT_EQ(log.count("takes the place of entry"), 4) << log.text();
    EXPECT_EQ(log.count("recompiling (entry 5"), 0) << log.text();
    EXPECT_EQ(f->eager_reason(), "");
  }
}

}  // namespace
