#include "support/logging.h"

#include "support/env.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>

namespace tcap {
namespace {

constexpr const char* kNames[] = {"capture",    "graphs", "graph_breaks",
                                  "recompiles", "fusion", "compiled_autograd",
                                  "compiled_autograd_verbose", "perf", "aot_graphs", "pipeline", "ddp",
                                  "guards", "verify", "export"};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(LogChannel::kCount));

std::string env_or(const char* name, std::string fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : std::move(fallback);
}

unsigned parse_mask(const std::string& spec) {
  unsigned mask = 0;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    while (!item.empty() && item.front() == ' ') item.erase(0, 1);
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty()) continue;
    bool off = item[0] == '-';
    if (off || item[0] == '+') item.erase(0, 1);
    unsigned bits = 0;
    if (item == "all") {
      bits = (1u << static_cast<unsigned>(LogChannel::kCount)) - 1;
    } else {
      for (unsigned k = 0; k < static_cast<unsigned>(LogChannel::kCount); ++k) {
        if (item == kNames[k]) bits = 1u << k;
      }
      if (item == "compiled_autograd_verbose") bits |= 1u << static_cast<unsigned>(LogChannel::CompiledAutograd);
      if (bits == 0) {
        std::fprintf(stderr, "[tcap] TCAP_LOGS: unknown channel '%s' (ignored)\n", item.c_str());
      }
    }
    mask = off ? (mask & ~bits) : (mask | bits);
  }
  return mask;
}

// An integer setting in [lo, hi]; anything else is ignored with a line saying so.
std::optional<long long> env_number(const char* name, long long lo, long long hi, const char* what) {
  const std::string text = env_or(name, "");
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (end && *end == '\0' && n >= lo && n <= hi) return n;
  std::fprintf(stderr, "[tcap] %s: '%s' is not %s (ignored)\n", name, text.c_str(), what);
  return std::nullopt;
}

Config read_config() {
  Config c;
  c.log_mask = parse_mask(env_or("TCAP_LOGS", ""));
  c.log_file = env_or("TCAP_LOG_FILE", "");
  c.dump_dir = env_or("TCAP_DUMP_DIR", "");
  c.cache_dir = env_or("TCAP_CACHE_DIR", env_or("HOME", "/tmp") + "/.cache/tcap");
  if (auto mb = env_number("TCAP_BUFFER_POOL_MB", 0, LLONG_MAX, "a number of megabytes")) c.buffer_pool_mb = *mb;
  if (auto n = env_number("TCAP_COMPILE_THREADS", 1, 256, "a number of threads in 1..256")) {
    c.compile_threads = static_cast<int>(*n);
  }
  if (auto n = env_number("TCAP_SMALL_MATMUL_MACS", 0, LLONG_MAX, "a number of multiply-adds")) c.small_matmul_macs = *n;
  c.stance = env_or("TCAP_STANCE", "");
  c.error_on_fallback = env_switch("TCAP_ERROR_ON_FALLBACK", false);
  c.verify = env_or("TCAP_VERIFY", "");
  c.memory_plans = env_switch("TCAP_MEMORY_PLAN", true);
  c.unboxed_calls = env_switch("TCAP_UNBOXED_CALLS", true);
  c.onednn_gemms = env_switch("TCAP_ONEDNN_GEMMS", true);
  c.compile_in_background = env_switch("TCAP_COMPILE_IN_BACKGROUND", false);
  return c;
}

Config& mutable_config() {
  static Config c = read_config();
  return c;
}

std::mutex& log_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

const Config& Config::get() { return mutable_config(); }

void reload_config_for_testing() { mutable_config() = read_config(); }

bool log_enabled(LogChannel c) {
  return (Config::get().log_mask >> static_cast<unsigned>(c)) & 1u;
}

const char* channel_name(LogChannel c) { return kNames[static_cast<unsigned>(c)]; }

void log_line(LogChannel c, const std::string& msg) {
  std::string text = std::string("[tcap:") + channel_name(c) + "] ";
  for (char ch : msg) {
    text += ch;
    if (ch == '\n') text += "    ";
  }
  if (text.empty() || text.back() != '\n') text += '\n';
  std::lock_guard<std::mutex> lock(log_mutex());
  const std::string& file = Config::get().log_file;
  if (!file.empty()) {
    std::ofstream(file, std::ios::app) << text;
  } else {
    std::cerr << text << std::flush;
  }
}

}  // namespace tcap
