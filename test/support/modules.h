// Helpers for tests that train a module next to an eager twin.
#pragma once

#include <torch/nn/module.h>
#include <torch/torch.h>

namespace tcap::testing {

// Copies `from`'s parameters into `to`'s, by name: the twin starts from the same weights.
inline void copy_params(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto dst = to.named_parameters();
  for (const auto& item : from.named_parameters()) dst[item.key()].copy_(item.value());
}

}  // namespace tcap::testing
