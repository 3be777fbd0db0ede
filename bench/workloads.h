// Every workload family of tcap-bench adds itself to the registry here; main() calls
// these in order, which is the order of the report.
#pragma once

#include "harness.h"

namespace tcap::bench {

// record_small_ops, record_mlp_step (workloads_capture.cpp).
void add_capture_workloads(Registry& registry);
// coscos, mlp_small, mlp_big, softmax_ce, transformer_block: tcap::compile replay vs eager
// (workloads_compile_list.cpp, measured by workloads_compile.cpp).
void add_compile_workloads(Registry& registry);
// program_cnn, program_dcgan, ...: whole training steps of the programs of test/programs/
// in each tcap mode (workloads_programs.cpp).
void add_program_workloads(Registry& registry);
// overhead_empty: the cost of a compiled call whose graph is empty, of the entry lookup
// and of the guard check alone (workloads_overhead.cpp).
void add_overhead_workloads(Registry& registry);
// serving_mlp_b1, serving_mlp_b8, serving_block_b1, serving_block_b8: one model in
// inference served by 1, 2 and 4 request threads, eager vs compiled (workloads_serving.cpp).
void add_serving_workloads(Registry& registry);
// ir_passes_20k: graph passes over a captured graph of ~20,000 nodes (workloads_ir.cpp).
void add_ir_workloads(Registry& registry);
// export_cnn, import_train_mlp (bench/workloads_export.cpp).
void add_export_workloads(Registry& registry);
// adam_mlp_big, adam_transformer_block: one optimizer step alone against its bandwidth
// floor (bench/workloads_updates.cpp).
void add_update_workloads(Registry& registry);

}  // namespace tcap::bench
