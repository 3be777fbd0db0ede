// Note [Cutting a region's backward]
// DESIGN.md D4: the first call of a compiled function runs eagerly with recording on,
// and returns the eager outputs, so the user's own backward() computes the real
// gradients once. Observers mark where that backward enters and leaves the region:
//   * start: a pre-hook appended to each output's grad_fn sees the gradient arriving for
//     that output (after the user's own hooks on it): the output's tangent. Recording is
//     turned on there (the session was pushed, recording off, by the engine driver; see
//     Note [Armed sessions]).
//   * end: the region's autograd nodes are those created while the forward ran (their
//     sequence numbers lie in the forward's range). A post-hook on every region node with
//     an edge leaving the region sees the gradient it sends to an input's sink
//     (AccumulateGrad for a leaf, grad_fn for a non-leaf): one contribution. Several
//     contributions to one input are summed in the compiled backward, exactly like the
//     engine's InputBuffer does; contributions from outside the region never enter.
// The compiled backward is the dataflow slice from the contributions back to the tangents
// and forward values. AccumulateGrad, leaf hooks and .grad stay the engine's own, so
// capture changes no .grad and runs no hook twice.
#include "aot/region.h"

#include "capture/hooks.h"
#include "capture/recorder.h"
#include "ir/op_facts.h"
#include "ir/writes_through_views.h"
#include "support/logging.h"

#include <ATen/SequenceNumber.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace tcap::aot {
namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

struct StartObserver : capture::ObserverPreHook {
  StartObserver(std::weak_ptr<RegionCapture> c, size_t output, uint32_t slot)
      : cap(std::move(c)), output(output), slot(slot) {}
  variable_list operator()(const variable_list& grads) override {
    if (auto c = cap.lock(); c && slot < grads.size()) c->on_tangent(output, grads[slot]);
    return grads;
  }
  std::weak_ptr<RegionCapture> cap;
  size_t output;
  uint32_t slot;
};

struct EndObserver : capture::ObserverPostHook {
  EndObserver(std::weak_ptr<RegionCapture> c, std::vector<std::pair<size_t, size_t>> edges)
      : cap(std::move(c)), edges(std::move(edges)) {}
  variable_list operator()(const variable_list& outputs, const variable_list& /*inputs*/) override {
    if (auto c = cap.lock()) {
      for (const auto& [edge, primal] : edges) {
        if (edge < outputs.size() && outputs[edge].defined()) c->on_contribution(primal, outputs[edge]);
      }
    }
    return outputs;
  }
  std::weak_ptr<RegionCapture> cap;
  std::vector<std::pair<size_t, size_t>> edges;  // (next_edge index, primal)
};

// Removes from a hook list the observers of `owner` (and of captures already gone).
template <class Observer, class Hooks>
void erase_observers(Hooks& hooks, const RegionCapture* owner) {
  hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                             [&](const auto& h) {
                               auto* o = dynamic_cast<Observer*>(h.get());
                               return o && (o->cap.expired() || o->cap.lock().get() == owner);
                             }),
              hooks.end());
}

}  // namespace

std::string unreplayable(const ir::Graph& /*g*/, const ir::Node& n) {
  auto op = c10::Dispatcher::singleton().findSchema({n.op, n.overload});
  if (!op) return n.qualified_op() + " is not a registered operator";
  for (const auto& a : n.args) {
    if (a.kind == ir::ArgKind::Opaque) {
      return n.qualified_op() + " takes a " + a.s + " argument ('" + a.name + "') that cannot be replayed";
    }
  }
  return "";
}

RegionCapture::RegionCapture() {
  CaptureOptions o;
  o.record_backward = true;
  o.single_threaded_autograd = false;
  session_ = std::make_unique<capture::Session>(o);
}

RegionCapture::~RegionCapture() = default;

bool RegionCapture::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

std::vector<at::Tensor> RegionCapture::record_forward(
    const std::function<std::vector<at::Tensor>()>& fn,
    const std::vector<std::pair<at::Tensor, std::pair<ir::InputKind, std::string>>>& inputs) {
  capture::Session& s = *session_;
  for (const auto& [t, kn] : inputs) s.declare_input(t, kn.second, kn.first);
  // The engine hook is installed while the forward runs, so that a backward() inside fn
  // is seen (and refused by check_forward) instead of being recorded as forward ops.
  capture::EngineHookLease lease(&capture::capture_backward_driver);
  seq_begin_ = at::sequence_number::peek();
  capture::push_session(&s);
  // Collectives in the forward (DistributedDataParallel's buffer broadcast) are recorded as
  // graph ops that every replay issues (Note [Collectives in a compiled step]); not in the
  // backward, whose gradient hooks run outside the region, at AccumulateGrad.
  s.set_records_collectives(true);
  std::vector<at::Tensor> outs;
  try {
    outs = fn();
  } catch (...) {
    s.set_records_collectives(false);
    s.set_recording(false);
    capture::pop_session(&s);
    throw;
  }
  s.set_records_collectives(false);
  s.set_recording(false);
  capture::pop_session(&s);
  seq_end_ = at::sequence_number::peek();
  fw_end_ = s.graph().nodes().size();
  for (const auto& n : s.graph().nodes()) {
    if (n.kind == ir::NodeKind::Input) primal_values_.push_back(n.outputs.at(0).values.at(0));
  }
  return outs;
}

std::vector<at::Tensor> RegionCapture::primal_tensors() const {
  const auto& all = session_->input_tensors();
  return std::vector<at::Tensor>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(primal_values_.size()));
}

std::string RegionCapture::check_forward(const std::vector<at::Tensor>& outputs) {
  capture::Session& s = *session_;
  if (!s.unreplayable_reason().empty()) return s.unreplayable_reason();
  const ir::Graph& g = s.graph();
  for (const auto& n : g.nodes()) {
    if (n.kind == ir::NodeKind::CallHook) return "a hook ran inside the function's forward";
    if (n.kind != ir::NodeKind::Call) continue;
    if (n.phase == ir::Phase::Backward) {
      return "the function calls backward() itself (" + n.qualified_op() +
             " ran in a backward); compile the forward only";
    }
    if (std::string why = unreplayable(g, n); !why.empty()) return why;
  }
  std::unordered_set<ir::ValueId> primal_set(primal_values_.begin(), primal_values_.end());
  std::unordered_set<ir::ValueId> seen;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const at::Tensor& o = outputs[k];
    const std::string name = "out" + std::to_string(k);
    if (!o.defined()) return "output " + std::to_string(k) + " is an undefined tensor";
    auto v = s.lookup(o);
    if (!v) return "output " + std::to_string(k) + " was not computed by recorded ops";
    if (primal_set.count(*v)) return "output " + std::to_string(k) + " is an input returned unchanged";
    if (!seen.insert(*v).second) return "output " + std::to_string(k) + " is returned twice";
    s.mark_output(o, name);
    output_values_.push_back(*v);
    output_names_.push_back(name);
  }
  return "";
}

std::string RegionCapture::watch_backward(const std::vector<at::Tensor>& outputs, Done done) {
  on_done_ = std::move(done);
  tangent_value_.assign(outputs.size(), ir::kNoValue);
  tangent_tensor_.assign(outputs.size(), at::Tensor());
  contributions_.assign(primal_values_.size(), {});
  auto in_region = [&](const Node* n) {
    const uint64_t seq = n->sequence_nr();
    return seq >= seq_begin_ && seq < seq_end_ && !dynamic_cast<const torch::autograd::AccumulateGrad*>(n);
  };
  // Gradient sinks of the primals.
  std::map<std::pair<const Node*, uint32_t>, size_t> sink;
  const auto primals = primal_tensors();
  for (size_t j = 0; j < primals.size(); ++j) {
    const at::Tensor& t = primals[j];
    if (!t.requires_grad()) continue;
    if (t.is_leaf()) {
      if (auto acc = torch::autograd::impl::try_get_grad_accumulator(t)) sink[{acc.get(), 0}] = j;
    } else {
      sink[{t.grad_fn().get(), t.output_nr()}] = j;
    }
  }
  for (size_t j = 0; j < primals.size(); ++j) {
    const at::Tensor& t = primals[j];
    if (t.requires_grad() && t.grad_fn() && in_region(t.grad_fn().get())) {
      return "the function writes in place into input " + std::to_string(j) +
             ", which requires grad (replay cannot rebase its autograd history)";
    }
  }
  std::unordered_set<const Node*> output_fns;
  std::vector<Node*> todo;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const at::Tensor& o = outputs[k];
    if (!o.requires_grad()) continue;
    Node* gf = o.grad_fn().get();
    if (!gf) return "output " + std::to_string(k) + " is a leaf that requires grad";
    if (!in_region(gf)) return "output " + std::to_string(k) + " was not computed inside the function";
    output_fns.insert(gf);
    todo.push_back(gf);
  }
  std::unordered_set<Node*> region;
  std::vector<std::pair<Node*, std::vector<std::pair<size_t, size_t>>>> boundary;
  while (!todo.empty()) {
    Node* n = todo.back();
    todo.pop_back();
    if (!region.insert(n).second) continue;
    // Nothing outside fn can have registered hooks here yet: these came from inside it.
    if (!n->tensor_pre_hooks().empty() || !n->pre_hooks().empty() || !n->post_hooks().empty() ||
        !n->retains_grad_hooks().empty()) {
      return "a hook (or retain_grad) was registered inside the function on " + n->name() +
             "; compiled replay would not call it";
    }
    std::vector<std::pair<size_t, size_t>> edges;
    const auto& next = n->next_edges();
    for (size_t i = 0; i < next.size(); ++i) {
      const auto& e = next[i];
      if (!e.is_valid()) continue;
      Node* t = e.function.get();
      if (in_region(t)) {
        if (output_fns.count(t)) {
          return "an output is also used inside the function (by " + n->name() + ")";
        }
        todo.push_back(t);
        continue;
      }
      auto it = sink.find({t, e.input_nr});
      if (it == sink.end()) {
        return "a gradient leaves the function through " + n->name() + " towards " + t->name() +
               ", which is not one of its inputs";
      }
      edges.emplace_back(i, it->second);
    }
    if (!edges.empty()) boundary.emplace_back(n, std::move(edges));
  }
  // User hooks on outputs are registered after the call returns, so they run before the
  // start observer (appended now, last): the tangent is the gradient after those hooks.
  auto self = weak_from_this();
  std::lock_guard<std::mutex> lock(observed_mutex_);
  for (size_t k = 0; k < outputs.size(); ++k) {
    const at::Tensor& o = outputs[k];
    if (!o.requires_grad()) continue;
    auto gf = o.grad_fn();
    gf->tensor_pre_hooks().push_back(std::make_unique<StartObserver>(self, k, o.output_nr()));
    observed_nodes_.push_back(gf);
  }
  for (auto& [n, edges] : boundary) {
    n->add_post_hook(std::make_unique<EndObserver>(self, std::move(edges)));
    observed_nodes_.push_back(n->getptr());
  }
  return "";
}

// Note [Abandoning a capture]
// A first call's capture waits for its backward (PendingCapture). Another thread's call
// may give up waiting (compile_forward_only) while the thread that made the graph runs
// that very backward: the engine, HookWrapScope and the observers themselves then iterate
// the hook lists of these nodes. So the giving-up thread only marks the capture done
// (abandon(), refused once a backward has started recording it: that backward finishes
// the capture) and disarms it; it never edits hook lists of a graph it does not own. The
// observers left behind hold a weak pointer and check done_: they do nothing, and go
// with their nodes. The owner thread, and the backward that completes the capture, erase
// them as before.
void RegionCapture::remove_observers() {
  if (std::this_thread::get_id() != owner_) {
    TCAP_LOG(Capture, "left the backward observers of a capture on the graph of another thread (inert)");
    return;
  }
  erase_observers_now();
}

void RegionCapture::erase_observers_now() {
  std::lock_guard<std::mutex> lock(observed_mutex_);
  for (auto& w : observed_nodes_) {
    auto n = w.lock();
    if (!n) continue;
    erase_observers<StartObserver>(n->tensor_pre_hooks(), this);
    erase_observers<EndObserver>(n->post_hooks(), this);
  }
  observed_nodes_.clear();
}

bool RegionCapture::abandon() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (started_) return false;
  done_ = true;
  on_done_ = nullptr;
  return true;
}

void RegionCapture::on_tangent(size_t output, const at::Tensor& grad) {
  // Only a backward that pushed this capture's session on its own thread records it
  // (Note [Armed sessions]): not a grad() call, not another thread's backward.
  const auto& on_thread = capture::thread_sessions();
  if (std::find(on_thread.begin(), on_thread.end(), session_.get()) == on_thread.end()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (done_ || !grad.defined() || output >= tangent_value_.size()) return;
  if (tangent_value_[output] != ir::kNoValue) return;
  session_->set_recording(true);
  started_ = true;
  tangent_value_[output] = session_->tangent_for(grad, "tangent_" + output_names_.at(output));
  // Note [Tangents that alias]
  // The backward is recorded by tensor identity. Two outputs' gradients can be one tensor,
  // or views of one tensor alike in every way ((a.sum() + b.sum()).backward() hands both
  // sums' backwards the same ones, expanded twice), and then which of the two a backward
  // op read cannot be told: the recording reads one for both. It is right for every later
  // call whose gradients alias the same way, so that is what the entry checks before its
  // compiled backward runs; gradients that do not alias any more take the recompute,
  // which is exact (a backward like (2 * a.sum() + b.sum()) after the capture's).
  for (size_t j = 0; j < tangent_tensor_.size(); ++j) {
    const at::Tensor& o = tangent_tensor_[j];
    if (o.defined() && tangents_alias(o, grad)) {
      aliased_tangents_.emplace_back(static_cast<int>(j), static_cast<int>(output));
    }
  }
  tangent_tensor_[output] = grad;
}

bool tangents_alias(const at::Tensor& a, const at::Tensor& b) {
  if (a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl()) return true;
  return a.has_storage() && b.has_storage() && a.layout() == c10::kStrided && b.layout() == c10::kStrided &&
         a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl() &&
         a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.scalar_type() == b.scalar_type();
}

std::vector<std::pair<int, int>> RegionCapture::aliased_tangents() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return aliased_tangents_;
}

void RegionCapture::on_contribution(size_t primal, const at::Tensor& grad) {
  const auto& on_thread = capture::thread_sessions();
  if (std::find(on_thread.begin(), on_thread.end(), session_.get()) == on_thread.end()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (done_ || !started_) return;
  auto v = session_->lookup(grad);
  if (!v) {
    if (failure_.empty()) failure_ = "a gradient for input " + std::to_string(primal) + " was not made by a recorded op";
    return;
  }
  contributions_.at(primal).push_back(*v);
}

void RegionCapture::backward_finished(bool ok) {
  Done cb;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_ || !started_) return;  // this backward did not reach the region
    done_ = true;
    session_->set_recording(false);
    tangent_tensor_.clear();  // only compared while recording
    if (!ok && failure_.empty()) failure_ = "the backward that reached the function failed";
    cb = std::move(on_done_);
  }
  erase_observers_now();  // this thread's backward just ran over these nodes
  if (cb) cb(*this);
}

JointGraph RegionCapture::joint_without_backward() const { return build_joint(false); }

JointGraph RegionCapture::joint_with_backward() {
  TORCH_CHECK(failure_.empty(), failure_);
  return build_joint(true);
}

JointGraph RegionCapture::build_joint(bool with_backward) const {
  // The recording, copied only where the backward's sums are added to it (a check capture
  // compares the forward alone: Note [Checking a new size]).
  std::optional<ir::Graph> grown;
  if (with_backward) grown.emplace(session_->graph());
  const ir::Graph& g = grown ? *grown : session_->graph();
  const auto fw_end = static_cast<ir::NodeId>(fw_end_);
  std::vector<ir::ValueId> tangents;
  std::vector<int> tangent_of;
  std::vector<ir::ValueId> grads;
  std::vector<int> grad_of;
  std::vector<ir::NodeId> keep;
  for (ir::NodeId id = 0; id < fw_end; ++id) {
    const auto& n = g.node(id);
    if (n.kind == ir::NodeKind::Call || n.kind == ir::NodeKind::CallHook) keep.push_back(id);
  }
  if (with_backward) {
    for (size_t k = 0; k < tangent_value_.size(); ++k) {
      const ir::ValueId t = tangent_value_[k];
      if (t == ir::kNoValue) continue;
      TORCH_CHECK(g.value(t).producer >= fw_end,
                  "the gradient given for output ", k, " is a tensor the forward computed");
      tangents.push_back(t);
      tangent_of.push_back(static_cast<int>(k));
    }
    // Sum several contributions to one input (the engine's InputBuffer does the same).
    auto add_op = c10::Dispatcher::singleton().findSchema({"aten::add", "Tensor"});
    TORCH_INTERNAL_ASSERT(add_op.has_value());
    bool added = false;
    for (size_t j = 0; j < contributions_.size(); ++j) {
      const auto& cs = contributions_[j];
      if (cs.empty()) continue;
      ir::ValueId acc = cs[0];
      for (size_t c = 1; c < cs.size(); ++c) {
        ir::Node n;
        n.kind = ir::NodeKind::Call;
        n.op = "aten::add";
        n.overload = "Tensor";
        n.phase = ir::Phase::Backward;
        n.grad_mode = false;
        n.autograd_node = "InputBuffer";
        n.args = {ir::Arg::value(acc), ir::Arg::value(cs[c]), ir::Arg::integer(1, "alpha")};
        const auto id = static_cast<ir::NodeId>(g.nodes().size());
        const ir::ValueId v = grown->new_value(id, 0, -1, g.value(acc).meta);
        n.outputs.push_back(ir::Arg::value(v));
        grown->add_node(std::move(n));
        acc = v;
        added = true;
      }
      grads.push_back(acc);
      grad_of.push_back(static_cast<int>(j));
    }
    if (added) grown->schemas()["aten::add.Tensor"] = capture::OpInfo::from(*add_op).schema;
    // The slice: backward nodes the gradients depend on, back to tangents and forward values,
    // and the writes through a view into memory a later kept node reads (Note [Writes
    // through a view]; the data flow alone leaves out the engine's own in-place
    // accumulation of the contributions, which the slice sums itself).
    std::unordered_set<ir::ValueId> tangent_set(tangents.begin(), tangents.end());
    std::unordered_set<ir::ValueId> needed;
    std::unordered_set<ir::ValueId> needed_memory;  // alias roots of `needed`
    auto need = [&](ir::ValueId v) {
      if (tangent_set.count(v) || g.value(v).producer < fw_end) return;
      needed.insert(v);
      needed_memory.insert(g.alias_root(v));
    };
    for (ir::ValueId v : grads) need(v);
    std::vector<ir::NodeId> slice;
    for (auto id = static_cast<ir::NodeId>(g.nodes().size()) - 1; id >= fw_end; --id) {
      const auto& n = g.node(id);
      bool defines = false;
      ir::for_each_value(n.outputs, [&](ir::ValueId v) {
        const ir::ValueId memory = ir::memory_written_through_a_view(g, v);
        defines = defines || needed.count(v) || (memory != ir::kNoValue && needed_memory.count(memory));
      });
      if (!defines) continue;
      if (n.kind == ir::NodeKind::Input) {
        TORCH_CHECK(false, "the backward of the function reads a tensor its forward did not record ('",
                    n.name, "')");
      }
      TORCH_CHECK(n.kind == ir::NodeKind::Call, "a hook runs inside the function's backward (on ",
                  n.autograd_node, "); compiled replay would not call it");
      // Note [Sizes that come from values]: a compiled backward cannot stop and look on.
      TORCH_CHECK(!ir::sizes_from_values(g, n), "its backward runs ", n.qualified_op(),
                  ", whose output sizes come from values (a data-dependent output shape), which a compiled "
                  "backward cannot check");
      slice.push_back(id);
      ir::for_each_value(n.args, need);
    }
    std::reverse(slice.begin(), slice.end());
    keep.insert(keep.end(), slice.begin(), slice.end());
  }
  // Inputs: primals, then tangents.
  std::vector<ir::CutInput> ins;
  for (ir::ValueId v : primal_values_) {
    const auto& n = g.node(g.value(v).producer);
    ins.push_back({v, n.input_kind, n.name});
  }
  for (size_t k = 0; k < tangents.size(); ++k) {
    ins.push_back({tangents[k], ir::InputKind::Tangent,
                   "tangent_" + output_names_.at(static_cast<size_t>(tangent_of[k]))});
  }
  std::vector<ir::CutOutput> outs;
  for (size_t k = 0; k < output_values_.size(); ++k) outs.push_back({output_values_[k], output_names_.at(k)});
  for (size_t k = 0; k < grads.size(); ++k) {
    outs.push_back({grads[k], ins.at(static_cast<size_t>(grad_of[k])).name, ir::OutputKind::Grad});
  }
  JointGraph j;
  j.graph = extract_subgraph(g, keep, ins, outs);
  j.num_primals = primal_values_.size();
  j.num_tangents = tangents.size();
  j.num_user_outputs = output_values_.size();
  j.tangent_of = tangent_of;
  j.grad_of = grad_of;
  return j;
}

}  // namespace tcap::aot
