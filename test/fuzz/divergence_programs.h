// The divergence fuzzer's programs and the changes drawn between their calls (divergence.cpp
// runs them): the grammar of models, one side (compiled or eager) of a program, and the
// change kinds.
#pragma once

#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/train_step.h>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace divergence {

namespace nn = torch::nn;
using Tensors = std::vector<at::Tensor>;

// --- programs -------------------------------------------------------------------------

enum class Door { Compile, Step, CompiledAutograd };
inline const char* door_name(Door d) {
  switch (d) {
    case Door::Compile: return "compile";
    case Door::Step: return "compile_step";
    case Door::CompiledAutograd: return "compiled_autograd";
  }
  return "?";
}

enum class Layer {
  Linear, Relu, Tanh, Gelu, Silu, Sigmoid, LayerNorm, BatchNorm, Dropout, Residual, Scale, Attention, Held, GroupNorm,
  InPlace, SizeBranch
};
constexpr int kLayerKinds = 16;

// What the model takes: features [batch, in], token ids [batch] (an Embedding stem),
// sequences [batch, in, kLength] (a Conv1d stem, flattened), or text [batch, length, in]
// whose length the calls vary (a TextStem, pooled over the length).
enum class Input { Features, Tokens, Sequences, Text };
constexpr int kVocabulary = 12;
constexpr int kLength = 5;
// The lengths a Text program is called at: 1 and 2, the stem's threshold (6) straddled,
// multiples of 3 (its parity branch) and not.
inline const std::vector<int>& text_lengths() {
  static const std::vector<int> lengths = {1, 2, 3, 4, 5, 6, 7, 9, 11, 12};
  return lengths;
}

struct Spec {
  int in = 4;
  Input input = Input::Features;
  int stem = 0;  // Tokens: the embedding width; Sequences: the convolution's channels; Text: the width per token
  int text_form = 0;  // Text: TextStem's form (its bits: attention, mean pooling, heads, host floats, conv, chunk)
  std::vector<std::pair<Layer, int>> layers;  // (kind, width after it)
  bool offset = false;  // an offset built in the default dtype after the last layer
  bool cross_entropy = false;
  bool masked = false;  // the loss over the rows a boolean mask of the batch selects (in[3])
  Door door = Door::Compile;
  std::string backend = "eager";
  bool adam = false;
  std::string str() const;
};

// A random program.
Spec draw_spec(std::mt19937_64& rng);

// x + lin(act(x)): a residual block of a given width.
struct ResidualImpl : nn::Module {
  explicit ResidualImpl(int w) : lin(register_module("lin", nn::Linear(w, w))) {}
  at::Tensor forward(const at::Tensor& x) { return x + lin->forward(torch::tanh(x)); }
  nn::Linear lin;
};
TORCH_MODULE(Residual);

// In-place writes inside a forward (Note [In-place updates as kernels]): a chain on a
// temporary that requires grad, and a running average kept in a buffer, updated under
// no_grad and read after the update. At an odd width the running statistics are written
// through out= overloads instead (Note [Writes are not lowered]): the average by add_out,
// and a running maximum by maximum_out into the buffer it reads, as Adam's amsgrad keeps
// its maximum.
struct InPlaceImpl : nn::Module {
  explicit InPlaceImpl(int w)
      : avg(register_buffer("avg", torch::zeros({w}))), peak(register_buffer("peak", torch::zeros({w}))),
        out_overloads(w % 2 == 1) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x * 0.75;
    h.add_(x, 0.5).mul_(0.8);
    {
      torch::NoGradGuard no_grad;
      if (out_overloads) {
        at::add_out(avg, avg * 0.9, x.detach().mean(0), 0.1);
        at::maximum_out(peak, x.detach().abs().amax(0), peak);
      } else {
        avg.mul_(0.9).add_(x.detach().mean(0), 0.1);
      }
    }
    return out_overloads ? h + avg - peak * 0.125 : h + avg;
  }
  at::Tensor avg, peak;
  bool out_overloads;
};
TORCH_MODULE(InPlace);

// Host code that reads the batch size (Note [Checking a new size]): a branch on its parity,
// a branch on a threshold that the fuzzer's batch sizes straddle, and a float computed
// from it. None changes the output's shape, so the layers after it take any batch. Each
// scales by at most 1.5: with gains of 4 (a first version) two such layers at a batch of
// one made SGD's training explode on both sides within a few calls, where eager's
// float32 reached NaN and tcap's a huge finite value (seed 43, program 1802).
struct SizeBranchImpl : nn::Module {
  at::Tensor forward(const at::Tensor& x) {
    const int64_t n = x.size(0);
    at::Tensor y = x;
    if (n % 2 == 1) y = y * 0.5;
    if (n > 5) y = y - y.narrow(0, 0, 1) * 0.5;
    return y * (1.0 - 0.5 / static_cast<double>(n));
  }
};
TORCH_MODULE(SizeBranch);

// Host code and tensor arithmetic over a length that varies between calls (Note [Checking a
// new size], Note [Dynamic sizes]): the stem of a Text program, [batch, length, in] ->
// [batch, width]. A per-token Linear over flatten(0, 1) viewed back (a product of two
// sizes); causal self-attention (form bit 0) with its heads split off by reshape (two
// heads with bit 2 and an even width) and a mask built from the length; host branches on
// the length (the last six tokens kept above six, a scaling at multiples of three);
// positions from arange over the length; a pooling over the length, a mean (bit 1) or a
// maximum. With bit 3 the positions and the mean divide by the length read on the host (a
// float computed from a size, which keeps an entry static). Sizes the ops derive from the
// length (Note [Sizes the ops derive]): with bit 4 a Conv1d of stride 2 over the length
// (ceil(n / 2) tokens), with bit 5 the first half of chunk(2) (ceil of the length after).
struct TextStemImpl : nn::Module {
  TextStemImpl(int in, int width, int form)
      : proj(register_module("proj", nn::Linear(in, width))),
        qkv(register_module("qkv", nn::Linear(width, 3 * width))),
        conv(register_module("conv", nn::Conv1d(nn::Conv1dOptions(width, width, 3).stride(2).padding(1)))),
        width(width),
        form(form) {}
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0);
    int64_t n = x.size(1);
    at::Tensor h = proj->forward(x.flatten(0, 1)).view({b, n, width});
    if (form & 16) {
      h = torch::tanh(conv->forward(h.transpose(1, 2))).transpose(1, 2);
      n = h.size(1);
    }
    if (form & 32) {
      h = h.chunk(2, 1)[0] * 1.25;
      n = h.size(1);
    }
    if (form & 1) {
      const int64_t heads = (form & 4) && width % 2 == 0 ? 2 : 1, d = width / heads;
      auto parts = qkv->forward(h).chunk(3, -1);
      auto split = [&](const at::Tensor& t) { return t.reshape({b, n, heads, d}).transpose(1, 2); };
      at::Tensor scores = split(parts[0]).matmul(split(parts[1]).transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
      at::Tensor causal = torch::ones({n, n}, torch::kBool).triu(1);
      at::Tensor att = scores.masked_fill(causal, -1e9).softmax(-1).matmul(split(parts[2]));
      h = h + att.transpose(1, 2).reshape({b, n, width});
    }
    if (n > 6) h = h.narrow(1, n - 6, 6);
    if (n % 3 == 0) h = h * 0.75;
    const int64_t m = h.size(1);
    const bool host_float = form & 8;
    at::Tensor positions = torch::arange(m, h.options()) * (host_float ? 1.0 / static_cast<double>(m) : 0.125);
    h = h + positions.unsqueeze(-1) * 0.25;
    if (!(form & 2)) return std::get<0>(h.max(1));
    return host_float ? h.sum(1) / static_cast<double>(m) : h.mean(1);
  }
  nn::Linear proj, qkv;
  nn::Conv1d conv;
  int64_t width;
  int form;
};
TORCH_MODULE(TextStem);

// The model's stem for token ids and sequences.
struct StemImpl : nn::Module {
  StemImpl(const Spec& s) {
    if (s.input == Input::Tokens) emb = register_module("emb", nn::Embedding(kVocabulary, s.stem));
    if (s.input == Input::Sequences) conv = register_module("conv", nn::Conv1d(nn::Conv1dOptions(s.in, s.stem, 3).padding(1)));
  }
  at::Tensor forward(const at::Tensor& x) { return emb ? emb->forward(x) : conv->forward(x).flatten(1); }
  nn::Embedding emb{nullptr};
  nn::Conv1d conv{nullptr};
};
TORCH_MODULE(Stem);

// The model of a program. `held`: the side's tensors that Held layers read through their
// closures.
nn::Sequential build(const Spec& s, std::vector<at::Tensor>& held);

// --- one side of a program, compiled or eager ------------------------------------------

struct Side {
  nn::Sequential model;
  std::unique_ptr<torch::optim::Optimizer> opt;
  tcap::CompiledFn fn;                          // Door::Compile
  std::shared_ptr<tcap::CompiledStep> step;     // Door::Step
  std::unique_ptr<tcap::CompiledAutogradGuard> ca;  // Door::CompiledAutograd: the program's whole life
  std::vector<at::Tensor> held;                 // what the model's Held layers read
  int hooks = 0;
};

struct Result {
  std::string error;  // "" when the call returned
  Tensors outputs;
};

// How tensor a (tcap's) differs from b (eager's), "" when it does not: relative `rtol`, and
// `atol` scaled by eager's largest magnitude (at least `floor`, a gradient's: the model's
// largest).
std::string first_difference(const at::Tensor& a, const at::Tensor& b, double rtol, double atol, double floor = 1.0);

// --- changes between calls -------------------------------------------------------------

// What one call of a program changes first.
struct Call {
  int batch = 4;
  int length = 4;  // Text programs: the sequence length
  bool transposed = false;
  bool no_grad = false;
  bool inference = false;     // a call under InferenceMode
  bool accumulate = false;    // no zero_grad before this call's backward
  bool edit_input_before_backward = false;
  bool step_before_backward = false;
  bool double_default = false;  // the call runs with the default dtype double
  bool target_view = false;     // compile_step's target is a view of its input
  std::vector<std::string> what;
  // Applied to both sides, each given its model and optimizer.
  std::vector<std::function<void(Side&)>> edits;
};

template <class M>
std::vector<std::shared_ptr<M>> modules_of(nn::Sequential& seq) {
  std::vector<std::shared_ptr<M>> out;
  for (auto& m : seq->modules(/*include_self=*/false)) {
    if (auto p = std::dynamic_pointer_cast<M>(m)) out.push_back(p);
  }
  return out;
}

// Draws the changes before call `call` of a program from `rng` (the program's batch size,
// its length and whether deterministic algorithms are toggled are the program's, updated here).
struct ChangeDraw {
  std::mt19937_64& rng;
  const Spec& spec;
  int& batch;
  int& length;
  bool& toggle_deterministic;
  Call draw(int call);
  int pick(int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); }
};

}  // namespace divergence
