// Internal to the graph JSON reader (json.cpp): checked access to a parsed JSON
// document. Every accessor checks the JSON type and throws a one-line
// GraphFormatError naming the path of the offending field
// ("tcap.graph: nodes[3].args[1].kind: ..."), so the reader never touches an
// unchecked field. Only generic JSON lives here; the graph schema stays in json.cpp.
#pragma once

#include <tcap/graph_json.h>

#include "ir/printable.h"

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

// "tcap.graph: <path>: <problem>", always one printable line of at most
// kMaxMessageBytes (control characters escaped: keys and parser context are raw input).
[[noreturn]] inline void throw_format_error(const std::string& path, const std::string& problem) {
  std::string msg = std::string(kGraphFormat) + ": " + (path.empty() ? "" : path + ": ") + problem;
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  throw GraphFormatError(printable(msg, kMaxMessageBytes));
}

// The path of `key` inside the object at `path`: "meta.torch_version", or
// meta["odd key"] (a JSON string, cut) for a key that is not a plain identifier.
inline std::string key_path(const std::string& path, const std::string& key);

// Error messages quote at most this many characters of the input.
constexpr size_t kMaxQuoted = 40;

inline std::string json_quoted(const std::string& s) {
  const std::string head = s.size() > kMaxQuoted ? s.substr(0, kMaxQuoted) : s;  // dump only what is shown
  std::string text = Json(head).dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > kMaxQuoted || head.size() < s.size()) text = text.substr(0, std::min(text.size(), kMaxQuoted - 3)) + "...";
  return text;
}

inline std::string key_path(const std::string& path, const std::string& key) {
  const bool plain = !key.empty() && key.size() <= kMaxQuoted &&
                     std::all_of(key.begin(), key.end(), [](char c) {
                       return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                              c == '_' || c == ':' || c == '.';
                     });
  if (!plain) return path + "[" + json_quoted(key) + "]";
  return path.empty() ? key : path + "." + key;
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

class JsonElements;

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
    return JsonCursor(*it, key_path(path_, key));
  }
  // A field that is required when `required`, else optional.
  std::optional<JsonCursor> field(const char* key, bool required) const {
    if (required || has(key)) return (*this)[key];
    return std::nullopt;
  }
  // The elements of an array, as cursors made one at a time (a cursor per element made
  // up front would cost more than the parsed document for an array of empty values).
  JsonElements elements() const;

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

// A view of a JSON array's elements: element(k) and iteration give JsonCursors.
class JsonElements {
 public:
  JsonElements(const Json& array, std::string path) : j_(&array), path_(std::move(path)) {}
  size_t size() const { return j_->size(); }
  JsonCursor operator[](size_t k) const { return JsonCursor((*j_)[k], path_ + "[" + std::to_string(k) + "]"); }

  class Iterator {
   public:
    Iterator(const JsonElements* e, size_t k) : e_(e), k_(k) {}
    JsonCursor operator*() const { return (*e_)[k_]; }
    Iterator& operator++() {
      ++k_;
      return *this;
    }
    bool operator!=(const Iterator& o) const { return k_ != o.k_; }

   private:
    const JsonElements* e_;
    size_t k_;
  };
  Iterator begin() const { return Iterator(this, 0); }
  Iterator end() const { return Iterator(this, size()); }

 private:
  const Json* j_;
  std::string path_;
};

inline JsonElements JsonCursor::elements() const {
  if (!j_.is_array()) fail("expected an array, got " + json_describe(j_));
  return JsonElements(j_, path_);
}

// --- limits (json_input.cpp) ---------------------------------------------------------

// Throws GraphFormatError unless `text` is within the limits of `options`: at most
// max_bytes, and a structure whose parsed form is not out of proportion to its size
// (Note [Reader memory]).
void check_input_limits(const std::string& text, const JsonReadOptions& options);
// The contents of the regular file `path`, at most the limit of `options`; throws
// GraphFormatError naming the file otherwise ("tcap.graph: cannot open <path>: ...").
std::string read_graph_file(const std::string& path, const JsonReadOptions& options);

}  // namespace tcap::ir
