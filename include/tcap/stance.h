// How compiled code behaves, for the whole process or one thread: the C++ counterpart of
// torch.compiler.set_stance and torch._dynamo's error_on_graph_break. Applies alike to
// tcap::compile, tcap::compile_step and tcap::CompiledAutogradGuard.
//
//   tcap::set_stance(tcap::Stance::FailOnRecompile);   // the process, from now on
//   {
//     tcap::StanceGuard g(tcap::Stance::ForceEager);    // this thread, this scope
//     model->forward(x);                               // runs eagerly, no capture
//   }
//   tcap::set_error_on_fallback(true);                 // any eager fallback throws
//
// Environment (read once, at the first use): TCAP_STANCE=default|force_eager|
// eager_on_recompile|fail_on_recompile, TCAP_ERROR_ON_FALLBACK=1, TCAP_VERIFY=1|N|log|log,N.
#pragma once

#include <c10/util/Exception.h>

#include <optional>
#include <string>

namespace tcap {

enum class Stance {
  Default,           // capture, compile, replay; recompile on guard misses (up to the cache limit)
  ForceEager,        // ignore compiled code: every call runs the user's code eagerly, nothing is captured
  EagerOnRecompile,  // replay compiled entries that fit; where a recompile would be needed, run eagerly
  FailOnRecompile,   // replay compiled entries that fit; where a recompile would be needed, throw RecompileError
};
std::string to_string(Stance s);  // "default", "force_eager", ...

// Thrown under Stance::FailOnRecompile when a call would recompile; the message names the
// function and the guard that failed.
class RecompileError : public c10::Error {
 public:
  using c10::Error::Error;
};
// Thrown when error_on_fallback is on and tcap would run something eagerly because it
// cannot compile it (an unsupported op, a hook it cannot replay, the cache limit, ...);
// the message names the function and the cause. Calls that run eagerly by design (the
// capturing first call, Stance::ForceEager) are not fallbacks.
class FallbackError : public c10::Error {
 public:
  using c10::Error::Error;
};

// Verify mode (docs/compile.md, "Verify mode"): checks replays against eager, to prove that
// a program meets the contract of what a replay re-reads and what it freezes. Every
// `every`-th replay of each compiled function, step and compiled backward also runs the
// program's code eagerly on the same inputs and state, compares everything the call
// produced (outputs, gradients, buffers and optimizer state it wrote), and keeps eager's
// results. A difference beyond the backend's tolerance throws tcap::VerifyError (or, with
// log_only, is printed as a warning) naming the function, the entry, the first tensor
// that differs and the likely cause. It costs an eager run per verified call, and holds
// twice the memory while it compares.
//   TCAP_VERIFY=1 (every replay), =N (every Nth), =log (every replay, warn), =log,N
struct VerifyOptions {
  int every = 0;          // 0: off; 1: every replay; N: every Nth replay
  bool log_only = false;  // warn instead of throwing VerifyError
  bool on() const { return every > 0; }
};
class VerifyError : public c10::Error {
 public:
  using c10::Error::Error;
};

// Process-wide settings (every thread without a StanceGuard).
void set_stance(Stance s);
void set_error_on_fallback(bool on);
void set_verify(VerifyOptions v);
// The settings in effect on this thread.
Stance stance();
bool error_on_fallback();
VerifyOptions verify_options();

// RAII: this thread's stance (and, when given, error_on_fallback and verify mode) for a scope.
class StanceGuard {
 public:
  explicit StanceGuard(Stance s, std::optional<bool> error_on_fallback = std::nullopt,
                       std::optional<VerifyOptions> verify = std::nullopt);
  ~StanceGuard();
  StanceGuard(const StanceGuard&) = delete;
  StanceGuard& operator=(const StanceGuard&) = delete;

 private:
  std::optional<Stance> prev_stance_;
  std::optional<bool> prev_error_;
  std::optional<VerifyOptions> prev_verify_;
};

}  // namespace tcap
