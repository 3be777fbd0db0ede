// The compiled step's entry and its implementation, shared by the two files of the front
// door: train_step.cpp (the serving loop's door, replay, the public API) and
// step_compile.cpp (capturing a step and compiling it into an entry). See Note [Compiling a
// whole training step] in train_step.cpp. Private to csrc/step.
#pragma once

#include <tcap/train_step.h>
#include <tcap/graph_json.h>
#include <tcap/interpreter.h>

#include "step/fused_optimizers.h"
#include "step/optimizers.h"
#include "step/step_captures.h"
#include "step/step_history.h"
#include "step/step_inputs.h"
#include "step/verify_step.h"
#include "compiler/pipeline.h"
#include "aot/region.h"
#include "aot/region_entry.h"
#include "aot/replay_function.h"
#include "cache/entry_cache.h"
#include "cache/unused_options.h"
#include "cache/verify.h"
#include "interp/hook_runner.h"
#include "capture/engine_shim.h"
#include "capture/hooks.h"
#include "capture/recorder.h"
#include "capture/session.h"
#include "passes/host_graph.h"
#include "passes/scalar_inputs.h"
#include "runtime/background_compiles.h"
#include "support/logging.h"

#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace tcap {
namespace step {

enum class GradEffect { Keep, Clear, Set };

// What a compiled step is: its graph and everything a replay needs to know about it,
// fixed once the entry is compiled. A specialization to new sizes is a copy of the plan
// with the graph specialized (and the history slice made again from it), compiled.
struct StepPlan {
  ir::Graph graph;          // the latest capture, then the compiled graph
  std::vector<ScalarPatch> patches;
  std::vector<GradEffect> grad_effect;  // per parameter
  std::vector<int> grad_output;         // per parameter: output index (Set)
  size_t num_user_outputs = 0;
  std::vector<size_t> mutated_inputs;
  // Checked inline and drawing random numbers: the devices whose generators a replay that
  // stops at a changed host value puts back (it runs another way then, and must draw
  // eager's numbers). Empty otherwise.
  std::vector<c10::Device> rng_devices;
  // Per opaque hook slot: (gathered tensor, position in its leaf hooks) (Note [Hooks in a
  // compiled step]).
  std::vector<std::pair<size_t, size_t>> hook_slots;
  // Parameters whose updates run as one fused call with one step count (Note [Fused
  // optimizer steps]).
  std::vector<step::MultiTensorUpdate> fused_groups;
  // Outputs returned with autograd history a later backward may use, and the slice that
  // gives them one on a replay (Note [Outputs with history from a replayed step]).
  std::vector<size_t> with_history;
  std::vector<bool> buffer_inputs;  // per input: a module buffer (the only inputs the slice may write)
  std::shared_ptr<const step::HistorySlice> history;
  // Per history node behind an input (StepInputs::histories): the step's backward ran it
  // without retain_graph, so a replay frees it as that backward did.
  std::vector<bool> uses_history;
};

struct StepEntry : cache::Entry, StepPlan {
  // A Candidate becomes Compiled, or runs eagerly from then on (cache::Entry::eager(),
  // Note [Calls that run eagerly]).
  enum class State { Candidate, Compiled } state = State::Candidate;
  std::mutex mutex;         // state changes
  std::vector<std::vector<HostState>> host;  // per optimizer, per parameter: at the latest capture
  // The plan's graph with its host scalars as inputs (Note [Host scalars as graph
  // inputs]), compiled: takes the step's tensors, then one number per patch. The 0-dim
  // tensors those numbers travel in, written in place per replay (calls are serial, and
  // the interpreter reads them as its run starts): no allocation per scalar per step.
  Executable exe;
  std::vector<at::Tensor> scalar_inputs;
  // The second capture as recorded, and its arguments that are host scalars (they differ
  // per call by design): what a check capture at new sizes is compared with (Note
  // [Checking a new size]).
  ir::Graph record;
  std::vector<std::pair<ir::NodeId, size_t>> record_scalars;
  std::shared_ptr<cache::Entry> size_miss_of;  // for generalizing over sizes at compile time
  std::vector<size_t> changed;
  std::shared_ptr<cache::Specializations<StepEntry>> specialized = std::make_shared<cache::Specializations<StepEntry>>();
};

}  // namespace step

// The two files of the front door name these without their namespace.
using step::GradEffect;
using step::HostScalar;
using step::HostState;
using step::OptimizerAdapter;
using step::ScalarPatch;
using step::StepEntry;
using step::StepPlan;

struct CompiledStep::Impl {
  std::vector<std::unique_ptr<OptimizerAdapter>> opts;
  step::StepParts parts;  // the models, their submodules and opts (as the aot helpers take them)
  CompiledFunction::Fn fn;
  CompileOptions options;
  std::unique_ptr<cache::EntryCache> cache;
  std::mutex call_mutex;
  CompiledStep::Call last;  // written under call_mutex
  cache::VerifyCounter verifier;  // verify mode: which replays to check

  std::string who() const { return "step '" + options.name + "'"; }

  // Note [A structure key without names]: a replay gathers without names; a capture with.
  step::StepInputs gather(const std::vector<at::Tensor>& user, bool with_names) const {
    return step::gather_step_inputs(parts, user, with_names);
  }
  step::StepInputs gather_named(const std::vector<at::Tensor>& user, const step::StepInputs& unnamed) const {
    step::StepInputs g = gather(user, true);
    TORCH_INTERNAL_ASSERT(g.structure == unnamed.structure && g.ts.size() == unnamed.ts.size(),
                          "tcap: compile_step's gathers with and without names disagree");
    return g;
  }

  // The step's own code, run eagerly (counted by the serving loop when it decided so).
  std::vector<at::Tensor> eager_call(const std::vector<at::Tensor>& user) {
    last.kind = CompiledStep::Call::Kind::Eager;
    last.host_values.clear();
    return fn(user);
  }
  // ... when an entry decides so.
  std::vector<at::Tensor> run_eager(const std::vector<at::Tensor>& user) {
    cache->stats().count(&CompileStats::eager_calls);
    return eager_call(user);
  }

  // Marks e eager for its guards; a fallback unless by design (Note [Calls that run eagerly]).
  void go_eager(StepEntry& e, const std::string& why, bool by_design = false) {
    cache->run_eagerly_from_now(e, why, by_design);
  }

  // Runs the step while recording it into e (a check capture does not count as a capture).
  std::vector<at::Tensor> capture(StepEntry& e, const std::vector<at::Tensor>& user, const step::StepInputs& g,
                                  bool count_capture = true);
  // Note [Checking a new size]: the step run while recording (into `recorded`, which the
  // entry cache compares with dynamic entries' records); returns the step's outputs.
  std::vector<at::Tensor> check_call(const std::vector<at::Tensor>& user, const step::StepInputs& g,
                                     cache::SizeCheckRecording* recorded);
  // Note [A step compiled from captures at two sizes] (step_compile.cpp): e's first capture
  // compiled with `a`'s capture at other sizes standing in for a first capture here.
  // Returns whether e was compiled; false leaves e a candidate, as it was.
  bool compile_from_other_sizes(StepEntry& e, const StepEntry& a, const step::StepInputs& g);
  // Which parameter (optimizer, index) each input node of e's graph is.
  std::unordered_map<ir::NodeId, std::pair<size_t, size_t>> param_inputs(const StepEntry& e,
                                                                         const step::StepInputs& g) const;
  void verify_and_compile(StepEntry& e, const ir::Graph& first, const std::vector<std::vector<HostState>>& host1,
                          const step::StepInputs& g);
  // The rest of verify_and_compile, for two captures whose comparison `cmp` found them alike.
  void compile_compared(StepEntry& e, step::StepComparison cmp, const step::StepInputs& g);
  // `tape`: a verified replay's, whose taped hook calls serve the step's opaque hooks
  // (Note [Hooks called once under verify], capture/hooks.h).
  std::vector<at::Tensor> replay(const StepEntry& e, const step::StepInputs& g, const std::vector<at::Tensor>& primals,
                                 const std::vector<at::Tensor>& user, capture::HookTape* tape = nullptr);
  struct ServedCall;
  std::vector<at::Tensor> call(const std::vector<at::Tensor>& user);
  // A verified replay (Note [Verifying a compiled step]), or nullopt where the entry cannot
  // be verified (logged): its outputs have a history node of their own.
  std::optional<std::vector<at::Tensor>> verified(const StepEntry& served, const StepEntry& guarded, const step::StepInputs& g,
                                                  const std::vector<at::Tensor>& primals,
                                                  const std::vector<at::Tensor>& user, const VerifyOptions& v);
  std::shared_ptr<const StepEntry> specialize(const std::shared_ptr<const StepEntry>& e, const std::vector<int64_t>& key);
  // Note [Specializations in the background]: e at class values `key`, made on the
  // background compile thread; null while it is being made (the call runs eagerly).
  std::shared_ptr<const StepEntry> specialize_in_background(const std::shared_ptr<const StepEntry>& e,
                                                            const std::vector<int64_t>& key);
  bool in_background() const { return runtime::background_compiles_on(options); }
  // The step graph with its patched scalars as inputs, through the one pipeline (the
  // options' fw_compiler when set: the step is one graph, run without autograd).
  static Executable compile_step_graph(const CompileOptions& options, const ir::Graph& g,
                                       const std::vector<ScalarPatch>& patches, const std::string& what,
                                       bool check_host_values) {
    std::vector<passes::ScalarArg> args;
    for (const auto& p : patches) {
      args.push_back({p.node, p.arg, std::string(step::to_string(p.expr)) + ".opt" + std::to_string(p.opt) + ".p" +
                                         std::to_string(p.param)});
    }
    return compiler::compile_graph(passes::scalars_as_inputs(g, args), options, what, options.fw_compiler,
                                   check_host_values);
  }
  static std::vector<at::Tensor> scalar_tensors(size_t n) {
    std::vector<at::Tensor> out;
    for (size_t k = 0; k < n; ++k) out.push_back(passes::host_scalar_input(0.0));
    return out;
  }
  void generalize(const StepEntry& a, StepEntry& b);
  void take_place_of_static(StepEntry& e);
  // e's history slice from its graph (Note [Outputs with history from a replayed step]);
  // why it has none where it needs one, else "". `who` names the step in the log.
  static std::string build_history(StepEntry& e, const std::string& who);
};

}  // namespace tcap
