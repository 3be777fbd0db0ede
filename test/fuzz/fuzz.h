// Fuzzing tcap's graph JSON reader and interpreter (docs/reliability.md).
//
// Each target defines LLVMFuzzerTestOneInput, so the same source runs under libFuzzer
// (the TCAP_FUZZ build, clang) and under driver.cpp, the standalone mutation fuzzer the
// normal build links instead (and CTest runs, briefly, with a fixed seed). A target
// returns normally for every input the library handles as documented, and aborts with
// the input and what went wrong on stderr otherwise: any exception but the documented
// one escapes the library, or a check of the target fails. A crash of the library is a
// crash of the target, and both drivers keep the input.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace tcap::fuzz {

// What happened to the inputs, counted by the targets; printed by the drivers at exit.
struct Counters {
  std::atomic<uint64_t> inputs{0};
  std::atomic<uint64_t> rejected{0};     // the reader threw GraphFormatError
  std::atomic<uint64_t> loaded{0};       // ... or returned a graph (which verifies)
  std::atomic<uint64_t> run_ok{0};       // the interpreter ran the graph to its end
  std::atomic<uint64_t> run_error{0};    // ... or threw c10::Error (its documented error)
  std::atomic<uint64_t> not_run{0};      // a loaded graph whose inputs the target cannot make
};
Counters& counters();
// One line: "inputs N, rejected N, loaded N, ...".
std::string summary();

// Once per process: LibTorch's warnings off, one intra-op thread.
void set_up_once();

// Aborts the process after printing `what` and the input (escaped, cut) to stderr.
[[noreturn]] void fail(const std::string& what, const uint8_t* data, size_t size);

// Mutates data[0, size) in place (room for max_size bytes) and returns the new size:
// mostly JSON-aware changes (a number to an edge value, a name to another name of the
// format, an element deleted, duplicated or moved, a subtree copied over another),
// otherwise byte-level ones (through `byte_mutate` when libFuzzer provides it).
using ByteMutator = size_t (*)(uint8_t* data, size_t size, size_t max_size);
size_t mutate(uint8_t* data, size_t size, size_t max_size, std::mt19937_64& rng, ByteMutator byte_mutate);

}  // namespace tcap::fuzz
