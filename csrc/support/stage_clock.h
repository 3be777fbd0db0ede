// Times a compile's stages, one lap each (Note [Where a compile spends its time] in
// compiler/pipeline.cpp): the pipeline's stages and fusion's steps.
#pragma once

#include <chrono>
#include <iomanip>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace tcap {

class StageClock {
 public:
  using Laps = std::vector<std::pair<const char*, double>>;  // stage, ms

  // The time since the last lap (or since the clock was made), as stage `what`.
  void lap(const char* what) {
    const auto now = std::chrono::steady_clock::now();
    laps_.emplace_back(what, std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }
  const Laps& laps() const { return laps_; }
  double total() const {
    double t = 0;
    for (const auto& l : laps_) t += l.second;
    return t;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  Laps laps_;
};

// "simplify 0.0574, fuse 0.785": each lap in ms to 3 significant digits; `detail(what)`
// is written after a lap's time (fusion's own steps after "fuse").
template <class Detail>
std::string laps_text(const StageClock::Laps& laps, Detail&& detail) {
  std::ostringstream s;
  s << std::setprecision(3);
  for (const auto& [what, ms] : laps) s << (s.tellp() > 0 ? ", " : "") << what << " " << ms << detail(what);
  return s.str();
}
inline std::string laps_text(const StageClock::Laps& laps) {
  return laps_text(laps, [](const char*) { return ""; });
}

}  // namespace tcap
