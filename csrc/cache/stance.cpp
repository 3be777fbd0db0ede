#include <tcap/stance.h>

#include "support/logging.h"

#include <atomic>
#include <cstdio>

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

thread_local std::optional<Stance> tls_stance;
thread_local std::optional<bool> tls_error_on_fallback;

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

Stance stance() { return tls_stance ? *tls_stance : process_stance().load(); }
bool error_on_fallback() { return tls_error_on_fallback ? *tls_error_on_fallback : process_error_on_fallback().load(); }

StanceGuard::StanceGuard(Stance s, std::optional<bool> error_on_fallback)
    : prev_stance_(tls_stance), prev_error_(tls_error_on_fallback) {
  tls_stance = s;
  if (error_on_fallback) tls_error_on_fallback = *error_on_fallback;
}

StanceGuard::~StanceGuard() {
  tls_stance = prev_stance_;
  tls_error_on_fallback = prev_error_;
}

}  // namespace tcap
