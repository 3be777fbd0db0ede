// tcap_fuzz_divergence: random programs, random state changes between their calls, each run
// compiled and on an eager twin, compared (docs/reliability.md, "The divergence fuzzer").
//
// A program is a model drawn from a grammar of LibTorch modules (a stem: Linear on
// features, Embedding on token ids or Conv1d on sequences; then Linear, activations,
// LayerNorm, BatchNorm1d, GroupNorm, Dropout, residual blocks, scalings, in-place updates
// of a temporary and of a running-average buffer, host code that branches on the batch
// size, single-head
// MultiheadAttention over the batch, a tensor the model holds through a closure, a loss,
// and sometimes an offset built in the default dtype at the end), a front door
// (tcap::compile of the model with an eager optimizer, compile_step with SGD or Adam,
// compiled autograd around an eager forward) and a backend (eager, llvm). It is called a
// number of times; before each call a few changes are drawn from what ordinary programs do
// between calls: another batch size, a non-contiguous input, train()/eval() of the model or
// of one module, a Dropout's p, a BatchNorm's momentum or eps, a LayerNorm's eps, a
// parameter edited in place, written through .data() or given other data (set_data), the
// learning rate, weight decay and momentum, a parameter frozen or unfrozen, deterministic
// algorithms, a call under NoGradGuard or InferenceMode, gradients accumulated over two
// calls, a gradient hook on a parameter, an input changed in place between the forward and
// the backward, an output kept across an optimizer step before its backward, a call with
// the default dtype double, a residual block's Linear replaced by a new module, the
// optimizer's parameter list reordered, the held tensor edited in place, an Embedding's
// padding_idx or max_norm, a Conv1d's padding mode, a step's target that is a view of its
// input. The twin gets the same changes.
// After each call the outputs, every parameter, its .grad and every buffer are compared
// (the eager backend within 1e-5 relative, llvm within 2e-3; atol scaled by magnitude);
// where one side raises, the other must raise too. Every difference is a divergence: the
// run prints the seed, the program and the changes that led to it, and exits with 1.
//
//   tcap_fuzz_divergence [-programs=N] [-calls=C] [-seed=S] [-only=K]
//
// -only=K runs program K of the seed alone (to reproduce a divergence).
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include "support/models.h"

#include <ATen/Context.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace nn = torch::nn;
using Tensors = std::vector<at::Tensor>;

// --- programs -------------------------------------------------------------------------

enum class Door { Compile, Step, CompiledAutograd };
const char* door_name(Door d) {
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

// A GroupNorm's groups over `width` features: the most with at least two features each (a
// group of one feature outputs its bias whatever the input: see the LayerNorm note below).
int groups_of(int width) {
  for (int g = width / 2; g > 1; --g) {
    if (width % g == 0) return g;
  }
  return 1;
}

// What the model takes: features [batch, in], token ids [batch] (an Embedding stem), or
// sequences [batch, in, kLength] (a Conv1d stem, flattened).
enum class Input { Features, Tokens, Sequences };
constexpr int kVocabulary = 12;
constexpr int kLength = 5;

struct Spec {
  int in = 4;
  Input input = Input::Features;
  int stem = 0;  // Tokens: the embedding width; Sequences: the convolution's channels
  std::vector<std::pair<Layer, int>> layers;  // (kind, width after it)
  bool offset = false;  // an offset built in the default dtype after the last layer
  bool cross_entropy = false;
  bool masked = false;  // the loss over the rows a boolean mask of the batch selects (in[3])
  Door door = Door::Compile;
  std::string backend = "eager";
  bool adam = false;
  std::string str() const {
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
    }
    for (const auto& [l, w] : layers) s << " -> " << names[static_cast<int>(l)] << "(" << w << ")";
    if (offset) s << " -> offset in the default dtype";
    s << (cross_entropy ? " -> cross_entropy" : " -> mse") << (masked ? " over a boolean mask of the batch" : "");
    return s.str();
  }
};

Spec draw_spec(std::mt19937_64& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  Spec s;
  s.in = 2 + pick(7);
  s.input = static_cast<Input>(pick(5) < 3 ? 0 : pick(2) + 1);
  int width = s.in;
  if (s.input == Input::Tokens) width = s.stem = 3 + pick(6);
  if (s.input == Input::Sequences) {
    s.in = 2 + pick(3);
    s.stem = 2 + pick(3);
    width = s.stem * kLength;
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

// x + lin(act(x)): a residual block of a given width.
struct ResidualImpl : nn::Module {
  explicit ResidualImpl(int w) : lin(register_module("lin", nn::Linear(w, w))) {}
  at::Tensor forward(const at::Tensor& x) { return x + lin->forward(torch::tanh(x)); }
  nn::Linear lin;
};
TORCH_MODULE(Residual);


// In-place writes inside a forward (Note [In-place updates as kernels]): a chain on a
// temporary that requires grad, and a running average kept in a buffer, updated under
// no_grad and read after the update.
struct InPlaceImpl : nn::Module {
  explicit InPlaceImpl(int w) : avg(register_buffer("avg", torch::zeros({w}))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x * 0.75;
    h.add_(x, 0.5).mul_(0.8);
    {
      torch::NoGradGuard no_grad;
      avg.mul_(0.9).add_(x.detach().mean(0), 0.1);
    }
    return h + avg;
  }
  at::Tensor avg;
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

// `held`: the side's tensors that Held layers read through their closures.
nn::Sequential build(const Spec& s, std::vector<at::Tensor>& held) {
  nn::Sequential seq;
  int width = s.input == Input::Features ? s.in : s.input == Input::Tokens ? s.stem : s.stem * kLength;
  if (s.input != Input::Features) seq->push_back(Stem(s));
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

// --- one program, compiled and eager ---------------------------------------------------

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

// `floor`: the magnitude atol scales with at least (a gradient's: the model's largest).
std::string first_difference(const at::Tensor& a, const at::Tensor& b, double rtol, double atol, double floor = 1.0) {
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

class Program {
 public:
  Program(uint64_t seed, int calls) : rng_(seed), seed_(seed), calls_(calls) {
    spec_ = draw_spec(rng_);
    torch::manual_seed(static_cast<int64_t>(seed));
    compiled_.model = build(spec_, compiled_.held);
    eager_.model = build(spec_, eager_.held);
    {
      torch::NoGradGuard no_grad;
      auto a = compiled_.model->parameters(), b = eager_.model->parameters();
      for (size_t k = 0; k < a.size(); ++k) b[k].copy_(a[k]);
    }
    for (Side* s : {&compiled_, &eager_}) {
      if (spec_.door == Door::Step && spec_.adam) {
        s->opt = std::make_unique<torch::optim::Adam>(s->model->parameters(), torch::optim::AdamOptions(0.01));
      } else {
        s->opt = std::make_unique<torch::optim::SGD>(s->model->parameters(), torch::optim::SGDOptions(0.05));
      }
    }
    tcap::CompileOptions o;
    o.backend = spec_.backend;
    o.name = "fuzz_" + std::to_string(seed);  // compiled autograd keeps its entries per options
    if (spec_.door == Door::Compile) {
      auto m = compiled_.model.ptr();
      compiled_.fn = tcap::compile(m, [m](const Tensors& in) { return Tensors{m->forward(in[0])}; }, o);
    } else if (spec_.door == Door::Step) {
      compiled_.step = tcap::compile_step(compiled_.model.ptr(), *compiled_.opt, body(compiled_), o);
    } else {
      compiled_.ca = std::make_unique<tcap::CompiledAutogradGuard>(o);
    }
  }

  // Calls a compiled entry served.
  int replays() const {
    if (compiled_.fn) return compiled_.fn->stats().replays;
    if (compiled_.step) return compiled_.step->stats().replays;
    return compiled_.ca ? compiled_.ca->stats().replays : 0;
  }

  // "" when every call agreed, else the divergence.
  std::string run(std::map<std::string, int>& changes_run) {
    for (int call = 0; call < calls_; ++call) {
      Call c = draw_call(call);
      for (const auto& w : c.what) ++changes_run[w];
      apply_changes(c);
      std::string why = one_call(c);
      if (!why.empty()) {
        std::ostringstream s;
        s << "seed " << seed_ << ", " << spec_.str() << "\n  call " << call << " [";
        for (size_t k = 0; k < c.what.size(); ++k) s << (k ? ", " : "") << c.what[k];
        s << "]: " << why << "\n  history:";
        for (const auto& h : history_) s << "\n    " << h;
        return s.str();
      }
      std::ostringstream h;
      h << "call " << call << ": batch " << c.batch;
      for (const auto& w : c.what) h << ", " << w;
      history_.push_back(h.str());
    }
    return "";
  }

  const Spec& spec() const { return spec_; }

 private:
  struct Call {
    int batch = 4;
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

  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }

  template <class M>
  std::vector<std::shared_ptr<M>> modules_of(nn::Sequential& seq) {
    std::vector<std::shared_ptr<M>> out;
    for (auto& m : seq->modules(/*include_self=*/false)) {
      if (auto p = std::dynamic_pointer_cast<M>(m)) out.push_back(p);
    }
    return out;
  }

  Call draw_call(int call) {
    Call c;
    c.batch = batch_;
    if (call < 3) return c;  // the first calls capture and compile
    const int n = pick(3);
    for (int k = 0; k < n; ++k) {
      const int kind = pick(28);
      const size_t which = rng_();
      switch (kind) {
        case 0:
          c.transposed = true;
          c.what.push_back("non-contiguous input");
          break;
        case 1: {
          const bool train = pick(2) == 0;
          c.what.push_back(train ? "model.train()" : "model.eval()");
          c.edits.push_back([train](Side& s) { s.model->train(train); });
          break;
        }
        case 2: {
          c.what.push_back("one module's train flag flipped");
          c.edits.push_back([which](Side& s) {
            auto mods = s.model->modules(false);
            auto& m = mods[which % mods.size()];
            m->train(!m->is_training());
          });
          break;
        }
        case 3: {
          const double p = std::vector<double>{0.0, 0.1, 0.5}[which % 3];
          c.what.push_back("Dropout p = " + std::to_string(p));
          c.edits.push_back([this, p](Side& s) {
            for (auto& d : modules_of<nn::DropoutImpl>(s.model)) d->options.p(p);
          });
          break;
        }
        case 4: {
          const double m = std::vector<double>{0.05, 0.3, 0.9}[which % 3];
          c.what.push_back("BatchNorm momentum = " + std::to_string(m));
          c.edits.push_back([this, m](Side& s) {
            for (auto& b : modules_of<nn::BatchNorm1dImpl>(s.model)) b->options.momentum(m);
          });
          break;
        }
        case 5: {
          const double eps = std::vector<double>{1e-5, 1e-2, 0.5}[which % 3];
          c.what.push_back("LayerNorm, BatchNorm and GroupNorm eps = " + std::to_string(eps));
          c.edits.push_back([this, eps](Side& s) {
            for (auto& l : modules_of<nn::LayerNormImpl>(s.model)) l->options.eps(eps);
            for (auto& b : modules_of<nn::BatchNorm1dImpl>(s.model)) b->options.eps(eps);
            for (auto& g : modules_of<nn::GroupNormImpl>(s.model)) g->options.eps(eps);
          });
          break;
        }
        case 6:
          c.what.push_back("a parameter scaled in place");
          c.edits.push_back([which](Side& s) {
            auto ps = s.model->parameters();
            torch::NoGradGuard no_grad;
            ps[which % ps.size()].mul_(0.9);
          });
          break;
        case 7:
          c.what.push_back("a parameter written through .data()");
          c.edits.push_back([which](Side& s) {
            auto ps = s.model->parameters();
            ps[which % ps.size()].data().add_(0.05);
          });
          break;
        case 8:
          c.what.push_back("a Linear's weight given other data (set_data)");
          c.edits.push_back([this, which](Side& s) {
            auto lins = modules_of<nn::LinearImpl>(s.model);
            auto& l = lins[which % lins.size()];
            torch::NoGradGuard no_grad;
            l->weight.set_data(l->weight.detach().clone().mul_(1.1));
          });
          break;
        case 9: {
          const double lr = std::vector<double>{0.01, 0.1, 0.002}[which % 3];
          c.what.push_back("learning rate = " + std::to_string(lr));
          c.edits.push_back([lr](Side& s) { s.opt->param_groups()[0].options().set_lr(lr); });
          break;
        }
        case 10:
          c.what.push_back("deterministic algorithms toggled");
          toggle_deterministic_ = !toggle_deterministic_;
          break;
        case 11:
          c.no_grad = true;
          c.what.push_back("a call under NoGradGuard");
          break;
        case 12:
          c.what.push_back("a gradient hook on a parameter");
          c.edits.push_back([which](Side& s) {
            if (s.hooks >= 2) return;
            ++s.hooks;
            auto ps = s.model->parameters();
            auto& p = ps[which % ps.size()];
            if (p.requires_grad()) p.register_hook([](const at::Tensor& g) { return g * 2; });
          });
          break;
        case 13:
          if (spec_.door != Door::Compile || spec_.input == Input::Tokens) break;
          c.edit_input_before_backward = true;
          c.what.push_back("the input changed in place between forward and backward");
          break;
        case 14:
          if (spec_.door != Door::Compile) break;
          c.step_before_backward = true;
          c.what.push_back("an optimizer step between forward and backward");
          break;
        case 16:
          c.what.push_back("a parameter frozen or unfrozen (requires_grad_)");
          c.edits.push_back([which](Side& s) {
            auto ps = s.model->parameters();
            auto& p = ps[which % ps.size()];
            p.requires_grad_(!p.requires_grad());
          });
          break;
        case 17: {
          const double wd = std::vector<double>{0.0, 0.01, 0.1}[which % 3];
          c.what.push_back("weight decay (and SGD momentum) = " + std::to_string(wd));
          c.edits.push_back([wd](Side& s) {
            auto& o = s.opt->param_groups()[0].options();
            if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&o)) sgd->weight_decay(wd).momentum(wd * 5);
            if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&o)) adam->weight_decay(wd);
          });
          break;
        }
        case 18:
          if (spec_.door == Door::Step) break;  // the step's own body zeroes the gradients
          c.accumulate = true;
          c.what.push_back("gradients accumulated over two calls (no zero_grad)");
          break;
        case 19:
          c.inference = true;
          c.what.push_back("a call under InferenceMode");
          break;
        case 20:
          c.double_default = true;
          c.what.push_back("a call with the default dtype double");
          break;
        case 21:
          c.what.push_back("a residual block's Linear replaced by a new module");
          c.edits.push_back([this, which](Side& s) {
            auto rs = modules_of<ResidualImpl>(s.model);
            if (rs.empty()) return;
            auto& r = rs[which % rs.size()];
            const int64_t w = r->lin->options.in_features();
            torch::manual_seed(static_cast<int64_t>(which % 100000));  // the same new weights on both sides
            r->lin = r->replace_module("lin", nn::Linear(w, w));
          });
          break;
        case 22:
          c.what.push_back("the optimizer's parameter list reordered");
          c.edits.push_back([](Side& s) {
            auto& ps = s.opt->param_groups()[0].params();
            std::reverse(ps.begin(), ps.end());
          });
          break;
        case 23:
          c.what.push_back("the tensor a Held layer reads edited in place");
          c.edits.push_back([](Side& s) {
            torch::NoGradGuard no_grad;
            for (auto& t : s.held) t.mul_(0.9).add_(0.05);
          });
          break;
        case 24: {
          const std::optional<int64_t> idx = std::vector<std::optional<int64_t>>{std::nullopt, 0, 3}[which % 3];
          c.what.push_back("Embedding padding_idx = " + (idx ? std::to_string(*idx) : std::string("none")));
          c.edits.push_back([this, idx](Side& s) {
            for (auto& e : modules_of<nn::EmbeddingImpl>(s.model)) e->options.padding_idx(idx);
          });
          break;
        }
        case 25: {
          const std::optional<double> norm = std::vector<std::optional<double>>{std::nullopt, 1.0, 0.5}[which % 3];
          c.what.push_back("Embedding max_norm = " + (norm ? std::to_string(*norm) : std::string("none")));
          c.edits.push_back([this, norm](Side& s) {
            for (auto& e : modules_of<nn::EmbeddingImpl>(s.model)) e->options.max_norm(norm);
          });
          break;
        }
        case 26: {
          const int mode = static_cast<int>(which % 4);
          static const char* modes[] = {"zeros", "reflect", "replicate", "circular"};
          c.what.push_back(std::string("Conv1d padding mode = ") + modes[mode]);
          c.edits.push_back([this, mode](Side& s) {
            for (auto& conv : modules_of<nn::Conv1dImpl>(s.model)) {
              switch (mode) {
                case 0: conv->options.padding_mode(torch::kZeros); break;
                case 1: conv->options.padding_mode(torch::kReflect); break;
                case 2: conv->options.padding_mode(torch::kReplicate); break;
                default: conv->options.padding_mode(torch::kCircular); break;
              }
            }
          });
          break;
        }
        case 27:
          if (spec_.door != Door::Step || spec_.input != Input::Features || spec_.cross_entropy ||
              spec_.in < spec_.layers.back().second) {
            break;
          }
          c.target_view = true;
          c.what.push_back("the step's target a view of its input");
          break;
        default:
          c.what.push_back("another batch size");
          batch_ = std::vector<int>{1, 2, 3, 5, 6, 8, 9}[which % 7];
          c.batch = batch_;
          break;
      }
    }
    return c;
  }

  void apply_changes(const Call& c) {
    for (const auto& e : c.edits) {
      e(compiled_);
      e(eager_);
    }
    at::globalContext().setDeterministicAlgorithms(toggle_deterministic_, /*warn_only=*/true);
  }

  // The loss of the model's output: mse against in[1] or cross_entropy against in[2], over
  // the rows mask in[3] selects when the program is masked (a size that comes from values).
  static at::Tensor loss_of(const Spec& spec, const at::Tensor& out, const Tensors& in) {
    auto rows = [&](const at::Tensor& t) { return spec.masked ? t.index({in[3]}) : t; };
    return spec.cross_entropy ? torch::nn::functional::cross_entropy(rows(out), rows(in[2]))
                              : torch::mse_loss(rows(out), rows(in[1]));
  }

  tcap::CompiledFunction::Fn body(Side& s) {
    auto m = s.model;
    auto* opt = s.opt.get();
    const Spec spec = spec_;
    return [m, opt, spec](const Tensors& in) mutable {
      opt->zero_grad();
      auto out = m->forward(in[0]);
      auto loss = loss_of(spec, out, in);
      loss.backward();
      opt->step();
      return Tensors{loss, out.detach()};
    };
  }

  // One side's call: the loss and outputs, or the error it raised.
  Result call_side(Side& s, bool compiled, const Call& c, const Tensors& in, int64_t seed) {
    Result r;
    torch::manual_seed(seed);
    struct DefaultDtype {
      explicit DefaultDtype(bool dbl) : on(dbl) {
        if (on) torch::set_default_dtype(caffe2::TypeMeta::Make<double>());
      }
      ~DefaultDtype() {
        if (on) torch::set_default_dtype(caffe2::TypeMeta::Make<float>());
      }
      bool on;
    } default_dtype(c.double_default);
    try {
      std::optional<torch::NoGradGuard> no_grad;
      if (c.no_grad) no_grad.emplace();
      std::optional<c10::InferenceMode> inference;
      if (c.inference) inference.emplace();
      auto forward = [&](const at::Tensor& x) {
        if (compiled && spec_.door == Door::Compile) return s.fn(std::vector<at::Tensor>{x})[0];
        return s.model->forward(x);
      };
      if (c.no_grad || c.inference) {
        r.outputs = {forward(in[0]).clone()};
        return r;
      }
      if (spec_.door == Door::Step) {
        if (compiled) r.outputs = (*s.step)(in);
        else r.outputs = body(s)(in);
        return r;
      }
      if (!c.accumulate) s.opt->zero_grad();
      at::Tensor x = in[0];
      if (c.edit_input_before_backward) x = in[0].clone();
      auto out = forward(x);
      auto loss = loss_of(spec_, out, in);
      if (c.edit_input_before_backward) {
        torch::NoGradGuard ng;
        x.mul_(1.5);
      }
      if (c.step_before_backward) {
        torch::NoGradGuard ng;
        for (auto& p : s.model->parameters()) p.data().add_(0.01);
      }
      loss.backward();  // compiled autograd's guard, where there is one, is on for the compiled side only
      s.opt->step();
      r.outputs = {loss.detach(), out.detach()};
    } catch (const std::exception& e) {
      r.error = e.what();
      const size_t nl = r.error.find('\n');
      if (nl != std::string::npos) r.error.resize(nl);
    }
    return r;
  }

  std::string one_call(const Call& c) {
    const int64_t width = spec_.in;
    const int out_width = spec_.layers.back().second;
    at::Tensor x;
    switch (spec_.input) {
      case Input::Features:
        x = c.transposed ? torch::randn({width, c.batch}).t() : torch::randn({c.batch, width});
        break;
      case Input::Tokens:
        x = c.transposed ? torch::randint(0, kVocabulary, {2 * c.batch}, torch::kLong).slice(0, 0, 2 * c.batch, 2)
                         : torch::randint(0, kVocabulary, {c.batch}, torch::kLong);
        break;
      case Input::Sequences:
        x = c.transposed ? torch::randn({c.batch, kLength, width}).transpose(1, 2) : torch::randn({c.batch, width, kLength});
        break;
    }
    at::Tensor target = c.target_view ? x.narrow(1, 0, out_width) : torch::randn({c.batch, out_width});
    Tensors in = {x, target, torch::randint(0, out_width, {c.batch}, torch::kLong)};
    if (spec_.masked) in.push_back(next_mask(c.batch));
    const int64_t seed = static_cast<int64_t>(rng_() % 1000000);
    Result got = call_side(compiled_, true, c, in, seed);
    Result want;
    {
      tcap::StanceGuard eager(tcap::Stance::ForceEager);  // compiled autograd's guard too
      want = call_side(eager_, false, c, in, seed);
    }
    if (got.error.empty() != want.error.empty()) {
      return got.error.empty() ? "eager raised, tcap did not: " + want.error : "tcap raised, eager did not: " + got.error;
    }
    if (!got.error.empty()) {
      // Both raised. A backward stopped by an error leaves .grad as far as it came: the
      // engine has accumulated the leaves it reached first, a compiled backward (one node)
      // none. That order is not part of eager's contract; both sides start again from no
      // gradients.
      compiled_.model->zero_grad(/*set_to_none=*/true);
      eager_.model->zero_grad(/*set_to_none=*/true);
      return "";
    }
    // The eager backend runs ATen's kernels: 1e-5 (the order of a few float32 roundings).
    // llvm's fused kernels round differently, and a LayerNorm over two elements with a
    // small eps, or a few SGD steps, amplifies that: 2e-3. A divergence of meaning is far
    // larger (a stale weight, a skipped hook, a missed option).
    const bool exact = spec_.backend == "eager";
    const double rtol = exact ? 1e-5 : 2e-3, atol = exact ? 1e-6 : 2e-4;
    // Gradients with llvm: 1e-3. Some are ill-conditioned in float32 itself: a bias before
    // attention, a residual, ReLU, GELU and a BatchNorm over a batch of 4 gets a gradient
    // of 5e-3 that eager's float32 computes 2.7e-4 away from float64, and llvm about as far
    // on the other side. A divergence of meaning (a stale weight, a hook skipped or doubled)
    // moves gradients by far more.
    const double grad_atol = exact ? atol : 1e-3;
    if (got.outputs.size() != want.outputs.size()) return "another number of outputs";
    for (size_t k = 0; k < got.outputs.size(); ++k) {
      std::string d = first_difference(got.outputs[k], want.outputs[k], rtol, atol);
      if (!d.empty()) return "output " + std::to_string(k) + ": " + d;
    }
    auto a = compiled_.model->named_parameters(), b = eager_.model->named_parameters();
    // Gradients are compared against the scale of the model's largest: a gradient that is
    // zero in exact arithmetic (terms that cancel: a bias before a BatchNorm) is rounding
    // noise of the size of the terms, which other gradients show, not of its own.
    double grad_floor = 1.0;
    for (size_t k = 0; k < b.size(); ++k) {
      const at::Tensor& g = b[k].value().grad();
      if (g.defined() && g.numel() && !g.is_sparse()) {
        grad_floor = std::max(grad_floor, g.detach().abs().max().nan_to_num(0, 0, 0).item<double>());
      }
    }
    for (size_t k = 0; k < a.size(); ++k) {
      std::string d = first_difference(a[k].value(), b[k].value(), rtol, atol);
      if (!d.empty()) return "parameter " + a[k].key() + ": " + d;
      d = first_difference(a[k].value().grad(), b[k].value().grad(), rtol, grad_atol, grad_floor);
      if (!d.empty()) return "the .grad of " + a[k].key() + ": " + d;
    }
    auto ba = compiled_.model->named_buffers(), bb = eager_.model->named_buffers();
    for (size_t k = 0; k < ba.size(); ++k) {
      std::string d = first_difference(ba[k].value(), bb[k].value(), rtol, atol);
      if (!d.empty()) return "buffer " + ba[k].key() + ": " + d;
    }
    if (!exact) {
      // Each call starts from eager's weights: fused kernels round differently, and over
      // many SGD steps (a LayerNorm after a ReLU that zeroed a row amplifies a rounding by
      // 1/sqrt(eps)) the two would drift apart without a difference of meaning. A wrong
      // update still shows, at the call that makes it.
      torch::NoGradGuard no_grad;
      for (size_t k = 0; k < a.size(); ++k) a[k].value().copy_(b[k].value());
      for (size_t k = 0; k < ba.size(); ++k) ba[k].value().copy_(bb[k].value());
    }
    return "";
  }

  // A mask of the batch with at least one row: the last one again (a GNN's train mask),
  // another with as many rows, or one with another count.
  at::Tensor next_mask(int64_t batch) {
    const int how = pick(5);
    if (mask_.defined() && mask_.size(0) == batch && how < 3) return mask_;
    int64_t count = mask_.defined() && mask_.size(0) == batch && how == 3 ? mask_.sum().item<int64_t>()
                                                                          : 1 + pick(static_cast<int>(batch));
    std::vector<int64_t> rows(static_cast<size_t>(batch));
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng_);
    mask_ = torch::zeros({batch}, torch::kBool);
    for (int64_t k = 0; k < count; ++k) mask_[rows[static_cast<size_t>(k)]] = true;
    return mask_;
  }

  std::mt19937_64 rng_;
  uint64_t seed_;
  int calls_;
  Spec spec_;
  Side compiled_, eager_;
  bool toggle_deterministic_ = false;
  int batch_ = 4;  // the program's batch size, until a change draws another
  at::Tensor mask_;  // the last mask of a masked program
  std::vector<std::string> history_;
};

long arg(int argc, char** argv, const std::string& name, long def) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("-" + name + "=", 0) == 0) return std::atol(a.c_str() + name.size() + 2);
  }
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  const long programs = arg(argc, argv, "programs", 40);
  const long calls = arg(argc, argv, "calls", 10);
  const long seed = arg(argc, argv, "seed", 1);
  const long only = arg(argc, argv, "only", -1);
  // The fuzzer runs every front door where a fallback is allowed (a program may do what
  // tcap runs eagerly, with its reason): what it checks is eager's answer.
  tcap::set_error_on_fallback(false);
  std::map<std::string, int> changes;
  std::map<std::string, int> doors;
  long run = 0, calls_run = 0, replays = 0;
  const auto start = std::chrono::steady_clock::now();
  for (long p = 0; p < std::max(programs, only + 1); ++p) {
    if (only >= 0 && p != only) continue;
    const uint64_t s = static_cast<uint64_t>(seed) * 1000003ULL + static_cast<uint64_t>(p);
    Program prog(s, static_cast<int>(calls));
    ++doors[std::string(door_name(prog.spec().door)) + "/" + prog.spec().backend];
    if (prog.spec().masked) ++doors["(of them: a loss over a boolean mask)"];
    std::string why = prog.run(changes);
    const int replayed = prog.replays();
    replays += replayed;
    if (std::getenv("TCAP_FUZZ_VERBOSE")) {
      std::printf("program %ld: %s: %d of %ld calls replayed\n", p, prog.spec().str().c_str(), replayed, calls);
    }
    at::globalContext().setDeterministicAlgorithms(false, false);
    ++run;
    calls_run += calls;
    if (!why.empty()) {
      std::printf("DIVERGENCE in program %ld (reproduce: tcap_fuzz_divergence -seed=%ld -calls=%ld -only=%ld):\n%s\n", p,
                  seed, calls, p, why.c_str());
      return 1;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  long changes_total = 0;
  for (const auto& [k, n] : changes) changes_total += n;
  std::printf("tcap_fuzz_divergence: %ld programs, %ld calls, %ld state changes, no divergence (%.1f s, seed %ld); "
              "%ld of the calls were served by a compiled entry\n",
              run, calls_run, changes_total, s, seed, replays);
  for (const auto& [k, n] : doors) std::printf("  %-28s %d programs\n", k.c_str(), n);
  for (const auto& [k, n] : changes) std::printf("  %-56s %d\n", k.c_str(), n);
  return 0;
}
