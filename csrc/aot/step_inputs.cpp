#include "aot/step_inputs.h"

#include "aot/step_history.h"

#include "capture/engine_shim.h"
#include "capture/hooks.h"

#include <algorithm>
#include <unordered_map>

namespace tcap::aot {

cache::CallView StepInputs::view() const {
  cache::CallView v;
  v.tensors = ts;
  v.flags = &flags;
  v.scalars = &scalars;
  v.structure = structure;
  return v;
}

StepInputs gather_step_inputs(const StepParts& parts, const std::vector<at::Tensor>& user) {
  const auto& models = parts.models;
  const auto& opts = parts.opts;
  StepInputs g;
  auto add = [&](const at::Tensor& t, std::string name, ir::InputKind kind) {
    g.ts.push_back(t);
    g.names.push_back(std::move(name));
    g.kinds.push_back(kind);
  };
  for (size_t k = 0; k < user.size(); ++k) add(user[k], "in" + std::to_string(k), ir::InputKind::UserInput);
  std::unordered_map<const c10::TensorImpl*, size_t> param_at;
  for (size_t m = 0; m < models.size(); ++m) {
    const std::string prefix = models.size() > 1 ? "m" + std::to_string(m) + "." : "";
    for (const auto& item : models[m]->named_parameters(true)) {
      if (!param_at.emplace(item.value().unsafeGetTensorImpl(), g.params.size()).second) continue;
      g.params.push_back({item.value(), prefix + item.key()});
    }
  }
  for (size_t o = 0; o < opts.size(); ++o) {
    const auto ps = opts[o]->params();
    for (size_t j = 0; j < ps.size(); ++j) {
      auto [it, fresh] = param_at.emplace(ps[j].unsafeGetTensorImpl(), g.params.size());
      if (fresh) g.params.push_back({ps[j], "opt" + std::to_string(o) + ".p" + std::to_string(j)});
      StepParam& p = g.params[it->second];
      if (p.opt < 0) {
        p.opt = static_cast<int>(o);
        p.index = j;
      }
    }
  }
  for (const auto& p : g.params) {
    g.param_input.push_back(static_cast<int>(g.ts.size()));
    add(p.tensor, p.name, ir::InputKind::Parameter);
  }
  for (size_t m = 0; m < models.size(); ++m) {
    const std::string prefix = models.size() > 1 ? "m" + std::to_string(m) + "." : "";
    for (const auto& item : models[m]->named_buffers(true)) add(item.value(), prefix + item.key(), ir::InputKind::Buffer);
  }
  for (const auto& p : g.params) {
    const at::Tensor& gr = p.tensor.grad();
    g.grad_input.push_back(gr.defined() ? static_cast<int>(g.ts.size()) : -1);
    if (gr.defined()) add(gr, p.name + ".grad", ir::InputKind::Buffer);
  }
  for (size_t o = 0; o < opts.size(); ++o) {
    std::vector<at::Tensor> st;
    std::vector<std::string> sn;
    opts[o]->state_tensors("opt" + std::to_string(o) + ".", st, sn);
    for (size_t k = 0; k < st.size(); ++k) {
      g.state_input.push_back(g.ts.size());
      add(st[k], sn[k], ir::InputKind::Buffer);
    }
  }
  // Note [Backpropagating into an earlier step's outputs]
  std::string aliased;
  for (size_t k = 0; k < user.size(); ++k) {
    std::vector<at::Tensor> hts;
    std::vector<std::string> hnames;
    auto node = history_tensors(user[k], hts, hnames);
    if (!node) continue;
    g.histories.push_back(std::move(node));
    for (size_t j = 0; j < hts.size(); ++j) {
      const std::string name = "in" + std::to_string(k) + ".history." + hnames[j];
      auto same = std::find_if(g.ts.begin(), g.ts.end(), [&](const at::Tensor& t) { return t.is_same(hts[j]); });
      if (same != g.ts.end()) {
        aliased += name + "=" + std::to_string(same - g.ts.begin()) + ";";
      } else {
        add(hts[j], name, ir::InputKind::UserInput);
      }
    }
  }
  for (const auto& m : parts.submodules) g.flags.push_back(m->is_training());
  for (size_t o = 0; o < opts.size(); ++o) {
    const std::string prefix = "opt" + std::to_string(o) + ".";
    opts[o]->guarded_options(prefix, g.scalars, g.scalar_names);
    g.scalar_is_lr.resize(g.scalars.size(), false);
    const size_t n = opts[o]->params().size();
    for (size_t j = 0; j < n; ++j) {
      g.scalars.push_back(opts[o]->host_state(j).lr);
      g.scalar_names.push_back(prefix + "p" + std::to_string(j) + ".lr");
      g.scalar_is_lr.push_back(true);
    }
  }
  for (size_t k = 0; k < g.ts.size(); ++k) {
    if (g.kinds[k] != ir::InputKind::UserInput && g.kinds[k] != ir::InputKind::Parameter) continue;
    const size_t hooks = capture::leaf_tensor_hooks(g.ts[k]).size();
    if (hooks > 0) g.hooked.emplace_back(k, hooks);
  }
  for (size_t k = 0, h = 0; k < g.names.size(); ++k) {
    g.structure += g.names[k];
    if (h < g.hooked.size() && g.hooked[h].first == k) g.structure += "#hooks" + std::to_string(g.hooked[h++].second);
    // What a recorded post-accumulate-grad hook records (Note [Recorded post-accumulate-grad
    // hooks]): DDP inside and outside no_sync() are different graphs.
    if (g.kinds[k] == ir::InputKind::Parameter) {
      if (const auto* hook = capture::recorded_grad_hook(g.ts[k])) g.structure += "#acc" + std::to_string(hook->record_key());
    }
    g.structure += ";";
  }
  g.structure += aliased;
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

}  // namespace tcap::aot
