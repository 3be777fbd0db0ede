#include <tcap/stance.h>

#include "support/logging.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace tcap {
namespace {

Stance parse_env_stance() {
  const std::string& s = Config::get().stance;
  if (s.empty() || s == "default") return Stance::Default;
  if (s == "force_eager") return Stance::ForceEager;
  if (s == "eager_on_recompile") return Stance::EagerOnRecompile;
  if (s == "fail_on_recompile") return Stance::FailOnRecompile;
  std::fprintf(stderr,
               "[tcap] TCAP_STANCE: unknown stance '%s' (ignored; use default, force_eager, eager_on_recompile or "
               "fail_on_recompile)\n",
               s.c_str());
  return Stance::Default;
}

std::atomic<Stance>& process_stance() {
  static std::atomic<Stance> s{parse_env_stance()};
  return s;
}

std::atomic<bool>& process_error_on_fallback() {
  static std::atomic<bool> e{Config::get().error_on_fallback};
  return e;
}

// TCAP_VERIFY: "1", "N", "log", "log,N" (or "N,log"); "0", "off", "" leave it off.
VerifyOptions parse_env_verify() {
  const std::string& s = Config::get().verify;
  VerifyOptions v;
  if (s.empty() || s == "0" || s == "off" || s == "false") return v;
  size_t start = 0;
  bool ok = true;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (part == "log") {
      v.log_only = true;
      if (v.every == 0) v.every = 1;
    } else if (part == "on" || part == "true") {
      v.every = std::max(v.every, 1);
    } else {
      char* end = nullptr;
      const long n = std::strtol(part.c_str(), &end, 10);
      if (part.empty() || *end != '\0' || n < 1 || n > 1000000000) ok = false;
      else v.every = static_cast<int>(n);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (!ok) {
    std::fprintf(stderr, "[tcap] TCAP_VERIFY: '%s' not understood (ignored; use 1, N, log or log,N)\n", s.c_str());
    return VerifyOptions{};
  }
  return v;
}

// Packed in one word (every, then log_only in bit 32): read on every call of a compiled
// function, without a lock.
uint64_t pack(const VerifyOptions& v) {
  return static_cast<uint32_t>(v.every) | (static_cast<uint64_t>(v.log_only) << 32);
}
VerifyOptions unpack(uint64_t p) { return VerifyOptions{static_cast<int>(p & 0xffffffffu), ((p >> 32) & 1) != 0}; }
std::atomic<uint64_t>& process_verify() {
  static std::atomic<uint64_t> v{pack(parse_env_verify())};
  return v;
}

thread_local std::optional<Stance> tls_stance;
thread_local std::optional<bool> tls_error_on_fallback;
thread_local std::optional<VerifyOptions> tls_verify;

}  // namespace

std::string to_string(Stance s) {
  switch (s) {
    case Stance::Default: return "default";
    case Stance::ForceEager: return "force_eager";
    case Stance::EagerOnRecompile: return "eager_on_recompile";
    case Stance::FailOnRecompile: return "fail_on_recompile";
  }
  return "stance" + std::to_string(static_cast<int>(s));
}

void set_stance(Stance s) { process_stance().store(s); }
void set_error_on_fallback(bool on) { process_error_on_fallback().store(on); }
void set_verify(VerifyOptions v) {
  TORCH_CHECK(v.every >= 0, "tcap::set_verify: every must be 0 (off) or more, not ", v.every);
  process_verify().store(pack(v), std::memory_order_relaxed);
}

VerifyOptions verify_options() {
  if (tls_verify) return *tls_verify;
  return unpack(process_verify().load(std::memory_order_relaxed));
}

Stance stance() { return tls_stance ? *tls_stance : process_stance().load(); }
bool error_on_fallback() { return tls_error_on_fallback ? *tls_error_on_fallback : process_error_on_fallback().load(); }

StanceGuard::StanceGuard(Stance s, std::optional<bool> error_on_fallback, std::optional<VerifyOptions> verify)
    : prev_stance_(tls_stance), prev_error_(tls_error_on_fallback), prev_verify_(tls_verify) {
  tls_stance = s;
  if (error_on_fallback) tls_error_on_fallback = *error_on_fallback;
  if (verify) {
    TORCH_CHECK(verify->every >= 0, "tcap::StanceGuard: verify.every must be 0 (off) or more, not ", verify->every);
    tls_verify = *verify;
  }
}

StanceGuard::~StanceGuard() {
  tls_stance = prev_stance_;
  tls_error_on_fallback = prev_error_;
  tls_verify = prev_verify_;
}

}  // namespace tcap
