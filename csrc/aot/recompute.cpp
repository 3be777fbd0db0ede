// Recomputing a region's forward (replay_function.h): gradients by recomputation, and
// the RNG states a recompute or a verified call replays.
#include "aot/replay_function.h"

#include <tcap/interpreter.h>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <mutex>

namespace tcap::aot {

using torch::autograd::variable_list;

RngStates RngStates::save(const std::vector<c10::Device>& devices) {
  RngStates r;
  for (const auto& d : devices) {
    at::Generator g = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(g.mutex());
    r.states_.emplace_back(g, g.get_state());
  }
  return r;
}

void RngStates::restore() const {
  for (const auto& [g, s] : states_) {
    at::Generator gen = g;
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(s);
  }
}

std::vector<c10::Device> devices_of(const ir::Graph& g) {
  std::vector<c10::Device> ds;
  for (const auto& v : g.values()) {
    if (std::find(ds.begin(), ds.end(), v.meta.device) == ds.end()) ds.push_back(v.meta.device);
  }
  if (ds.empty()) ds.push_back(c10::kCPU);
  return ds;
}

variable_list recompute_gradients(const ir::Graph& forward, const std::vector<size_t>& written,
                                  const std::vector<at::Tensor>& primals, const variable_list& grads, size_t num_outputs,
                                  bool create_graph, std::vector<at::Tensor>* outputs) {
  at::AutoGradMode grad_on(true);
  std::vector<at::Tensor> args;
  std::vector<at::Tensor> diff_args;
  std::vector<size_t> diff_index;
  for (size_t j = 0; j < primals.size(); ++j) {
    at::Tensor t = primals[j];
    if (std::find(written.begin(), written.end(), j) != written.end()) t = t.detach().clone();
    if (t.requires_grad()) {
      at::Tensor a = create_graph ? t.view_as(t) : t.detach().requires_grad_(true);
      diff_args.push_back(a);
      diff_index.push_back(j);
      args.push_back(a);
    } else {
      args.push_back(t);
    }
  }
  Interpreter interp(forward, /*differentiable=*/true);
  interp.keep_values(false);
  auto outs = interp.run(args);
  if (outputs) *outputs = outs;
  std::vector<at::Tensor> os, gs;
  for (size_t k = 0; k < num_outputs && k < grads.size(); ++k) {
    if (grads[k].defined() && outs[k].requires_grad()) {
      os.push_back(outs[k]);
      gs.push_back(grads[k]);
    }
  }
  variable_list result(primals.size());
  if (os.empty() || diff_args.empty()) return result;
  auto gi = torch::autograd::grad(os, diff_args, gs, /*retain_graph=*/create_graph, create_graph,
                                  /*allow_unused=*/true);
  for (size_t k = 0; k < diff_index.size(); ++k) result[diff_index[k]] = gi[k];
  return result;
}

}  // namespace tcap::aot
