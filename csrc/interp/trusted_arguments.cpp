// Note [Kernels that trust their arguments] (interp/trusted_arguments.h).
#include "interp/trusted_arguments.h"

#include "ir/op_facts.h"

#include <ATen/core/List.h>
#include <c10/util/Exception.h>

namespace tcap::interp {

namespace {

bool is_fused_optimizer(const ir::Node& n) {
  return n.op == "aten::_fused_adam_" || n.op == "aten::_fused_adamw_" || n.op == "aten::_fused_sgd_";
}

}  // namespace

bool trusts_its_arguments(const ir::Node& n) { return ir::op_has(n.op, ir::OpFact::TrustsArguments); }

void check_trusted_arguments(const ir::Node& n, const torch::jit::Stack& stack) {
  if (is_fused_optimizer(n)) {
    // The multi-tensor kernels walk each parameter's elements in its gradient and state.
    const auto self = stack.at(0).toTensorList();
    const bool sgd = n.op == "aten::_fused_sgd_";
    const size_t lists = sgd ? 3 : 6;
    for (size_t k = 1; k < lists; ++k) {
      const auto l = stack.at(k).toTensorList();
      if (l.empty() && k != 1) continue;  // max_exp_avg_sqs without amsgrad, buffers without momentum
      TORCH_CHECK(l.size() == self.size(), "argument ", k, " has ", l.size(), " tensors for ", self.size(), " parameters");
      for (size_t i = 0; i < l.size(); ++i) {
        const at::Tensor t = l.get(i), p = self.get(i);
        if (!sgd && k == 5) {
          TORCH_CHECK(t.numel() == 1, "state_steps[", i, "] has ", t.numel(), " elements, not 1");
          continue;
        }
        TORCH_CHECK(t.sizes() == p.sizes() && t.scalar_type() == p.scalar_type() && t.device() == p.device() &&
                        t.is_contiguous() && p.is_contiguous(),
                    "tensor ", i, " of argument ", k, " is not a dense tensor like parameter ", i);
      }
    }
    return;
  }
  if (n.op == "aten::native_layer_norm_backward") {
    // (grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask)
    const at::Tensor& grad_out = stack.at(0).toTensor();
    const at::Tensor& input = stack.at(1).toTensor();
    const auto shape = stack.at(2).toIntList().vec();
    TORCH_CHECK(grad_out.sizes() == input.sizes(), "grad_out has sizes ", grad_out.sizes(), " but input has ",
                input.sizes());
    const auto dims = static_cast<int64_t>(shape.size());
    TORCH_CHECK(dims >= 1 && dims <= input.dim() &&
                    input.sizes().slice(static_cast<size_t>(input.dim() - dims)).vec() == shape,
                "normalized_shape ", c10::IntArrayRef(shape), " is not the trailing sizes of input ", input.sizes());
    int64_t inner = 1;
    for (int64_t d : shape) inner *= d;
    const int64_t outer = inner == 0 ? 0 : input.numel() / inner;
    for (size_t k : {3, 4}) {
      const at::Tensor& t = stack.at(k).toTensor();
      TORCH_CHECK(t.numel() == outer, k == 3 ? "mean" : "rstd", " has ", t.numel(), " elements, not ", outer);
    }
    for (size_t k : {5, 6}) {
      if (stack.at(k).isNone()) continue;
      const at::Tensor& t = stack.at(k).toTensor();
      TORCH_CHECK(!t.defined() || t.numel() == inner, k == 5 ? "weight" : "bias", " has ", t.numel(),
                  " elements, not ", inner);
    }
  }
}

}  // namespace tcap::interp
