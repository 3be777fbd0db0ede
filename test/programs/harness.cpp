#include "programs/harness.h"

#include "runtime/fused_kernel.h"
#include "support/backends.h"
#include "support/compare.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <tuple>
#include <unordered_map>

namespace tcap::programs {

using tcap::testing::close;

std::string ModeSpec::name() const {
  std::string m;
  switch (mode) {
    case Mode::Eager: m = "eager"; break;
    case Mode::Capture: m = "capture"; break;
    case Mode::Compile: m = "compile"; break;
    case Mode::CompileStep: m = "compile_step"; break;
    case Mode::CompiledAutograd: m = "compiled_autograd"; break;
  }
  return backend == "eager" ? m : m + "/" + backend;
}

namespace {

// One intra-op thread per test process. CTest runs these processes in parallel on small
// shared machines, where two intra-op threads per process mostly wait for each other: the
// DCGAN discriminator's forward and backward took 106 ms with two threads and 2 ms with
// one on a loaded 2-core machine. Results are compared within tolerances either way; the
// printed step times are single-threaded, for eager and the mode alike.
const bool kOneThread = [] {
  at::set_num_threads(1);
  return true;
}();

// Every state tensor of an optimizer, in parameter order (the step count as a tensor).
std::vector<at::Tensor> optimizer_state(torch::optim::Optimizer& opt) {
  std::vector<at::Tensor> out;
  auto add = [&out](const at::Tensor& t) {
    if (t.defined()) out.push_back(t.detach().clone());
  };
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it == opt.state().end()) continue;
      auto* s = it->second.get();
      if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(s)) {
        add(sgd->momentum_buffer());
      } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(s)) {
        add(torch::tensor(static_cast<double>(adam->step()), torch::kDouble));
        add(adam->exp_avg());
        add(adam->exp_avg_sq());
        add(adam->max_exp_avg_sq());
      } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
        add(torch::tensor(static_cast<double>(adamw->step()), torch::kDouble));
        add(adamw->exp_avg());
        add(adamw->exp_avg_sq());
        add(adamw->max_exp_avg_sq());
      } else {
        ADD_FAILURE() << "optimizer state of an unknown type";
      }
    }
  }
  return out;
}

std::string prefix(size_t i) { return "m" + std::to_string(i) + "."; }

// Copies of every tensor a step can read (parameters, their .grad, buffers, optimizer
// state, the batch), keyed by the original's TensorImpl: the captured graph is replayed
// on these, since the step itself has updated the originals in place.
std::unordered_map<const void*, at::Tensor> snapshot(Program& p, const Tensors& batch) {
  std::unordered_map<const void*, at::Tensor> copies;
  auto add = [&copies](const at::Tensor& t) {
    if (t.defined()) copies.emplace(t.unsafeGetTensorImpl(), t.detach().clone());
  };
  for (auto& m : p.modules()) {
    for (auto& t : m->parameters()) {
      add(t);
      add(t.grad());
    }
    for (auto& t : m->buffers()) add(t);
  }
  for (auto* opt : p.optimizers()) {
    for (auto& entry : opt->state()) {
      auto* s = entry.second.get();
      if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(s)) add(sgd->momentum_buffer());
      if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(s)) {
        add(a->exp_avg());
        add(a->exp_avg_sq());
        add(a->max_exp_avg_sq());
      }
      if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
        add(a->exp_avg());
        add(a->exp_avg_sq());
        add(a->max_exp_avg_sq());
      }
    }
  }
  for (const auto& t : batch) add(t);
  return copies;
}

// One step under CaptureGuard; then the captured graph replayed on the step's inputs
// (copies taken before the step) must give the step's losses and .grads.
Tensors captured_step(Program& p, const Tensors& batch, int step, std::vector<std::string>& problems) {
  auto copies = snapshot(p, batch);
  Tensors losses;
  ir::Graph graph;
  std::vector<at::Tensor> seen;
  {
    CaptureGuard capture;
    auto modules = p.modules();
    for (size_t i = 0; i < modules.size(); ++i) capture.register_module(*modules[i], prefix(i));
    for (size_t k = 0; k < batch.size(); ++k) capture.input(batch[k], "batch" + std::to_string(k));
    losses = p.train_step(batch);
    for (size_t k = 0; k < losses.size(); ++k) capture.output(losses[k], "loss" + std::to_string(k));
    capture.stop();
    graph = capture.graph();
    seen = capture.input_tensors();
  }
  std::vector<at::Tensor> inputs;
  for (const auto& t : seen) {
    auto it = copies.find(t.unsafeGetTensorImpl());
    inputs.push_back(it != copies.end() ? it->second : t);  // tensors the step holds, unchanged
  }
  const size_t logged = p.host_log.size();
  Tensors replayed;
  try {
    replayed = interpret(graph, inputs);
  } catch (const std::exception& e) {
    problems.push_back("step " + std::to_string(step) + ": replay threw: " + e.what());
    return losses;
  }
  p.host_log.resize(logged);  // the replay runs the hooks' recorded bodies again
  std::map<std::string, at::Tensor> params;
  auto modules = p.modules();
  for (size_t i = 0; i < modules.size(); ++i) {
    for (const auto& item : modules[i]->named_parameters()) params[prefix(i) + item.key()] = item.value();
  }
  const auto* out = graph.output_node();
  for (size_t k = 0; k < replayed.size(); ++k) {
    const std::string& name = out->output_names.at(k);
    at::Tensor expected;
    if (k < losses.size()) {
      expected = losses[k];
    } else if (out->output_kinds.at(k) == ir::OutputKind::Grad && params.count(name)) {
      expected = params[name].grad();
    } else {
      continue;
    }
    auto r = close(replayed[k], expected, 1e-4, 1e-5);
    if (!r) problems.push_back("step " + std::to_string(step) + ": replayed " + name + ": " + r.message());
  }
  size_t grads = 0;
  for (auto kind : out->output_kinds) grads += kind == ir::OutputKind::Grad;
  if (grads == 0) problems.push_back("step " + std::to_string(step) + ": the captured graph has no gradients");
  return losses;
}

void collect_state(Program& p, RunResult& r) {
  auto modules = p.modules();
  for (size_t i = 0; i < modules.size(); ++i) {
    for (const auto& item : modules[i]->named_parameters()) {
      r.params[prefix(i) + item.key()] = p.comparable(item.key(), item.value().detach()).clone();
      const auto& g = item.value().grad();
      r.grads[prefix(i) + item.key()] = g.defined() ? g.clone() : at::Tensor();
    }
    for (const auto& item : modules[i]->named_buffers()) r.buffers[prefix(i) + item.key()] = item.value().clone();
  }
  for (auto* opt : p.optimizers()) {
    for (auto& t : optimizer_state(*opt)) r.optimizer_state.push_back(t);
  }
}

}  // namespace

RunResult run_program(const ProgramFactory& make, const ModeSpec& spec, int steps) {
  auto program = make();
  Program& p = *program;
  RunResult r;
  std::optional<StanceGuard> strict;
  if (spec.mode != Mode::Eager && spec.mode != Mode::Capture) strict.emplace(Stance::Default, /*error_on_fallback=*/true);
  std::optional<ModeRunner> runner;
  if (spec.mode != Mode::Capture) runner.emplace(p, spec.mode, spec.backend);

  double timed_us = 0;
  int timed = 0;
  for (int step = 0; step < steps; ++step) {
    auto batch = p.batch(step);
    p.before_step(step);
    const size_t logged = p.host_log.size();
    const int64_t launches_before = runtime::runtime_stats().launches;
    const auto t0 = std::chrono::steady_clock::now();
    Tensors losses;
    if (spec.mode == Mode::Capture) {
      losses = captured_step(p, batch, step, r.problems);
    } else {
      losses = runner->step(batch);
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (step >= steps / 2) {
      timed_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
      ++timed;
      r.kernel_launches += runtime::runtime_stats().launches - launches_before;
    }
    Tensors copies;
    for (const auto& l : losses) copies.push_back(l.detach().clone());
    r.losses.push_back(copies);
    std::vector<double> log(p.host_log.begin() + static_cast<std::ptrdiff_t>(logged), p.host_log.end());
    std::sort(log.begin(), log.end());
    r.host_logs.push_back(log);
  }
  r.us_per_step = timed ? timed_us / timed : 0;
  collect_state(p, r);
  if (runner) {
    std::tie(r.served, r.calls) = runner->served();
  } else {
    r.served = r.calls = steps;
  }
  return r;
}

void check_program(const ProgramFactory& make, const ModeSpec& spec, int steps, Tolerance tol) {
  TCAP_SKIP_WITHOUT_BACKEND(spec.backend);
  const auto eager = run_program(make, ModeSpec{}, steps);
  const auto run = run_program(make, spec, steps);
  const std::string what = make()->name() + " " + spec.name();
  for (const auto& problem : run.problems) ADD_FAILURE() << what << ": " << problem;
  // Every program has pointwise chains: a compiled mode with a kernel backend that ran
  // none in its steady state lost its fusion somewhere (a graph left unfused still gives
  // eager's answer, so the comparisons below would not notice).
  if (!spec.backend.empty() && spec.backend != "eager" && spec.mode != Mode::Eager && spec.mode != Mode::Capture) {
    EXPECT_GT(run.kernel_launches, 0) << what << ": no generated kernel ran in the steady state";
  }
  ASSERT_EQ(run.losses.size(), eager.losses.size());
  for (size_t s = 0; s < eager.losses.size(); ++s) {
    ASSERT_EQ(run.losses[s].size(), eager.losses[s].size()) << what << " step " << s;
    for (size_t k = 0; k < eager.losses[s].size(); ++k) {
      EXPECT_TRUE(close(run.losses[s][k], eager.losses[s][k], tol.rtol, tol.atol)) << what << " step " << s << " loss " << k;
    }
    ASSERT_EQ(run.host_logs[s].size(), eager.host_logs[s].size()) << what << " step " << s << ": host-side side effects";
    for (size_t k = 0; k < eager.host_logs[s].size(); ++k) {
      const double e = eager.host_logs[s][k];
      EXPECT_NEAR(run.host_logs[s][k], e, tol.atol + tol.rtol * std::abs(e)) << what << " step " << s << " logged " << k;
    }
  }
  auto compare_maps = [&](const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b,
                          const char* kind) {
    ASSERT_EQ(a.size(), b.size()) << what << " " << kind;
    for (const auto& [name, t] : b) {
      ASSERT_TRUE(a.count(name)) << what << " " << kind << " " << name;
      EXPECT_TRUE(close(a.at(name), t, tol.rtol, tol.atol)) << what << " " << kind << " " << name;
    }
  };
  compare_maps(run.params, eager.params, "parameter");
  compare_maps(run.grads, eager.grads, "grad");
  compare_maps(run.buffers, eager.buffers, "buffer");
  ASSERT_EQ(run.optimizer_state.size(), eager.optimizer_state.size()) << what << " optimizer state";
  for (size_t k = 0; k < eager.optimizer_state.size(); ++k) {
    EXPECT_TRUE(close(run.optimizer_state[k], eager.optimizer_state[k], tol.rtol, tol.atol))
        << what << " optimizer state " << k;
  }
  EXPECT_GE(run.served * 5, run.calls * 4) << what << ": " << run.served << " of " << run.calls
                                           << " calls served by compiled graphs (80% required)";
  std::printf("[program] %-12s %-24s eager %9.1f us/step  mode %9.1f us/step  speedup %.2fx  compiled %d/%d\n",
              make()->name().c_str(), spec.name().c_str(), eager.us_per_step, run.us_per_step,
              run.us_per_step > 0 ? eager.us_per_step / run.us_per_step : 0.0, run.served, run.calls);
}

}  // namespace tcap::programs
