// Workloads that measure what recording costs: the same code run eagerly and inside a
// tcap::CaptureGuard, interleaved in one run (goal: <= 1 µs per recorded op).
#include "seed_mlp.h"
#include "workloads.h"

#include <tcap/capture.h>
#include <tcap/interpreter.h>

#include <torch/torch.h>

#include <memory>
#include <stdexcept>

namespace tcap::bench {

namespace {

namespace nn = torch::nn;

// --- record_small_ops ------------------------------------------------------------------

constexpr int kStreamOps = 1000;  // 250 x (mul, add, relu, neg)

// Tiny pointwise ops on a 16-element tensor: the kernel is a few ns, so the time is the
// dispatcher's (and, under capture, the recorder's). Values stay in [-0.5, 0].
at::Tensor small_op_stream(at::Tensor y) {
  for (int i = 0; i < kStreamOps / 4; ++i) {
    y = y.mul(1.0001);
    y = y.add(0.5);
    y = y.relu();
    y = y.neg();
  }
  return y;
}

std::vector<Variant> make_small_ops(const Options&) {
  auto x = std::make_shared<at::Tensor>(torch::randn({16}));

  size_t recorded_ops = 0;
  {
    tcap::CaptureGuard cap;
    small_op_stream(*x);
    recorded_ops = cap.graph().num_calls();
  }

  Variant eager{"eager", [x](Sample& s) {
                  s.start();
                  at::Tensor y = small_op_stream(*x);
                  s.stop("us_per_op");
                },
                kStreamOps};
  // A fresh guard per stream; its construction and destruction are outside the clock.
  Variant record{"record", [x](Sample& s) {
                   tcap::CaptureGuard cap;
                   s.start();
                   at::Tensor y = small_op_stream(*x);
                   s.stop("us_per_op");
                 },
                 kStreamOps};
  record.fixed = {{"recorded_ops", static_cast<double>(recorded_ops)}};
  // The same, and the graph read inside the clock: the recorder defers part of each
  // node until then (Note [Deferred call nodes]).
  Variant record_read{"record_read", [x](Sample& s) {
                        tcap::CaptureGuard cap;
                        s.start();
                        at::Tensor y = small_op_stream(*x);
                        const ir::Graph g = cap.graph();
                        s.stop("us_per_op");
                      },
                      kStreamOps};
  record_read.fixed = record.fixed;
  return {eager, record, record_read};
}

// Sets overhead_us_per_op on `variant`: its per-op excess over eager, with the spread of
// the paired per-round differences. `per_op`: the metric is per op (else per step of
// recorded_ops ops).
void derive_overhead(std::vector<Record>& records, const char* variant, const char* metric, bool per_op) {
  Record* eager = find_variant(records, "eager");
  Record* record = find_variant(records, variant);
  if (!eager || !record) return;
  const double scale = per_op ? 1.0 : 1.0 / *record->get("recorded_ops");
  set_with_spread(*record, "overhead_us_per_op", (*record->get(metric) - *eager->get(metric)) * scale,
                  paired_difference(*record, *eager, metric, scale));
}

void derive_small_ops(std::vector<Record>& records) {
  derive_overhead(records, "record", "us_per_op", true);
  derive_overhead(records, "record_read", "us_per_op", true);
}

// --- record_mlp_step -------------------------------------------------------------------

// The step captured once and replayed by an Interpreter built once.
struct Replay {
  explicit Replay(const ir::Graph& g, std::vector<at::Tensor> in)
      : interp(g), inputs(std::move(in)) {}
  tcap::Interpreter interp;
  std::vector<at::Tensor> inputs;
};

std::vector<Variant> make_mlp_step(const Options&) {
  torch::manual_seed(0);
  auto mlp = std::make_shared<Mlp>();

  // The first step differs from the rest (no .grad yet: zero_grad writes nothing and
  // backward does not accumulate), so the counted capture is of a steady-state step.
  mlp->step();
  std::shared_ptr<Replay> replay;
  size_t recorded_ops = 0;
  {
    tcap::CaptureGuard cap;
    mlp->declare(cap);
    cap.output(mlp->step(), "loss");
    cap.stop();
    const ir::Graph g = cap.graph();
    recorded_ops = g.num_calls();
    replay = std::make_shared<Replay>(g, cap.input_tensors());
  }
  // Replay must compute what eager computes, or its timing means nothing.
  const at::Tensor eager_loss = mlp->step().detach();
  const at::Tensor replay_loss = replay->interp.run(replay->inputs).at(0);
  if (!torch::allclose(eager_loss, replay_loss)) {
    throw std::runtime_error("record_mlp_step: replayed loss differs from eager");
  }

  Variant eager{"eager", [mlp](Sample& s) {
                  s.start();
                  mlp->step();
                  s.stop("step_us");
                }};
  Variant record{"record", [mlp](Sample& s) {
                   tcap::CaptureGuard cap;
                   mlp->declare(cap);
                   s.start();
                   mlp->step();
                   s.stop("step_us");
                 }};
  record.fixed = {{"recorded_ops", static_cast<double>(recorded_ops)}};
  Variant record_read{"record_read", [mlp](Sample& s) {
                        tcap::CaptureGuard cap;
                        mlp->declare(cap);
                        s.start();
                        mlp->step();
                        const ir::Graph g = cap.graph();
                        s.stop("step_us");
                      }};
  record_read.fixed = record.fixed;
  Variant replayed{"replay", [replay](Sample& s) {
                     s.start();
                     replay->interp.run(replay->inputs);
                     s.stop("step_us");
                   }};
  return {eager, record, record_read, replayed};
}

void derive_mlp_step(std::vector<Record>& records) {
  derive_overhead(records, "record", "step_us", false);
  derive_overhead(records, "record_read", "step_us", false);
}

}  // namespace

void add_capture_workloads(Registry& registry) {
  registry.add({"record_small_ops",
                "1000 tiny pointwise ops (mul, add, relu, neg) on f32[16], eager vs inside a "
                "CaptureGuard (record_read: and the graph read); µs per op",
                make_small_ops, derive_small_ops});
  registry.add({"record_mlp_step",
                "seed MLP 10-5-2 (softmax, MSE, batch 1) zero_grad + forward + backward, eager vs "
                "inside a CaptureGuard (record_read: and the graph read) vs Interpreter replay of "
                "the captured graph; µs per step",
                make_mlp_step, derive_mlp_step});
}

}  // namespace tcap::bench
