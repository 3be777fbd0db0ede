// tcap_fuzz_divergence: random programs, random state changes between their calls, each run
// compiled and on an eager twin, compared (docs/reliability.md, "The divergence fuzzer").
//
// A program is a model drawn from a grammar of LibTorch modules (Linear, activations,
// LayerNorm, BatchNorm1d, Dropout, residual blocks, scalings, a loss), a front door
// (tcap::compile of the model with an eager optimizer, compile_step with SGD or Adam,
// compiled autograd around an eager forward) and a backend (eager, llvm). It is called a
// number of times; before each call a few changes are drawn from what ordinary programs do
// between calls: another batch size, a non-contiguous input, train()/eval() of the model or
// of one module, a Dropout's p, a BatchNorm's momentum or eps, a LayerNorm's eps, a
// parameter edited in place, written through .data() or given other data (set_data), the
// learning rate, weight decay and momentum, a parameter frozen or unfrozen, deterministic
// algorithms, a call under NoGradGuard or InferenceMode, gradients accumulated over two
// calls, a gradient hook on a parameter, an input changed in place between the forward and
// the backward, an output kept across an optimizer step before its backward. The twin
// gets the same changes.
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

#include <ATen/Context.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
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

enum class Layer { Linear, Relu, Tanh, Gelu, Silu, Sigmoid, LayerNorm, BatchNorm, Dropout, Residual, Scale };

struct Spec {
  int in = 4;
  std::vector<std::pair<Layer, int>> layers;  // (kind, width after it)
  bool cross_entropy = false;
  Door door = Door::Compile;
  std::string backend = "eager";
  bool adam = false;
  std::string str() const {
    static const char* names[] = {"Linear", "ReLU",    "Tanh",    "GELU",     "SiLU", "Sigmoid",
                                  "LayerNorm", "BatchNorm1d", "Dropout", "Residual", "Scale"};
    std::ostringstream s;
    s << door_name(door) << "/" << backend << (door == Door::Step ? (adam ? "/Adam" : "/SGD") : "") << ": in " << in;
    for (const auto& [l, w] : layers) s << " -> " << names[static_cast<int>(l)] << "(" << w << ")";
    s << (cross_entropy ? " -> cross_entropy" : " -> mse");
    return s.str();
  }
};

Spec draw_spec(std::mt19937_64& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  Spec s;
  s.in = 2 + pick(7);
  int width = s.in;
  const int n = 2 + pick(5);
  for (int k = 0; k < n; ++k) {
    Layer l = static_cast<Layer>(pick(11));
    if (k == 0) l = Layer::Linear;
    // No BatchNorm right after a BatchNorm: the first's bias then gets a gradient that is
    // zero in exact arithmetic (the second removes the batch mean), and with a small batch
    // after a ReLU the cancelling terms are thousands of times its size, so fused kernels'
    // roundings differ there by far more than any tolerance, in eager as much.
    if (l == Layer::BatchNorm && !s.layers.empty() && s.layers.back().first == Layer::BatchNorm) l = Layer::Tanh;
    // Hidden widths of at least 3: a LayerNorm over one feature outputs its bias whatever
    // the input, over two it outputs +-1 (to within eps); either way the gradient through
    // it is zero in exact arithmetic, and what a backward computes there is rounding noise
    // amplified by 1/sqrt(eps), in eager too.
    if (l == Layer::Linear) width = 3 + pick(7);
    s.layers.push_back({l, width});
  }
  if (s.layers.back().first != Layer::Linear) s.layers.push_back({Layer::Linear, 1 + pick(5)});
  s.cross_entropy = s.layers.back().second > 1 && pick(2) == 0;
  s.door = static_cast<Door>(pick(3));
  s.backend = pick(2) ? "llvm" : "eager";
  // Adam divides by the root of the squared gradient: for a gradient that is zero in exact
  // arithmetic (a Linear's bias before a BatchNorm), rounding alone moves the parameter by
  // the learning rate. With fused kernels, whose roundings differ, that is not a
  // divergence of meaning (verify mode leaves those elements out, Note [Verify
  // tolerances]); the fuzzer runs Adam with the eager backend only.
  s.adam = s.backend == "eager" && pick(2) == 0;
  return s;
}

// x + lin(act(x)): a residual block of a given width.
struct ResidualImpl : nn::Module {
  explicit ResidualImpl(int w) : lin(register_module("lin", nn::Linear(w, w))) {}
  at::Tensor forward(const at::Tensor& x) { return x + lin->forward(torch::tanh(x)); }
  nn::Linear lin;
};
TORCH_MODULE(Residual);

nn::Sequential build(const Spec& s) {
  nn::Sequential seq;
  int width = s.in;
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
      case Layer::Dropout: seq->push_back(nn::Dropout(0.25)); break;
      case Layer::Residual: seq->push_back(Residual(width)); break;
      case Layer::Scale: seq->push_back(nn::Functional([](const at::Tensor& x) { return x * 1.5 - 0.25; })); break;
    }
    width = w;
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
  int hooks = 0;
};

struct Result {
  std::string error;  // "" when the call returned
  Tensors outputs;
};

std::string first_difference(const at::Tensor& a, const at::Tensor& b, double rtol, double atol) {
  if (a.defined() != b.defined()) return a.defined() ? "defined where eager's is not" : "undefined where eager's is defined";
  if (!a.defined()) return "";
  if (a.sizes() != b.sizes()) {
    std::ostringstream s;
    s << "shape " << a.sizes() << " where eager's is " << b.sizes();
    return s.str();
  }
  if (a.scalar_type() != b.scalar_type()) return "another dtype";
  auto x = a.detach().to(at::kDouble), y = b.detach().to(at::kDouble);
  // atol scales with the tensor's magnitude, as verify mode's does (Note [Verify tolerances]).
  const double scale = y.numel() ? std::max(1.0, y.abs().max().item<double>()) : 1.0;
  if (!at::allclose(x, y, rtol, atol * scale, /*equal_nan=*/true)) {
    std::ostringstream s;
    s << "max difference " << (x - y).abs().max().item<double>() << " (eager's largest magnitude " << scale << ")";
    return s.str();
  }
  return "";
}

class Program {
 public:
  Program(uint64_t seed, int calls) : rng_(seed), seed_(seed), calls_(calls) {
    spec_ = draw_spec(rng_);
    torch::manual_seed(static_cast<int64_t>(seed));
    compiled_.model = build(spec_);
    eager_.model = build(spec_);
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
      const int kind = pick(20);
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
          c.what.push_back("LayerNorm and BatchNorm eps = " + std::to_string(eps));
          c.edits.push_back([this, eps](Side& s) {
            for (auto& l : modules_of<nn::LayerNormImpl>(s.model)) l->options.eps(eps);
            for (auto& b : modules_of<nn::BatchNorm1dImpl>(s.model)) b->options.eps(eps);
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
          if (spec_.door != Door::Compile) break;
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

  tcap::CompiledFunction::Fn body(Side& s) {
    auto m = s.model;
    auto* opt = s.opt.get();
    const bool ce = spec_.cross_entropy;
    return [m, opt, ce](const Tensors& in) mutable {
      opt->zero_grad();
      auto out = m->forward(in[0]);
      auto loss = ce ? torch::nn::functional::cross_entropy(out, in[2]) : torch::mse_loss(out, in[1]);
      loss.backward();
      opt->step();
      return Tensors{loss, out.detach()};
    };
  }

  // One side's call: the loss and outputs, or the error it raised.
  Result call_side(Side& s, bool compiled, const Call& c, const Tensors& in, int64_t seed) {
    Result r;
    torch::manual_seed(seed);
    try {
      std::optional<torch::NoGradGuard> no_grad;
      if (c.no_grad) no_grad.emplace();
      std::optional<c10::InferenceMode> inference;
      if (c.inference) inference.emplace();
      auto forward = [&](const at::Tensor& x) {
        if (compiled && spec_.door == Door::Compile) return s.fn(std::vector<at::Tensor>{x})[0];
        return s.model->forward(x);
      };
      auto loss_of = [&](const at::Tensor& out) {
        return spec_.cross_entropy ? torch::nn::functional::cross_entropy(out, in[2]) : torch::mse_loss(out, in[1]);
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
      auto loss = loss_of(out);
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
    at::Tensor x = c.transposed ? torch::randn({width, c.batch}).t() : torch::randn({c.batch, width});
    Tensors in = {x, torch::randn({c.batch, out_width}), torch::randint(0, out_width, {c.batch}, torch::kLong)};
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
    if (got.outputs.size() != want.outputs.size()) return "another number of outputs";
    for (size_t k = 0; k < got.outputs.size(); ++k) {
      std::string d = first_difference(got.outputs[k], want.outputs[k], rtol, atol);
      if (!d.empty()) return "output " + std::to_string(k) + ": " + d;
    }
    auto a = compiled_.model->named_parameters(), b = eager_.model->named_parameters();
    for (size_t k = 0; k < a.size(); ++k) {
      std::string d = first_difference(a[k].value(), b[k].value(), rtol, atol);
      if (!d.empty()) return "parameter " + a[k].key() + ": " + d;
      d = first_difference(a[k].value().grad(), b[k].value().grad(), rtol, atol);
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

  std::mt19937_64 rng_;
  uint64_t seed_;
  int calls_;
  Spec spec_;
  Side compiled_, eager_;
  bool toggle_deterministic_ = false;
  int batch_ = 4;  // the program's batch size, until a change draws another
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
