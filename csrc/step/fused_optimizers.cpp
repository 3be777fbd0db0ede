#include "step/fused_optimizers.h"

#include "ir/verify_args.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace tcap::step {

// Note [Fused optimizer steps]
// torch::optim's step() updates one parameter at a time: Adam records eight ATen ops per
// parameter (mul_, add_, mul_, addcmul_, sqrt, div, add_, addcdiv_), SGD with momentum
// three. On small models those calls, not their arithmetic, are the step's cost, and a
// compiled step that replays them one by one cannot beat eager by much. So after a step
// is verified (its host scalars are patches), each parameter's recorded update is matched
// against the exact chain its optimizer records for its options, and the updates of one
// optimizer group (same options, device, dtype and, for Adam, step count) are replaced by
// one call of ATen's multi-tensor kernel: _fused_adam_, _fused_adamw_ or _fused_sgd_, the
// kernels behind Python's fused=True, with the learning rate (and Adam's step count, fed
// through an aten::full node) as patched scalars. Why ATen's kernels rather than generated
// ones: the optimizers are a closed set of formulas whose multi-tensor kernels ATen
// already ships for CPU and CUDA, and a graph of ATen ops stays replayable, printable and
// serializable as any other.
//
// The match is strict, so that a fused update is the same arithmetic: every op, operand
// and constant of the chain (betas, 1 - beta, eps, momentum, 1 - dampening, weight
// decay) is checked, every intermediate is used by the chain alone, the parameter is
// written through views of itself only, and all tensors are dense with the parameter's
// sizes. What does not match keeps its recorded ops (amsgrad, a hook between, a sparse or
// strided tensor), and says why under TCAP_LOGS=perf. Results agree with eager to
// rounding (the kernels order some operations differently), not bitwise, and Adam
// amplifies that rounding where a gradient is near zero (a bias before BatchNorm: its
// update m / sqrt(v) is then the sign of rounding noise), so a long run drifts from
// eager's. That is why it is opt-in (CompileOptions::fused_optimizers), as fused=True is
// in Python; off, the recorded ops replay eager's bits.
//
// One step count per fused Adam call: a group's parameters are fused only if their
// counters agree when the step is compiled, and a replay checks that they still agree
// (fused_steps_agree), else the step runs eagerly (counters drift apart only when some
// parameters had no gradient in an eager step).

namespace {

using ir::kNoValue;
using ir::NodeId;
using ir::ValueId;
using Kind = FusedForm::Kind;

bool scalar(const ir::Arg& a, double* out) {
  switch (a.kind) {
    case ir::ArgKind::Double: *out = a.d; return true;
    case ir::ArgKind::Int: *out = static_cast<double>(a.i); return true;
    default: return false;
  }
}

bool is(const ir::Node& n, const char* op, const char* overload) {
  return n.kind == ir::NodeKind::Call && n.op == op && n.overload == overload;
}

ValueId value_arg(const ir::Node& n, size_t i) {
  return i < n.args.size() && n.args[i].kind == ir::ArgKind::Value ? n.args[i].values[0] : kNoValue;
}

ValueId result(const ir::Node& n) {
  return !n.outputs.empty() && n.outputs[0].kind == ir::ArgKind::Value ? n.outputs[0].values[0] : kNoValue;
}

struct Chain {
  std::vector<NodeId> nodes;
  ValueId param = kNoValue, grad = kNoValue, state1 = kNoValue, state2 = kNoValue;
  ValueId updated = kNoValue;  // the parameter's last version in the chain (later ops may read it)
};

class Matcher {
 public:
  Matcher(const ir::Graph& g, const std::vector<ScalarPatch>& patches) : g_(g), users_(g.values().size()) {
    for (const auto& n : g.nodes()) {
      ir::for_each_value(n.args, [&](ValueId v) {
        auto& u = users_[static_cast<size_t>(v)];
        if (u.empty() || u.back() != n.id) u.push_back(n.id);
      });
    }
    for (const auto& p : patches) patch_[{p.node, p.arg}] = &p;
  }

  // Parameter (o, j)'s update as its optimizer records it for options f; "" on a match.
  std::string match(size_t o, size_t j, const FusedForm& f, ValueId P, ValueId S1, ValueId S2, Chain* c) {
    c->param = P;
    o_ = o;
    j_ = j;
    const ir::TensorMeta& pm = g_.value(P).meta;
    if (!pm.is_contiguous()) return "the parameter is not contiguous";
    if (f.kind == Kind::Sgd) return match_sgd(f, P, S1, c);
    if (f.amsgrad) return "amsgrad has no fused form here";
    return match_adam(f, P, S1, S2, c);
  }

 private:
  std::string match_adam(const FusedForm& f, ValueId P, ValueId M, ValueId V, Chain* c) {
    if (M == kNoValue || V == kNoValue) return "its exp_avg / exp_avg_sq are not inputs of the step";
    NodeId n8 = patched(HostScalar::NegLrOverBiasCorrection1, "aten::addcdiv_", "", 3);
    if (n8 < 0) return "no addcdiv_ takes its step size";
    const ir::Node& upd = g_.node(n8);
    ValueId pw = value_arg(upd, 0), m2 = value_arg(upd, 1), e = value_arg(upd, 2);
    if (pw == kNoValue || m2 == kNoValue || e == kNoValue) return "addcdiv_ does not take tensors";
    c->updated = result(upd);
    // Decoupled weight decay: p.mul_(1 - lr * weight_decay) first.
    const ir::Node& pw_producer = g_.node(g_.value(pw).producer);
    if (f.kind == Kind::AdamW && f.weight_decay != 0) {
      if (!is(pw_producer, "aten::mul_", "Scalar") || !has_patch(pw_producer.id, 1, HostScalar::OneMinusLrTimesWd)) {
        return "no mul_ applies its decoupled weight decay";
      }
      if (!users_are(pw, {n8}) || !views_of(value_arg(pw_producer, 0), P)) return "its weight decay is not a plain mul_";
      c->nodes.push_back(pw_producer.id);
    } else if (!views_of(pw, P)) {
      return "addcdiv_ writes something else than the parameter";
    }
    // exp_avg.mul_(beta1).add_(grad, 1 - beta1)
    const ir::Node* n2 = producer(m2, "aten::add_", "Tensor");
    if (!n2 || !users_are(m2, {n8})) return "exp_avg is not updated by add_";
    const ValueId m1 = value_arg(*n2, 0), grad = value_arg(*n2, 1);
    const ir::Node* n1 = producer(m1, "aten::mul_", "Scalar");
    if (!n1 || value_arg(*n1, 0) != M || !users_are(M, {n1->id}) || !users_are(m1, {n2->id})) {
      return "exp_avg is not scaled by mul_";
    }
    if (!constant(*n1, 1, f.beta1) || !constant(*n2, 2, 1 - f.beta1)) return "exp_avg's coefficients differ from beta1";
    // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2); sqrt; / sqrt(bc2); add_(eps)
    const ir::Node* n7 = producer(e, "aten::add_", "Scalar");
    if (!n7 || !users_are(e, {n8}) || !constant(*n7, 1, f.eps) || !constant(*n7, 2, 1)) return "the denominator's eps differs";
    const ValueId d = value_arg(*n7, 0);
    const ir::Node* n6 = producer(d, "aten::div", "Scalar");
    if (!n6 || !users_are(d, {n7->id}) || !has_patch(n6->id, 1, HostScalar::SqrtBiasCorrection2)) {
      return "the denominator is not divided by sqrt(1 - beta2^step)";
    }
    const ValueId s = value_arg(*n6, 0);
    const ir::Node* n5 = producer(s, "aten::sqrt", "");
    if (!n5 || !users_are(s, {n6->id})) return "the denominator is not a sqrt";
    const ValueId v2 = value_arg(*n5, 0);
    const ir::Node* n4 = producer(v2, "aten::addcmul_", "");
    if (!n4 || !users_are(v2, {n5->id}) || value_arg(*n4, 1) != grad || value_arg(*n4, 2) != grad ||
        !constant(*n4, 3, 1 - f.beta2)) {
      return "exp_avg_sq is not updated by addcmul_(grad, grad, 1 - beta2)";
    }
    const ValueId v1 = value_arg(*n4, 0);
    const ir::Node* n3 = producer(v1, "aten::mul_", "Scalar");
    if (!n3 || value_arg(*n3, 0) != V || !users_are(V, {n3->id}) || !users_are(v1, {n4->id}) ||
        !constant(*n3, 1, f.beta2)) {
      return "exp_avg_sq is not scaled by mul_(beta2)";
    }
    c->nodes.insert(c->nodes.end(), {n1->id, n2->id, n3->id, n4->id, n5->id, n6->id, n7->id, n8});
    // Adam's (coupled) weight decay: grad = grad.add(p, weight_decay).
    ValueId g0 = grad;
    if (f.kind == Kind::Adam && f.weight_decay != 0) {
      const ir::Node* wd = producer(grad, "aten::add", "Tensor");
      if (!wd || !views_of(value_arg(*wd, 1), P) || !constant(*wd, 2, f.weight_decay) ||
          !users_are(grad, {n2->id, n4->id})) {
        return "its weight decay is not grad.add(p, weight_decay)";
      }
      g0 = value_arg(*wd, 0);
      c->nodes.push_back(wd->id);
    }
    c->grad = g0;
    c->state1 = M;
    c->state2 = V;
    return dense_like(P, {g0, M, V});
  }

  std::string match_sgd(const FusedForm& f, ValueId P, ValueId B, Chain* c) {
    const NodeId n3 = patched(HostScalar::NegLr, "aten::add_", "Tensor", 2);
    if (n3 < 0) return "no add_ takes its learning rate";
    const ir::Node& upd = g_.node(n3);
    if (!views_of(value_arg(upd, 0), P)) return "add_ writes something else than the parameter";
    c->updated = result(upd);
    const ValueId x = value_arg(upd, 1);  // the direction: grad, buf, or grad + momentum * buf
    c->nodes.push_back(n3);
    ValueId grad = x;
    if (f.momentum != 0) {
      if (B == kNoValue) return "its momentum buffer is not an input of the step";
      ValueId b2 = x;
      ValueId nesterov_grad = kNoValue;
      if (f.nesterov) {  // d_p = d_p.add(buf, momentum)
        const ir::Node* nn = producer(x, "aten::add", "Tensor");
        if (!nn || !users_are(x, {n3}) || !constant(*nn, 2, f.momentum)) return "its Nesterov step differs";
        nesterov_grad = value_arg(*nn, 0);
        b2 = value_arg(*nn, 1);
        if (!users_are(b2, {nn->id})) return "its momentum buffer is read in the step";
        c->nodes.push_back(nn->id);
      } else if (!users_are(b2, {n3})) {
        return "its momentum buffer is read in the step";
      }
      // buf.mul_(momentum).add_(d_p, 1 - dampening)
      const ir::Node* n2 = producer(b2, "aten::add_", "Tensor");
      if (!n2 || !constant(*n2, 2, 1 - f.dampening)) return "its momentum buffer is not updated by add_";
      grad = value_arg(*n2, 1);
      if (f.nesterov && grad != nesterov_grad) return "its Nesterov step reads another gradient";
      const ValueId b1 = value_arg(*n2, 0);
      const ir::Node* n1 = producer(b1, "aten::mul_", "Scalar");
      if (!n1 || value_arg(*n1, 0) != B || !users_are(B, {n1->id}) || !users_are(b1, {n2->id}) ||
          !constant(*n1, 1, f.momentum)) {
        return "its momentum buffer is not scaled by mul_(momentum)";
      }
      c->nodes.push_back(n2->id);
      c->nodes.push_back(n1->id);
      c->state1 = B;
    }
    if (f.weight_decay != 0) {  // d_p = d_p.add(p, weight_decay)
      const ir::Node* wd = producer(grad, "aten::add", "Tensor");
      if (!wd || !views_of(value_arg(*wd, 1), P) || !constant(*wd, 2, f.weight_decay)) {
        return "its weight decay is not grad.add(p, weight_decay)";
      }
      for (NodeId u : users_[static_cast<size_t>(grad)]) {
        if (std::find(c->nodes.begin(), c->nodes.end(), u) == c->nodes.end()) return "its decayed gradient is read elsewhere";
      }
      grad = value_arg(*wd, 0);
      c->nodes.push_back(wd->id);
    }
    if (grad == kNoValue) return "its gradient is not a tensor";
    c->grad = grad;
    std::vector<ValueId> same{grad};
    if (c->state1 != kNoValue) same.push_back(c->state1);
    return dense_like(P, same);
  }

  // The one node holding the patch `x` of this parameter at argument `arg`, if it is op.
  NodeId patched(HostScalar x, const char* op, const char* overload, size_t arg) const {
    NodeId found = -1;
    for (const auto& [key, p] : patch_) {
      if (p->opt != o_ || p->param != j_ || p->expr != x) continue;
      if (found >= 0 || key.second != arg || !is(g_.node(key.first), op, overload)) return -1;
      found = key.first;
    }
    return found;
  }
  bool has_patch(NodeId n, size_t arg, HostScalar x) const {
    auto it = patch_.find({n, arg});
    return it != patch_.end() && it->second->expr == x && it->second->opt == o_ && it->second->param == j_;
  }
  const ir::Node* producer(ValueId v, const char* op, const char* overload) const {
    if (v == kNoValue) return nullptr;
    const ir::Node& n = g_.node(g_.value(v).producer);
    return is(n, op, overload) && result(n) == v ? &n : nullptr;
  }
  bool users_are(ValueId v, std::initializer_list<NodeId> nodes) const {
    if (v == kNoValue) return false;
    const auto& u = users_[static_cast<size_t>(v)];
    return u.size() == nodes.size() && std::equal(u.begin(), u.end(), nodes.begin());
  }
  bool constant(const ir::Node& n, size_t arg, double want) const {
    double x = 0;
    return arg < n.args.size() && !patch_.count({n.id, arg}) && scalar(n.args[arg], &x) && x == want;
  }
  // v is P, or a view of P (through views only) with P's layout.
  bool views_of(ValueId v, ValueId P) const {
    if (v == kNoValue) return false;
    const ir::TensorMeta& pm = g_.value(P).meta;
    const ir::TensorMeta& vm = g_.value(v).meta;
    if (vm.sizes != pm.sizes || vm.strides != pm.strides || vm.storage_offset != pm.storage_offset) return false;
    while (v != P) {
      const ir::Value& val = g_.value(v);
      if (val.view_of == kNoValue || val.version_of != kNoValue) return false;
      v = val.view_of;
    }
    return true;
  }
  std::string dense_like(ValueId P, const std::vector<ValueId>& vs) const {
    const ir::TensorMeta& pm = g_.value(P).meta;
    for (ValueId v : vs) {
      const ir::TensorMeta& m = g_.value(v).meta;
      if (m.sizes != pm.sizes || m.dtype != pm.dtype || m.device != pm.device) {
        return "its gradient or state differs from the parameter in sizes, dtype or device";
      }
      if (!m.is_contiguous()) return "its gradient or state is not contiguous";
    }
    return "";
  }

  const ir::Graph& g_;
  std::vector<std::vector<NodeId>> users_;
  std::map<std::pair<NodeId, size_t>, const ScalarPatch*> patch_;
  size_t o_ = 0, j_ = 0;
};

struct Group {
  size_t opt = 0;
  FusedForm form;
  int64_t step = 0;
  std::vector<size_t> params;
  std::vector<Chain> chains;
  NodeId first = 0, last = 0;
};

}  // namespace

FusedOptimizerSteps fuse_optimizer_steps(const ir::Graph& g, const std::vector<ScalarPatch>& patches,
                                         const std::vector<const OptimizerAdapter*>& opts,
                                         const std::map<std::pair<size_t, size_t>, ir::ValueId>& params) {
  FusedOptimizerSteps r;
  std::unordered_map<std::string, ValueId> input_named;
  for (NodeId id : g.input_nodes()) input_named[g.node(id).name] = result(g.node(id));
  auto state = [&](size_t o, size_t j, const char* what) {
    auto it = input_named.find("opt" + std::to_string(o) + ".p" + std::to_string(j) + "." + what);
    return it == input_named.end() ? kNoValue : it->second;
  };
  Matcher m(g, patches);
  std::vector<Group> groups;
  for (const auto& [key, P] : params) {
    const auto [o, j] = key;
    const FusedForm f = opts.at(o)->fused_form(j);
    if (f.kind == Kind::None) continue;
    const bool has_patches = std::any_of(patches.begin(), patches.end(),
                                         [&, o = o, j = j](const ScalarPatch& p) { return p.opt == o && p.param == j; });
    if (!has_patches) continue;  // no update of this parameter in the step (no gradient)
    Chain c;
    std::string why = f.kind == Kind::Sgd ? m.match(o, j, f, P, state(o, j, "momentum_buffer"), kNoValue, &c)
                                          : m.match(o, j, f, P, state(o, j, "exp_avg"), state(o, j, "exp_avg_sq"), &c);
    // Every host scalar of the update must sit on its chain (they are all replaced).
    for (const auto& p : patches) {
      if (why.empty() && p.opt == o && p.param == j && std::find(c.nodes.begin(), c.nodes.end(), p.node) == c.nodes.end()) {
        why = "a host scalar of its update is used outside it";
      }
    }
    if (!why.empty()) {
      r.kept.push_back("optimizer " + std::to_string(o) + " parameter " + std::to_string(j) + ": " + why);
      continue;
    }
    const ir::TensorMeta& pm = g.value(P).meta;
    const int64_t step = f.kind == Kind::Sgd ? 0 : opts[o]->host_state(j).step;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& gr) {
      const ir::TensorMeta& qm = g.value(gr.chains[0].param).meta;
      return gr.opt == o && gr.form == f && gr.step == step && qm.device == pm.device && qm.dtype == pm.dtype;
    });
    if (it == groups.end()) {
      groups.push_back(Group{o, f, step, {}, {}, 0, 0});
      it = groups.end() - 1;
    }
    it->params.push_back(j);
    it->chains.push_back(std::move(c));
  }
  // A group's call runs where its last update ran: nothing in between may touch its
  // tensors or read what its updates made.
  std::vector<char> removed(g.nodes().size(), 0);
  for (auto it = groups.begin(); it != groups.end();) {
    std::unordered_set<ValueId> touched;  // alias roots of the group's tensors, and the chains' results
    std::unordered_set<ValueId> grads;    // alias roots of its gradients: read by the fused call, so not written
    std::unordered_set<NodeId> own;
    it->first = static_cast<NodeId>(g.nodes().size());
    it->last = 0;
    for (const auto& c : it->chains) {
      for (ValueId v : {c.param, c.state1, c.state2}) {
        if (v != kNoValue) touched.insert(g.alias_root(v));
      }
      grads.insert(g.alias_root(c.grad));
      for (NodeId n : c.nodes) {
        own.insert(n);
        it->first = std::min(it->first, n);
        it->last = std::max(it->last, n);
        ir::for_each_value(g.node(n).outputs, [&](ValueId v) { touched.insert(v); });
      }
    }
    std::string why;
    for (NodeId n = it->first; n < it->last && why.empty(); ++n) {
      if (own.count(n)) continue;
      const ir::Node& node = g.node(n);
      const std::string here = node.qualified_op() + " (node %" + std::to_string(n) + ")";
      ir::for_each_value(node.args, [&](ValueId v) {
        if (touched.count(v) || touched.count(g.alias_root(v))) why = here;
      });
      ir::for_each_value(node.outputs, [&](ValueId v) {
        const ValueId root = g.alias_root(v);
        if (touched.count(v) || touched.count(root) || (g.value(v).version_of != kNoValue && grads.count(root))) why = here;
      });
    }
    if (!why.empty()) {
      r.kept.push_back("optimizer " + std::to_string(it->opt) + ": " + why + " runs between its updates and uses them");
      it = groups.erase(it);
      continue;
    }
    for (NodeId n : own) removed[static_cast<size_t>(n)] = 1;
    ++it;
  }
  if (groups.empty()) {
    r.graph = g;
    r.patches = patches;
    return r;
  }

  ir::Graph& out = r.graph;
  for (const ir::Hook& hk : g.hooks()) out.add_hook(hk.kind, hk.autograd_node, hk.slot);
  out.meta() = g.meta();
  std::unordered_map<ValueId, ValueId> map;
  std::vector<NodeId> new_id(g.nodes().size(), -1);
  auto emit = [&](const Group& gr) {
    const ir::TensorMeta pm = g.value(gr.chains[0].param).meta;
    const size_t first_param = gr.params.front();
    auto list = [&](auto member, const char* name) {
      std::vector<ValueId> vs;
      for (const auto& c : gr.chains) {
        if (c.*member != kNoValue) vs.push_back(map.at(c.*member));
      }
      return ir::Arg::value_list(vs, false, name);
    };
    ir::Node call;
    call.kind = ir::NodeKind::Call;
    call.grad_mode = false;
    call.phase = ir::Phase::Forward;
    std::vector<ir::Arg> written;  // the lists the op writes, in schema order
    size_t lr_arg = 0;
    if (gr.form.kind == Kind::Sgd) {
      call.op = "aten::_fused_sgd_";
      call.args = {list(&Chain::param, "self"), list(&Chain::grad, "grads"), list(&Chain::state1, "momentum_buffer_list"),
                   ir::Arg::real(gr.form.weight_decay, "weight_decay"), ir::Arg::real(gr.form.momentum, "momentum"),
                   ir::Arg::real(opts[gr.opt]->host_state(first_param).lr, "lr"),
                   ir::Arg::real(gr.form.dampening, "dampening"), ir::Arg::boolean(gr.form.nesterov, "nesterov"),
                   ir::Arg::boolean(false, "maximize"), ir::Arg::boolean(false, "is_first_step"),
                   ir::Arg::none("grad_scale"), ir::Arg::none("found_inf")};
      lr_arg = 5;
      written = {call.args[0], call.args[1], call.args[2]};
    } else {
      // The step count, as the 0-dim tensor the kernel reads: aten::full([], step).
      ir::Arg size;
      size.kind = ir::ArgKind::IntList;
      size.name = "size";
      ir::Arg dtype;
      dtype.kind = ir::ArgKind::ScalarType;
      dtype.name = "dtype";
      dtype.i = static_cast<int64_t>(c10::ScalarType::Float);
      ir::Arg device;
      device.kind = ir::ArgKind::Device;
      device.name = "device";
      device.s = pm.device.str();
      ir::TensorMeta sm;
      sm.dtype = c10::ScalarType::Float;
      sm.device = pm.device;
      ir::Node no_grad;
      no_grad.grad_mode = false;
      const ValueId step = out.add_call("aten::full", "",
                                        {size, ir::Arg::real(static_cast<double>(gr.step), "fill_value"), dtype,
                                         ir::Arg::none("layout"), device, ir::Arg::none("pin_memory")},
                                        sm, &no_grad);
      const NodeId full_id = out.value(step).producer;
      r.patches.push_back(ScalarPatch{full_id, 1, gr.opt, first_param, HostScalar::Step});
      call.op = gr.form.kind == Kind::AdamW ? "aten::_fused_adamw_" : "aten::_fused_adam_";
      call.args = {list(&Chain::param, "self"), list(&Chain::grad, "grads"), list(&Chain::state1, "exp_avgs"),
                   list(&Chain::state2, "exp_avg_sqs"), ir::Arg::value_list({}, false, "max_exp_avg_sqs"),
                   ir::Arg::value_list(std::vector<ValueId>(gr.chains.size(), step), false, "state_steps"),
                   ir::Arg::real(opts[gr.opt]->host_state(first_param).lr, "lr"), ir::Arg::real(gr.form.beta1, "beta1"),
                   ir::Arg::real(gr.form.beta2, "beta2"), ir::Arg::real(gr.form.weight_decay, "weight_decay"),
                   ir::Arg::real(gr.form.eps, "eps"), ir::Arg::boolean(false, "amsgrad"),
                   ir::Arg::boolean(false, "maximize"), ir::Arg::none("grad_scale"), ir::Arg::none("found_inf")};
      lr_arg = 6;
      written = {call.args[0], call.args[1], call.args[2], call.args[3]};
    }
    // No results: every element of a written list gets a new version (as the recorder
    // records a mutated argument the op does not return).
    const auto call_id = static_cast<NodeId>(out.nodes().size());
    int index = 0;
    for (const auto& a : written) {
      for (ValueId v : a.values) {
        const ValueId nv = out.new_value(call_id, index++, -1, out.value(v).meta);
        out.value(nv).version_of = v;
        call.outputs.push_back(ir::Arg::value(nv));
      }
    }
    // Ops after the call that read an updated parameter (a model used again after its
    // optimizer's step) read the call's new version of it.
    for (size_t k = 0; k < gr.chains.size(); ++k) {
      if (gr.chains[k].updated != kNoValue) map[gr.chains[k].updated] = call.outputs[k].values[0];
    }
    out.add_node(std::move(call));
    out.schemas()[out.node(call_id).op] = ir::known_schema_string(out.node(call_id).op, "");
    r.patches.push_back(ScalarPatch{call_id, lr_arg, gr.opt, first_param, HostScalar::Lr});
    r.groups.push_back(MultiTensorUpdate{gr.opt, gr.params});
    r.fused_params += static_cast<int>(gr.params.size());
  };
  std::vector<ValueId> outs;
  std::vector<std::string> out_names;
  std::vector<ir::OutputKind> out_kinds;
  for (const auto& n : g.nodes()) {
    if (n.kind == ir::NodeKind::Input) {
      const ValueId v = result(n);
      map[v] = out.add_input(n.input_kind, n.name, g.value(v).meta);
      new_id[static_cast<size_t>(n.id)] = out.value(map[v]).producer;
      continue;
    }
    if (n.kind == ir::NodeKind::Output) {
      for (const auto& a : n.args) outs.push_back(map.at(a.values.at(0)));
      out_names = n.output_names;
      out_kinds = n.output_kinds;
      continue;
    }
    if (!removed[static_cast<size_t>(n.id)]) {
      new_id[static_cast<size_t>(n.id)] = ir::copy_node(g, n, out, map);
      continue;
    }
    for (const auto& gr : groups) {
      if (gr.last == n.id) emit(gr);
    }
  }
  out.set_outputs(std::move(outs), std::move(out_names), std::move(out_kinds));
  for (const auto& p : patches) {
    if (removed[static_cast<size_t>(p.node)]) continue;  // replaced by the fused calls' own
    ScalarPatch q = p;
    q.node = new_id[static_cast<size_t>(p.node)];
    r.patches.push_back(q);
  }
  return r;
}

bool fused_steps_agree(const std::vector<MultiTensorUpdate>& groups, const std::vector<const OptimizerAdapter*>& opts) {
  for (const auto& gr : groups) {
    if (gr.params.empty()) continue;
    const OptimizerAdapter& o = *opts.at(gr.opt);
    if (o.fused_form(gr.params[0]).kind == FusedForm::Kind::Sgd) continue;  // no step count
    const int64_t step = o.host_state(gr.params[0]).step;
    for (size_t j : gr.params) {
      if (o.host_state(j).step != step) return false;
    }
  }
  return true;
}

}  // namespace tcap::step
