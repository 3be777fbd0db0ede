// The fuzzers' input mutations (fuzz.h). Random bytes rarely survive a JSON parser, so
// most mutations parse the input and change one thing a graph file is made of: a
// number (to an edge value: -1, 2^32, INT64_MAX, ...), a string (to another name of
// the format: arg kinds, dtypes, ops, devices, or one with control characters), an
// array element or an object member (deleted, duplicated, moved), or a whole subtree
// (copied over another, so an arg list lands where a shape was). The rest are text and
// byte edits: numbers JSON cannot hold as doubles (1e999), truncations, bit flips.
#include "fuzz/fuzz.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <vector>

namespace tcap::fuzz {
namespace {

using Json = nlohmann::json;

const char* const kStrings[] = {
    // arg, node, input, output and hook kinds; phases
    "none", "undefined_tensor", "value", "value_list", "opt_value_list", "bool", "int", "double", "complex",
    "string", "int_list", "double_list", "bool_list", "scalar_type", "layout", "memory_format", "device",
    "wrapped_scalar", "opaque", "input", "call", "call_hook", "output", "user_input", "parameter", "buffer",
    "tangent", "constant", "saved", "user", "grad", "tensor_pre_hook", "retains_grad_hook", "pre_hook",
    "post_hook", "accumulate_grad", "forward", "backward",
    // dtypes, layouts, memory formats, devices
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool", "complex64",
    "complex32", "qint8", "bits8", "float8_e4m3fn", "float4_e2m1fn_x2", "undefined", "f32", "strided",
    "sparse_coo", "mkldnn", "jagged", "contiguous_format", "preserve_format", "channels_last", "cpu", "cuda",
    "cuda:0", "meta", "cpu:0", "cuda:127", "xla:1",
    // operators and overloads
    "aten::sum", "aten::ones_like", "aten::new_empty_strided", "aten::empty_like", "aten::zeros_like",
    "aten::mul", "aten::add", "aten::sub", "aten::view", "aten::reshape", "aten::expand", "aten::as_strided",
    "aten::cat", "aten::stack", "aten::split", "aten::unbind", "aten::index", "aten::index_select",
    "aten::gather", "aten::_to_copy", "aten::to", "aten::full", "aten::zeros", "aten::arange", "aten::relu_",
    "aten::t", "aten::addmm", "aten::mm", "aten::native_layer_norm", "aten::native_layer_norm_backward",
    "aten::max", "aten::mean", "aten::slice", "aten::select", "aten::permute", "aten::transpose",
    "aten::clone", "aten::copy_", "aten::fill_", "aten::threshold_backward", "aten::_softmax",
    "aten::embedding", "aten::convolution", "aten::empty_strided", "aten::new_zeros", "aten::narrow",
    "aten::squeeze", "aten::unsqueeze", "aten::sort", "aten::topk", "aten::where", "tcap::fused",
    "Tensor", "Scalar", "dim_IntList", "int", "self", "other", "out", "",
    // hostile text
    "nan", "inf", "-inf", "\x1b[2J\x1b[H", "a\nb", "\x7f\xc2\x9b", "tcap.graph"};

const char* const kKeys[] = {"format", "version", "meta", "schemas", "hooks", "values", "nodes",
                             "id", "kind", "slot", "autograd_node", "producer", "output_index",
                             "list_index", "dtype", "shape", "strides", "storage_offset", "device",
                             "requires_grad", "version_of", "view_of", "input_kind", "name", "op",
                             "overload", "hook", "args", "outputs", "phase", "grad_mode",
                             "output_names", "output_kinds", "value", "values", "real", "imag", "type"};

const int64_t kInts[] = {-1,         0,          1,          2,          3,          7,
                         -2,         255,        256,        65535,      65536,      45,
                         46,         47,         8,          2147483647, -2147483648LL, 4294967296LL,
                         1LL << 40,  std::numeric_limits<int64_t>::max(),
                         std::numeric_limits<int64_t>::min()};

const char* const kNumberTexts[] = {"1e999", "-1e999", "18446744073709551615", "18446744073709551616",
                                    "-9223372036854775809", "1.5", "-0.0", "1e-400", "0.1e1", "00"};

template <size_t N>
const char* pick(const char* const (&table)[N], std::mt19937_64& rng) {
  return table[rng() % N];
}

// Every value of the tree (pointers into it), breadth first, bounded.
std::vector<Json*> values_of(Json& root) {
  std::vector<Json*> out{&root};
  for (size_t k = 0; k < out.size() && out.size() < 20000; ++k) {
    Json* j = out[k];
    if (j->is_object() || j->is_array()) {
      for (auto& child : *j) out.push_back(&child);
    }
  }
  return out;
}

Json random_scalar(std::mt19937_64& rng) {
  switch (rng() % 5) {
    case 0: return kInts[rng() % (sizeof kInts / sizeof kInts[0])];
    case 1: return pick(kStrings, rng);
    case 2: return rng() % 2 == 0;
    case 3: return nullptr;
    default: return static_cast<double>(static_cast<int64_t>(rng() % 2001) - 1000) / 8.0;
  }
}

// One structural change to `root`; false when nothing applied.
bool mutate_tree(Json& root, std::mt19937_64& rng) {
  std::vector<Json*> all = values_of(root);
  Json& j = *all[rng() % all.size()];
  switch (j.type()) {
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      if (rng() % 4 == 0) {
        // A neighbour, wrapping around (the mutator itself must not overflow).
        j = static_cast<int64_t>(static_cast<uint64_t>(j.get<int64_t>()) + rng() % 5 - 2);
      } else {
        j = kInts[rng() % (sizeof kInts / sizeof kInts[0])];
      }
      return true;
    case Json::value_t::number_float: j = random_scalar(rng); return true;
    case Json::value_t::string: j = rng() % 8 == 0 ? random_scalar(rng) : Json(pick(kStrings, rng)); return true;
    case Json::value_t::boolean: j = rng() % 4 == 0 ? random_scalar(rng) : Json(!j.get<bool>()); return true;
    case Json::value_t::null: j = random_scalar(rng); return true;
    case Json::value_t::array: {
      const size_t n = j.size();
      switch (rng() % 5) {
        case 0:
          if (n == 0) return false;
          j.erase(j.begin() + static_cast<std::ptrdiff_t>(rng() % n));
          return true;
        case 1:
          if (n == 0) return false;
          j.push_back(j[rng() % n]);
          return true;
        case 2:
          if (n < 2) return false;
          std::swap(j[rng() % n], j[rng() % n]);
          return true;
        case 3: j.push_back(random_scalar(rng)); return true;
        default:
          if (n == 0) return false;
          j = j[rng() % n];  // the element replaces its list
          return true;
      }
    }
    case Json::value_t::object: {
      if (rng() % 3 == 0 || j.empty()) {
        j[pick(kKeys, rng)] = random_scalar(rng);
        return true;
      }
      auto it = j.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng() % j.size()));
      if (rng() % 2 == 0) {
        j.erase(it);
      } else {
        Json moved = it.value();
        j.erase(it);
        j[pick(kKeys, rng)] = std::move(moved);
      }
      return true;
    }
    default: return false;
  }
}

// A copy of one subtree over another (shapes and kinds from elsewhere in the graph).
bool splice_tree(Json& root, std::mt19937_64& rng) {
  std::vector<Json*> all = values_of(root);
  if (all.size() < 2) return false;
  Json* from = all[rng() % all.size()];
  Json* to = all[rng() % all.size()];
  if (from == to || from == &root || to == &root) return false;
  Json copy = *from;  // `to` may contain `from`
  *to = std::move(copy);
  return true;
}

// Text edits the tree cannot express.
std::string mutate_text(std::string text, std::mt19937_64& rng) {
  if (text.empty()) return "{}";
  switch (rng() % 4) {
    case 0: {  // a number JSON (or a double) cannot hold
      std::vector<size_t> starts;
      for (size_t k = 0; k < text.size(); ++k) {
        const bool digit = text[k] >= '0' && text[k] <= '9';
        if (digit && (k == 0 || !(text[k - 1] >= '0' && text[k - 1] <= '9'))) starts.push_back(k);
      }
      if (starts.empty()) return text;
      const size_t at = starts[rng() % starts.size()];
      size_t end = at;
      while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
      return text.replace(at, end - at, pick(kNumberTexts, rng));
    }
    case 1: return text.substr(0, rng() % text.size());  // truncated
    case 2: {  // a raw control byte inside a string
      const size_t at = text.find('"', rng() % text.size());
      if (at == std::string::npos) return text;
      return text.insert(at + 1, 1, static_cast<char>(rng() % 2 ? 0x1b : 0x9b));
    }
    default: {  // a run of bytes repeated
      const size_t at = rng() % text.size();
      const size_t len = std::min<size_t>(1 + rng() % 16, text.size() - at);
      return text.insert(at, text.substr(at, len));
    }
  }
}

size_t own_byte_mutate(uint8_t* data, size_t size, size_t max_size, std::mt19937_64& rng) {
  if (size == 0) return 0;
  switch (rng() % 3) {
    case 0: data[rng() % size] ^= static_cast<uint8_t>(1u << (rng() % 8)); return size;
    case 1: {  // delete a range
      const size_t at = rng() % size;
      const size_t len = std::min<size_t>(1 + rng() % 8, size - at);
      std::memmove(data + at, data + at + len, size - at - len);
      return size - len;
    }
    default: {  // insert a byte
      if (size >= max_size) return size;
      const size_t at = rng() % (size + 1);
      std::memmove(data + at + 1, data + at, size - at);
      data[at] = static_cast<uint8_t>(rng());
      return size + 1;
    }
  }
}

size_t store(const std::string& text, uint8_t* data, size_t size, size_t max_size) {
  if (text.size() > max_size) return size;
  std::memcpy(data, text.data(), text.size());
  return text.size();
}

}  // namespace

size_t mutate(uint8_t* data, size_t size, size_t max_size, std::mt19937_64& rng, ByteMutator byte_mutate) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const unsigned choice = rng() % 16;
  if (choice < 11) {
    Json root;
    try {
      root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    } catch (const Json::exception&) {
      root = Json::value_t::discarded;
    }
    if (!root.is_discarded()) {
      const bool changed = choice < 8 ? mutate_tree(root, rng) : splice_tree(root, rng);
      if (changed) {
        try {
          return store(root.dump(rng() % 4 == 0 ? 1 : -1), data, size, max_size);
        } catch (const Json::exception&) {  // a string that is not UTF-8
        }
      }
    }
  }
  if (choice < 14) return store(mutate_text(text, rng), data, size, max_size);
  return byte_mutate ? byte_mutate(data, size, max_size) : own_byte_mutate(data, size, max_size, rng);
}

}  // namespace tcap::fuzz
