// A compiled graph as an Executable: run by interpreters, one per call running at once
// (Note [One executable on several threads]), each with its own memory plan (Note [Memory
// plans]) under the CPU buffer pool (Note [CPU buffer pool]), each run a profiler scope
// named "tcap::<what>" (Note [Profiler names]).
#pragma once

#include <tcap/compile.h>
#include <tcap/graph.h>

#include <memory>
#include <string>

namespace tcap::interp {
class DirectCalls;
}

namespace tcap::runtime {

// `check_host_values`: each run compares the values it reads on the host with the
// recorded ones (Interpreter::check_host_values). `kernels`: the table g's fused nodes
// name their kernels in (Note [A compiled graph owns its kernels]); the executable's
// interpreters hold the kernels they find there for as long as it lives.
Executable interpreter_executable(const ir::Graph& g, const std::string& what, bool check_host_values = false,
                                  std::shared_ptr<const interp::DirectCalls> kernels = nullptr);

}  // namespace tcap::runtime
