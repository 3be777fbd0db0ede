// The lowerings of activation functions and their backwards (ATen node -> kernel IR), one
// per operator, for the lowering table (fuse/lowering.cpp). Each computes in the node's
// compute dtype, as ATen's CPU kernels do (docs/fusion.md).
#pragma once

#include "fuse/lowering.h"

#include <vector>

namespace tcap::fuse::activations {


std::vector<Val> sigmoid(Emitter& e, const ir::Node& n);
std::vector<Val> relu(Emitter& e, const ir::Node& n);
std::vector<Val> silu(Emitter& e, const ir::Node& n);
std::vector<Val> gelu(Emitter& e, const ir::Node& n);
std::vector<Val> gelu_backward(Emitter& e, const ir::Node& n);
std::vector<Val> silu_backward(Emitter& e, const ir::Node& n);
std::vector<Val> sigmoid_backward(Emitter& e, const ir::Node& n);
std::vector<Val> tanh_backward(Emitter& e, const ir::Node& n);
std::vector<Val> threshold_backward(Emitter& e, const ir::Node& n);
std::vector<Val> threshold(Emitter& e, const ir::Node& n);
std::vector<Val> hardtanh(Emitter& e, const ir::Node& n);
std::vector<Val> hardtanh_backward(Emitter& e, const ir::Node& n);
std::vector<Val> leaky_relu(Emitter& e, const ir::Node& n);
std::vector<Val> leaky_relu_backward(Emitter& e, const ir::Node& n);
std::vector<Val> elu(Emitter& e, const ir::Node& n);
std::vector<Val> softplus(Emitter& e, const ir::Node& n);
std::vector<Val> softplus_backward(Emitter& e, const ir::Node& n);
std::vector<Val> hardsigmoid(Emitter& e, const ir::Node& n);
std::vector<Val> hardswish(Emitter& e, const ir::Node& n);
std::vector<Val> mish(Emitter& e, const ir::Node& n);
std::vector<Val> clamp(Emitter& e, const ir::Node& n);
std::vector<Val> clamp_min(Emitter& e, const ir::Node& n);
std::vector<Val> clamp_max(Emitter& e, const ir::Node& n);

}  // namespace tcap::fuse::activations
