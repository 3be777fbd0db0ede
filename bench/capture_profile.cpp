// tcap-capture-profile: the seed MLP training step (bench/seed_mlp.h) in a loop, with the
// part to measure inside one function, tcap_profiled_region, so that an instruction
// profiler can count it alone:
//
//   valgrind --tool=callgrind --toggle-collect=tcap_profiled_region
//            ./build/bench/tcap-capture-profile --mode record --steps 200
//   callgrind_annotate callgrind.out.<pid>
//
// --mode eager    the step, eagerly
// --mode record   the step inside a fresh CaptureGuard (built and destroyed outside)
// --mode read     cap.graph() of a recorded step (the step itself outside)
// Without a profiler it prints the median time of the region, for a quick look; the
// numbers that count are tcap-bench's (record_mlp_step).
#include "seed_mlp.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

enum class Mode { Eager, Record, Read };

// What the profiler counts. extern "C" and noinline: one stable symbol to toggle on.
extern "C" __attribute__((noinline)) size_t tcap_profiled_region(Mode mode, tcap::bench::Mlp& mlp,
                                                                 tcap::CaptureGuard* cap) {
  if (mode == Mode::Read) return cap->graph().nodes().size();
  mlp.step();
  return 0;
}

[[noreturn]] void usage() {
  std::fprintf(stderr, "usage: tcap-capture-profile [--mode eager|record|read] [--steps N]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Mode mode = Mode::Record;
  int steps = 200;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mode" && i + 1 < argc) {
      const std::string m = argv[++i];
      if (m == "eager") {
        mode = Mode::Eager;
      } else if (m == "record") {
        mode = Mode::Record;
      } else if (m == "read") {
        mode = Mode::Read;
      } else {
        usage();
      }
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
      if (steps <= 0) usage();
    } else {
      usage();
    }
  }
  torch::manual_seed(0);
  tcap::bench::Mlp mlp;
  for (int i = 0; i < 100; ++i) mlp.step();  // warm: every step after the first records the same ops
  std::vector<double> us;
  size_t sink = 0;
  for (int i = 0; i < steps; ++i) {
    std::chrono::steady_clock::time_point t0, t1;
    if (mode == Mode::Eager) {
      t0 = std::chrono::steady_clock::now();
      sink += tcap_profiled_region(mode, mlp, nullptr);
      t1 = std::chrono::steady_clock::now();
    } else {
      tcap::CaptureGuard cap;
      mlp.declare(cap);
      if (mode == Mode::Read) mlp.step();
      t0 = std::chrono::steady_clock::now();
      sink += tcap_profiled_region(mode, mlp, &cap);
      t1 = std::chrono::steady_clock::now();
    }
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  std::printf("%s: median %.1f us per region over %d steps (%zu)\n",
              mode == Mode::Eager ? "eager" : mode == Mode::Record ? "record" : "read", us[us.size() / 2],
              steps, sink);
  return 0;
}
