// Test helpers shared by the IR and interpreter tests: metadata of a contiguous tensor, and
// editing and reading graph JSON text.
#pragma once

#include <tcap/graph.h>
#include <tcap/graph_json.h>

#include <gtest/gtest.h>

#include <string>

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

// The same, as the tests that build graphs by hand spell it.
inline TensorMeta meta(std::vector<int64_t> sizes, c10::ScalarType dtype = c10::kFloat) {
  return contiguous_meta(std::move(sizes), dtype);
}

// The message of the GraphFormatError that parsing `text` throws ("" if none).
inline std::string error_of(const std::string& text, const JsonReadOptions& options = {}) {
  try {
    from_json_string(text, options);
  } catch (const GraphFormatError& e) {
    return e.what();
  }
  return "";
}

// Replaces the first `from` in `text` (which must be there) with `to`.
inline std::string edit(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "test bug: " << from << " not in the base JSON";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

}  // namespace tcap::ir::testing
