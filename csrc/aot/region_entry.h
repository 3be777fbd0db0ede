// A compiled entry of tcap::compile: one captured call of a function, its joint graph
// partitioned and compiled, guarded by the one set of guards all front doors share
// (cache/guards.h), and what replay needs to know about it.
#pragma once

#include "cache/entry_cache.h"

#include <tcap/compile.h>

#include <atomic>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tcap::aot {

struct RegionEntry : cache::Entry {
  std::string fn_name;
  JointGraph joint;
  PartitionResult part;
  Executable fw, bw;
  bool has_backward = false;  // a compiled backward exists
  bool use_function = false;  // replay through ReplayFunction (grad mode on, a primal requires grad)
  // Replay facts.
  std::vector<bool> output_differentiable;  // per user output
  std::vector<bool> tangent_present;        // per user output: it had a gradient at capture
  // Outputs whose gradients aliased when the backward was recorded: the compiled backward
  // serves a call only if they still do (Note [Tangents that alias] in region.cpp).
  std::vector<std::pair<int, int>> aliased_tangents;
  std::vector<size_t> mutated_primals;      // primals the forward writes in place
  // Primals a recompute of the forward must run on copies of: mutated_primals and those a
  // node writes without its schema saying so (Note [Writes a schema does not show]).
  std::vector<size_t> recompute_clones;
  bool has_rng = false;
  // Note [Autograd Functions in a region]: the first forward op that ran inside an autograd
  // Function ("aten::relu (node %3)"), or "" when none did.
  std::string autograd_function;
  double compile_ms = 0;
  // Note [Entries without a compiled backward] (replay_function.cpp): said once.
  mutable std::atomic<bool> logged_forward_through_autograd{false};
  // Host reads of the joint graph that are observations, not guards (Note [Observed host
  // values]): forgotten in `joint` (passes::forget_host_reads).
  std::vector<ir::NodeId> observed_reads;
  std::shared_ptr<cache::Stats> stats;  // its front door's
  // The forward as recorded (RegionCapture::joint_without_backward): what a check capture
  // at new sizes is compared with (Note [Checking a new size]).
  ir::Graph forward_record;
  // A dynamic entry's specializations, by class values (Note [Dynamic sizes]).
  std::shared_ptr<cache::Specializations<RegionEntry>> specialized =
      std::make_shared<cache::Specializations<RegionEntry>>();
};

// Partitions and compiles `joint` into e (the graphs, the executables, the replay facts,
// the host-read guards), for replay on primals like `primals` (the capture's). Throws
// c10::Error saying why the region cannot be compiled.
//
// `host_miss_of`: the entry that missed this call on a host value alone. When the two
// captures differ only in values read on the host (and CompileOptions::observe_host_values),
// those reads become observations (dropped from e's graph, no longer guarded) and the
// function returns true: e generalizes host_miss_of and replaces it.
bool compile_region(RegionEntry& e, JointGraph joint, bool has_backward, const std::vector<at::Tensor>& primals,
                    const CompileOptions& options, const RegionEntry* host_miss_of = nullptr);

// Note [Dynamic sizes] for regions: b, captured at sizes `changed` away from a's, becomes
// dynamic in those dims when the two graphs agree (logged under recompiles, `who` naming
// the function either way).
void generalize(const RegionEntry& a, RegionEntry& b, const std::vector<size_t>& changed, const std::string& who);
// The entry serving a call at the class values `key`: e itself, or e specialized to them
// (compiled once per distinct sizes, without running the user's code; counted in e's
// stats). On every replay's path: it builds nothing unless it compiles.
std::shared_ptr<const RegionEntry> specialize(const std::shared_ptr<const RegionEntry>& e, const std::vector<int64_t>& key,
                                              const std::vector<at::Tensor>& primals, const CompileOptions& options);
// The same, with the specialization made on the background compile thread (Note
// [Specializations in the background]): null while it is being made (the call runs eagerly).
std::shared_ptr<const RegionEntry> specialize_in_background(const std::shared_ptr<const RegionEntry>& e,
                                                            const std::vector<int64_t>& key,
                                                            const std::vector<at::Tensor>& primals,
                                                            const CompileOptions& options);
// Note [The contract of a compiled function]: logs under guards what e reads from outside
// its inputs, and how (the function's first entry).
void log_contract(const RegionEntry& e, const std::string& who);

}  // namespace tcap::aot
