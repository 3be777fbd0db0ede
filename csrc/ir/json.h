// Internal to the graph JSON reader (json.cpp): checked access to a parsed JSON
// document. Every accessor checks the JSON type and throws a one-line
// GraphFormatError naming the path of the offending field
// ("tcap.graph: nodes[3].args[1].kind: ..."), so the reader never touches an
// unchecked field. Only generic JSON lives here; the graph schema stays in json.cpp.
#pragma once

#include <tcap/graph_json.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tcap::ir {

// The reader's document type. Not ordered_json: ordered_map grows a vector of
// pair<const string, json>, whose copy on reallocation recurses through the whole
// subtree, so a deeply nested input would overflow the stack.
using Json = nlohmann::json;

// "tcap.graph: <path>: <problem>", always one line.
[[noreturn]] inline void throw_format_error(const std::string& path, const std::string& problem) {
  std::string msg = std::string(kGraphFormat) + ": " + (path.empty() ? "" : path + ": ") + problem;
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  throw GraphFormatError(msg);
}

// Error messages quote at most this many characters of the input.
constexpr size_t kMaxQuoted = 40;

inline std::string json_quoted(const std::string& s) {
  std::string text = Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > kMaxQuoted) text = text.substr(0, kMaxQuoted - 3) + "...";
  return text;
}

// `string "abc"`, `number 1.5`, `array of size 3`: what was found instead. Arrays and
// objects are not printed (dumping a deeply nested one would recurse without bound).
inline std::string json_describe(const Json& j) {
  if (j.is_array()) return "array of size " + std::to_string(j.size());
  if (j.is_object()) return "object of size " + std::to_string(j.size());
  if (j.is_string()) return "string " + json_quoted(j.get_ref<const std::string&>());
  if (j.is_null()) return "null";
  return std::string(j.type_name()) + " " + j.dump();
}

// A JSON value and its path ("nodes[3].args[1]"), for error messages.
class JsonCursor {
 public:
  JsonCursor(const Json& j, std::string path) : j_(j), path_(std::move(path)) {}

  const Json& raw() const { return j_; }
  [[noreturn]] void fail(const std::string& problem) const { throw_format_error(path_, problem); }

  const Json& object() const {
    if (!j_.is_object()) fail("expected an object, got " + json_describe(j_));
    return j_;
  }
  bool has(const char* key) const { return object().contains(key); }
  // A required field.
  JsonCursor operator[](const char* key) const {
    const Json& o = object();
    auto it = o.find(key);
    if (it == o.end()) fail(std::string("missing field \"") + key + "\"");
    return JsonCursor(*it, path_.empty() ? std::string(key) : path_ + "." + key);
  }
  // A field that is required when `required`, else optional.
  std::optional<JsonCursor> field(const char* key, bool required) const {
    if (required || has(key)) return (*this)[key];
    return std::nullopt;
  }
  std::vector<JsonCursor> elements() const {
    if (!j_.is_array()) fail("expected an array, got " + json_describe(j_));
    std::vector<JsonCursor> out;
    out.reserve(j_.size());
    for (size_t k = 0; k < j_.size(); ++k) {
      out.emplace_back(j_[k], path_ + "[" + std::to_string(k) + "]");
    }
    return out;
  }

  int64_t integer() const {
    const bool fits =
        j_.is_number_integer() &&
        !(j_.is_number_unsigned() && j_.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX));
    if (!fits) fail("expected a 64-bit integer, got " + json_describe(j_));
    return j_.get<int64_t>();
  }
  int64_t integer_in(int64_t lo, int64_t hi) const {
    const int64_t v = integer();
    if (v < lo || v > hi) {
      fail(std::to_string(v) + " is out of range [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]");
    }
    return v;
  }
  // An index into a table of `count` entries, named `what` ("values").
  int32_t index_into(size_t count, const char* what) const {
    const int64_t v = integer();
    if (v < 0 || static_cast<uint64_t>(v) >= count) {
      fail(std::to_string(v) + " is out of range (the graph has " + std::to_string(count) + " " +
           what + ")");
    }
    return static_cast<int32_t>(v);
  }
  bool boolean() const {
    if (!j_.is_boolean()) fail("expected true or false, got " + json_describe(j_));
    return j_.get<bool>();
  }
  const std::string& string() const {
    if (!j_.is_string()) fail("expected a string, got " + json_describe(j_));
    return j_.get_ref<const std::string&>();
  }
  // A number, or one of the strings "nan", "inf", "-inf" (JSON has no such numbers).
  double real() const {
    if (j_.is_number()) return j_.get<double>();
    if (j_.is_string()) {
      const auto& s = j_.get_ref<const std::string&>();
      if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
      if (s == "inf") return std::numeric_limits<double>::infinity();
      if (s == "-inf") return -std::numeric_limits<double>::infinity();
    }
    fail("expected a number (or \"nan\", \"inf\", \"-inf\"), got " + json_describe(j_));
  }

 private:
  const Json& j_;
  std::string path_;
};

}  // namespace tcap::ir
