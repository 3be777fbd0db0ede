#include "step/step_inputs.h"

#include "step/step_history.h"

#include "capture/engine_shim.h"
#include "capture/hooks.h"

#include <algorithm>
#include <optional>

namespace tcap::step {

const at::Tensor& StepInputs::leaf(size_t j) const {
  return j < params.size() ? params[j].tensor : ts.at(input_leaves.at(j - params.size()));
}

std::string StepInputs::leaf_name(size_t j) const {
  if (j < params.size()) return params[j].name;
  const size_t k = input_leaves.at(j - params.size());
  return k < names.size() ? names[k] : "in" + std::to_string(k);
}

cache::CallView StepInputs::view() const {
  cache::CallView v;
  v.tensors = ts;
  v.modules = &modules;
  v.scalars = &scalars;
  v.structure = structure;
  return v;
}

// Note [A structure key without names]
// compile_step gathers its tensors on every call. The names of the graph's inputs (a
// parameter's dotted path, "opt0.p3.exp_avg") are needed only to capture and to explain a
// miss, and building them per call cost 8-12% of a small step; a replay's gather
// (with_names false) builds none. The structure key guards what the names did, as bytes:
// the number of user inputs, parameters and buffers, which parameters have a .grad, each
// optimizer state tensor's parameter and slot, hook counts, what DDP's hooks record, the
// tensors of earlier steps' histories. Both gathers walk the same tensors in the same
// order (each module's own parameters over modules(), the order named_parameters() walks
// them in), so a call's key and its capture's agree.
//
// Note [Optimizer state by parameter identity]
// The key also holds, per parameter (found by identity among the models' parameters), the
// optimizer and the position in its param groups it has, and per state tensor the
// parameter it belongs to: a reordered param group, or a parameter moved to another
// group, changes which state and which learning rate a recorded update reads.
namespace {

void key_int(std::string& key, int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof(v)); }

}  // namespace

StepInputs gather_step_inputs(const StepParts& parts, const std::vector<at::Tensor>& user, bool with_names) {
  const auto& models = parts.models;
  const auto& opts = parts.opts;
  StepInputs g;
  std::string& key = g.structure;
  auto add = [&](const at::Tensor& t, ir::InputKind kind, auto&& name) {  // name(): called with names only
    g.ts.push_back(t);
    g.kinds.push_back(kind);
    if (with_names) g.names.push_back(name());
  };
  for (size_t k = 0; k < user.size(); ++k) {
    add(user[k], ir::InputKind::UserInput, [k] { return "in" + std::to_string(k); });
  }
  key_int(key, static_cast<int64_t>(user.size()));
  // Parameters: the models' (deduplicated), then the optimizers' that no model has.
  std::vector<std::pair<const c10::TensorImpl*, size_t>> index;  // sorted: parameter -> position
  auto find = [&](const at::Tensor& t) -> std::optional<size_t> {
    const std::pair<const c10::TensorImpl*, size_t> probe{t.unsafeGetTensorImpl(), 0};
    auto it = std::lower_bound(index.begin(), index.end(), probe);
    if (it != index.end() && it->first == t.unsafeGetTensorImpl()) return it->second;
    return std::nullopt;
  };
  // The models as they are now (Note [Module state guards]), each module's own tensors
  // in the order named_parameters(true) walks them; with several models their names start
  // with "m<i>.".
  cache::read_modules(models, g.modules, with_names);
  {
    std::vector<at::Tensor> ps;
    std::vector<std::string> pn;
    if (with_names) g.modules.append_named_tensors(/*buffers=*/false, ps, pn);
    else g.modules.append_tensors(/*buffers=*/false, ps);
    for (size_t j = 0; j < ps.size(); ++j) {
      if (find(ps[j])) continue;  // tied weights: once
      const std::pair<const c10::TensorImpl*, size_t> entry{ps[j].unsafeGetTensorImpl(), g.params.size()};
      index.insert(std::upper_bound(index.begin(), index.end(), entry), entry);
      g.params.push_back({ps[j], with_names ? pn[j] : std::string()});
    }
  }
  const size_t model_params = g.params.size();
  for (size_t o = 0; o < opts.size(); ++o) {
    const auto ps = opts[o]->params();
    for (size_t j = 0; j < ps.size(); ++j) {
      std::optional<size_t> at = find(ps[j]);
      for (size_t q = model_params; !at && q < g.params.size(); ++q) {
        if (g.params[q].tensor.is_same(ps[j])) at = q;
      }
      if (!at) {
        at = g.params.size();
        g.params.push_back({ps[j], with_names ? "opt" + std::to_string(o) + ".p" + std::to_string(j) : std::string()});
      }
      StepParam& p = g.params[*at];
      if (p.opt < 0) {
        p.opt = static_cast<int>(o);
        p.index = j;
      }
    }
  }
  key_int(key, static_cast<int64_t>(g.params.size()));
  // Which optimizer and position each parameter has (Note [Optimizer state by parameter
  // identity]): LibTorch keys optimizer state by the parameter tensor, and a graph's update
  // of one parameter reads the state and host scalars of its (optimizer, position), so a
  // param group reordered or a parameter moved to another group recaptures.
  for (const auto& p : g.params) {
    key_int(key, p.opt);
    key_int(key, static_cast<int64_t>(p.index));
  }
  for (const auto& p : g.params) {
    g.param_input.push_back(static_cast<int>(g.ts.size()));
    add(p.tensor, ir::InputKind::Parameter, [&p] { return p.name; });
  }
  {
    std::vector<at::Tensor> bs;
    std::vector<std::string> bn;
    if (with_names) g.modules.append_named_tensors(/*buffers=*/true, bs, bn);
    else g.modules.append_tensors(/*buffers=*/true, bs);
    key_int(key, static_cast<int64_t>(bs.size()));
    for (size_t j = 0; j < bs.size(); ++j) add(bs[j], ir::InputKind::Buffer, [&] { return bn[j]; });
  }
  // Note [Leaves of a step]: the user inputs that are leaves requiring grad get a .grad
  // from the step's backward, as parameters do (a parameter passed as an input counts once).
  for (size_t k = 0; k < user.size(); ++k) {
    const at::Tensor& t = user[k];
    if (t.defined() && t.requires_grad() && t.is_leaf() && !find(t)) g.input_leaves.push_back(k);
  }
  key_int(key, static_cast<int64_t>(g.input_leaves.size()));
  for (size_t j = 0; j < g.num_leaves(); ++j) {
    const at::Tensor& gr = g.leaf(j).grad();
    g.grad_input.push_back(gr.defined() ? static_cast<int>(g.ts.size()) : -1);
    key.push_back(gr.defined() ? 'g' : '-');
    if (gr.defined()) add(gr, ir::InputKind::Buffer, [&] { return g.leaf_name(j) + ".grad"; });
  }
  for (size_t o = 0; o < opts.size(); ++o) {
    std::vector<at::Tensor> st;
    std::vector<std::string> sn;
    std::vector<size_t> sj;
    StateSink sink{st, with_names ? &sn : nullptr, with_names ? "opt" + std::to_string(o) + "." : "", &key, &sj};
    key.push_back('s');
    opts[o]->state_tensors(sink);
    for (size_t k = 0; k < st.size(); ++k) {
      g.state_input.push_back(g.ts.size());
      int param = -1;
      for (size_t q = 0; q < g.params.size() && param < 0; ++q) {
        if (g.params[q].opt == static_cast<int>(o) && g.params[q].index == sj[k]) param = static_cast<int>(q);
      }
      g.state_param.push_back(param);
      key_int(key, param);  // the parameter a state tensor belongs to, by identity
      add(st[k], ir::InputKind::Buffer, [&] { return sn[k]; });
    }
  }
  // Note [Backpropagating into an earlier step's outputs]
  for (size_t k = 0; k < user.size(); ++k) {
    std::vector<at::Tensor> hts;
    std::vector<std::string> hnames;
    auto node = history_tensors(user[k], hts, with_names ? &hnames : nullptr);
    if (!node) continue;
    g.histories.push_back(std::move(node));
    key.push_back('h');
    key_int(key, static_cast<int64_t>(k));
    for (size_t j = 0; j < hts.size(); ++j) {
      auto same = std::find_if(g.ts.begin(), g.ts.end(), [&](const at::Tensor& t) { return t.is_same(hts[j]); });
      key_int(key, same != g.ts.end() ? same - g.ts.begin() : -1);  // the tensor another input is, or a new one
      if (same == g.ts.end()) {
        add(hts[j], ir::InputKind::UserInput, [&] { return "in" + std::to_string(k) + ".history." + hnames[j]; });
      }
    }
  }
  for (size_t o = 0; o < opts.size(); ++o) {
    const std::string prefix = with_names ? "opt" + std::to_string(o) + "." : "";
    opts[o]->guarded_options(prefix, g.scalars, with_names ? &g.scalar_names : nullptr);
    g.scalar_is_lr.resize(g.scalars.size(), false);
    const size_t n = opts[o]->params().size();
    for (size_t j = 0; j < n; ++j) {
      g.scalars.push_back(opts[o]->host_state(j).lr);
      if (with_names) g.scalar_names.push_back(prefix + "p" + std::to_string(j) + ".lr");
      g.scalar_is_lr.push_back(true);
    }
  }
  for (size_t k = 0; k < g.ts.size(); ++k) {
    if (g.kinds[k] != ir::InputKind::UserInput && g.kinds[k] != ir::InputKind::Parameter) continue;
    const size_t hooks = capture::leaf_tensor_hooks(g.ts[k]).size();
    if (hooks > 0) {
      g.hooked.emplace_back(k, hooks);
      key.push_back('k');
      key_int(key, static_cast<int64_t>(k));
      key_int(key, static_cast<int64_t>(hooks));
    }
    // What a recorded post-accumulate-grad hook records (Note [Recorded post-accumulate-grad
    // hooks]): DDP inside and outside no_sync() are different graphs.
    if (g.kinds[k] == ir::InputKind::Parameter) {
      if (const auto* hook = capture::recorded_grad_hook(g.ts[k])) {
        key.push_back('a');
        key_int(key, static_cast<int64_t>(k));
        key_int(key, static_cast<int64_t>(hook->record_key()));
      }
    }
  }
  return g;
}

std::vector<std::vector<HostState>> host_states(const std::vector<const OptimizerAdapter*>& opts) {
  std::vector<std::vector<HostState>> out(opts.size());
  for (size_t o = 0; o < opts.size(); ++o) {
    const size_t n = opts[o]->params().size();
    for (size_t j = 0; j < n; ++j) out[o].push_back(opts[o]->host_state(j));
  }
  return out;
}

}  // namespace tcap::step
