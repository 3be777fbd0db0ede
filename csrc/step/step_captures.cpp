#include "step/step_captures.h"

#include "ir/op_facts.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

namespace tcap::step {
namespace {

bool same_double(double a, double b) {
  if (!std::isfinite(a) || !std::isfinite(b)) return a == b || (std::isnan(a) && std::isnan(b));
  return a == b || std::abs(a - b) <= 1e-12 * std::max(1.0, std::abs(a));
}

bool is_scalar_arg(const ir::Arg& a) { return a.kind == ir::ArgKind::Double || a.kind == ir::ArgKind::WrappedScalar; }

// Ops an optimizer's update is made of: a constant scalar argument of one of them that
// writes into a parameter may be the learning rate.
bool update_op(const std::string& op) { return ir::op_has(op, ir::OpFact::UpdateStep); }

}  // namespace

namespace {

// Whether host read n reads a norm (LibTorch's clip_grad_norm_ ends with
// total_norm.item(): a norm of the gradients' norms, stacked).
bool reads_a_norm(const ir::Graph& g, const ir::Node& n) {
  bool norm = false;
  ir::for_each_value(n.args, [&](ir::ValueId v) {
    const ir::Node& p = g.node(g.value(v).producer);
    norm = norm || ir::op_has(p.op, ir::OpFact::Norm);
  });
  return norm;
}

}  // namespace

StepComparison compare_step_captures(const ir::Graph& first, const ir::Graph& second,
                                     const std::vector<std::vector<HostState>>& host1,
                                     const std::vector<std::vector<HostState>>& host2,
                                     const std::vector<const OptimizerAdapter*>& opts,
                                     const std::unordered_map<ir::NodeId, std::pair<size_t, size_t>>& input_param,
                                     bool observe_host_values) {
  StepComparison out;
  auto fail = [&](std::string why) {
    out.why_not = std::move(why);
    out.patches.clear();
    out.observed.clear();
    return out;
  };
  if (first.nodes().size() != second.nodes().size()) {
    return fail("two consecutive steps recorded different graphs (" + std::to_string(first.nodes().size()) + " vs " +
                std::to_string(second.nodes().size()) + " nodes)");
  }
  // The parameter (optimizer, index) each node's result goes to: the one whose input it
  // writes, else the first one a user of it goes to.
  std::vector<std::optional<std::pair<size_t, size_t>>> param_of(second.nodes().size());
  std::vector<bool> writes_param(second.nodes().size(), false);
  for (const auto& n : second.nodes()) {
    ir::for_each_value(n.outputs, [&](ir::ValueId v) {
      if (second.value(v).version_of == ir::kNoValue) return;
      auto it = input_param.find(second.value(second.alias_root(v)).producer);
      if (it != input_param.end()) {
        param_of[static_cast<size_t>(n.id)] = it->second;
        writes_param[static_cast<size_t>(n.id)] = true;
      }
    });
  }
  for (auto it = second.nodes().rbegin(); it != second.nodes().rend(); ++it) {
    if (param_of[static_cast<size_t>(it->id)]) continue;
    ir::for_each_value(it->outputs, [&](ir::ValueId v) {
      for (ir::NodeId u : second.users(v)) {
        if (!param_of[static_cast<size_t>(it->id)] && param_of[static_cast<size_t>(u)]) {
          param_of[static_cast<size_t>(it->id)] = param_of[static_cast<size_t>(u)];
        }
      }
    });
  }
  // The expression explaining (d1, d2) for parameter p, if any.
  auto explain = [&](double d1, double d2, std::pair<size_t, size_t> p, bool lr_only) -> std::optional<HostScalar> {
    for (HostScalar h : opts[p.first]->host_scalars()) {
      if (lr_only && !step::depends_on_lr(h)) continue;
      if (same_double(step::evaluate(h, host1[p.first][p.second]), d1) &&
          same_double(step::evaluate(h, host2[p.first][p.second]), d2)) {
        return h;
      }
    }
    return std::nullopt;
  };
  for (size_t i = 0; i < second.nodes().size(); ++i) {
    const ir::Node& a = first.nodes()[i];
    const ir::Node& b = second.nodes()[i];
    const std::string where = "node %" + std::to_string(i) + " (" + b.qualified_op() + ")";
    if (a.kind != b.kind || a.op != b.op || a.overload != b.overload || a.args.size() != b.args.size() ||
        a.outputs.size() != b.outputs.size()) {
      return fail("two consecutive steps recorded different graphs at " + where);
    }
    for (size_t k = 0; k < a.outputs.size(); ++k) {
      if (a.outputs[k] == b.outputs[k]) continue;
      if (ir::is_host_value(b.outputs[k]) && a.outputs[k].kind == b.outputs[k].kind) {
        if (!observe_host_values) {
          if (reads_a_norm(second, b)) {
            return fail("the value read on the host by " + where + " changed between two steps: it is a norm, "
                        "as torch::nn::utils::clip_grad_norm_ reads and returns on every call; use "
                        "tcap::clip_grad_norm_ (<tcap/clip_grad.h>), which returns it as a tensor and reads nothing on "
                        "the host, or, if no code branches on the value, CompileOptions::observe_host_values = true");
          }
          return fail("the value read on the host by " + where + " changed between two steps; it is a guard, so "
                      "these guards never fit twice (if host code only logs or returns it, "
                      "CompileOptions::observe_host_values = true makes it an observation)");
        }
        if (out.observed.empty() || out.observed.back() != b.id) out.observed.push_back(b.id);
        continue;
      }
      return fail("two consecutive steps recorded different results at " + where);
    }
    const auto p = param_of[i];
    for (size_t k = 0; k < a.args.size(); ++k) {
      const bool scalar = is_scalar_arg(a.args[k]) && a.args[k].kind == b.args[k].kind &&
                          a.args[k].i2 == b.args[k].i2 && a.args[k].i == b.args[k].i;
      if (a.args[k] == b.args[k]) {
        // A constant argument of a parameter update may be the learning rate.
        if (!scalar || !p || !writes_param[i] || !update_op(b.op)) continue;
        if (auto h = explain(a.args[k].d, b.args[k].d, *p, /*lr_only=*/true)) {
          out.patches.push_back({b.id, k, p->first, p->second, *h});
        }
        continue;
      }
      if (!scalar) return fail("two consecutive steps recorded different arguments at " + where);
      std::optional<HostScalar> h;
      std::pair<size_t, size_t> q{0, 0};
      if (p) {
        q = *p;
        h = explain(a.args[k].d, b.args[k].d, q, false);
      }
      for (size_t o = 0; !h && o < opts.size(); ++o) {
        for (size_t j = 0; !h && j < host2[o].size(); ++j) {
          q = {o, j};
          h = explain(a.args[k].d, b.args[k].d, q, false);
        }
      }
      if (!h) {
        std::ostringstream ss;
        ss << "a scalar computed on the host changes between steps (" << where << " argument " << k << ": "
           << a.args[k].d << " -> " << b.args[k].d << ") and is not one tcap can recompute";
        return fail(ss.str());
      }
      out.patches.push_back({b.id, k, q.first, q.second, *h});
    }
  }
  // Values compare by everything but their storage offset: where a view starts in a storage
  // is no op's business (an input narrowed from a long tensor starts elsewhere every step:
  // truncated backpropagation through time), and which inputs share memory, and how, is
  // guarded on its own (Note [Alias geometry guards]).
  const auto& va = first.values();
  const auto& vb = second.values();
  bool same = va.size() == vb.size();
  for (size_t i = 0; same && i < va.size(); ++i) {
    ir::Value a = va[i];
    a.meta.storage_offset = vb[i].meta.storage_offset;
    same = a == vb[i];
  }
  if (!same) return fail("two consecutive steps recorded tensors of different shapes");
  return out;
}

}  // namespace tcap::step
