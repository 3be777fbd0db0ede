// Test helper shared by the IR and interpreter tests: metadata of a contiguous tensor.
#pragma once

#include <tcap/graph.h>

#include <vector>

namespace tcap::ir::testing {

inline TensorMeta contiguous_meta(std::vector<int64_t> sizes, c10::ScalarType dtype = c10::kFloat) {
  TensorMeta m;
  m.dtype = dtype;
  m.strides.assign(sizes.size(), 1);
  for (size_t k = sizes.size(); k-- > 1;) m.strides[k - 1] = m.strides[k] * sizes[k];
  m.sizes = std::move(sizes);
  return m;
}

}  // namespace tcap::ir::testing
