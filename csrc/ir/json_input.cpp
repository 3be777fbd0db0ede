// The graph JSON reader's input: files and limits (docs/graph-json.md, "Limits").
//
// Note [Reader memory]
// The reader parses the whole document into an nlohmann::json tree before it reads the
// graph out of it, and that tree costs far more than the text: about 5 bytes per byte of
// text for a graph written by to_json_string (8 for the compact form), but 32 for a flood
// of empty objects ("[{},{},...]"): a 50 MB file of them took 2.8 GB before the reader
// found that the first one had no "id". So the reader bounds both:
//   - the text: at most JsonReadOptions::max_bytes (TCAP_MAX_GRAPH_MB, 64 MiB by
//     default), checked before a file is read, and again while it is read (it may grow);
//   - the tree: before parsing, one pass over the text counts objects, arrays, members,
//     values and string bytes, estimates the tree from them (the per-item costs below,
//     measured with nlohmann::json 3.11 on x86-64), and refuses a document whose tree
//     would take more than kMaxTreeBytesPerByte per byte of text (plus kTreeSlack for
//     small documents).
// So the reader's peak memory is at most about 13 times max_bytes, reached only by
// documents close to the refusal line; graphs tcap writes stay well inside it.
// Only regular files are read: a FIFO would block and a device (/dev/zero) never ends;
// both, and directories, are refused before any byte is read.
#include "ir/json.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tcap::ir {
namespace {

constexpr size_t kDefaultMaxGraphMiB = 64;
constexpr size_t kMaxTreeBytesPerByte = 12;
constexpr size_t kTreeSlack = size_t{1} << 16;
// Per-item costs of the parsed tree: a json value, and what an object, an array and an
// object member (its key and map node) add to it; string contents cost their length.
constexpr size_t kValueBytes = 16, kObjectBytes = 64, kArrayBytes = 32, kMemberBytes = 64, kStringBytes = 32;

size_t read_default_max_bytes() {
  const char* env = std::getenv("TCAP_MAX_GRAPH_MB");
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long long mb = std::strtoll(env, &end, 10);
    if (end != nullptr && *end == '\0' && mb >= 1 && mb <= (1LL << 30)) return static_cast<size_t>(mb) << 20;
    std::fprintf(stderr, "[tcap] TCAP_MAX_GRAPH_MB: '%s' is not a number of mebibytes >= 1 (ignored)\n",
                 printable(env, 64).c_str());
  }
  return kDefaultMaxGraphMiB << 20;
}

size_t max_bytes_of(const JsonReadOptions& options) {
  return options.max_bytes != 0 ? options.max_bytes : default_max_graph_bytes();
}

// "N bytes, over the limit of M (...)"; "more than" N when the size is not known.
std::string over_limit(size_t size, size_t limit) {
  return std::to_string(size) + " bytes, over the limit of " + std::to_string(limit) +
         " (raise it with TCAP_MAX_GRAPH_MB or JsonReadOptions::max_bytes)";
}

// See Note [Reader memory].
size_t estimated_tree_bytes(const std::string& text) {
  size_t objects = 0, arrays = 0, commas = 0, members = 0, strings = 0, string_bytes = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      } else {
        ++string_bytes;
      }
      continue;
    }
    switch (c) {
      case '"': in_string = true, ++strings; break;
      case '{': ++objects; break;
      case '[': ++arrays; break;
      case ',': ++commas; break;
      case ':': ++members; break;
      default: break;
    }
  }
  const size_t values = 1 + commas + objects + arrays;
  const size_t string_values = strings > members ? strings - members : 0;
  return kValueBytes * values + kObjectBytes * objects + kArrayBytes * arrays + kMemberBytes * members +
         kStringBytes * string_values + string_bytes;
}

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes the descriptor on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

size_t default_max_graph_bytes() {
  static const size_t bytes = read_default_max_bytes();
  return bytes;
}

void check_input_limits(const std::string& text, const JsonReadOptions& options) {
  const size_t limit = max_bytes_of(options);
  if (text.size() > limit) throw_format_error("", "the input is " + over_limit(text.size(), limit));
  const size_t tree = estimated_tree_bytes(text);
  if (tree > kMaxTreeBytesPerByte * text.size() + kTreeSlack) {
    throw_format_error("", "the input's structure would take about " + std::to_string(tree >> 20) +
                               " MiB to parse, more than " + std::to_string(kMaxTreeBytesPerByte) +
                               " bytes per byte of input (millions of empty values?): not a tcap graph");
  }
}

std::string read_graph_file(const std::string& path, const JsonReadOptions& options) {
  const size_t limit = max_bytes_of(options);
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)};
  if (f.fd < 0) throw_format_error("", "cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw_format_error("", "cannot read " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    throw_format_error("", "cannot read " + path + ": it is " + file_kind(st.st_mode) + ", not a regular file");
  }
  if (static_cast<unsigned long long>(st.st_size) > limit) {
    throw_format_error("", "cannot read " + path + ": it is " + over_limit(static_cast<size_t>(st.st_size), limit));
  }
  std::string text;
  text.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t got = ::read(f.fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw_format_error("", "cannot read " + path + ": " + std::strerror(errno));
    if (got == 0) break;
    if (text.size() + static_cast<size_t>(got) > limit) {
      throw_format_error("", "cannot read " + path + ": it is more than " + over_limit(limit, limit));
    }
    text.append(buf, static_cast<size_t>(got));
  }
  return text;
}

}  // namespace tcap::ir
