// tcap::clip_grad_norm_: LibTorch's torch::nn::utils::clip_grad_norm_, returning the total
// norm as a tensor instead of a double.
//
//   tcap::clip_grad_norm_(model->parameters(), 0.25);           // drop-in
//   auto norm = tcap::clip_grad_norm_(model->parameters(), 0.25);
//   log(norm.item<double>());                                   // read it where it is needed
//
// Why: LibTorch's version ends with total_norm.item(), so a step that calls it reads a
// value on the host that changes every step. A value read on the host is a guard of a
// compiled step (host code may branch on it), so such a step never compiles unless
// CompileOptions::observe_host_values promises that no code branches on the norm. This one
// computes the same norm with the same ops and scales the gradients the same way, and
// leaves the norm on its device: nothing is read on the host, and the step compiles.
// With error_if_nonfinite it reads only whether the norm is finite (a guard that holds
// step after step), not the norm itself.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace tcap {

inline at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0,
                                  bool error_if_nonfinite = false) {
  std::vector<at::Tensor> with_grad;
  for (const auto& p : parameters) {
    if (p.grad().defined()) with_grad.push_back(p);
  }
  if (with_grad.empty()) return at::zeros({}, at::kDouble);
  at::Tensor total;
  // The same ops as torch::nn::utils::clip_grad_norm_, so the norm and the scaled gradients
  // are the same bits.
  if (norm_type == std::numeric_limits<double>::infinity()) {
    std::vector<at::Tensor> norms;
    for (const auto& p : with_grad) norms.push_back(p.grad().data().abs().max());
    total = norms.size() == 1 ? norms[0] : at::max(at::stack(norms));
  } else if (norm_type == 0) {
    total = at::full({}, static_cast<double>(with_grad.size()));
  } else {
    std::vector<at::Tensor> norms;
    for (const auto& p : with_grad) norms.push_back(p.grad().data().norm(norm_type));
    total = norms.size() == 1 ? norms[0] : at::stack(norms).norm(norm_type);
  }
  if (error_if_nonfinite) {
    TORCH_CHECK(at::isfinite(total).item<bool>(), "The total norm of order ", norm_type,
                " for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and "
                "scale the gradients with the non-finite norm anyway, set `error_if_nonfinite=false`");
  }
  auto coef = at::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (auto& p : with_grad) p.grad().data().mul_(coef);
  return total;
}

inline at::Tensor clip_grad_norm_(std::initializer_list<at::Tensor> parameters, double max_norm,
                                  double norm_type = 2.0, bool error_if_nonfinite = false) {
  return clip_grad_norm_(std::vector<at::Tensor>(parameters), max_norm, norm_type, error_if_nonfinite);
}

inline at::Tensor clip_grad_norm_(const at::Tensor& parameter, double max_norm, double norm_type = 2.0,
                                  bool error_if_nonfinite = false) {
  return clip_grad_norm_(std::vector<at::Tensor>{parameter}, max_norm, norm_type, error_if_nonfinite);
}

}  // namespace tcap
