// Logging channels, PyTorch TORCH_LOGS style: TCAP_LOGS=capture,graphs,recompiles,...
//
// Every environment variable tcap reads is listed here, read once (Config::get()):
//   TCAP_LOGS        comma-separated channels; "all" turns on every channel,
//                    "-name" turns one off again ("all,-capture").
//   TCAP_LOG_FILE    append log lines there instead of stderr.
//   TCAP_DUMP_DIR    folder where graphs and fused kernels (kernels/) are dumped.
//   TCAP_CACHE_DIR   on-disk cache folder (default ~/.cache/tcap).
//   TCAP_BUFFER_POOL_MB  cap of the CPU buffer pool's cached blocks (default 1024; 0: no
//                    pool). Note [CPU buffer pool].
//   TCAP_COMPILE_THREADS  threads compiling a graph's kernels at once (default: the
//                    machine's cores, at most 8; 1: one after the other). Note
//                    [Parallel kernel compilation].
//   TCAP_STANCE      default | force_eager | eager_on_recompile | fail_on_recompile: the
//                    process's stance (include/tcap/stance.h; tcap::set_stance overrides).
//   TCAP_ERROR_ON_FALLBACK  1: every eager fallback throws tcap::FallbackError.
//   TCAP_VERIFY      1 | N | log | log,N: check every (Nth) replay against eager
//                    (include/tcap/stance.h, VerifyOptions; docs/compile.md, "Verify mode").
//   TCAP_ONEDNN_GEMMS  0: the llvm backend keeps every matrix product ATen's (default 1:
//                    float32 CPU products that measure faster through oneDNN take it;
//                    Note [GEMMs through oneDNN], runtime/onednn_gemm.cpp).
//   TCAP_MAX_GRAPH_MB  largest graph JSON input read by load_json, from_json_string
//                    and tcap-inspect, in MiB (default 64); JsonReadOptions::max_bytes
//                    overrides it per call. Read once by ir::default_max_graph_bytes()
//                    (ir/json_input.cpp, Note [Reader memory]).
#pragma once

#include <sstream>
#include <string>

namespace tcap {

enum class LogChannel : unsigned {
  Capture = 0,      // recorder: inputs classified, fallbacks, hooks wrapped
  Graphs,           // captured graphs printed in readable form
  GraphBreaks,      // why something could not be captured or compiled (eager fallback)
  Recompiles,       // guard failures and the reason of each recompile
  Fusion,           // fusion groups
  CompiledAutograd, // compiled-autograd backward graphs
  CompiledAutogradVerbose,
  Perf,             // timing of compile stages
  AotGraphs,        // tcap::compile: joint, forward and backward graphs, partition decisions
  Pipeline,         // every stage of the compile pipeline: the graph after it (compiler/pipeline.cpp)
  Ddp,              // DistributedDataParallel: buckets, when each all-reduce starts, waits, unused parameters
  Guards,           // each entry's guards, and what a graph reads from outside its inputs (its contract)
  Verify,           // verify mode: each verified replay and what it compared
  Export,           // export_program / load_program: what was written or read, and why not
  kCount
};

struct Config {
  unsigned log_mask = 0;
  std::string log_file;
  std::string dump_dir;
  std::string cache_dir;
  long long buffer_pool_mb = 1024;
  int compile_threads = 0;  // 0: the default (cores, at most 8)
  bool compile_in_background = false;  // TCAP_COMPILE_IN_BACKGROUND (runtime/background_compiles.h)
  long long small_matmul_macs = -1;  // TCAP_SMALL_MATMUL_MACS; -1: the default (fuse/fusion.h)
  std::string stance;       // TCAP_STANCE as given ("" = default)
  bool error_on_fallback = false;
  std::string verify;       // TCAP_VERIFY as given ("" = off)
  bool memory_plans = true;   // TCAP_MEMORY_PLAN (runtime/buffer_pool.h, Note [Memory plans])
  bool unboxed_calls = true;  // TCAP_UNBOXED_CALLS (interp/unboxed_calls.cpp)
  bool onednn_gemms = true;   // TCAP_ONEDNN_GEMMS (Note [GEMMs through oneDNN], runtime/onednn_gemm.cpp)
  static const Config& get();
};

bool log_enabled(LogChannel c);
const char* channel_name(LogChannel c);
// Writes one line "[tcap:<channel>] <msg>" (multi-line messages are indented).
void log_line(LogChannel c, const std::string& msg);
// For tests: re-read TCAP_LOGS from the environment.
void reload_config_for_testing();

}  // namespace tcap

#define TCAP_LOG(channel, expr)                               \
  do {                                                        \
    if (::tcap::log_enabled(::tcap::LogChannel::channel)) {   \
      std::ostringstream tcap_log_ss_;                        \
      tcap_log_ss_ << expr;                                   \
      ::tcap::log_line(::tcap::LogChannel::channel, tcap_log_ss_.str()); \
    }                                                         \
  } while (0)
