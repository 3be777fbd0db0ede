// The divergence fuzzer's programs (divergence_programs.h).
#include "divergence_programs.h"

#include "support/models.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>

namespace divergence {

namespace {

// A GroupNorm's groups over `width` features: the most with at least two features each (a
// group of one feature outputs its bias whatever the input: see the LayerNorm note in
// draw_spec).
int groups_of(int width) {
  for (int g = width / 2; g > 1; --g) {
    if (width % g == 0) return g;
  }
  return 1;
}

}  // namespace

std::string Spec::str() const {
  static const char* names[] = {"Linear",   "ReLU",     "Tanh",  "GELU",      "SiLU",    "Sigmoid",    "LayerNorm",
                                "BatchNorm1d", "Dropout", "Residual", "Scale", "Attention", "Held", "GroupNorm", "InPlace",
                                "SizeBranch"};
  std::ostringstream s;
  s << door_name(door) << "/" << backend << (door == Door::Step ? (adam ? "/Adam" : "/SGD") : "") << ": ";
  switch (input) {
    case Input::Features: s << "in " << in; break;
    case Input::Tokens: s << "tokens of " << kVocabulary << " -> Embedding(" << stem << ")"; break;
    case Input::Sequences:
      s << "in " << in << "x" << kLength << " -> Conv1d(" << stem << ") -> flatten(" << stem * kLength << ")";
      break;
    case Input::Text:
      s << "text of " << in << " per token -> TextStem(" << stem << (text_form & 1 ? ", causal attention" : "")
        << (text_form & 1 && text_form & 4 && stem % 2 == 0 ? " of 2 heads" : "")
        << (text_form & 2 ? ", mean" : ", max") << " over the length"
        << (text_form & 8 ? ", floats divided by the length on the host" : "")
        << (text_form & 16 ? ", a Conv1d of stride 2 over the length" : "")
        << (text_form & 32 ? ", the first half of chunk(2)" : "") << ")";
      break;
  }
  for (const auto& [l, w] : layers) {
    s << " -> " << names[static_cast<int>(l)] << (l == Layer::InPlace && w % 2 == 1 ? " with out= overloads" : "") << "("
      << w << ")";
  }
  if (offset) s << " -> offset in the default dtype";
  s << (cross_entropy ? " -> cross_entropy" : " -> mse") << (masked ? " over a boolean mask of the batch" : "");
  return s.str();
}

Spec draw_spec(std::mt19937_64& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  Spec s;
  s.in = 2 + pick(7);
  s.input = static_cast<Input>(pick(6) < 3 ? 0 : pick(3) + 1);
  int width = s.in;
  if (s.input == Input::Tokens) width = s.stem = 3 + pick(6);
  if (s.input == Input::Sequences) {
    s.in = 2 + pick(3);
    s.stem = 2 + pick(3);
    width = s.stem * kLength;
  }
  if (s.input == Input::Text) {
    width = s.stem = 3 + pick(4);
    s.text_form = pick(64);
  }
  s.backend = pick(2) ? "llvm" : "eager";
  const int n = 2 + pick(5);
  for (int k = 0; k < n; ++k) {
    Layer l = static_cast<Layer>(pick(kLayerKinds));
    if (k == 0 && s.input == Input::Features) l = Layer::Linear;
    // No BatchNorm right after a BatchNorm: the first's bias then gets a gradient that is
    // zero in exact arithmetic (the second removes the batch mean), and with a small batch
    // after a ReLU the cancelling terms are thousands of times its size, so fused kernels'
    // roundings differ there by far more than any tolerance, in eager as much.
    // (A GroupNorm is a BatchNorm's kin here: its groups' means remove a bias as well.)
    const auto is_norm = [](Layer x) { return x == Layer::BatchNorm || x == Layer::GroupNorm; };
    if (is_norm(l) && !s.layers.empty() && is_norm(s.layers.back().first)) l = Layer::Tanh;
    // With llvm, a BatchNorm only right after an activation. A bias that reaches a training
    // BatchNorm through affine ops only (a Linear's, attention's output projection, then a
    // scaling) has a gradient that is zero in exact arithmetic: the batch mean removes it.
    // What a backward computes there is the rounding of terms that cancel, and after a
    // small-variance batch and a LayerNorm over few features fused kernels' roundings
    // differ there by more than the tolerance (2.1e-4 in an attention's out_proj.bias).
    if (is_norm(l) && s.backend == "llvm") {
      const Layer prev = s.layers.empty() ? Layer::Linear : s.layers.back().first;
      const bool after_activation = prev == Layer::Relu || prev == Layer::Tanh || prev == Layer::Gelu ||
                                    prev == Layer::Silu || prev == Layer::Sigmoid;
      if (!after_activation) l = Layer::Tanh;
    }
    // Hidden widths of at least 3: a LayerNorm over one feature outputs its bias whatever
    // the input, over two it outputs +-1 (to within eps); either way the gradient through
    // it is zero in exact arithmetic, and what a backward computes there is rounding noise
    // amplified by 1/sqrt(eps), in eager too.
    if (l == Layer::Linear) width = 3 + pick(7);
    s.layers.push_back({l, width});
  }
  if (s.layers.back().first != Layer::Linear) s.layers.push_back({Layer::Linear, 1 + pick(5)});
  s.offset = pick(4) == 0;
  s.cross_entropy = s.layers.back().second > 1 && pick(2) == 0;
  s.door = static_cast<Door>(pick(3));
  // Adam divides by the root of the squared gradient: for a gradient that is zero in exact
  // arithmetic (a Linear's bias before a BatchNorm), rounding alone moves the parameter by
  // the learning rate. With fused kernels, whose roundings differ, that is not a
  // divergence of meaning (verify mode leaves those elements out, Note [Verify
  // tolerances]); the fuzzer runs Adam with the eager backend only.
  s.adam = s.backend == "eager" && pick(2) == 0;
  s.masked = pick(4) == 0;
  return s;
}

// `held`: the side's tensors that Held layers read through their closures.
nn::Sequential build(const Spec& s, std::vector<at::Tensor>& held) {
  nn::Sequential seq;
  int width = s.input == Input::Features ? s.in : s.input == Input::Sequences ? s.stem * kLength : s.stem;
  if (s.input == Input::Text) seq->push_back(TextStem(s.in, s.stem, s.text_form));
  else if (s.input != Input::Features) seq->push_back(Stem(s));
  for (const auto& [l, w] : s.layers) {
    switch (l) {
      case Layer::Linear: seq->push_back(nn::Linear(width, w)); break;
      case Layer::Relu: seq->push_back(nn::ReLU()); break;
      case Layer::Tanh: seq->push_back(nn::Tanh()); break;
      case Layer::Gelu: seq->push_back(nn::GELU()); break;
      case Layer::Silu: seq->push_back(nn::SiLU()); break;
      case Layer::Sigmoid: seq->push_back(nn::Sigmoid()); break;
      case Layer::LayerNorm: seq->push_back(nn::LayerNorm(nn::LayerNormOptions({width}))); break;
      case Layer::BatchNorm: seq->push_back(nn::BatchNorm1d(width)); break;
      case Layer::GroupNorm: seq->push_back(nn::GroupNorm(groups_of(width), width)); break;
      case Layer::Dropout: seq->push_back(nn::Dropout(0.25)); break;
      case Layer::Residual: seq->push_back(Residual(width)); break;
      case Layer::Scale: seq->push_back(nn::Functional([](const at::Tensor& x) { return x * 1.5 - 0.25; })); break;
      case Layer::Attention: seq->push_back(tcap::testing::BatchAttention(width)); break;
      case Layer::InPlace: seq->push_back(InPlace(width)); break;
      case Layer::SizeBranch: seq->push_back(SizeBranch()); break;
      case Layer::Held: {
        held.push_back(torch::linspace(0.5, 1.5, width));
        at::Tensor t = held.back();
        seq->push_back(nn::Functional([t](const at::Tensor& x) { return x * t; }));
        break;
      }
    }
    width = w;
  }
  if (s.offset) {
    // Built in the default dtype: a call with another default dtype returns that dtype.
    seq->push_back(nn::Functional([](const at::Tensor& x) { return x + torch::ones({x.size(-1)}) * 0.125; }));
  }
  return seq;
}

std::string first_difference(const at::Tensor& a, const at::Tensor& b, double rtol, double atol, double floor) {
  if (a.defined() != b.defined()) return a.defined() ? "defined where eager's is not" : "undefined where eager's is defined";
  if (!a.defined()) return "";
  if (a.sizes() != b.sizes()) {
    std::ostringstream s;
    s << "shape " << a.sizes() << " where eager's is " << b.sizes();
    return s.str();
  }
  if (a.scalar_type() != b.scalar_type()) return "another dtype";
  auto x = a.detach().to(at::kDouble), y = b.detach().to(at::kDouble);
  // A training that overflowed on both sides (a scaled residual chain under SGD): where inf
  // and nan come out of inf arithmetic is rounding too, and means nothing.
  if (!y.isfinite().all().item<bool>() && !x.isfinite().all().item<bool>()) return "";
  // atol scales with the tensor's magnitude, as verify mode's does (Note [Verify tolerances]).
  // Of the finite elements: a training that diverged to inf on both sides compares equal.
  const double scale = y.numel() ? std::max(floor, y.abs().nan_to_num(0, 0, 0).max().item<double>()) : floor;
  if (!at::allclose(x, y, rtol, atol * scale, /*equal_nan=*/true)) {
    std::ostringstream s;
    const auto d = (x - y).abs().flatten();
    const int64_t at = d.argmax().item<int64_t>();
    s << "max difference " << d[at].item<double>() << " (tcap " << x.flatten()[at].item<double>() << ", eager "
      << y.flatten()[at].item<double>() << " at element " << at << "; eager's largest magnitude " << scale << ")";
    return s.str();
  }
  return "";
}

}  // namespace divergence
