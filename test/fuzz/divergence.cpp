// tcap_fuzz_divergence: random programs, random state changes between their calls, each run
// compiled and on an eager twin, compared (docs/reliability.md, "The divergence fuzzer").
//
// A program is a model drawn from a grammar of LibTorch modules (a stem: Linear on
// features, Embedding on token ids, Conv1d on sequences, or a text stem over sequences of
// varying length: per-token Linear, causal attention, host branches on the length, pooling
// over it; then Linear, activations,
// LayerNorm, BatchNorm1d, GroupNorm, Dropout, residual blocks, scalings, in-place updates
// of a temporary and of a running-average buffer, host code that branches on the batch
// size, single-head
// MultiheadAttention over the batch, a tensor the model holds through a closure, a loss,
// and sometimes an offset built in the default dtype at the end), a front door
// (tcap::compile of the model with an eager optimizer, compile_step with SGD or Adam,
// compiled autograd around an eager forward) and a backend (eager, llvm). It is called a
// number of times; before each call a few changes are drawn from what ordinary programs do
// between calls: another batch size, another sequence length, a non-contiguous input, train()/eval() of the model or
// of one module, a Dropout's p or inplace, a BatchNorm's momentum (or none), eps or
// track_running_stats, a LayerNorm's eps, a GroupNorm's groups, a parameter edited in place, written through .data() or given other data (set_data), the
// learning rate, weight decay and momentum, a parameter frozen or unfrozen, deterministic
// algorithms, a call under NoGradGuard or InferenceMode, gradients accumulated over two
// calls, a gradient hook on a parameter, an input changed in place between the forward and
// the backward, an output kept across an optimizer step before its backward, a call with
// the default dtype double, a residual block's Linear replaced by a new module, the
// optimizer's parameter list reordered, the held tensor edited in place, an Embedding's
// padding_idx, max_norm or scale_grad_by_freq, a Conv1d's padding mode, a step's target that is a view of its
// input. The twin gets the same changes.
// After each call the outputs, every parameter, its .grad and every buffer are compared
// (the eager backend within 1e-5 relative, llvm within 2e-3; atol scaled by magnitude);
// where one side raises, the other must raise too. Every difference is a divergence: the
// run prints the seed, the program and the changes that led to it, and exits with 1.
//
//   tcap_fuzz_divergence [-programs=N] [-calls=C] [-seed=S] [-only=K] [-from=K] [-backend=eager] [-float64] [-inject=F]
//
// -only=K runs program K of the seed alone (to reproduce a divergence); -from=K starts the
// run at program K (to go on after one). -backend=eager compiles every program with the
// eager backend, whatever was drawn (the program and its changes stay the same): a
// divergence with llvm that the eager backend does not show is in the kernels' arithmetic,
// not in what the graph means. (There is no -backend=llvm: the grammar draws the layers
// after the backend, keeping from llvm what its rounding makes ill-posed, such as Adam and
// a BatchNorm after affine layers; an eager-drawn program under llvm would be one of
// those.) -float64 builds every program and its inputs in float64 (the default dtype): a
// divergence of meaning stays, one of float32 rounding goes (the program's random draws
// differ, though). -inject=F makes the compiled side wrong on purpose, its backward started
// from the loss times F: a run that does not then report a divergence is a fuzzer that
// cannot catch a wrong gradient (CTest's tcap_fuzz_divergence_catches_*).
//
// The grammar of programs and the change kinds: divergence_programs.h (divergence_programs.cpp,
// divergence_changes.cpp); here, running a program on both sides and comparing.
#include "divergence_programs.h"

#include <tcap/stance.h>

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

using namespace divergence;

// --- one program, compiled and eager ---------------------------------------------------

// The loss of the model's output: mse against in[1] or cross_entropy against in[2], over
// the rows mask in[3] selects when the program is masked (a size that comes from values).
at::Tensor loss_of(const Spec& spec, const at::Tensor& out, const Tensors& in) {
  auto rows = [&](const at::Tensor& t) { return spec.masked ? t.index({in[3]}) : t; };
  return spec.cross_entropy ? torch::nn::functional::cross_entropy(rows(out), rows(in[2]))
                            : torch::mse_loss(rows(out), rows(in[1]));
}

// The gradients of eager's call recomputed in float64 from the state eager's call started
// from (Note [Rounding in an ill-conditioned call]). It runs on the eager twin itself, its
// parameters and buffers set back and converted to float64: the module options, train and
// eval modes, the tensors Held layers read and the gradient hooks on parameters are the
// call's own. The twin is not used after it (the program ends, or the run stops).
class Reference64 {
 public:
  // `before`: eager's parameters before the call (one_call keeps them).
  Reference64(Side& eager, const Call& c, const std::vector<at::Tensor>& before) : side_(eager), params_(before) {
    if (c.accumulate) caveat_ = "gradients accumulated over calls";
    if (c.edit_input_before_backward || c.step_before_backward) caveat_ = "an edit between forward and backward";
    if (c.no_grad || c.inference) caveat_ = "a call without gradients";
    for (auto& m : eager.model->modules(false)) {
      if (auto d = std::dynamic_pointer_cast<nn::DropoutImpl>(m); d && d->is_training() && d->options.p() > 0) {
        caveat_ = "a training Dropout (the reference would draw its own mask)";
      }
    }
    if (!caveat_.empty()) return;
    for (const auto& b : eager.model->buffers()) buffers_.push_back(b.detach().clone());
  }

  // Runs the reference once; the caveat where it cannot.
  const std::string& run(const Spec& spec, const Tensors& in, int64_t seed) {
    if (ran_ || !caveat_.empty()) return caveat_;
    ran_ = true;
    auto gen = at::detail::getDefaultCPUGenerator();
    const at::Tensor state = gen.get_state();
    nn::Sequential& m = side_.model;
    try {
      tcap::StanceGuard eager(tcap::Stance::ForceEager);
      {
        torch::NoGradGuard no_grad;
        auto ps = m->parameters();
        auto bs = m->buffers();
        for (size_t k = 0; k < ps.size() && k < params_.size(); ++k) ps[k].copy_(params_[k]);
        for (size_t k = 0; k < bs.size() && k < buffers_.size(); ++k) bs[k].copy_(buffers_[k]);
      }
      m->to(torch::kDouble);
      m->zero_grad(/*set_to_none=*/true);
      torch::manual_seed(seed);
      Tensors in64 = in;
      for (auto& t : in64) {
        if (t.is_floating_point()) t = t.to(torch::kDouble);
      }
      loss_of(spec, m->forward(in64[0]), in64).backward();
      for (const auto& p : m->parameters()) grads_.push_back(p.grad().defined() ? p.grad().detach().clone() : at::Tensor());
    } catch (const std::exception& e) {
      caveat_ = std::string("the reference raised: ") + e.what();
      const size_t nl = caveat_.find('\n');
      if (nl != std::string::npos) caveat_.resize(nl);
    }
    gen.set_state(state);
    return caveat_;
  }

  // Parameter k's gradient in float64 (undefined where there is none).
  at::Tensor grad(size_t k) const { return k < grads_.size() ? grads_[k] : at::Tensor(); }

 private:
  Side& side_;
  std::vector<at::Tensor> params_, buffers_, grads_;
  std::string caveat_;
  bool ran_ = false;
};

class Program {
 public:
  // `backend`: "" or "eager" (-backend); `inject`: -inject's factor (1: none).
  Program(uint64_t seed, int calls, const std::string& backend, double inject)
      : rng_(seed), seed_(seed), calls_(calls), inject_(inject) {
    spec_ = draw_spec(rng_);
    if (!backend.empty()) spec_.backend = backend;
    exact_ = spec_.backend == "eager";
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
      compiled_.step = tcap::compile_step(compiled_.model.ptr(), *compiled_.opt, body(compiled_, inject_), o);
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
      Call c = ChangeDraw{rng_, spec_, batch_, length_, toggle_deterministic_}.draw(call);
      for (const auto& w : c.what) ++changes_run[w];
      apply_changes(c);
      std::string why = one_call(c);
      if (!ended_.empty()) {
        ended_ = "ended at call " + std::to_string(call) + ": " + ended_;
        return "";
      }
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
      if (spec_.input == Input::Text) h << ", length " << c.length;
      for (const auto& w : c.what) h << ", " << w;
      history_.push_back(h.str());
    }
    return "";
  }

  const Spec& spec() const { return spec_; }
  // Why the program's calls ended early, "" where they did not.
  const std::string& ended() const { return ended_; }

 private:
  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }

  void apply_changes(const Call& c) {
    for (const auto& e : c.edits) {
      e(compiled_);
      e(eager_);
    }
    at::globalContext().setDeterministicAlgorithms(toggle_deterministic_, /*warn_only=*/true);
  }

  // A step's body; `scale` multiplies the loss its backward starts from (-inject).
  tcap::CompiledFunction::Fn body(Side& s, double scale = 1.0) {
    auto m = s.model;
    auto* opt = s.opt.get();
    const Spec spec = spec_;
    return [m, opt, spec, scale](const Tensors& in) mutable {
      opt->zero_grad();
      auto out = m->forward(in[0]);
      auto loss = loss_of(spec, out, in);
      (scale != 1.0 ? loss * scale : loss).backward();
      opt->step();
      return Tensors{loss, out.detach()};
    };
  }

  // One side's call: the loss and outputs, or the error it raised.
  Result call_side(Side& s, bool compiled, const Call& c, const Tensors& in, int64_t seed) {
    Result r;
    torch::manual_seed(seed);
    struct DefaultDtype {
      explicit DefaultDtype(bool dbl) : on(dbl), before(torch::get_default_dtype()) {
        if (on) torch::set_default_dtype(caffe2::TypeMeta::Make<double>());
      }
      ~DefaultDtype() {
        if (on) torch::set_default_dtype(before);
      }
      bool on;
      caffe2::TypeMeta before;
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
      // Compiled autograd's guard, where there is one, is on for the compiled side only.
      (compiled && inject_ != 1.0 ? loss * inject_ : loss).backward();
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
      case Input::Text:
        x = c.transposed ? torch::randn({c.batch, width, c.length}).transpose(1, 2) : torch::randn({c.batch, c.length, width});
        break;
    }
    at::Tensor target = c.target_view ? x.narrow(1, 0, out_width) : torch::randn({c.batch, out_width});
    Tensors in = {x, target, torch::randint(0, out_width, {c.batch}, torch::kLong)};
    if (spec_.masked) in.push_back(next_mask(c.batch));
    const int64_t seed = static_cast<int64_t>(rng_() % 1000000);
    // Eager's parameters before the step: the size of its update scales what a parameter's
    // comparison allows (below).
    std::vector<at::Tensor> before;
    for (const auto& p : eager_.model->parameters()) before.push_back(p.detach().clone());
    std::optional<Reference64> reference;
    if (!exact_) reference.emplace(eager_, c, before);
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
    const bool exact = exact_;
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
    // A parameter after the step is its value before plus the update, whose rounding is the
    // gradient's (compared against grad_floor) times the learning rate: in a training that
    // explodes (weights of 1e9 after a few SGD steps through two Scale layers and a
    // GroupNorm, seed 55 program 222) the update's rounding is far above the rounding of
    // a parameter of the update's size. So the parameters' comparison scales with the
    // largest update as well; a wrong update (a stale weight, a skipped step) is as large
    // as the update itself and still shows.
    double update_floor = 1.0;
    for (size_t k = 0; k < b.size() && k < before.size(); ++k) {
      const at::Tensor u = (b[k].value().detach() - before[k]).abs();
      if (u.numel()) update_floor = std::max(update_floor, u.max().nan_to_num(0, 0, 0).item<double>());
    }
    // Every difference first: the float64 reference (below) runs on the eager twin.
    struct Difference {
      size_t k;
      std::string what;
      bool of_gradient;  // the gradient differs too (else the update alone does)
      at::Tensor tcap, eager;
    };
    std::vector<Difference> differences;
    for (size_t k = 0; k < a.size(); ++k) {
      const std::string dp = first_difference(a[k].value(), b[k].value(), rtol, atol, update_floor);
      const std::string dg = first_difference(a[k].value().grad(), b[k].value().grad(), rtol, grad_atol, grad_floor);
      if (dp.empty() && dg.empty()) continue;
      differences.push_back({k, dp.empty() ? "the .grad of " + a[k].key() + ": " + dg : "parameter " + a[k].key() + ": " + dp,
                             !dg.empty(), a[k].value().grad(), b[k].value().grad().defined() ? b[k].value().grad().clone() : at::Tensor()});
    }
    if (!differences.empty()) {
      std::vector<std::string> rounding;  // gradients off by float32 rounding in an ill-conditioned call
      for (const auto& d : differences) {
        // A parameter whose gradient agrees took another update: a difference of meaning.
        const Judged j = d.of_gradient && reference ? judge(*reference, d.k, d.tcap, d.eager, in, seed) : Judged{};
        if (!j.rounding) return d.what + (j.distances.empty() ? "" : "\n  float64 reference: " + j.distances);
        rounding.push_back(a[d.k].key() + "'s gradient (" + j.distances + ")");
      }
      ended_ = "float32 rounding in an ill-conditioned call:";
      for (const auto& r : rounding) ended_ += " " + r;
      return "";
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

  // Note [Rounding in an ill-conditioned call]
  // With llvm a gradient may differ from eager's beyond the tolerances although the graph
  // means the same: in a training that exploded (weights of 1e25 after eleven SGD steps), a
  // BatchNorm over a batch of 4 followed by affine layers and an MSE subtracts terms that
  // nearly cancel, and eager's float32 itself keeps two of its seven digits (seed 7,
  // program 5139: eager 1.0% from float64, llvm 4.9%; the eager backend agrees with eager to
  // 1e-5 over the whole program). llvm's kernels sum in another order, in float32 where
  // ATen's batch norm sums in double. Such a difference is judged, not tolerated: the call's
  // gradients are recomputed in float64 from the state eager's call started from, and a
  // gradient is rounding when eager's own float32 is more than 1e-4 of its largest element
  // away from float64 (the call lost digits) and tcap's is within 10 times eager's distance.
  // A difference of meaning (a stale weight, a skipped hook) leaves tcap as far from float64
  // as the difference itself while eager stays close, and still stops the run. The program's
  // later calls would train on in the same regime; it ends there, and the run says so.
  struct Judged {
    bool rounding = false;
    std::string distances;  // from float64, in words ("" where there is no reference)
  };
  Judged judge(Reference64& ref, size_t k, const at::Tensor& tcap, const at::Tensor& eager, const Tensors& in,
               int64_t seed) {
    const std::string caveat = ref.run(spec_, in, seed);
    if (!caveat.empty()) return {false, "none (" + caveat + ")"};
    const at::Tensor g64 = ref.grad(k);
    if (!g64.defined() || !tcap.defined() || !eager.defined()) return {};
    const double scale = g64.abs().max().item<double>();
    const double e = (eager.to(at::kDouble) - g64).abs().max().item<double>();
    const double t = (tcap.to(at::kDouble) - g64).abs().max().item<double>();
    std::ostringstream s;
    s << "eager's float32 off by " << e << ", tcap's by " << t << ", of a largest element " << scale;
    return {e > 1e-4 * scale && t <= 10 * e, s.str()};
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
  bool exact_ = false;  // the eager backend: ATen's kernels on both sides
  double inject_ = 1.0;  // -inject: the compiled side's backward starts from loss * inject_
  std::string ended_;  // why the program's calls ended before its last, "" while they go on
  bool toggle_deterministic_ = false;
  int batch_ = 4;  // the program's batch size, until a change draws another
  int length_ = 4;  // a Text program's length, likewise
  at::Tensor mask_;  // the last mask of a masked program
  std::vector<std::string> history_;
};

// The value of option -name=VALUE, "" where it is not given.
std::string text_arg(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("-" + name + "=", 0) == 0) return a.substr(name.size() + 2);
  }
  return "";
}

long arg(int argc, char** argv, const std::string& name, long def) {
  const std::string v = text_arg(argc, argv, name);
  return v.empty() ? def : std::atol(v.c_str());
}

// Whether flag -name is given.
bool flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    if (argv[i] == "-" + name) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const long programs = arg(argc, argv, "programs", 40);
  const long calls = arg(argc, argv, "calls", 10);
  const long seed = arg(argc, argv, "seed", 1);
  const long only = arg(argc, argv, "only", -1);
  const long from = arg(argc, argv, "from", 0);
  const std::string backend = text_arg(argc, argv, "backend");
  const bool float64 = flag(argc, argv, "float64");
  const std::string inject_text = text_arg(argc, argv, "inject");
  const double inject = inject_text.empty() ? 1.0 : std::atof(inject_text.c_str());
  if (float64) torch::set_default_dtype(caffe2::TypeMeta::Make<double>());
  if (!backend.empty() && backend != "eager") {
    std::fprintf(stderr,
                 "tcap_fuzz_divergence: -backend=%s: only -backend=eager (the grammar draws a program's layers after "
                 "its backend)\n",
                 backend.c_str());
    return 2;
  }
  // The fuzzer runs every front door where a fallback is allowed (a program may do what
  // tcap runs eagerly, with its reason): what it checks is eager's answer.
  tcap::set_error_on_fallback(false);
  std::map<std::string, int> changes;
  std::map<std::string, int> doors;
  long run = 0, calls_run = 0, replays = 0, ended = 0;
  const auto start = std::chrono::steady_clock::now();
  for (long p = std::max(0L, from); p < std::max(programs, only + 1); ++p) {
    if (only >= 0 && p != only) continue;
    const uint64_t s = static_cast<uint64_t>(seed) * 1000003ULL + static_cast<uint64_t>(p);
    Program prog(s, static_cast<int>(calls), backend, inject);
    ++doors[std::string(door_name(prog.spec().door)) + "/" + prog.spec().backend];
    if (prog.spec().masked) ++doors["(of them: a loss over a boolean mask)"];
    if (prog.spec().input == Input::Text) ++doors["(of them: text whose length varies)"];
    std::string why = prog.run(changes);
    const int replayed = prog.replays();
    replays += replayed;
    if (!prog.ended().empty()) {
      ++ended;
      std::printf("program %ld %s\n", p, prog.ended().c_str());
    }
    if (std::getenv("TCAP_FUZZ_VERBOSE")) {
      std::printf("program %ld: %s: %d of %ld calls replayed\n", p, prog.spec().str().c_str(), replayed, calls);
    }
    at::globalContext().setDeterministicAlgorithms(false, false);
    ++run;
    calls_run += calls;
    if (!why.empty()) {
      std::printf("DIVERGENCE in program %ld (reproduce: tcap_fuzz_divergence -seed=%ld -calls=%ld -only=%ld%s%s%s):\n%s\n", p,
                  seed, calls, p, backend.empty() ? "" : (" -backend=" + backend).c_str(), float64 ? " -float64" : "",
                  inject_text.empty() ? "" : (" -inject=" + inject_text).c_str(), why.c_str());
      return 1;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  long changes_total = 0;
  for (const auto& [k, n] : changes) changes_total += n;
  std::printf("tcap_fuzz_divergence: %ld programs, %ld calls, %ld state changes, no divergence (%.1f s, seed %ld); "
              "%ld of the calls were served by a compiled entry\n",
              run, calls_run, changes_total, s, seed, replays);
  if (ended) std::printf("  %ld programs ended early, each at a call whose gradients float32 cannot hold (above)\n", ended);
  for (const auto& [k, n] : doors) std::printf("  %-28s %d programs\n", k.c_str(), n);
  for (const auto& [k, n] : changes) std::printf("  %-56s %d\n", k.c_str(), n);
  return 0;
}
