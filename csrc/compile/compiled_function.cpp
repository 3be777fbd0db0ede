// tcap::compile (include/tcap/compile.h): the cache of compiled entries, their guards,
// and replay through a torch::autograd::Function.
//
// Note [Replaying a compiled region]
// A hit calls ReplayFunction::apply(TensorList primals, entry). Its forward runs the
// compiled forward graph (below autograd) and saves what the partition chose; its
// backward runs the compiled backward graph and returns one gradient per primal. The
// engine then routes those gradients to the real AccumulateGrad nodes, so .grad,
// leaf hooks and optimizers behave as in eager. Two cases recompute instead: a double
// backward (create_graph=true: the compiled backward makes no graph) and a gradient
// arriving for an output whose gradient the capture never saw. Both re-run the recorded
// forward through autograd from the primals (RNG state restored, mutated buffers cloned)
// and differentiate it with torch::autograd::grad, which is exact and differentiable.
#include <tcap/compile.h>
#include <tcap/graph_json.h>
#include <tcap/interpreter.h>

#include "compile/backends.h"
#include "compile/cuda_graphs.h"
#include "compile/guards.h"
#include "compile/inplace.h"
#include "compile/int_patches.h"
#include "compile/region.h"
#include "compile/replay_node.h"
#include "runtime/buffer_pool.h"
#include "support/logging.h"

#include <ATen/core/Generator.h>
#include <ATen/Context.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/custom_class.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <map>
#include <unordered_map>

namespace tcap {

Executable eager_backend(const ir::Graph& g) {
  int rewritten = 0;
  auto interp = std::make_shared<Interpreter>(aot::reuse_buffers(g, &rewritten));
  TCAP_LOG(Perf, "eager backend: " << rewritten << " ops run in place on a dying intermediate");
  interp->keep_values(false);
  auto mu = std::make_shared<std::mutex>();
  return [interp, mu](std::vector<at::Tensor> in) {
    std::lock_guard<std::mutex> lock(*mu);
    runtime::PoolScope pool;  // Note [CPU buffer pool]
    return interp->run(std::move(in));
  };
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using aot::AutocastSig;

std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream ss;
  ss << s;
  return ss.str();
}

// What a guard remembers of one input tensor.
struct TensorSig {
  bool defined = false;
  c10::ScalarType dtype = c10::kFloat;
  c10::Device device = c10::kCPU;
  std::vector<int64_t> sizes, strides;
  bool requires_grad = false;
  std::vector<bool> dyn;  // per dim: any size >= 2 accepted (contiguous inputs only)
  bool any_dyn() const { return std::find(dyn.begin(), dyn.end(), true) != dyn.end(); }
  static TensorSig of(const at::Tensor& t) {
    TensorSig s;
    s.defined = t.defined();
    if (!s.defined) return s;
    s.dtype = t.scalar_type();
    s.device = t.device();
    s.sizes = t.sizes().vec();
    s.strides = t.strides().vec();
    s.requires_grad = t.requires_grad();
    return s;
  }
  // "" if t matches, else what changed.
  std::string mismatch(const at::Tensor& t) const {
    if (t.defined() != defined) return defined ? "became undefined" : "became defined";
    if (!defined) return "";
    if (t.scalar_type() != dtype) {
      return "changed dtype: " + ir::dtype_name(dtype) + " -> " + ir::dtype_name(t.scalar_type());
    }
    if (t.device() != device) return "changed device: " + device.str() + " -> " + t.device().str();
    if (any_dyn()) {
      if (t.dim() != static_cast<int64_t>(sizes.size())) {
        return "changed shape: " + shape_str(sizes) + " -> " + shape_str(t.sizes());
      }
      for (size_t d = 0; d < sizes.size(); ++d) {
        const int64_t n = t.size(static_cast<int64_t>(d));
        if (dyn[d] ? n < 2 : n != sizes[d]) {
          return "changed shape: " + shape_str(sizes) + " -> " + shape_str(t.sizes()) +
                 (dyn[d] ? " (dynamic dims need a size >= 2)" : "");
        }
      }
      if (!t.is_contiguous()) return "is no longer contiguous (its dynamic dims need it)";
    } else if (t.sizes() != c10::IntArrayRef(sizes)) {
      return "changed shape: " + shape_str(sizes) + " -> " + shape_str(t.sizes());
    }
    if (!any_dyn() && t.strides() != c10::IntArrayRef(strides)) {
      return "changed strides: " + shape_str(strides) + " -> " + shape_str(t.strides());
    }
    if (t.requires_grad() != requires_grad) {
      return std::string("changed requires_grad: ") + (requires_grad ? "true -> false" : "false -> true");
    }
    return "";
  }
  std::string str() const {
    if (!defined) return "undefined";
    std::string shape = "[";
    for (size_t d = 0; d < sizes.size(); ++d) {
      shape += (d ? ", " : "") + (d < dyn.size() && dyn[d] ? std::string("s") + std::to_string(d) : std::to_string(sizes[d]));
    }
    shape += "]";
    return ir::dtype_short_name(dtype) + shape + (any_dyn() ? " contiguous" : " stride " + shape_str(strides)) + " " +
           device.str() + (requires_grad ? " requires_grad" : "");
  }
};

// The primals' storages: which inputs share memory must stay the same.
std::vector<int> alias_classes(const std::vector<at::Tensor>& ts) {
  std::vector<const void*> keys(ts.size());
  for (size_t k = 0; k < ts.size(); ++k) {
    keys[k] = ts[k].defined() && ts[k].has_storage()
                  ? static_cast<const void*>(ts[k].storage().unsafeGetStorageImpl())
                  : static_cast<const void*>(ts[k].unsafeGetTensorImpl());
  }
  std::vector<int> out(ts.size());
  if (ts.size() <= 32) {  // the usual case: no hashing
    for (size_t k = 0; k < ts.size(); ++k) {
      size_t f = 0;
      while (keys[f] != keys[k]) ++f;
      out[k] = static_cast<int>(f);
    }
    return out;
  }
  std::unordered_map<const void*, int> first;
  for (size_t k = 0; k < ts.size(); ++k) out[k] = first.emplace(keys[k], static_cast<int>(k)).first->second;
  return out;
}

struct SharedStats {
  std::mutex mutex;
  CompileStats stats;
};

struct Entry {
  int id = 0;
  std::string fn_name;
  JointGraph joint;
  PartitionResult part;
  Executable fw, bw;
  bool has_backward = false;  // a compiled backward exists
  bool use_function = false;  // replay through ReplayFunction (grad mode on, inputs require grad)
  // Guards.
  bool grad_mode = true;
  bool inference_mode = false;
  AutocastSig autocast;
  std::vector<TensorSig> inputs;            // the call's inputs (user + module tensors)
  std::vector<std::string> input_names;
  std::vector<int> aliases;                 // alias classes of the primals
  std::vector<const c10::TensorImpl*> module_tensors;
  std::vector<bool> training;               // per submodule
  std::vector<at::Tensor> held;             // primals found during capture (closure tensors)
  std::vector<TensorSig> held_sigs;
  std::shared_ptr<Interpreter> host_guard;  // recomputes the values read on the host
  std::vector<ir::Arg> host_expected;
  std::vector<std::string> host_what;
  // Replay facts.
  std::vector<bool> output_differentiable;
  std::vector<bool> tangent_present;        // per user output
  std::vector<size_t> mutated_primals;
  bool has_rng = false;
  double compile_ms = 0;
  std::shared_ptr<SharedStats> stats;
  // Dynamic dims (Note [Dynamic dims]): how the joint graph's ints follow them, and the
  // entries specialized from it per concrete size.
  struct DimRef {
    size_t input, dim;
  };
  std::vector<DimRef> dyn_dims;
  std::vector<aot::IntPatch> patches;  // IntPatch::size indexes dyn_dims
  std::map<std::vector<int64_t>, std::shared_ptr<Entry>> specialized;
};

struct EntryHolder : torch::CustomClassHolder {
  explicit EntryHolder(std::shared_ptr<Entry> e) : entry(std::move(e)) {}
  std::shared_ptr<Entry> entry;
};

// RNG state of the default generators of the devices a graph runs on.
struct RngStates {
  std::vector<std::pair<at::Generator, at::Tensor>> states;
  static RngStates save(const std::vector<c10::Device>& devices) {
    RngStates r;
    for (const auto& d : devices) {
      at::Generator g = at::globalContext().defaultGenerator(d);
      std::lock_guard<std::mutex> lock(g.mutex());
      r.states.emplace_back(g, g.get_state());
    }
    return r;
  }
  void restore() const {
    for (const auto& [g, s] : states) {
      at::Generator gen = g;
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(s);
    }
  }
};

struct RngCapsule : torch::CustomClassHolder {
  RngStates rng;
};

// Note [Saved tensors of a compiled region]: what a ReplayFunction node keeps for its
// backward. The engine frees a built-in node's saved tensors one node at a time, as the
// backward moves up the graph; a compiled backward is one node, so a tensor saved in the
// context would live until the whole compiled backward returns (CppNode::apply holds the
// node's mutex, so release_variables() cannot be called from inside). So the saved values
// that are not outputs of the region (intermediates and primals) are kept here instead,
// and without retain_graph the backward moves them out and hands the executable the only
// references: it frees each at its last use, as the engine would (the peak memory of the
// backward is eager's, not eager's plus every saved tensor). The saved values that are
// outputs stay in the context's SavedVariables: holding an output here would be a
// reference cycle (output -> grad_fn -> context -> output). The checks SavedVariable
// makes are kept: an in-place change after the forward, and a second backward through
// a released node, are errors.
struct SavedCapsule : torch::CustomClassHolder {
  std::vector<at::Tensor> saved;      // per saved value; undefined where it is an output
  std::vector<uint32_t> versions;     // of `saved`, after the forward
  std::vector<size_t> in_context;     // the saved values kept by ctx->save_for_backward
  std::vector<at::Tensor> primals;    // for a backward that recomputes
  bool released = false;

  void release() {
    released = true;
    std::vector<at::Tensor>().swap(saved);
    std::vector<at::Tensor>().swap(primals);
  }
  // The saved values in order, checked as SavedVariable::unpack checks; moved out when
  // `take` (the backward frees them), else copied.
  std::vector<at::Tensor> unpack(const AutogradContext& ctx, const std::string& fn_name, bool take) {
    TORCH_CHECK(!released, torch::autograd::ERR_BACKWARD_TWICE);
    for (size_t k = 0; k < saved.size(); ++k) {
      if (!saved[k].defined()) continue;
      const uint32_t now = saved[k]._version();
      TORCH_CHECK(now == versions[k],
                  "one of the variables needed for gradient computation has been modified by an inplace operation: "
                  "saved tensor ", k, " of the compiled function '", fn_name, "' ([", saved[k].toString(), " ",
                  saved[k].sizes(), "]) is at version ", now, "; expected version ", versions[k], " instead.");
    }
    std::vector<at::Tensor> out;
    if (take) out.swap(saved);
    else out = saved;
    if (!in_context.empty()) {
      const auto from_ctx = ctx.get_saved_variables();
      for (size_t j = 0; j < in_context.size(); ++j) out[in_context[j]] = from_ctx[j];
    }
    if (take) release();
    return out;
  }
};

c10::intrusive_ptr<SavedCapsule> saved_capsule(const AutogradContext& ctx) {
  return c10::static_intrusive_pointer_cast<SavedCapsule>(ctx.saved_data.at("saved").toCapsule());
}

std::vector<c10::Device> devices_of(const ir::Graph& g) {
  std::vector<c10::Device> ds;
  for (const auto& v : g.values()) {
    if (std::find(ds.begin(), ds.end(), v.meta.device) == ds.end()) ds.push_back(v.meta.device);
  }
  if (ds.empty()) ds.push_back(c10::kCPU);
  return ds;
}

variable_list recompute_backward(const Entry& e, const std::vector<at::Tensor>& primals,
                                 const variable_list& grads, const RngStates* rng, bool create_graph) {
  std::optional<RngStates> current;
  if (rng) {
    current = RngStates::save(devices_of(e.part.forward));
    rng->restore();
  }
  struct Restore {
    std::optional<RngStates>& s;
    ~Restore() {
      if (s) s->restore();
    }
  } restore{current};
  at::AutoGradMode grad_on(true);
  std::vector<at::Tensor> args;
  std::vector<at::Tensor> diff_args;
  std::vector<size_t> diff_index;
  for (size_t j = 0; j < primals.size(); ++j) {
    at::Tensor t = primals[j];
    const bool mutated = std::find(e.mutated_primals.begin(), e.mutated_primals.end(), j) != e.mutated_primals.end();
    if (mutated) t = t.detach().clone();
    if (t.requires_grad()) {
      at::Tensor a = create_graph ? t.view_as(t) : t.detach().requires_grad_(true);
      diff_args.push_back(a);
      diff_index.push_back(j);
      args.push_back(a);
    } else {
      args.push_back(t);
    }
  }
  Interpreter interp(e.part.forward, /*differentiable=*/true);
  interp.keep_values(false);
  auto outs = interp.run(args);
  std::vector<at::Tensor> os, gs;
  for (size_t k = 0; k < e.part.num_user_outputs && k < grads.size(); ++k) {
    if (grads[k].defined() && outs[k].requires_grad()) {
      os.push_back(outs[k]);
      gs.push_back(grads[k]);
    }
  }
  variable_list result(primals.size() + 1);
  if (os.empty() || diff_args.empty()) return result;
  auto gi = torch::autograd::grad(os, diff_args, gs, /*retain_graph=*/create_graph, create_graph,
                                  /*allow_unused=*/true);
  for (size_t k = 0; k < diff_index.size(); ++k) result[diff_index[k]] = gi[k];
  return result;
}

struct ReplayFunction : torch::autograd::Function<ReplayFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList primals, std::shared_ptr<Entry> e) {
    std::vector<at::Tensor> ins(primals.begin(), primals.end());
    if (e->has_rng) {
      auto cap = c10::make_intrusive<RngCapsule>();
      cap->rng = RngStates::save(devices_of(e->part.forward));
      ctx->saved_data["rng"] = c10::IValue::make_capsule(cap);
    }
    auto outs = e->fw(ins);
    for (size_t j : e->mutated_primals) torch::autograd::impl::bump_version(ins[j]);
    const size_t n = e->part.num_user_outputs;
    TORCH_CHECK(outs.size() == n + e->part.saved.size(), "tcap: the compiled forward of '", e->fn_name,
                "' returned ", outs.size(), " tensors, expected ", n + e->part.saved.size());
    variable_list user(outs.begin(), outs.begin() + static_cast<std::ptrdiff_t>(n));
    // Note [Saved tensors of a compiled region]
    auto capsule = c10::make_intrusive<SavedCapsule>();
    capsule->saved.assign(std::make_move_iterator(outs.begin() + static_cast<std::ptrdiff_t>(n)),
                          std::make_move_iterator(outs.end()));
    capsule->versions.resize(capsule->saved.size());
    variable_list in_context;
    for (size_t k = 0; k < capsule->saved.size(); ++k) {
      at::Tensor& t = capsule->saved[k];
      if (!t.defined()) continue;
      const bool is_output = std::any_of(user.begin(), user.end(), [&](const at::Tensor& u) {
        return u.unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
      });
      if (is_output) {
        capsule->in_context.push_back(k);
        in_context.push_back(std::move(t));
        t = at::Tensor();
      } else {
        capsule->versions[k] = t._version();
      }
    }
    ctx->save_for_backward(in_context);
    capsule->primals = std::move(ins);
    ctx->saved_data["saved"] = c10::IValue::make_capsule(std::move(capsule));
    ctx->saved_data["entry"] = c10::IValue::make_capsule(c10::make_intrusive<EntryHolder>(e));
    variable_list nondiff;
    for (size_t k = 0; k < n; ++k) {
      if (!e->output_differentiable[k]) nondiff.push_back(user[k]);
    }
    if (!nondiff.empty()) ctx->mark_non_differentiable(nondiff);
    ctx->set_materialize_grads(false);
    return user;
  }

  // `grads` is CppNode_apply_functional's own list (custom_function.h passes its local
  // backward_inputs as an lvalue in 2.11 and never reads it after): taking it by reference
  // lets the compiled backward hold the only reference to each incoming gradient, and free
  // it at its last use, as the engine does. A list passed as an rvalue or a const one binds
  // too (then the gradients are moved or copied from there).
  template <class Grads>
  static variable_list backward(AutogradContext* ctx, Grads&& grads) {
    auto holder = c10::static_intrusive_pointer_cast<EntryHolder>(ctx->saved_data["entry"].toCapsule());
    const Entry& e = *holder->entry;
    const bool create_graph = at::GradMode::is_enabled();
    std::string why;
    if (create_graph) why = "create_graph=true (double backward)";
    else if (!e.has_backward) why = "no compiled backward (the capture saw no backward)";
    for (size_t k = 0; k < grads.size() && why.empty(); ++k) {
      if (grads[k].defined() && !e.tangent_present[k]) {
        why = "a gradient arrived for output " + std::to_string(k) + ", which had none when captured";
      }
    }
    if (!why.empty()) {
      TCAP_LOG(GraphBreaks, "'" << e.fn_name << "' entry " << e.id << ": backward recomputes eagerly: " << why);
      {
        std::lock_guard<std::mutex> lock(e.stats->mutex);
        ++e.stats->stats.backward_fallbacks;
      }
      auto capsule = saved_capsule(*ctx);
      TORCH_CHECK(!capsule->released, torch::autograd::ERR_BACKWARD_TWICE);
      std::vector<at::Tensor> primals = capsule->primals;
      if (!torch::autograd::get_current_graph_task_keep_graph()) capsule->release();
      const RngStates* rng = nullptr;
      c10::intrusive_ptr<RngCapsule> cap;
      if (ctx->saved_data.count("rng")) {
        cap = c10::static_intrusive_pointer_cast<RngCapsule>(ctx->saved_data["rng"].toCapsule());
        rng = &cap->rng;
      }
      return recompute_backward(e, primals, grads, rng, create_graph);
    }
    // Without retain_graph the executable gets the only references to the saved values
    // that are not outputs, and frees each at its last use.
    std::vector<at::Tensor> ins =
        saved_capsule(*ctx)->unpack(*ctx, e.fn_name, /*take=*/!torch::autograd::get_current_graph_task_keep_graph());
    ins.reserve(ins.size() + e.part.tangent_of.size());
    for (int k : e.part.tangent_of) {
      auto& g = grads.at(static_cast<size_t>(k));
      if (g.defined()) {
        ins.push_back(std::move(g));
      } else {
        // An output that got no gradient this time: a zero tangent (it had one at capture).
        const auto& m = e.joint.graph.value(e.joint.graph.output_values().at(static_cast<size_t>(k))).meta;
        ins.push_back(at::zeros(c10::IntArrayRef(m.sizes), at::TensorOptions().dtype(m.dtype).device(m.device)));
      }
    }
    auto outs = e.bw(std::move(ins));
    TORCH_CHECK(outs.size() == e.part.grad_of.size(), "tcap: the compiled backward of '", e.fn_name,
                "' returned ", outs.size(), " gradients, expected ", e.part.grad_of.size());
    const size_t num_primals = e.joint.num_primals;
    variable_list result(num_primals + 1);
    for (size_t k = 0; k < outs.size(); ++k) result[static_cast<size_t>(e.part.grad_of[k])] = outs[k];
    return result;
  }
};

}  // namespace

struct CompiledFunction::Impl {
  Fn fn;
  CompileOptions options;
  std::shared_ptr<torch::nn::Module> module;
  std::vector<std::string> module_names;  // parameters then buffers, at compile() time
  std::vector<std::shared_ptr<torch::nn::Module>> submodules;
  std::vector<std::shared_ptr<Entry>> entries;
  std::shared_ptr<SharedStats> stats = std::make_shared<SharedStats>();
  std::string eager_reason;
  bool warned_limit = false;
  // The capture waiting for its backward, with what is needed to finish it.
  struct Pending {
    std::shared_ptr<aot::RegionCapture> capture;
    std::shared_ptr<Entry> entry;  // guards filled, graphs not yet
    int calls_since = 0;
    bool finished = false;         // backward_finished ran (set under stats->mutex)
    std::string failure;
    std::shared_ptr<Entry> ready;  // the entry built by the backward
    std::shared_ptr<Entry> size_miss_of;  // the entry that missed on sizes only
    std::vector<Entry::DimRef> changed;
  };
  std::shared_ptr<Pending> pending;
  std::mutex pending_mutex;

  // The module's parameters then buffers, in named_parameters(true) / named_buffers(true)
  // order (submodules is that preorder), without building the dotted names each call.
  std::vector<at::Tensor> module_tensors() const {
    std::vector<at::Tensor> ts;
    if (!module) return ts;
    for (const auto& m : submodules) {
      for (auto& p : m->parameters(/*recurse=*/false)) ts.push_back(std::move(p));
    }
    for (const auto& m : submodules) {
      for (auto& b : m->buffers(/*recurse=*/false)) ts.push_back(std::move(b));
    }
    return ts;
  }

  void count(int CompileStats::*field) {
    std::lock_guard<std::mutex> lock(stats->mutex);
    ++(stats->stats.*field);
  }

  std::vector<at::Tensor> run_eager(const std::vector<at::Tensor>& inputs) {
    count(&CompileStats::eager_calls);
    return fn(inputs);
  }

  void go_eager(const std::string& why) {
    eager_reason = why;
    TCAP_LOG(GraphBreaks, "'" << options.name << "' runs eagerly: " << why);
  }

  std::string check(const Entry& e, const std::vector<at::Tensor>& call_inputs,
                    const std::vector<at::Tensor>& primals) const {
    if (at::GradMode::is_enabled() != e.grad_mode) {
      return std::string("grad mode changed: ") + (e.grad_mode ? "on -> off" : "off -> on");
    }
    if (c10::InferenceMode::is_enabled() != e.inference_mode) return "inference mode changed";
    if (!(AutocastSig::now() == e.autocast)) return "autocast state changed";
    if (call_inputs.size() != e.inputs.size()) {
      return "number of inputs changed: " + std::to_string(e.inputs.size()) + " -> " +
             std::to_string(call_inputs.size());
    }
    for (size_t k = 0; k < call_inputs.size(); ++k) {
      std::string m = e.inputs[k].mismatch(call_inputs[k]);
      if (!m.empty()) return "input '" + e.input_names[k] + "' " + m;
    }
    if (module) {
      for (size_t i = 0; i < e.module_tensors.size(); ++i) {
        const size_t pos = call_inputs.size() - e.module_tensors.size() + i;
        if (call_inputs[pos].unsafeGetTensorImpl() != e.module_tensors[i]) {
          return "module tensor '" + e.input_names[pos] + "' was replaced by another tensor";
        }
      }
      for (size_t i = 0; i < submodules.size(); ++i) {
        if (submodules[i]->is_training() != e.training[i]) {
          return "training mode of submodule " + std::to_string(i) + " (" + submodules[i]->name() +
                 ") changed: " + (e.training[i] ? "train -> eval" : "eval -> train");
        }
      }
    }
    for (size_t k = 0; k < e.held.size(); ++k) {
      std::string m = e.held_sigs[k].mismatch(e.held[k]);
      if (!m.empty()) return "captured tensor " + std::to_string(k) + " " + m;
    }
    if (alias_classes(primals) != e.aliases) return "inputs that shared memory changed";
    if (e.host_guard) {
      e.host_guard->run(primals);
      const auto& got = e.host_guard->host_values();
      for (size_t k = 0; k < e.host_expected.size() && k < got.size(); ++k) {
        const ir::Arg& a = e.host_expected[k];
        const c10::IValue& v = got[k];
        bool same = true;
        std::string was, now;
        if (a.kind == ir::ArgKind::Bool && v.isBool()) {
          same = (a.i != 0) == v.toBool();
          was = a.i ? "true" : "false";
          now = v.toBool() ? "true" : "false";
        } else if (a.kind == ir::ArgKind::Int && v.isInt()) {
          same = a.i == v.toInt();
          was = std::to_string(a.i);
          now = std::to_string(v.toInt());
        } else if (a.kind == ir::ArgKind::Double && v.isDouble()) {
          same = a.d == v.toDouble();
          std::ostringstream w, n;
          w << a.d;
          n << v.toDouble();
          was = w.str();
          now = n.str();
        } else {
          same = false;
          was = ir::to_string(a.kind);
          now = v.tagKind();
        }
        if (!same) return "the value read on the host by " + e.host_what[k] + " changed: " + was + " -> " + now;
      }
    }
    return "";
  }

  std::vector<at::Tensor> primals_of(const Entry& e, const std::vector<at::Tensor>& call_inputs) const {
    std::vector<at::Tensor> p = call_inputs;
    p.insert(p.end(), e.held.begin(), e.held.end());
    return p;
  }

  std::vector<at::Tensor> replay(const std::shared_ptr<Entry>& e, const std::vector<at::Tensor>& primals) {
    count(&CompileStats::replays);
    if (e->use_function) {
      return ReplayFunction::apply(at::TensorList(primals), e);
    }
    auto outs = e->fw(primals);
    for (size_t j : e->mutated_primals) torch::autograd::impl::bump_version(primals[j]);
    outs.resize(e->part.num_user_outputs);
    return outs;
  }

  // Fills the guards of a new entry from the call's inputs (before fn runs).
  std::shared_ptr<Entry> new_entry(const std::vector<at::Tensor>& call_inputs,
                                   const std::vector<std::string>& names) {
    auto e = std::make_shared<Entry>();
    e->id = static_cast<int>(entries.size());
    e->fn_name = options.name;
    e->stats = stats;
    e->grad_mode = at::GradMode::is_enabled();
    e->inference_mode = c10::InferenceMode::is_enabled();
    e->autocast = AutocastSig::now();
    for (const auto& t : call_inputs) e->inputs.push_back(TensorSig::of(t));
    e->input_names = names;
    if (module) {
      for (const auto& t : module_tensors()) e->module_tensors.push_back(t.unsafeGetTensorImpl());
      for (const auto& m : submodules) e->training.push_back(m->is_training());
    }
    return e;
  }

  void dump(const Entry& e) const {
    std::string dir = options.dump_dir.empty() ? Config::get().dump_dir : options.dump_dir;
    if (dir.empty()) return;
    std::filesystem::create_directories(dir);
    const std::string base = dir + "/" + options.name + "." + std::to_string(e.id);
    ir::save_json(e.joint.graph, base + ".joint.json");
    ir::save_json(e.part.forward, base + ".forward.json");
    if (e.has_backward) ir::save_json(e.part.backward, base + ".backward.json");
  }

  // Partitions and compiles a captured joint graph into e.
  void finish_entry(Entry& e, const std::vector<at::Tensor>& primals, JointGraph joint, bool has_backward) {
    const auto t0 = std::chrono::steady_clock::now();
    e.joint = std::move(joint);
    e.has_backward = has_backward;
    e.mutated_primals.clear();
    e.host_guard.reset();
    e.host_expected.clear();
    e.host_what.clear();
    e.has_rng = false;
    e.part = partition(e.joint, has_backward ? options.partitioner : Partitioner::Default);
    const auto& fw = e.part.forward;
    if (options.fw_compiler) e.fw = options.fw_compiler(fw);
    else e.fw = compile_graph(fw, std::to_string(e.id) + ".forward");
    if (options.cuda_graphs) e.fw = with_cuda_graphs(std::move(e.fw), fw, options.name + "." + std::to_string(e.id) + ".forward");
    if (has_backward) {
      if (options.bw_compiler) e.bw = options.bw_compiler(e.part.backward);
      else e.bw = compile_graph(e.part.backward, std::to_string(e.id) + ".backward");
      if (options.cuda_graphs) {
        e.bw = with_cuda_graphs(std::move(e.bw), e.part.backward, options.name + "." + std::to_string(e.id) + ".backward");
      }
    }
    // Replay facts.
    const auto& jg = e.joint.graph;
    const auto outs = jg.output_values();
    e.output_differentiable.clear();
    e.tangent_present.assign(e.joint.num_user_outputs, false);
    for (size_t k = 0; k < e.joint.num_user_outputs; ++k) {
      const auto& m = jg.value(outs[k]).meta;
      e.output_differentiable.push_back(m.requires_grad);
    }
    for (int k : e.joint.tangent_of) e.tangent_present[static_cast<size_t>(k)] = true;
    const auto inputs = jg.input_nodes();
    for (size_t j : jg.written_inputs()) {
      if (j < e.joint.num_primals) e.mutated_primals.push_back(j);
    }
    for (size_t j : e.mutated_primals) {
      const auto& in = jg.node(inputs[j]);
      TORCH_CHECK(!(e.grad_mode && primals.at(j).requires_grad()), "the function writes in place into input '",
                  in.name, "', which requires grad (replay cannot rebase its autograd history)");
    }
    e.has_rng = std::any_of(fw.nodes().begin(), fw.nodes().end(),
                            [](const ir::Node& n) { return n.draws_random_numbers(); });
    // Host reads become a guard graph (their ancestors only; no writes, no RNG).
    build_host_guard(e);
    e.held.clear();
    e.held_sigs.clear();
    for (size_t j = e.inputs.size(); j < primals.size(); ++j) {
      e.held.push_back(primals[j]);
      e.held_sigs.push_back(TensorSig::of(primals[j]));
    }
    e.aliases = alias_classes(primals);
    e.use_function = e.grad_mode && std::any_of(primals.begin(), primals.end(), [](const at::Tensor& t) {
                       return t.defined() && t.requires_grad();
                     });
    e.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    TCAP_LOG(AotGraphs, "'" << options.name << "' entry " << e.id << " joint graph:\n"
                            << ir::to_string(e.joint.graph) << "\nforward graph:\n"
                            << ir::to_string(e.part.forward)
                            << (has_backward ? "\nbackward graph:\n" + ir::to_string(e.part.backward) : "")
                            << "\n" << e.part.explain());
    TCAP_LOG(Perf, "'" << options.name << "' entry " << e.id << " compiled in " << e.compile_ms << " ms");
    dump(e);
  }

  Executable compile_graph(const ir::Graph& g, const std::string& what) const {
    const std::string dir = options.dump_dir.empty() ? Config::get().dump_dir : options.dump_dir;
    return compile_with_backend(options.backend, g, options.name + "." + what, dir);
  }

  void build_host_guard(Entry& e) const {
    const auto& fw = e.part.forward;
    std::vector<ir::NodeId> reads;
    for (const auto& n : fw.nodes()) {
      if (n.kind != ir::NodeKind::Call) continue;
      if (std::any_of(n.outputs.begin(), n.outputs.end(), ir::is_host_value)) reads.push_back(n.id);
    }
    if (reads.empty()) return;
    std::set<ir::NodeId> keep(reads.begin(), reads.end());
    std::vector<ir::NodeId> todo(reads.begin(), reads.end());
    while (!todo.empty()) {
      const auto& n = fw.node(todo.back());
      todo.pop_back();
      ir::for_each_value(n.args, [&](ir::ValueId v) {
        const auto p = fw.value(v).producer;
        if (fw.node(p).kind == ir::NodeKind::Call && keep.insert(p).second) todo.push_back(p);
      });
    }
    for (ir::NodeId id : keep) {
      const auto& n = fw.node(id);
      TORCH_CHECK(!n.draws_random_numbers(), "a value read on the host (item()) depends on the random op ",
                  n.qualified_op());
      ir::for_each_value(n.outputs, [&](ir::ValueId v) {
        TORCH_CHECK(fw.value(v).version_of == ir::kNoValue,
                    "a value read on the host (item()) depends on the in-place op ", n.qualified_op());
      });
      for (const auto& a : n.outputs) {
        if (ir::is_host_value(a)) {
          e.host_expected.push_back(a);
          e.host_what.push_back(n.qualified_op() + " (node %" + std::to_string(n.id) + ")");
        }
      }
    }
    std::vector<ir::ValueId> ins;
    std::vector<ir::InputKind> kinds;
    std::vector<std::string> names;
    for (ir::NodeId id : fw.input_nodes()) {
      ins.push_back(fw.node(id).outputs[0].values[0]);
      kinds.push_back(fw.node(id).input_kind);
      names.push_back(fw.node(id).name);
    }
    ir::Graph gg = extract_subgraph(fw, std::vector<ir::NodeId>(keep.begin(), keep.end()), ins, kinds, names,
                                    {}, {}, {});
    e.host_guard = std::make_shared<Interpreter>(gg);
    e.host_guard->keep_values(false);
  }

  // Collects a capture that finished (from the engine thread) into the cache.
  void collect_pending() {
    std::shared_ptr<Pending> p;
    {
      std::lock_guard<std::mutex> lock(pending_mutex);
      if (!pending || !pending->finished) return;
      p = std::move(pending);
      pending.reset();
    }
    capture::disarm_watcher(p->capture.get());
    if (p->ready) {
      entries.push_back(p->ready);
      count(&CompileStats::compiles);
      if (p->size_miss_of) try_generalize(*p->size_miss_of, *p->ready, p->changed);
    } else {
      go_eager("its backward could not be captured: " + p->failure);
    }
  }

  std::vector<at::Tensor> call(const std::vector<at::Tensor>& user_inputs) {
    collect_pending();
    if (!eager_reason.empty()) return run_eager(user_inputs);
    std::vector<at::Tensor> call_inputs = user_inputs;
    for (auto& t : module_tensors()) call_inputs.push_back(std::move(t));
    std::string first_miss;
    std::shared_ptr<Entry> size_miss_of;
    std::vector<Entry::DimRef> changed;
    for (const auto& e : entries) {
      const auto primals = primals_of(*e, call_inputs);
      std::string why = check(*e, call_inputs, primals);
      if (why.empty()) return replay(specialize(e, call_inputs, primals), primals);
      if (first_miss.empty()) first_miss = why;
      if (options.dynamic && !size_miss_of && e->dyn_dims.empty()) {
        changed = size_only_change(*e, call_inputs);
        if (!changed.empty()) size_miss_of = e;
      }
    }
    {
      std::unique_lock<std::mutex> lock(pending_mutex);
      if (pending) {
        // The first call's backward has not run yet: stay eager until it does. If it
        // never comes, compile the forward alone (its backward then recomputes).
        if (++pending->calls_since <= 2) {
          lock.unlock();
          return run_eager(user_inputs);
        }
        auto p = std::move(pending);
        pending.reset();
        lock.unlock();
        p->capture->remove_observers();
        capture::disarm_watcher(p->capture.get());
        try {
          finish_entry(*p->entry, p->capture->primal_tensors(), p->capture->joint_without_backward(), false);
          entries.push_back(p->entry);
          count(&CompileStats::compiles);
          TCAP_LOG(GraphBreaks, "'" << options.name << "': no backward reached the first call; compiled its "
                                    "forward alone (a backward will recompute)");
        } catch (const c10::Error& err) {
          go_eager(err.what_without_backtrace());
        }
        return call(user_inputs);
      }
    }
    if (static_cast<int>(entries.size()) >= options.cache_size_limit) {
      if (!warned_limit) {
        warned_limit = true;
        TORCH_WARN("tcap: '", options.name, "' reached its cache size limit (", options.cache_size_limit,
                   " compiled entries); it runs eagerly from now on. Last guard failure: ", first_miss);
      }
      eager_reason = "cache size limit (" + std::to_string(options.cache_size_limit) + ") reached";
      return run_eager(user_inputs);
    }
    if (!entries.empty()) {
      count(&CompileStats::recompiles);
      std::string dyn;
      for (const auto& c : changed) {
        dyn += "; marking dim " + std::to_string(c.dim) + " of '" + size_miss_of->input_names[c.input] + "' dynamic";
      }
      TCAP_LOG(Recompiles, "'" << options.name << "' recompiling (entry " << entries.size() << ", limit "
                               << options.cache_size_limit << "): " << first_miss << dyn);
    }
    return capture_call(user_inputs, call_inputs, size_miss_of, changed);
  }

  // Note [Dynamic dims]
  // When a call misses an entry only because some input sizes changed, those dims are
  // marked dynamic: the call is captured as usual at its own sizes, and the two joint
  // graphs are compared. If they are the same graph except for integers (op arguments,
  // tensor sizes, strides, offsets) that are each m * size + c of one changed dim, the new
  // entry becomes dynamic: its guards accept any size >= 2 on those dims (contiguous
  // inputs), and a call with new sizes is served by patching the integers and
  // partitioning/compiling again, without running the user's code. Anything else (a
  // float computed from a size, a different op sequence, a value read on the host) keeps
  // the entry static, and the log says why.
  std::vector<Entry::DimRef> size_only_change(const Entry& e, const std::vector<at::Tensor>& in) const {
    std::vector<Entry::DimRef> out;
    if (in.size() != e.inputs.size() || at::GradMode::is_enabled() != e.grad_mode) return {};
    for (size_t k = 0; k < in.size(); ++k) {
      const auto& sig = e.inputs[k];
      const at::Tensor& t = in[k];
      if (!t.defined() || !sig.defined || t.scalar_type() != sig.dtype || t.device() != sig.device ||
          t.requires_grad() != sig.requires_grad || t.dim() != static_cast<int64_t>(sig.sizes.size())) {
        return {};
      }
      if (t.sizes() == c10::IntArrayRef(sig.sizes)) {
        if (t.strides() != c10::IntArrayRef(sig.strides)) return {};
        continue;
      }
      if (!t.is_contiguous()) return {};
      for (int64_t d = static_cast<int64_t>(sig.sizes.size()) - 1, expect = 1; d >= 0; --d) {
        if (sig.sizes[static_cast<size_t>(d)] != 1 && sig.strides[static_cast<size_t>(d)] != expect) return {};
        expect *= sig.sizes[static_cast<size_t>(d)];
      }
      for (size_t d = 0; d < sig.sizes.size(); ++d) {
        const int64_t n = t.size(static_cast<int64_t>(d));
        if (n == sig.sizes[d]) continue;
        if (n < 2 || sig.sizes[d] < 2) return {};
        out.push_back({k, d});
      }
    }
    return out;
  }

  void try_generalize(const Entry& a, Entry& b, const std::vector<Entry::DimRef>& changes) {
    std::string why = generalize(a, b, changes);
    if (why.empty()) {
      std::string dims;
      for (const auto& c : changes) dims += " '" + b.input_names[c.input] + "' dim " + std::to_string(c.dim);
      TCAP_LOG(Recompiles, "'" << options.name << "' entry " << b.id << " is dynamic in" << dims << " ("
                               << b.patches.size() << " integers follow the sizes)");
      return;
    }
    b.dyn_dims.clear();
    b.patches.clear();
    TCAP_LOG(Recompiles, "'" << options.name << "' entry " << b.id << " stays static: " << why);
  }

  // Fills b.dyn_dims / b.patches; "" on success, else why not.
  static std::string generalize(const Entry& a, Entry& b, const std::vector<Entry::DimRef>& changes) {
    if (!a.host_expected.empty() || !b.host_expected.empty()) return "the function reads values on the host";
    const auto& ga = a.joint.graph;
    const auto& gb = b.joint.graph;
    if (a.joint.num_primals != b.joint.num_primals || a.joint.num_tangents != b.joint.num_tangents ||
        a.joint.grad_of != b.joint.grad_of) {
      return "the graphs at the two sizes differ in structure";
    }
    std::vector<std::pair<int64_t, int64_t>> sizes;  // (at a, at b) per change
    for (const auto& c : changes) sizes.emplace_back(a.inputs[c.input].sizes[c.dim], b.inputs[c.input].sizes[c.dim]);
    std::vector<aot::IntPatch> patches;
    std::string why = aot::find_int_patches(ga, gb, sizes, patches);
    if (!why.empty()) return why;
    b.dyn_dims = changes;
    b.patches = std::move(patches);
    for (const auto& c : changes) {
      auto& sig = b.inputs[c.input];
      sig.dyn.resize(sig.sizes.size(), false);
      sig.dyn[c.dim] = true;
    }
    return "";
  }

  // The entry serving these inputs: e itself, or e specialized to the current sizes.
  std::shared_ptr<Entry> specialize(const std::shared_ptr<Entry>& e, const std::vector<at::Tensor>& call_inputs,
                                    const std::vector<at::Tensor>& primals) {
    if (e->dyn_dims.empty()) return e;
    std::vector<int64_t> key;
    bool own = true;
    for (const auto& c : e->dyn_dims) {
      key.push_back(call_inputs[c.input].size(static_cast<int64_t>(c.dim)));
      own = own && key.back() == e->inputs[c.input].sizes[c.dim];
    }
    if (own) return e;
    auto& slot = e->specialized[key];
    if (slot) return slot;
    auto s = std::make_shared<Entry>(*e);
    s->specialized.clear();
    s->dyn_dims.clear();
    s->patches.clear();
    JointGraph j = e->joint;
    aot::apply_int_patches(j.graph, e->patches, key);
    finish_entry(*s, primals, std::move(j), e->has_backward);
    count(&CompileStats::compiles);
    TCAP_LOG(Recompiles, "'" << options.name << "' entry " << e->id << " specialized to sizes " << c10::IntArrayRef(key)
                             << " of its dynamic dims (no recapture)");
    slot = s;
    return s;
  }

  std::vector<at::Tensor> capture_call(const std::vector<at::Tensor>& user_inputs,
                                       const std::vector<at::Tensor>& call_inputs,
                                       const std::shared_ptr<Entry>& size_miss_of,
                                       const std::vector<Entry::DimRef>& changed) {
    count(&CompileStats::captures);
    std::vector<std::string> names;
    std::vector<std::pair<at::Tensor, std::pair<ir::InputKind, std::string>>> decl;
    for (size_t k = 0; k < user_inputs.size(); ++k) {
      names.push_back("in" + std::to_string(k));
      TORCH_CHECK(user_inputs[k].defined(), "tcap::compile('", options.name, "'): input ", k, " is undefined");
      decl.push_back({user_inputs[k], {ir::InputKind::UserInput, names.back()}});
    }
    if (module) {
      for (const auto& item : module->named_parameters(true)) {
        names.push_back(item.key());
        decl.push_back({item.value(), {ir::InputKind::Parameter, item.key()}});
      }
      for (const auto& item : module->named_buffers(true)) {
        names.push_back(item.key());
        decl.push_back({item.value(), {ir::InputKind::Buffer, item.key()}});
      }
    }
    auto entry = new_entry(call_inputs, names);
    auto cap = std::make_shared<aot::RegionCapture>();
    const bool grad_mode = at::GradMode::is_enabled();
    auto outs = cap->record_forward([&] { return fn(user_inputs); }, decl);
    std::string why = cap->check_forward(outs);
    if (!why.empty()) {
      go_eager(why);
      return outs;
    }
    const bool needs_backward =
        grad_mode && std::any_of(outs.begin(), outs.end(), [](const at::Tensor& t) { return t.requires_grad(); });
    if (!needs_backward) {
      try {
        finish_entry(*entry, cap->primal_tensors(), cap->joint_without_backward(), false);
        entries.push_back(entry);
        count(&CompileStats::compiles);
        if (size_miss_of) try_generalize(*size_miss_of, *entry, changed);
      } catch (const c10::Error& err) {
        go_eager(err.what_without_backtrace());
      }
      return outs;
    }
    auto p = std::make_shared<Pending>();
    p->capture = cap;
    p->entry = entry;
    p->size_miss_of = size_miss_of;
    p->changed = changed;
    std::weak_ptr<Pending> wp = p;
    // Runs on the thread that ran the backward, inside it: build the entry now, publish it
    // for the next call (collect_pending).
    why = cap->watch_backward(outs, [this, wp](aot::RegionCapture& c) {
      auto pp = wp.lock();
      if (!pp) return;
      try {
        finish_entry(*pp->entry, c.primal_tensors(), c.joint_with_backward(), true);
        pp->ready = pp->entry;
      } catch (const c10::Error& err) {
        pp->failure = err.what_without_backtrace();
      } catch (const std::exception& err) {
        pp->failure = err.what();
      }
      std::lock_guard<std::mutex> lock(pending_mutex);
      pp->finished = true;
    });
    if (!why.empty()) {
      cap->remove_observers();
      go_eager(why);
      return outs;
    }
    {
      std::lock_guard<std::mutex> lock(pending_mutex);
      pending = p;
    }
    capture::arm_watcher(cap);
    return outs;
  }
};

CompiledFunction::CompiledFunction(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CompiledFunction::~CompiledFunction() {
  if (impl_ && impl_->pending) {
    impl_->pending->capture->remove_observers();
    capture::disarm_watcher(impl_->pending->capture.get());
  }
}

std::vector<at::Tensor> CompiledFunction::operator()(const std::vector<at::Tensor>& inputs) {
  return impl_->call(inputs);
}

at::Tensor CompiledFunction::forward(const at::Tensor& x) {
  auto outs = impl_->call({x});
  TORCH_CHECK(outs.size() == 1, "tcap: forward(x) needs a function with one output, got ", outs.size());
  return outs[0];
}

const CompileStats& CompiledFunction::stats() const {
  impl_->collect_pending();
  return impl_->stats->stats;
}

std::vector<CompiledEntryInfo> CompiledFunction::entries() const {
  impl_->collect_pending();
  std::vector<CompiledEntryInfo> out;
  for (const auto& e : impl_->entries) {
    CompiledEntryInfo info;
    info.joint = e->joint;
    info.partition = e->part;
    info.compile_ms = e->compile_ms;
    for (size_t k = 0; k < e->inputs.size(); ++k) info.guards.push_back(e->input_names[k] + ": " + e->inputs[k].str());
    info.guards.push_back(std::string("grad mode ") + (e->grad_mode ? "on" : "off"));
    for (const auto& w : e->host_what) info.guards.push_back("host value of " + w);
    out.push_back(std::move(info));
  }
  return out;
}

std::string CompiledFunction::eager_reason() const {
  impl_->collect_pending();
  return impl_->eager_reason;
}

std::shared_ptr<CompiledFunction> compile_function(CompiledFunction::Fn fn, CompileOptions options) {
  TORCH_CHECK(fn, "tcap::compile: the function is empty");
  TORCH_CHECK(options.cache_size_limit >= 1, "tcap::compile: cache_size_limit must be at least 1");
  auto impl = std::make_unique<CompiledFunction::Impl>();
  impl->fn = std::move(fn);
  impl->options = std::move(options);
  return std::make_shared<CompiledFunction>(std::move(impl));
}

std::shared_ptr<CompiledFunction> compile(std::shared_ptr<torch::nn::Module> module, CompiledFunction::Fn fn,
                                          CompileOptions options) {
  TORCH_CHECK(module, "tcap::compile: the module is null");
  auto f = compile_function(std::move(fn), std::move(options));
  f->impl_->module = module;
  f->impl_->submodules.push_back(module);
  for (const auto& m : module->modules(/*include_self=*/false)) f->impl_->submodules.push_back(m);
  return f;
}

}  // namespace tcap

namespace tcap::aot {

const std::type_info& replay_node_type() { return typeid(torch::autograd::CppNode<ReplayFunction>); }

bool describe_replay_node(const torch::autograd::Node& node, std::string& key, std::vector<at::Tensor>& tensors,
                          std::vector<c10::IValue>& keep_alive) {
  if (typeid(node) != typeid(torch::autograd::CppNode<ReplayFunction>)) return false;
  const auto* cpp = static_cast<const torch::autograd::CppNode<ReplayFunction>*>(&node);
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): reading the context only.
  auto& ctx = const_cast<torch::autograd::AutogradContext&>(cpp->ctx_);
  const c10::IValue& entry = ctx.saved_data.at("entry");
  const auto* holder = static_cast<const EntryHolder*>(entry.toCapsule().get());
  const auto address = reinterpret_cast<std::uintptr_t>(holder->entry.get());
  key.append(reinterpret_cast<const char*>(&address), sizeof(address));
  keep_alive.push_back(entry);
  const auto capsule = saved_capsule(ctx);
  for (auto& t : capsule->unpack(ctx, holder->entry->fn_name, /*take=*/false)) tensors.push_back(std::move(t));
  for (const auto& t : capsule->primals) tensors.push_back(t);
  return true;
}

void release_replay_node(torch::autograd::Node& node) {
  if (typeid(node) != typeid(torch::autograd::CppNode<ReplayFunction>)) return;
  auto& cpp = static_cast<torch::autograd::CppNode<ReplayFunction>&>(node);
  saved_capsule(cpp.ctx_)->release();
}

}  // namespace tcap::aot
