// What both fuzz targets share (fuzz.h): counters, failure reports, and libFuzzer's
// hooks into the mutator when built with it.
#include "fuzz/fuzz.h"

#include "ir/printable.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

namespace tcap::fuzz {

Counters& counters() {
  static Counters c;
  return c;
}

std::string summary() {
  const Counters& c = counters();
  return "inputs " + std::to_string(c.inputs) + ", rejected (GraphFormatError) " + std::to_string(c.rejected) +
         ", loaded " + std::to_string(c.loaded) + ", interpreted " + std::to_string(c.run_ok) +
         ", interpreter errors (c10::Error) " + std::to_string(c.run_error) + ", not run " +
         std::to_string(c.not_run);
}

namespace {
class Quiet final : public c10::WarningHandler {
  void process(const c10::Warning&) override {}
};
}  // namespace

void set_up_once() {
  static const bool done = [] {
    static Quiet quiet;  // LibTorch's warnings (deprecated devices, ...) are not findings
    c10::WarningUtils::set_warning_handler(&quiet);
    at::set_num_threads(1);
    return true;
  }();
  (void)done;
}

void fail(const std::string& what, const uint8_t* data, size_t size) {
  std::cerr << "tcap fuzz: FAILED: " << what << "\ninput (" << size << " bytes): "
            << ir::printable(std::string_view(reinterpret_cast<const char*>(data), size), 4096) << std::endl;
  std::abort();
}

#ifdef TCAP_LIBFUZZER
namespace {
// libFuzzer prints its own figures; these say what became of the inputs.
struct PrintAtExit {
  ~PrintAtExit() { std::fprintf(stderr, "tcap fuzz: %s\n", summary().c_str()); }
} print_at_exit;
}  // namespace
#endif

}  // namespace tcap::fuzz

#ifdef TCAP_LIBFUZZER
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::mt19937_64 rng(seed);
  return tcap::fuzz::mutate(data, size, max_size, rng, &LLVMFuzzerMutate);
}
#endif
