// Note [The compile pipeline]
// Every graph tcap compiles goes through these two functions, and only these:
// tcap::compile's joint graphs (compile_joint), compile_step's step graphs and compiled
// autograd's backward graphs (compile_graph). Each stage is one line; its output is
// verified (ir::verify) and printed under TCAP_LOGS=pipeline, so a reader sees the
// compiler in one screen and a broken pass fails at the stage that broke the graph.
//
//   joint graph ─ partition (default | min-cut) ─┬─ forward ─┐
//                                                └─ backward ┴─ compile_graph:
//     the user's fw/bw_compiler, or
//     target (eager | cpu_llvm | cuda) ─ [llvm: ReLUs into oneDNN products]
//     ─ fuse (decompose, group, lower, generate kernels) ─ [llvm: products through oneDNN,
//     adjacent independent kernels as one launch] ─ reuse buffers
//     ─ executable (interpreter over the fused graph) ─ CUDA graphs
#include "compiler/pipeline.h"

#include "cache/entry_cache.h"
#include "compiler/backends.h"
#include "runtime/cuda_graphs.h"
#include "fuse/decompose_losses.h"
#include "fuse/lowering.h"
#include "fuse/fusion.h"
#include "passes/drop_detaches.h"
#include "passes/fold_transposes.h"
#include "passes/reuse_buffers.h"
#include "interp/hook_runner.h"
#include "runtime/buffer_pool.h"
#include "runtime/fused_kernel.h"
#include "runtime/graph_executable.h"
#include "runtime/onednn_gemm.h"
#include "fuse/horizontal.h"
#include "fuse/onednn_gemms.h"
#include "support/env.h"
#include "support/logging.h"
#include "support/stage_clock.h"

#include <tcap/graph_json.h>
#include <tcap/interpreter.h>

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <mutex>
#include <optional>
#include <sstream>

namespace tcap {

using compiler::choose_target;
using compiler::kernel_maker;
using compiler::Target;

namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

// Verifies a stage's output and prints it under TCAP_LOGS=pipeline.
const ir::Graph& stage(const ir::Graph& g, const std::string& what, const char* after) {
  ir::verify(g);
  TCAP_LOG(Pipeline, what << " after " << after << ":\n" << ir::to_string(g));
  return g;
}

// Note [Where a compile spends its time]
// Under TCAP_LOGS=perf every compiled graph says how long each stage took, fusion's steps
// apart ("'f.3.forward' compiled in 0.92 ms: simplify 0.02, fuse 0.61 (decompose 0.09,
// group 0.05, lower 0.1, kernels 0.25, rewrite 0.12), ..."), and every joint graph how long
// its partition took: where a dynamic entry's specialization at new sizes goes (the same
// stages again, minus LLVM, whose kernels compile at the graph's first run) and what a
// change to a pass costs. Each stage's time includes its verification (ir::verify). The
// laps are kept as numbers (support/stage_clock.h) and written only when the log is on.

// Kernels a maker left Compiling, for later (Note [Kernels compiled in the background],
// Note [Kernels compiled at their first run]), and where their LLVM IR is dumped.
struct KernelsToCompile {
  std::vector<std::shared_ptr<runtime::FusedKernel>> kernels;
  std::vector<std::string> ll_paths;
};

// Where TCAP_DUMP_DIR's files of kernel `name` of graph `what` go, without the extension.
std::string kernel_dump_base(const std::string& dump_dir, const std::string& what, const std::string& name) {
  return dump_dir + "/kernels/" + what + "." + name;
}

// The fusion pass with each kept group's kernel made by `make` and added to `table`, the
// graph's own (Note [A compiled graph owns its kernels]); those `make` left Compiling go
// to `later` (when given).
ir::Graph fuse_graph(const ir::Graph& g, const std::string& what, const std::string& dump_dir,
                     const c10::Device& device, const KernelMaker& make, runtime::KernelTable* table,
                     KernelsToCompile* later = nullptr, StageClock::Laps* steps = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  fuse::FusionOptions opts;
  opts.device = device;
  // Kernels compiled at their first run (`later`): here the maker only plans each kernel
  // and looks its code up, some microseconds; threads started for that cost more than the
  // lookups (a thread's first kernel builds its LLVM target), about 2 ms a graph, which a
  // dynamic entry paid at every new size.
  if (later) opts.compile_threads = 1;
  opts.compile = [&](const fuse::FusedGroup& fg, std::string* why) -> int64_t {
    try {
      auto fk = std::make_shared<runtime::FusedKernel>();
      fk->name = fg.name;
      fk->kernel = fg.kernel;
      fk->device = device;
      make(fg, *fk);
      fk->inputs = fg.input_metas;
      fk->outputs = fg.output_metas;
      fk->fallback = fg.fallback;
      if (!dump_dir.empty()) {
        const std::string base = kernel_dump_base(dump_dir, what, fg.name);
        std::filesystem::create_directories(dump_dir + "/kernels");
        write_file(base + ".kir", kir::to_string(fg.kernel));
        if (fk->compiled) {
          const auto file = fk->compiled->dump();
          if (!file.first.empty()) write_file(base + file.first, file.second);
        }
      }
      // At the group's ordinal, not in the order compiles finish on several threads (Note
      // [Parallel kernel compilation]): the fused graph is the same for any thread count.
      return table->put(fg.ordinal, std::move(fk));
    } catch (const c10::Error& e) {
      *why = e.what_without_backtrace();
      return -1;
    }
  };
  fuse::FusionResult res = fuse::fuse(g, opts);
  for (const auto& fg : res.groups) {  // Note [Fused results written in place]
    if (fg.output_into_input.empty()) continue;
    if (auto k = table->at(fg.kernel_id)) k->output_into_input = fg.output_into_input;
  }
  for (const auto& fg : res.groups) {
    if (!later) break;
    auto k = table->at(fg.kernel_id);
    if (!k || k->code.load(std::memory_order_relaxed) != runtime::FusedKernel::Compiling) continue;
    later->kernels.push_back(std::move(k));
    later->ll_paths.push_back(dump_dir.empty() ? "" : kernel_dump_base(dump_dir, what, fg.name) + ".ll");
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  TCAP_LOG(Fusion, what << ": " << res.groups.size() << " fused kernels (" << ms << " ms)\n"
                        << res.explain() << "fused graph:\n" << ir::to_string(res.graph));
  if (log_enabled(LogChannel::Fusion)) {
    for (const auto& fg : res.groups) TCAP_LOG(Fusion, kir::to_string(fg.kernel));
  }
  if (!dump_dir.empty()) ir::save_json(res.graph, dump_dir + "/" + what + ".fused.json");
  if (steps) *steps = std::move(res.times);
  return std::move(res.graph);
}

// Note [Kernels compiled at their first run]
// Every front door compiles an entry's graphs before any call replays them (tcap::compile
// when the capture's backward has run, compile_step and compiled autograd once a capture is
// chosen), and with the llvm backend most of a compile is LLVM. A program whose sizes vary
// captures its first sizes, then others; code compiled for the first sizes with their
// numbers built in would be compiled again, reading them at launch, as soon as a second
// size of its kernel structure comes (Note [Sizes at launch]), and a graph that is never
// run (an entry replaced before its first replay) would pay for nothing. So with the llvm
// backend (and kernels not compiled in the background) fusion forms, lowers and plans every
// group when the graph is compiled (a group the renderer cannot plan stays ATen calls, as
// always) and registers each kernel's numbers with its structure; the kernels not already
// in the cache are compiled when the graph first runs, all of them, in parallel, before any
// runs. By then code of their structure compiled for other sizes may serve them (the first
// entry of a program whose sizes changed before it replayed is served by the code its
// dynamic entry compiled). The values are those the kernels would give at compile time;
// what moves is when LLVM runs, and which code serves a kernel depends only on the order
// of the sizes the program met, never on timing.
// With the kernels compiled in the background, the first run submits them to the
// background thread instead (and runs their ATen ops until they are ready), for the same
// reason: by then the sizes met before it have told each structure which numbers vary.
Executable compiled_at_first_run(Executable inner, const std::string& what, KernelsToCompile pending,
                                 bool in_background) {
  if (pending.kernels.empty()) return inner;
  struct State {
    std::once_flag once;
    std::string what;
    KernelsToCompile pending;
    bool in_background = false;
  };
  auto state = std::make_shared<State>();
  state->what = what;
  state->pending = std::move(pending);
  state->in_background = in_background;
  return [inner = std::move(inner), state](std::vector<at::Tensor> in) {
    std::call_once(state->once, [&state] {
      if (state->in_background) {
        compiler::compile_later(state->what, state->pending.kernels, state->pending.ll_paths);
      } else {
        compiler::compile_now(state->what, state->pending.kernels, state->pending.ll_paths);
      }
      state->pending = {};
    });
    return inner(std::move(in));
  };
}

// g with ops run in place on intermediates that die there (passes/reuse_buffers.h), the
// count logged under perf as `what`'s; the last rewrite of every graph an interpreter runs.
ir::Graph with_buffers_reused(const ir::Graph& g, const std::string& what) {
  int rewritten = 0;
  ir::Graph h = passes::reuse_buffers(g, &rewritten);
  TCAP_LOG(Perf, what << ": " << rewritten << " ops run in place on a dying intermediate");
  return h;
}

// The rewrites every compiled graph gets before fusion (the interpreter that runs the
// result runs it below autograd, which drop_detaches needs); each result is a stage.
ir::Graph simplify(const ir::Graph& g, const std::string& what) {
  int folded = 0;
  ir::Graph h = passes::fold_transposes(g, &folded);
  if (folded > 0) {
    stage(h, what, "fold_transposes");
    TCAP_LOG(Perf, what << ": " << folded << " pairs of transposes that cancel dropped");
  }
  int detaches = 0;
  h = passes::drop_detaches(h, &detaches);
  if (detaches > 0) {
    stage(h, what, "drop_detaches");
    TCAP_LOG(Perf, what << ": " << detaches << " detaches of tensors made in the graph dropped");
  }
  return h;
}

}  // namespace

namespace compiler {

namespace {

// Note [Cross-entropy at the bandwidth floor] (fuse/decompose_losses.cpp): the rewrite
// decides what the partitioner saves, so it runs on the joint graph, for targets that fuse
// (where no user compiler receives the graphs).
JointGraph losses_decomposed(const JointGraph& joint, const std::string& name, const c10::Device& device) {
  fuse::Decomposed d = fuse::decompose_losses(joint.graph, device);
  for (const auto& line : d.decisions) TCAP_LOG(Fusion, name << " (joint graph): " << line);
  if (d.count == 0) return joint;
  JointGraph j = joint;
  j.graph = std::move(d.graph);
  stage(j.graph, name, "decompose_losses");
  return j;
}

}  // namespace

namespace {

// The llvm backend's choice for a product (Note [GEMMs through oneDNN]), its reason in *why.
bool product_through_onednn(int64_t m, int64_t k, int64_t n, const std::vector<int64_t>& as,
                            const std::vector<int64_t>& bs, bool bias, std::string* why) {
  double aten = 0, onednn = 0;
  const bool faster = runtime::onednn_gemm_is_faster({m, k, n, as, bs, bias}, &aten, &onednn);
  std::ostringstream s;
  s << "[" << m << ", " << k << "] @ [" << k << ", " << n << "]: its class measured " << onednn << " ms through oneDNN, "
    << aten << " ms through ATen";
  *why = s.str();
  return faster;
}

// Note [ReLU inside the product]: the choice for a ReLU after such a product.
bool relu_inside(int64_t m, int64_t k, int64_t n, const std::vector<int64_t>& as, const std::vector<int64_t>& bs,
                 bool bias, std::string* why) {
  double apart = 0, inside = 0;
  const bool faster = runtime::onednn_relu_inside_is_faster({m, k, n, as, bs, bias}, &apart, &inside);
  std::ostringstream s;
  s << "[" << m << ", " << k << "] @ [" << k << ", " << n << "]: its class measured " << inside
    << " ms with the ReLU inside, " << apart << " ms with the ReLU after";
  *why = s.str();
  return faster;
}

bool onednn_route_on() { return Config::get().onednn_gemms && runtime::onednn_gemm_available(); }

}  // namespace

ir::Graph gemms_through_onednn(const ir::Graph& g, const std::string& what) {
  if (!onednn_route_on()) return g;
  fuse::Decomposed d = fuse::gemms_through_onednn(g, product_through_onednn);
  for (const auto& line : d.decisions) TCAP_LOG(Fusion, what << ": " << line);
  if (d.count == 0) return g;
  return stage(d.graph, what, "gemms_through_onednn");
}

ir::Graph relu_inside_gemms(const ir::Graph& g, const std::string& what) {
  // Switches read at each compile: tests and the bench's same-binary comparisons set them
  // between compiles.
  if (!onednn_route_on() || !env_switch("TCAP_RELU_INSIDE_GEMMS", true)) return g;
  fuse::Decomposed d = fuse::relu_inside_gemms(g, product_through_onednn, relu_inside);
  for (const auto& line : d.decisions) TCAP_LOG(Fusion, what << ": " << line);
  if (d.count == 0) return g;
  return stage(d.graph, what, "relu_inside_gemms");
}

ir::Graph horizontal_kernels(const ir::Graph& g, const std::string& what) {
  if (!env_switch("TCAP_HORIZONTAL_KERNELS", true)) return g;
  fuse::HorizontalResult r = fuse::horizontal_kernels(g);
  for (const auto& line : r.decisions) TCAP_LOG(Fusion, what << ": " << line);
  if (r.runs == 0) return g;
  TCAP_LOG(Perf, what << ": " << r.kernels << " kernels launched as " << r.runs << " (Note [Horizontal kernels])");
  return stage(r.graph, what, "horizontal_kernels");
}

namespace {

// compile_graph, for a target already chosen (`known`: compile_joint's, whose graphs share
// the joint graph's devices) or chosen here.
Executable compile_graph_for(const ir::Graph& g, const CompileOptions& o, const std::string& what,
                             const GraphCompiler& user, bool check_host_values, const Target* known) {
  stage(g, what, "capture");
  Executable exe;
  if (user) {
    TORCH_INTERNAL_ASSERT(!check_host_values, "host values cannot be checked inside a user's compiler");
    exe = user(g);
  } else {
    StageClock clock;  // Note [Where a compile spends its time]
    StageClock::Laps fusion_steps;
    const Target target = known ? *known : choose_target(o.backend, g, what);
    auto kernels = std::make_shared<runtime::KernelTable>();
    KernelsToCompile first_run;
    ir::Graph h = simplify(g, what);
    clock.lap("simplify");
    if (target.kind == Backend::Llvm) {
      h = relu_inside_gemms(h, what);
      clock.lap("relu_inside_gemms");
    }
    if (target.fuses()) {
      // llvm: the kernels not in the cache compile from the graph's first run, on the
      // calling thread or the background thread (both Notes above); cuda: now.
      const bool later = target.kind == Backend::Llvm;
      h = stage(fuse_graph(h, what, cache::dump_dir_of(o), target.device, kernel_maker(target, later), kernels.get(),
                           later ? &first_run : nullptr, &fusion_steps),
                what, "fuse");
      clock.lap("fuse");
    }
    if (target.kind == Backend::Llvm) {
      h = gemms_through_onednn(h, what);
      clock.lap("gemms_through_onednn");
      h = horizontal_kernels(h, what);
      clock.lap("horizontal_kernels");
    }
    h = stage(with_buffers_reused(h, what), what, "reuse_buffers");
    clock.lap("reuse_buffers");
    exe = compiled_at_first_run(runtime::interpreter_executable(h, what, check_host_values, std::move(kernels)),
                                what, std::move(first_run), compiler::compiles_in_background(o, target));
    clock.lap("executable");
    TCAP_LOG(Perf, what << " compiled in " << std::setprecision(3) << clock.total() << " ms: "
                        << laps_text(clock.laps(), [&](const char* stage) {
                             return std::string(stage) == "fuse" ? " (" + laps_text(fusion_steps) + ")" : "";
                           }));
  }
  if (o.cuda_graphs) exe = with_cuda_graphs(std::move(exe), g, what);
  return exe;
}

}  // namespace

Executable compile_graph(const ir::Graph& g, const CompileOptions& o, const std::string& what,
                         const GraphCompiler& user, bool check_host_values) {
  return compile_graph_for(g, o, what, user, check_host_values, nullptr);
}

CompiledJoint compile_joint(const JointGraph& joint, bool has_backward, const CompileOptions& o,
                            const std::string& name, bool check_host_values) {
  stage(joint.graph, name, "joint capture");
  CompiledJoint c;
  // What the graphs are compiled for, chosen once (its fallback logged once), where no
  // user compiler takes them.
  Target target;
  const bool chosen = o.backend != Backend::Eager && !o.fw_compiler && !o.bw_compiler;
  if (chosen) target = choose_target(o.backend, joint.graph, name);
  MinCutOptions min_cut;
  if (target.fuses()) min_cut.fuses = [](const ir::Node& n) { return fuse::joins_kernels(n); };
  StageClock clock;  // Note [Where a compile spends its time]
  const JointGraph& to_partition = target.fuses() ? losses_decomposed(joint, name, target.device) : joint;
  if (target.fuses()) clock.lap("decompose_losses");
  c.part = partition(to_partition, has_backward ? o.partitioner : Partitioner::Default, min_cut);
  stage(c.part.forward, name + ".forward", "partition");
  if (has_backward) stage(c.part.backward, name + ".backward", "partition");
  clock.lap("partition");
  TCAP_LOG(Perf, name << " joint graph partitioned in " << std::setprecision(3) << clock.total()
                       << " ms: " << laps_text(clock.laps()));
  const Target* known = chosen ? &target : nullptr;
  c.forward = compile_graph_for(c.part.forward, o, name + ".forward", o.fw_compiler, check_host_values, known);
  if (has_backward) {
    c.backward = compile_graph_for(c.part.backward, o, name + ".backward", o.bw_compiler, false, known);
  }
  return c;
}

}  // namespace compiler

Executable eager_backend(const ir::Graph& g) {
  return runtime::interpreter_executable(with_buffers_reused(g, "eager backend"), "graph");
}

Executable llvm_backend(const ir::Graph& g) {
  CompileOptions o;
  o.backend = Backend::Llvm;
  return compiler::compile_graph(g, o, "graph");
}

Executable fused_backend(const ir::Graph& g, const std::string& what, const std::string& dump_dir,
                         const c10::Device& device, const KernelMaker& make_kernel) {
  auto kernels = std::make_shared<runtime::KernelTable>();
  ir::Graph h = fuse_graph(g, what, dump_dir, device, make_kernel, kernels.get());
  return runtime::interpreter_executable(with_buffers_reused(h, what), what, /*check_host_values=*/false,
                                         std::move(kernels));
}

}  // namespace tcap
