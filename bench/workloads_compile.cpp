// Workloads for tcap::compile: a function or module compiled once and replayed, against
// eager LibTorch, in one run. Forward and backward are timed apart; compile time and the
// memory each variant keeps for the backward are measured once, at setup.
//
// Note [What a compile workload measures]
// One iteration is a training-style step split in four: reset the grads to undefined
// (untimed: zero_grad(set_to_none)), the forward call (fwd_us), the loss (untimed, eager in
// every variant), loss.backward() (bwd_us). Variants:
//   eager               plain LibTorch;
//   tcap_eager          tcap::compile, backend "eager", Partitioner::MinCut;
//   tcap_eager_default  the same with Partitioner::Default.
// A tcap variant's first call and its backward run at setup:
//   compile_ms        wall time of that call and backward (capture, partition, compile),
//                     median of kCompiles fresh compiles, the last one kept;
//   entry_compile_ms  tcap's own CompiledEntryInfo::compile_ms (partition and compile
//                     alone), median of the same.
// Setup then checks that a replay matches eager (values and grads), and every timed call
// checks that it was a compiled replay whose backward ran compiled (CompileStats), or the
// run stops with the reason.
// Memory comes from a separate untimed pass under a CpuByteCounter (Note [Counting CPU
// bytes] in harness.h): one priming iteration, then one measured iteration.
//   peak_bytes   the most CPU tensor bytes in use during forward + loss + backward, above
//                the bytes in use when the iteration starts (grads were reset: the
//                iteration allocates them);
//   held_bytes   measured: bytes the forward allocated that are still alive after it,
//                less its outputs, i.e. what it keeps for the backward;
//   saved_bytes  eager: held_bytes; tcap: entries()[0].partition.saved_bytes, the
//                partitioner's count of saved tensors that are not inputs. It also counts
//                saved user outputs and views of inputs, which hold no memory of their own,
//                so held_bytes is the like-for-like figure.
#include "workloads.h"

#include <tcap/compile.h>

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace tcap::bench {

namespace {

namespace nn = torch::nn;
using Tensors = std::vector<at::Tensor>;

// One variant's step. See Note [What a compile workload measures].
struct Step {
  std::string what;                                   // "coscos/tcap_eager", for messages
  std::function<at::Tensor()> forward;                // the timed call
  std::function<at::Tensor(const at::Tensor&)> loss;  // untimed, eager
  Tensors leaves;                                     // what the backward writes .grad of
  std::shared_ptr<tcap::CompiledFunction> compiled;   // tcap variants only
};

// Fresh compiles per tcap variant at setup; compile_ms is their median.
constexpr int kCompiles = 5;

// Builds the step of one variant: options is null for eager.
using MakeStep = std::function<Step(const tcap::CompileOptions* options)>;

void reset_grads(const Tensors& leaves) {
  for (const auto& t : leaves) {
    if (t.grad().defined()) t.mutable_grad().reset();
  }
}

void run_untimed(const Step& s) {
  reset_grads(s.leaves);
  s.loss(s.forward()).backward();
}

[[noreturn]] void fail(const Step& s, const std::string& why) {
  std::string message = s.what + ": " + why;
  if (s.compiled && !s.compiled->eager_reason().empty()) {
    message += " (runs eagerly: " + s.compiled->eager_reason() + ")";
  }
  throw std::runtime_error(message);
}

// The first call of a tcap variant and its backward: capture, partition, compile. Returns
// the wall time in ms.
double compile_first_call(const Step& s) {
  const auto t0 = std::chrono::steady_clock::now();
  run_untimed(s);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!s.compiled->eager_reason().empty()) fail(s, "tcap::compile fell back to eager");
  const tcap::CompileStats& st = s.compiled->stats();
  if (st.captures != 1 || st.compiles != 1 || s.compiled->entries().size() != 1) {
    fail(s, "expected 1 capture and 1 compiled entry after the first call and its backward, got " +
                std::to_string(st.captures) + " and " + std::to_string(st.compiles));
  }
  return ms;
}

// One timed iteration; a tcap variant's call must be a replay with a compiled backward.
void run_timed(const Step& s, Sample& sample) {
  const int replays = s.compiled ? s.compiled->stats().replays : 0;
  const int fallbacks = s.compiled ? s.compiled->stats().backward_fallbacks : 0;
  reset_grads(s.leaves);
  sample.start();
  at::Tensor out = s.forward();
  sample.stop("fwd_us");
  at::Tensor loss = s.loss(out);
  sample.start();
  loss.backward();
  sample.stop("bwd_us");
  if (!s.compiled) return;
  const tcap::CompileStats& st = s.compiled->stats();
  if (st.replays != replays + 1) fail(s, "a timed call was not a compiled replay");
  if (st.backward_fallbacks != fallbacks) {
    fail(s, "a timed backward ran the eager recompute, not the compiled backward");
  }
}

struct Bytes {
  int64_t peak = 0;
  int64_t held = 0;
};

// The untimed memory pass. See Note [Counting CPU bytes] in harness.h.
Bytes measure_bytes(const Step& s) {
  CpuByteCounter counter;
  run_untimed(s);  // priming: what the measured iteration frees was counted
  reset_grads(s.leaves);
  const int64_t before = counter.current();
  counter.reset_peak();
  Bytes b;
  {
    at::Tensor out = s.forward();
    b.held = counter.current() - before - static_cast<int64_t>(out.storage().nbytes());
    s.loss(out).backward();
  }
  b.peak = counter.peak() - before;
  return b;
}

// Output and grads of one untimed iteration, copied.
Tensors result_of(const Step& s) {
  reset_grads(s.leaves);
  at::Tensor out = s.forward();
  Tensors r{out.detach().clone()};
  s.loss(out).backward();
  for (const auto& t : s.leaves) r.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
  return r;
}

// A replay must compute what eager computes, or its timing means nothing. The eager
// backend runs the very kernels eager runs (a recompute repeats them on the same values).
void check_matches(const Step& s, const Step& eager) {
  const Tensors got = result_of(s);
  const Tensors want = result_of(eager);
  for (size_t i = 0; i < want.size(); ++i) {
    const bool same = got[i].defined() == want[i].defined() &&
                      (!want[i].defined() || torch::allclose(got[i], want[i], 1e-5, 1e-6));
    if (!same) {
      fail(s, i == 0 ? "the replay's output differs from eager"
                     : "the grad of leaf " + std::to_string(i - 1) + " differs from eager");
    }
  }
}

std::vector<Variant> make_variants(const std::string& workload, const MakeStep& make_step) {
  auto eager = std::make_shared<Step>(make_step(nullptr));
  eager->what = workload + "/eager";
  run_untimed(*eager);  // the first eager run pays one-time costs, not the captures below

  std::vector<Variant> variants;
  {
    const Bytes b = measure_bytes(*eager);
    Variant v{"eager", [eager](Sample& s) { run_timed(*eager, s); }};
    v.fixed = {{"compile_ms", 0},
               {"entry_compile_ms", 0},
               {"peak_bytes", static_cast<double>(b.peak)},
               {"saved_bytes", static_cast<double>(b.held)},
               {"held_bytes", static_cast<double>(b.held)}};
    variants.push_back(std::move(v));
  }
  struct Spec {
    const char* name;
    tcap::Partitioner partitioner;
  };
  const Spec specs[] = {{"tcap_eager", tcap::Partitioner::MinCut},
                        {"tcap_eager_default", tcap::Partitioner::Default}};
  for (const auto& spec : specs) {
    tcap::CompileOptions o;
    o.name = workload;
    o.backend = "eager";
    o.partitioner = spec.partitioner;
    // One wall time each is noisy: the process's first capture pays one-time
    // initialisation, and fresh heap pages fault in during a workload's first compiles.
    std::shared_ptr<Step> step;
    std::vector<double> compile_ms_of, entry_ms_of;
    for (int k = 0; k < kCompiles; ++k) {
      step = std::make_shared<Step>(make_step(&o));
      step->what = workload + "/" + spec.name;
      compile_ms_of.push_back(compile_first_call(*step));
      entry_ms_of.push_back(step->compiled->entries().at(0).compile_ms);
    }
    check_matches(*step, *eager);
    const Bytes b = measure_bytes(*step);
    const int64_t saved = step->compiled->entries().at(0).partition.saved_bytes;
    Variant v{spec.name, [step](Sample& s) { run_timed(*step, s); }};
    v.fixed = {{"compile_ms", quantile(compile_ms_of, 0.5)},
               {"entry_compile_ms", quantile(entry_ms_of, 0.5)},
               {"peak_bytes", static_cast<double>(b.peak)},
               {"saved_bytes", static_cast<double>(saved)},
               {"held_bytes", static_cast<double>(b.held)}};
    variants.push_back(std::move(v));
  }
  return variants;
}

// bwd_us over the eager variant's (x_eager is fwd_us's, added by the harness).
void derive_bwd_ratio(std::vector<Record>& records) {
  const Record* eager = find_variant(records, "eager");
  if (!eager || !eager->get("bwd_us")) return;
  for (auto& r : records) {
    if (&r != eager && r.get("bwd_us")) r.set("bwd_x_eager", *r.get("bwd_us") / *eager->get("bwd_us"));
  }
}

// --- coscos ----------------------------------------------------------------------------

Tensors coscos(const Tensors& in) { return {torch::cos(torch::cos(in[0] + in[1] + in[2] + in[3]))}; }

std::vector<Variant> make_coscos(const Options&) {
  torch::manual_seed(0);
  // Shared by every variant: grads are reset before each iteration.
  Tensors inputs;
  for (int i = 0; i < 4; ++i) inputs.push_back(torch::randn({1024, 2048}, torch::requires_grad()));
  return make_variants("coscos", [inputs](const tcap::CompileOptions* o) {
    Step s;
    s.leaves = inputs;
    s.loss = [](const at::Tensor& out) { return out.sum(); };
    if (!o) {
      s.forward = [inputs] { return coscos(inputs)[0]; };
    } else {
      s.compiled = tcap::compile(coscos, *o);
      s.forward = [f = s.compiled.get(), inputs] { return (*f)(inputs)[0]; };
    }
    return s;
  });
}

// --- mlp_small -------------------------------------------------------------------------

// The seed MLP (as in record_mlp_step), batch 1, MSE loss against a fixed target. Each
// variant has its own model, with the same weights.
std::vector<Variant> make_mlp_small(const Options&) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({1, 10});
  const at::Tensor target = torch::randn({1, 2});
  return make_variants("mlp_small", [x, target](const tcap::CompileOptions* o) {
    torch::manual_seed(1);
    nn::Sequential model{nn::Linear(10, 5), nn::ReLU(), nn::Linear(5, 2), nn::Softmax(1)};
    Step s;
    s.leaves = model->parameters();
    s.loss = [target](const at::Tensor& out) { return torch::mse_loss(out, target); };
    if (!o) {
      s.forward = [model, x]() mutable { return model->forward(x); };
    } else {
      s.compiled = tcap::compile(model, *o);
      // The compiled function holds the module weakly: the step keeps it alive.
      s.forward = [f = s.compiled.get(), model, x] { return f->forward(x); };
    }
    return s;
  });
}

}  // namespace

void add_compile_workloads(Registry& registry) {
  registry.add({"coscos",
                "cos(cos(a+b+c+d)), 4 x f32[1024, 2048] requiring grad, loss out.sum(): eager vs "
                "tcap::compile replay (eager backend; min-cut / default partitioner); µs per call",
                make_coscos, derive_bwd_ratio});
  registry.add({"mlp_small",
                "seed MLP 10-5-2 (softmax, batch 1) compiled as a module, MSE loss and backward "
                "outside it: eager vs tcap::compile replay (eager backend); µs per call",
                make_mlp_small, derive_bwd_ratio});
}

}  // namespace tcap::bench
