// Float32 CPU matrix products routed to tcap::onednn_mm where it measures faster (Note
// [GEMMs through oneDNN], runtime/onednn_gemm.cpp).
#pragma once

#include "fuse/decompose.h"

#include <tcap/graph.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tcap::fuse {

// The products of fewer multiply-adds stay ATen's: oneDNN's call overhead is not paid back.
constexpr int64_t kMinOneDnnMacs = int64_t{1} << 24;

// Whether a product a [m, k] (strides a_strides) @ b [k, n] (b_strides), plus a bias row
// when `bias`, goes through oneDNN; `why` receives the measured reason either way.
using GemmChooser = std::function<bool(int64_t m, int64_t k, int64_t n, const std::vector<int64_t>& a_strides,
                                       const std::vector<int64_t>& b_strides, bool bias, std::string* why)>;

// g with each aten::mm, and each aten::addmm whose self is one row of n values and whose
// beta and alpha are 1, on float32 CPU tensors of at least kMinOneDnnMacs multiply-adds,
// that `choose` accepts, replaced by tcap::onednn_mm. Decisions name every such product.
Decomposed gemms_through_onednn(const ir::Graph& g, const GemmChooser& choose);

// Note [ReLU inside the product] (runtime/onednn_gemm.cpp): g with each aten::relu whose
// input is such a product that `choose` sends to oneDNN (directly, through one view, or
// through a view and the add of a bias row: a Linear over a 3-d input), each op the only
// reader of the one before, replaced by tcap::onednn_mm(..., bias, "relu") (and the
// view) where `choose_relu` accepts the product. Runs before fusion; decisions name every
// ReLU of a product.
Decomposed relu_inside_gemms(const ir::Graph& g, const GemmChooser& choose, const GemmChooser& choose_relu);

}  // namespace tcap::fuse
