// Workloads for tcap::compile: a function or module compiled once and replayed, against
// eager LibTorch, in one run. Forward and backward are timed apart; compile time and the
// memory each variant keeps for the backward are measured once, at setup.
//
// Note [What a compile workload measures]
// One iteration is a training-style step split in four: reset the grads to undefined
// (untimed: zero_grad(set_to_none)), the forward call (fwd_us), the loss (untimed, eager in
// every variant; softmax_ce's compiled function returns the loss itself), loss.backward()
// (bwd_us). Variants:
//   eager               plain LibTorch;
//   tcap_eager          tcap::compile, backend "eager", Partitioner::MinCut;
//   tcap_eager_default  the same with Partitioner::Default;
//   tcap_llvm           backend "llvm" (fused CPU kernels), Partitioner::MinCut;
//   tcap_llvm_relu_after  the same, compiled with TCAP_RELU_INSIDE_GEMMS=0 (a ReLU after a
//                       product through oneDNN stays a kernel: what Note [ReLU inside the
//                       product] saves, in one run);
//   ca_eager, ca_llvm   eager forward, loss.backward() under a CompiledAutogradGuard
//                       (compiled autograd, backend "eager" / "llvm"); these also report
//                       lookup_us: the guard's walk of the autograd graph and cache lookup,
//                       part of bwd_us.
// (py_eager and inductor come from bench/inductor_bench.py: Note [The torch.compile peer]
// in harness.h.) A tcap variant that cannot be set up is reported as skipped with the
// reason instead of stopping the run: a backend that does not exist ("unknown backend")
// is just skipped; anything else (tcap falling back to eager, a replay that differs from
// eager) is a failure (the row says FAILED and tcap-bench exits with 1).
// A tcap variant's first call and its backward run at setup:
//   compile_ms        wall time of that call and backward (capture, partition, compile),
//                     median of kCompiles fresh compiles, the last one kept;
//   entry_compile_ms  tcap's own CompiledEntryInfo::compile_ms (partition and compile
//                     alone), median of the same.
// Setup then checks that a replay matches eager (values and grads, within the workload's
// Tolerance), and every timed call checks that it was a compiled replay whose backward ran
// compiled (CompileStats), or the run stops with the reason.
// Memory comes from a separate untimed pass under a CpuByteCounter (Note [Counting CPU
// bytes] in harness.h): one priming iteration, then one measured iteration.
//   peak_bytes   the most CPU tensor bytes in use during forward + loss + backward, above
//                the bytes in use before the priming iteration (grads were reset: the
//                iteration allocates them; kept_bytes are included);
//   held_bytes   measured: bytes the forward allocated that are still alive after it,
//                less its output's storage, i.e. what it keeps for the backward (tensors
//                that live in recycled pool blocks are not in it: see kept_bytes);
//   kept_bytes   bytes the priming iteration (a tcap variant's first replay) allocated and
//                that stay allocated between iterations: buffers a backend keeps across
//                calls (the CPU buffer pool's cached blocks, Note [CPU buffer pool]);
//                eager: 0 or caches;
//   saved_bytes  eager: held_bytes; tcap: entries()[0].partition.saved_bytes, the
//                partitioner's count of saved tensors that are not inputs. It also counts
//                saved user outputs and views of inputs, which hold no memory of their own,
//                so held_bytes is the like-for-like figure.
#include "compile_variants.h"

#include "compiler/pipeline.h"

#include <tcap/buffer_pool.h>
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/interpreter.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <set>
#include <string>
#include <vector>

namespace tcap::bench::compile_workloads {

namespace {

namespace nn = torch::nn;

// loss.backward(), under a compiled-autograd guard for the ca_* variants.
void backward_of(const Step& s, const at::Tensor& loss) {
  if (!s.ca) {
    loss.backward();
    return;
  }
  tcap::CompiledAutogradGuard guard(*s.ca);
  loss.backward();
}

tcap::CompiledAutogradStats ca_stats(const Step& s) { return tcap::CompiledAutogradGuard(*s.ca).stats(); }

// Fresh compiles per tcap variant at setup; compile_ms is their median (1 with --quick).
constexpr int kCompiles = 5;

void reset_grads(const Tensors& leaves) {
  for (const auto& t : leaves) {
    if (t.grad().defined()) t.mutable_grad().reset();
  }
}

void run_untimed(const Step& s) {
  reset_grads(s.leaves);
  backward_of(s, s.loss(s.forward()));
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
  if (s.ca) {
    const auto st = ca_stats(s);
    if (st.captures != 1 || st.compiles != 1) {
      fail(s, "expected compiled autograd to capture and compile the first backward, got " +
                  std::to_string(st.captures) + " captures and " + std::to_string(st.compiles) +
                  " compiles (TCAP_LOGS=graph_breaks says why)");
    }
    return ms;
  }
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
  const tcap::CompiledAutogradStats ca_before = s.ca ? ca_stats(s) : tcap::CompiledAutogradStats{};
  reset_grads(s.leaves);
  sample.start();
  at::Tensor out = s.forward();
  sample.stop("fwd_us");
  at::Tensor loss = s.loss(out);
  sample.start();
  backward_of(s, loss);
  sample.stop("bwd_us");
  if (s.ca) {
    const auto st = ca_stats(s);
    if (st.replays != ca_before.replays + 1) fail(s, "a timed backward was not served by the compiled backward");
    sample.add("lookup_us", (st.lookup_us - ca_before.lookup_us) * 1e-6);
    return;
  }
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
  int64_t kept = 0;
};

// The untimed memory pass. See Note [Counting CPU bytes] in harness.h. For a tcap variant
// it runs before any other replay, so that its priming iteration is the compiled
// function's first replay: buffers a backend allocates then and keeps across calls (the
// CPU buffer pool's cached blocks) are counted, in kept_bytes and peak_bytes; the pool is
// emptied first.
Bytes measure_bytes(const Step& s) {
  // Blocks the pool cached for an earlier variant would serve this one uncounted.
  tcap::empty_buffer_pool();
  CpuByteCounter counter;
  const int64_t start = counter.current();
  run_untimed(s);  // priming: what the measured iteration frees was counted
  reset_grads(s.leaves);
  const int64_t before = counter.current();
  counter.reset_peak();
  Bytes b;
  b.kept = before - start;
  {
    const auto live_before = counter.live();
    at::Tensor out = s.forward();
    // What the forward allocated and keeps, less its output's storage.
    for (const auto& [data, bytes] : counter.live()) {
      if (data != out.storage().data() && live_before.count(data) == 0) b.held += bytes;
    }
    backward_of(s, s.loss(out));
  }
  b.peak = counter.peak() - start;
  return b;
}

// Output and grads of one untimed iteration, copied.
Tensors result_of(const Step& s) {
  reset_grads(s.leaves);
  at::Tensor out = s.forward();
  Tensors r{out.detach().clone()};
  backward_of(s, s.loss(out));
  for (const auto& t : s.leaves) r.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
  return r;
}

// "" if got is close to want (see Tolerance), else what differs.
std::string difference(const at::Tensor& got, const at::Tensor& want, Tolerance tol) {
  if (got.defined() != want.defined()) return got.defined() ? "defined, eager's is not" : "undefined, eager's is not";
  if (!want.defined()) return "";
  if (got.sizes() != want.sizes()) return "of another shape";
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  double scale = w.abs().max().item<double>();
  if (scale == 0) scale = 1;
  const at::Tensor err = (g - w).abs();
  if ((err <= tol.atol * scale + tol.rtol * w.abs()).all().item<bool>()) return "";
  return "off by up to " + std::to_string(err.max().item<double>() / scale) + " of its largest magnitude (rtol " +
         std::to_string(tol.rtol) + ", atol " + std::to_string(tol.atol) + ")";
}

// A replay must compute what eager computes, or its timing means nothing. The eager
// backend runs the very kernels eager runs (a recompute repeats them on the same values).
void check_matches(const Step& s, const Step& eager, Tolerance tol) {
  const Tensors got = result_of(s);
  const Tensors want = result_of(eager);
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string diff = difference(got[i], want[i], tol);
    if (!diff.empty()) {
      fail(s, (i == 0 ? "the replay's output" : "the grad of leaf " + std::to_string(i - 1)) + " differs from eager: " +
                  diff);
    }
  }
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// Note [GEMM floors]
// What a step costs beyond its matmuls and convolutions is what fusion can still win: the
// `gemm_floor` variant runs only the contractions of the workload's graphs (the forward and
// backward tcap::compile partitions, as captured: addmm, mm, bmm, baddbmm, convolution and
// their backward), the same ops with the same shapes and strides through the same
// library, on fresh random tensors, timed as fwd_us and bwd_us. derive_bwd_ratio then
// gives each variant x_gemm_floor ((fwd + bwd) over the floor's) and fwd_x_gemm_floor /
// bwd_x_gemm_floor. A variant below the floor does less than the captured contractions
// (a matmul fused into a kernel, a product through a faster library); one at 1.0 spends
// nothing outside them. `gemm_floor_onednn` runs the same contractions with the products
// the llvm backend sends through oneDNN sent there (Note [GEMMs through oneDNN], the same
// measurement), so x_gemm_floor_onednn is the llvm variants' distance from their own
// products' time.
bool is_contraction(const std::string& op) {
  static const std::set<std::string> ops{"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm",
                                         "aten::convolution", "aten::convolution_backward", "aten::_convolution",
                                         "aten::mkldnn_convolution"};
  return ops.count(op) > 0;
}

// The contractions of g as a graph of their own, and random inputs for it.
struct Contractions {
  tcap::ir::Graph graph;
  Tensors inputs;
  int count = 0;
};

Contractions contractions_of(const tcap::ir::Graph& g) {
  Contractions c;
  std::vector<tcap::ir::NodeId> nodes;
  std::set<tcap::ir::ValueId> made;
  std::vector<tcap::ir::ValueId> inputs, outputs;
  for (const auto& n : g.nodes()) {
    if (n.kind != tcap::ir::NodeKind::Call || !is_contraction(n.op)) continue;
    nodes.push_back(n.id);
    tcap::ir::for_each_value(n.args, [&](tcap::ir::ValueId v) {
      if (!made.count(v) && std::find(inputs.begin(), inputs.end(), v) == inputs.end()) inputs.push_back(v);
    });
    tcap::ir::for_each_value(n.outputs, [&](tcap::ir::ValueId v) {
      made.insert(v);
      outputs.push_back(v);
    });
  }
  c.count = static_cast<int>(nodes.size());
  if (nodes.empty()) return c;
  std::vector<tcap::ir::CutInput> cut_inputs;
  std::vector<tcap::ir::CutOutput> cut_outputs;
  for (tcap::ir::ValueId v : inputs) cut_inputs.push_back({v, tcap::ir::InputKind::UserInput, ""});
  for (tcap::ir::ValueId v : outputs) cut_outputs.push_back({v, ""});
  c.graph = tcap::ir::extract_subgraph(g, nodes, cut_inputs, cut_outputs);
  for (tcap::ir::ValueId v : inputs) {
    const auto& m = g.value(v).meta;
    at::Tensor t = at::empty_strided(m.sizes, m.strides, at::TensorOptions().dtype(m.dtype).device(m.device));
    if (t.is_floating_point()) t.normal_();
    else t.zero_();
    c.inputs.push_back(t);
  }
  return c;
}

// c with its products routed as the llvm backend routes them; `routed` counts them.
Contractions through_onednn(const Contractions& c, int* routed) {
  Contractions r = c;
  if (!c.count) return r;
  r.graph = tcap::compiler::gemms_through_onednn(c.graph, "gemm_floor_onednn");
  for (const auto& n : r.graph.nodes()) *routed += n.op == "tcap::onednn_mm";
  return r;
}

Variant floor_variant(const char* name, std::shared_ptr<Contractions> fwd, std::shared_ptr<Contractions> bwd) {
  auto fi = fwd->count ? std::make_shared<tcap::Interpreter>(fwd->graph) : nullptr;
  auto bi = bwd->count ? std::make_shared<tcap::Interpreter>(bwd->graph) : nullptr;
  Variant v{name, [fwd, bwd, fi, bi](Sample& s) {
              at::NoGradGuard no_grad;
              s.start();
              if (fi) fi->run(fwd->inputs);
              s.stop("fwd_us");
              s.start();
              if (bi) bi->run(bwd->inputs);
              s.stop("bwd_us");
            }};
  v.fixed = {{"contractions", static_cast<double>(fwd->count + bwd->count)}};
  return v;
}

// The gemm_floor variants (Note [GEMM floors]) from a tcap::compile of the workload:
// through ATen, and, when `onednn` and some product goes there, through oneDNN.
std::vector<Variant> gemm_floor_variants(const std::string& workload, const MakeStep& make_step, bool aten, bool onednn) {
  tcap::CompileOptions o;
  o.name = workload + "_gemm_floor";
  auto step = std::make_shared<Step>(make_step(&o));
  step->what = workload + "/gemm_floor";
  compile_first_call(*step);
  const auto entries = step->compiled->entries();
  auto fwd = std::make_shared<Contractions>(contractions_of(entries.at(0).partition.forward));
  auto bwd = std::make_shared<Contractions>(contractions_of(entries.at(0).partition.backward));
  std::vector<Variant> out;
  if (fwd->count + bwd->count == 0) {
    if (aten) out.push_back(Variant::skip("gemm_floor", "no matmuls or convolutions", false));
    if (onednn) out.push_back(Variant::skip("gemm_floor_onednn", "no matmuls or convolutions", false));
    return out;
  }
  if (aten) out.push_back(floor_variant("gemm_floor", fwd, bwd));
  if (onednn) {
    int routed = 0;
    auto fo = std::make_shared<Contractions>(through_onednn(*fwd, &routed));
    auto bo = std::make_shared<Contractions>(through_onednn(*bwd, &routed));
    if (routed) out.push_back(floor_variant("gemm_floor_onednn", fo, bo));
    else out.push_back(Variant::skip("gemm_floor_onednn", "no product goes through oneDNN here", false));
  }
  return out;
}

}  // namespace

std::vector<Variant> make_variants(const std::string& workload, const Options& opts, Tolerance tol,
                                   const MakeStep& make_step) {
  auto eager = std::make_shared<Step>(make_step(nullptr));
  eager->what = workload + "/eager";
  run_untimed(*eager);  // the first eager run pays one-time costs, not the captures below

  std::vector<Variant> variants;
  // CPU tensor bytes mean nothing on a CUDA device (Note [Benchmarks on a CUDA device]).
  const bool on_cpu = opts.device == "cpu";
  // Appends the byte metrics, in report order; saved_bytes where the variant has one.
  auto add_bytes = [&](Variant& v, const Bytes& b, std::optional<int64_t> saved) {
    if (!on_cpu) return;
    v.fixed.emplace_back("peak_bytes", static_cast<double>(b.peak));
    if (saved) v.fixed.emplace_back("saved_bytes", static_cast<double>(*saved));
    v.fixed.emplace_back("held_bytes", static_cast<double>(b.held));
    v.fixed.emplace_back("kept_bytes", static_cast<double>(b.kept));
  };
  if (opts.wants("eager")) {
    const Bytes b = on_cpu ? measure_bytes(*eager) : Bytes{};
    Variant v{"eager", [eager](Sample& s) { run_timed(*eager, s); }};
    v.fixed = {{"compile_ms", 0}, {"entry_compile_ms", 0}};
    add_bytes(v, b, b.held);
    variants.push_back(std::move(v));
  }
  if (opts.wants("gemm_floor") || opts.wants("gemm_floor_onednn")) {
    try {
      for (auto& v : gemm_floor_variants(workload, make_step, opts.wants("gemm_floor"), opts.wants("gemm_floor_onednn"))) {
        variants.push_back(std::move(v));
      }
    } catch (const std::exception& e) {
      variants.push_back(Variant::skip("gemm_floor", first_line(e.what()), true));
    }
  }
  struct Spec {
    const char* name;
    const char* backend;
    tcap::Partitioner partitioner;
    bool cuda_graphs = false;
    const char* switched_off = nullptr;  // a TCAP_* switch set to 0 while the variant compiles
  };
  const std::vector<Spec> specs =
      on_cpu ? std::vector<Spec>{{"tcap_eager", "eager", tcap::Partitioner::MinCut},
                                 {"tcap_eager_default", "eager", tcap::Partitioner::Default},
                                 {"tcap_llvm", "llvm", tcap::Partitioner::MinCut},
                                 {"tcap_llvm_relu_after", "llvm", tcap::Partitioner::MinCut, false,
                                  "TCAP_RELU_INSIDE_GEMMS"}}
             : std::vector<Spec>{{"tcap_eager", "eager", tcap::Partitioner::MinCut},
                                 {"tcap_cuda", "cuda", tcap::Partitioner::MinCut},
                                 {"tcap_cuda_graphs", "cuda", tcap::Partitioner::MinCut, true}};
  for (const auto& spec : specs) {
    // A variant with a switch off runs only when named (--variants): it is an A/B of a pass.
    if (!opts.wants(spec.name) || (spec.switched_off && opts.variants.empty())) continue;
    tcap::CompileOptions o;
    o.name = workload;
    o.backend = spec.backend;
    o.partitioner = spec.partitioner;
    o.cuda_graphs = spec.cuda_graphs;
    struct Switch {  // set for the variant's compiles, unset after them (even on a throw)
      const char* name;
      explicit Switch(const char* n) : name(n) {
        if (name) ::setenv(name, "0", 1);
      }
      ~Switch() {
        if (name) ::unsetenv(name);
      }
    };
    try {
      Switch off(spec.switched_off);
      // One wall time each is noisy: the process's first capture pays one-time
      // initialisation, and fresh heap pages fault in during a workload's first compiles.
      std::shared_ptr<Step> step;
      std::vector<double> compile_ms_of, entry_ms_of;
      for (int k = 0; k < (opts.quick ? 1 : kCompiles); ++k) {
        step = std::make_shared<Step>(make_step(&o));
        step->what = workload + "/" + spec.name;
        compile_ms_of.push_back(compile_first_call(*step));
        entry_ms_of.push_back(step->compiled->entries().at(0).compile_ms);
      }
      // First: its priming iteration is the first replay.
      const Bytes b = on_cpu ? measure_bytes(*step) : Bytes{};
      // With CUDA graphs the second call captures the graphs and the third replays them:
      // the values compared are a replay's.
      if (spec.cuda_graphs) {
        for (int k = 0; k < 2; ++k) run_untimed(*step);
      }
      check_matches(*step, *eager, tol);
      const int64_t saved = step->compiled->entries().at(0).partition.saved_bytes;
      Variant v{spec.name, [step](Sample& s) { run_timed(*step, s); }};
      v.fixed = {{"compile_ms", quantile(compile_ms_of, 0.5)}, {"entry_compile_ms", quantile(entry_ms_of, 0.5)}};
      add_bytes(v, b, saved);
      variants.push_back(std::move(v));
    } catch (const std::exception& e) {
      // A backend that does not exist yet (tcap::compile's "unknown backend", seen when the
      // first call's entry is compiled) is skipped; any other reason is a failure.
      const std::string why = e.what();
      const bool unavailable = why.find("unknown backend") != std::string::npos;
      variants.push_back(Variant::skip(
          spec.name, unavailable ? "backend '" + std::string(spec.backend) + "' is not available (" + first_line(why) + ")"
                                 : first_line(why),
          !unavailable));
    }
  }
  const Spec ca_specs[] = {{"ca_eager", "eager", tcap::Partitioner::MinCut},
                           {on_cpu ? "ca_llvm" : "ca_cuda", on_cpu ? "llvm" : "cuda", tcap::Partitioner::MinCut}};
  for (const auto& spec : ca_specs) {
    if (!opts.wants(spec.name)) continue;
    try {
      auto step = std::make_shared<Step>(make_step(nullptr));
      step->what = workload + "/" + spec.name;
      step->ca = std::make_shared<tcap::CompiledAutogradOptions>();
      step->ca->compile.name = workload + "_" + spec.name;
      step->ca->compile.backend = spec.backend;
      const double ms = compile_first_call(*step);
      const Bytes b = on_cpu ? measure_bytes(*step) : Bytes{};
      check_matches(*step, *eager, tol);
      Variant v{spec.name, [step](Sample& s) { run_timed(*step, s); }};
      v.fixed = {{"compile_ms", ms}};
      add_bytes(v, b, std::nullopt);
      variants.push_back(std::move(v));
    } catch (const std::exception& e) {
      const std::string why = e.what();
      const bool unavailable = why.find("cannot compile") != std::string::npos && why.find("LLVM") != std::string::npos;
      variants.push_back(Variant::skip(spec.name, first_line(why), !unavailable));
    }
  }
  return variants;
}

// bwd_us over the eager variant's (x_eager is fwd_us's, added by the harness); and each
// variant's times over the GEMM floor's (Note [GEMM floors]).
void derive_bwd_ratio(std::vector<Record>& records) {
  const Record* eager = find_variant(records, "eager");
  if (eager && eager->get("bwd_us")) {
    for (auto& r : records) {
      if (&r != eager && r.get("bwd_us")) r.set("bwd_x_eager", *r.get("bwd_us") / *eager->get("bwd_us"));
    }
  }
  for (const char* name : {"gemm_floor", "gemm_floor_onednn"}) {
    const Record* floor = find_variant(records, name);
    if (!floor || !floor->get("fwd_us") || !floor->get("bwd_us")) continue;
    const double ff = *floor->get("fwd_us"), fb = *floor->get("bwd_us");
    const std::string x = std::string("x_") + name;
    for (auto& r : records) {
      if (&r == floor || !r.get("fwd_us") || !r.get("bwd_us")) continue;
      const double f = *r.get("fwd_us"), b = *r.get("bwd_us");
      r.set(x, (f + b) / (ff + fb));
      if (ff > 0) r.set("fwd_" + x, f / ff);
      if (fb > 0) r.set("bwd_" + x, b / fb);
    }
  }
}

}  // namespace tcap::bench::compile_workloads
