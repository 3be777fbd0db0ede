#include "step/step_history.h"

#include "aot/replay_function.h"
#include "ir/op_facts.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace tcap::step {

std::string make_history_slice(const ir::Graph& g, const std::vector<size_t>& outputs, const std::vector<bool>& buffer,
                               const std::vector<ir::NodeId>& patched, HistorySlice* out) {
  const auto outs = g.output_values();
  const auto input_nodes = g.input_nodes();
  auto input_of = [&](ir::ValueId v) -> std::optional<size_t> {
    const ir::Node& p = g.node(g.value(v).producer);
    if (p.kind != ir::NodeKind::Input) return std::nullopt;
    auto it = std::find(input_nodes.begin(), input_nodes.end(), p.id);
    return static_cast<size_t>(it - input_nodes.begin());
  };
  auto name_of = [&](size_t i) { return "'" + g.node(input_nodes.at(i)).name + "'"; };
  const std::string what = "the history of output " + std::to_string(outputs.front());
  // The value each output was computed as. A tensor and its detached twin share storage
  // and geometry, so capture may name the output by a later detach() of it (the step
  // detached it for its own loss): the history needs the value before the detach.
  std::vector<ir::ValueId> made;
  for (size_t k : outputs) {
    ir::ValueId v = outs.at(k);
    for (;;) {
      const ir::Node& p = g.node(g.value(v).producer);
      if (p.kind != ir::NodeKind::Call || p.op != "aten::detach" || p.args.empty() || p.args[0].values.empty()) break;
      v = p.args[0].values[0];
    }
    made.push_back(v);
  }
  // Per input: the value it holds when the step ends, where the step writes it (the
  // optimizer's update of a parameter). A slice reading that value reads the input after
  // the replay instead of redoing the update (which a recompute could not: the parameter
  // is a leaf that requires grad). Writes through a view after the last whole write leave
  // no such value.
  const auto input_value = [&](size_t i) { return g.node(input_nodes[i]).outputs.at(0).values.at(0); };
  std::unordered_map<ir::ValueId, size_t> final_of;  // final value -> input
  std::vector<ir::ValueId> final_value(input_nodes.size(), ir::kNoValue);
  {
    std::unordered_map<size_t, ir::ValueId> last_write;  // input -> newest written value
    for (const auto& v : g.values()) {
      if (v.version_of == ir::kNoValue) continue;
      auto i = input_of(g.alias_root(v.id));
      if (!i) continue;
      auto& last = last_write[*i];
      last = std::max(last, v.id);
    }
    for (const auto& [i, v] : last_write) {
      ir::ValueId w = v;
      while (g.value(w).version_of != ir::kNoValue) w = g.value(w).version_of;
      if (w != input_value(i)) continue;
      final_of[v] = i;
      final_value[i] = v;
    }
  }
  std::vector<bool> reads_final(input_nodes.size(), false);
  std::unordered_set<ir::ValueId> needed;
  auto need = [&](ir::ValueId v) {
    if (auto it = final_of.find(v); it != final_of.end()) {
      reads_final[it->second] = true;
      return;
    }
    needed.insert(v);
  };
  for (ir::ValueId v : made) need(v);
  std::vector<ir::NodeId> keep;
  std::unordered_set<ir::NodeId> kept;
  for (auto it = g.nodes().rbegin(); it != g.nodes().rend(); ++it) {
    const ir::Node& n = *it;
    if (n.kind != ir::NodeKind::Call && n.kind != ir::NodeKind::CallHook) continue;
    bool live = false;
    ir::for_each_value(n.outputs, [&](ir::ValueId v) { live = live || needed.count(v) > 0; });
    if (!live) continue;
    if (n.kind == ir::NodeKind::CallHook) return what + " runs a hook";
    const std::string op = n.qualified_op();
    if (n.draws_random_numbers()) {
      return what + " draws random numbers (" + op + "): a recompute would draw others; make and consume it in one "
             "compile_step (docs/compile.md, \"Outputs with autograd history\")";
    }
    if (ir::op_has(n.op, ir::OpFact::Collective)) return what + " issues a collective (" + op + ")";
    if (std::find(patched.begin(), patched.end(), n.id) != patched.end()) {
      return what + " uses a scalar the optimizer recomputes every step (" + op + ")";
    }
    keep.push_back(n.id);
    kept.insert(n.id);
    ir::for_each_value(n.args, need);
  }
  std::reverse(keep.begin(), keep.end());
  // The inputs other ops of the step write, and those the slice writes.
  std::vector<bool> written_elsewhere(input_nodes.size(), false), written_here(input_nodes.size(), false);
  for (const auto& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    auto& written = kept.count(n.id) ? written_here : written_elsewhere;
    ir::for_each_value(n.outputs, [&](ir::ValueId v) {
      if (g.value(v).version_of == ir::kNoValue) return;
      if (auto i = input_of(g.alias_root(v))) written[*i] = true;
    });
    for (size_t a : ir::hidden_writes(n)) {  // Note [Writes a schema does not show]
      if (auto i = input_of(g.alias_root(n.args[a].values.at(0)))) written[*i] = true;
    }
  }
  HistorySlice s;
  s.outputs = outputs;
  std::vector<ir::CutInput> ins;
  for (size_t i = 0; i < input_nodes.size(); ++i) {
    const ir::Node& in = g.node(input_nodes[i]);
    const ir::ValueId v = in.outputs.at(0).values.at(0);
    const bool reads_start = needed.count(v) > 0;
    if (!reads_start && !written_here[i] && !reads_final[i]) continue;
    if (reads_start && written_elsewhere[i]) {
      return what + " reads " + name_of(i) + ", which the step changes in place afterwards (eager's backward "
             "would see it changed): compute the output after the update, or return it detached";
    }
    if (written_here[i] && !(i < buffer.size() && buffer[i])) {
      return what + " changes " + name_of(i) + " in place, which is not a module buffer";
    }
    if (written_here[i] && (written_elsewhere[i] || reads_final[i])) {
      return what + " changes " + name_of(i) + ", which other ops of the step change too";
    }
    if (written_here[i]) s.written.push_back(ins.size());
    s.inputs.push_back(i);
    ins.push_back({reads_final[i] ? final_value[i] : v, in.input_kind, in.name});
  }
  std::vector<ir::CutOutput> cut_outs;
  for (size_t j = 0; j < outputs.size(); ++j) cut_outs.push_back({made[j], "out" + std::to_string(outputs[j])});
  s.graph = ir::extract_subgraph(g, keep, ins, cut_outs);
  ir::verify(s.graph);
  *out = std::move(s);
  return "";
}

struct HistoryCall {
  std::shared_ptr<const HistorySlice> slice;
  std::string who;
  std::vector<at::Tensor> primals;  // per slice input; a clone where the slice writes it
  std::vector<uint32_t> versions;   // of the primals that are not clones, after the replay
  std::vector<at::Tensor> values;   // the outputs, until the history takes them
  std::vector<size_t> diff;         // the primals that require grad (the node's inputs)
  bool released = false;

  void release() {
    released = true;
    std::vector<at::Tensor>().swap(primals);
  }
  // SavedVariable's checks: not released, nothing changed in place since the replay.
  void check() const {
    TORCH_CHECK(!released, torch::autograd::ERR_BACKWARD_TWICE);
    const auto& w = slice->written;
    for (size_t j = 0; j < primals.size(); ++j) {
      if (std::find(w.begin(), w.end(), j) != w.end()) continue;
      const uint32_t now = primals[j]._version();
      TORCH_CHECK(now == versions[j],
                  "one of the variables needed for gradient computation has been modified by an inplace operation: "
                  "'", slice->graph.node(slice->graph.input_nodes().at(j)).name, "' ([", primals[j].toString(), " ",
                  primals[j].sizes(), "]), read by the outputs ", who, " returned with their history, is at version ",
                  now, "; expected version ", versions[j], " instead.");
    }
  }
};

std::shared_ptr<HistoryCall> before_step(const std::shared_ptr<const HistorySlice>& slice,
                                         const std::vector<at::Tensor>& primals, std::string who) {
  auto c = std::make_shared<HistoryCall>();
  c->slice = slice;
  c->who = std::move(who);
  const auto& w = slice->written;
  for (size_t j = 0; j < slice->inputs.size(); ++j) {
    const at::Tensor& t = primals.at(slice->inputs[j]);
    const bool clone = std::find(w.begin(), w.end(), j) != w.end();
    c->primals.push_back(clone ? t.detach().clone() : t);
  }
  return c;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct CallHolder : torch::CustomClassHolder {
  explicit CallHolder(std::shared_ptr<HistoryCall> c) : call(std::move(c)) {}
  std::shared_ptr<HistoryCall> call;
};

struct StepHistory : torch::autograd::Function<StepHistory> {
  static variable_list forward(AutogradContext* ctx, at::TensorList /*diff*/, std::shared_ptr<HistoryCall> call) {
    variable_list out = std::move(call->values);
    ctx->saved_data["call"] = c10::IValue::make_capsule(c10::make_intrusive<CallHolder>(std::move(call)));
    ctx->set_materialize_grads(false);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<CallHolder>(ctx->saved_data["call"].toCapsule());
    HistoryCall& c = *holder->call;
    c.check();
    const auto& w = c.slice->written;
    const bool create_graph = at::GradMode::is_enabled();
    std::vector<at::Tensor> primals = c.primals;
    if (!torch::autograd::get_current_graph_task_keep_graph()) c.release();
    variable_list all = aot::recompute_gradients(c.slice->graph, w, primals, grads, c.slice->outputs.size(), create_graph);
    variable_list result;
    result.reserve(c.diff.size() + 1);
    for (size_t j : c.diff) result.push_back(std::move(all[j]));
    result.emplace_back();  // the call argument's
    return result;
  }
};

using HistoryNode = torch::autograd::CppNode<StepHistory>;

HistoryCall* call_of(torch::autograd::Node& node) {
  auto* n = dynamic_cast<HistoryNode*>(&node);
  if (!n) return nullptr;
  auto it = n->ctx_.saved_data.find("call");
  if (it == n->ctx_.saved_data.end()) return nullptr;
  return static_cast<CallHolder*>(it->second.toCapsule().get())->call.get();
}

}  // namespace

std::shared_ptr<torch::autograd::Node> history_tensors(const at::Tensor& input, std::vector<at::Tensor>& out,
                                                       std::vector<std::string>* names) {
  if (!input.defined() || !input.requires_grad()) return nullptr;
  auto fn = input.grad_fn();
  if (!fn) return nullptr;
  HistoryCall* c = call_of(*fn);
  if (!c || c->released) return nullptr;
  c->check();
  for (size_t j = 0; j < c->primals.size(); ++j) {
    out.push_back(c->primals[j]);
    if (names) names->push_back(c->slice->graph.node(c->slice->graph.input_nodes().at(j)).name);
  }
  return fn;
}

bool is_history_node(const torch::autograd::Node& n) { return dynamic_cast<const HistoryNode*>(&n) != nullptr; }

void release_history(torch::autograd::Node& node) {
  if (HistoryCall* c = call_of(node)) c->release();
}

void attach_history(const std::shared_ptr<HistoryCall>& call, std::vector<at::Tensor>& outs) {
  if (!at::GradMode::is_enabled()) return;
  for (const auto& t : call->primals) call->versions.push_back(t._version());  // clones' are never checked
  std::vector<at::Tensor> diff;
  for (size_t j = 0; j < call->primals.size(); ++j) {
    if (call->primals[j].requires_grad()) {
      call->diff.push_back(j);
      diff.push_back(call->primals[j]);
    }
  }
  if (diff.empty()) return;
  const auto& ks = call->slice->outputs;
  for (size_t k : ks) call->values.push_back(outs.at(k));
  variable_list with = StepHistory::apply(at::TensorList(diff), call);
  for (size_t j = 0; j < ks.size(); ++j) outs[ks[j]] = std::move(with[j]);
}

}  // namespace tcap::step
