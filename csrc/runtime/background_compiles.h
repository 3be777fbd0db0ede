// Kernels compiled off the calling thread.
//
// Note [Kernels compiled in the background]
// A cold compile is mostly LLVM (10-25 ms a kernel, Note [Parallel kernel compilation]),
// and a program whose sizes vary pays it again for each kernel structure's second size
// (Note [Sizes at launch]). With CompileOptions::compile_in_background (or
// TCAP_COMPILE_IN_BACKGROUND=1) a CPU graph's kernels that need LLVM do not hold up the
// call that compiled the graph:
//   - fusion forms, lowers and plans every group as usual (a group the renderer cannot
//     plan stays ATen calls, as without the option); a kernel found in the memory cache,
//     or served by code of its structure compiled for other sizes, is ready at once;
//   - the others are registered as *compiling*: a call of one runs the group's own ATen
//     ops (its fallback graph, the same one a guard mismatch runs, Note [Fused kernel
//     guards]), so the graph is served at once, unfused where its kernels are not ready;
//   - a graph's first run submits one job that compiles its kernels on the background
//     compile thread (jobs run in the order graphs first ran), and makes them ready
//     together when the last is done, so a graph's memory plan records again once, not
//     once per kernel (Note [Memory plans]). Submitting at the first run, not at compile
//     time, lets the sizes met before it tell each kernel structure which numbers vary,
//     so a program whose sizes change compiles each structure once (Note [Kernels compiled
//     at their first run], compiler/pipeline.cpp);
//   - a kernel the job cannot compile keeps running its ATen ops, logged under
//     graph_breaks with the reason; a graph that dies first has its remaining kernels
//     skipped.
// Values are eager's ATen ops' until the kernels are ready and the kernels' afterwards,
// so which calls ran which depends on timing: results agree with eager to the usual
// tolerances either way, but two runs of a program need not be bitwise equal. That is why
// the option is off by default (and why verify mode, which compares with eager anyway, is
// unaffected). wait_for_background_compiles() blocks until every job submitted so far has
// finished (tests, benchmarks, a server that wants its kernels before it opens: after a
// warm-up call, since a graph that never ran has submitted nothing). At exit
// the thread finishes the kernel it is compiling and drops the rest.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace tcap {
struct CompileOptions;
}

namespace tcap::runtime {

// Whether `o` asks for compiles in the background (CompileOptions::compile_in_background,
// or TCAP_COMPILE_IN_BACKGROUND=1 for every graph).
bool background_compiles_on(const CompileOptions& o);

// Runs `job` on the background compile thread after the jobs submitted before it.
// `what` names it in logs. A job that throws is logged (graph_breaks) and dropped.
void submit_background_compile(std::string what, std::function<void()> job);
// The same for a dynamic entry's specialization (Note [Specializations in the background]
// in cache/dynamic_sizes.h): the `submit` every front door passes there.
void submit_specialization(std::string what, std::function<void()> job);

// Blocks until every job submitted so far has finished.
void wait_for_background_compiles();

// Tests: while paused, the thread starts no job (one running finishes); wait() would wait
// for the pause to end.
void pause_background_compiles_for_testing(bool paused);

struct BackgroundCompileStats {
  int64_t jobs = 0;           // submitted
  int64_t finished = 0;       // done (or skipped at exit)
  int64_t kernels = 0;        // kernels made ready by jobs
  int64_t failed = 0;         // kernels a job could not compile (they run their ATen ops)
  int64_t unfused_runs = 0;   // kernel calls that ran ATen ops because the kernel was compiling
};
BackgroundCompileStats background_compile_stats();

// Counters the fused-kernel runtime and the jobs update.
void count_background_kernels(int64_t ready, int64_t failed);
void count_unfused_run();

}  // namespace tcap::runtime
