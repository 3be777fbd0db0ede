// tcap-bench [--filter SUBSTRING,...] [--variants A,B] [--json FILE] [--repeats N] [--keep-archives DIR]
//            [--quick] [--inductor | --no-inductor] [--python PATH] [--device cpu|cuda]
//
// Runs the registered workloads (see workloads.h), prints one table per workload and,
// with --json, writes one object per (workload, variant). See bench/README.md.
#include "harness.h"
#include "workloads.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <cstring>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>

namespace {

constexpr const char* kUsage =
    "usage: tcap-bench [--filter SUBSTRING,...] [--variants A,B] [--json FILE] [--repeats N]\n"
    "                  [--quick] [--inductor | --no-inductor] [--python PATH] [--device cpu|cuda]\n"
    "  --filter S,T    run only the workloads whose name contains S or T\n"
    "  --variants A,B  run only these variants (eager, tcap_eager, tcap_eager_default,\n"
    "                  tcap_llvm, tcap_llvm_relu_after, tcap_cuda, tcap_cuda_graphs, ca_eager, ca_llvm,\n"
    "                  ca_cuda, gemm_floor,\n"
    "                  gemm_floor_onednn,\n"
    "                  py_eager, inductor,\n"
    "                  record, record_read, replay; the program workloads' compile,\n"
    "                  compile_llvm, step, step_llvm, step_fused, step_fused_llvm, ca, ca_llvm; the update\n"
    "                  workloads' step_llvm_apart; overhead_empty's call,\n"
    "                  lookup, guard_check, context_check, lookup_8, scan_8;\n"
    "                  the serving workloads' eager_Nt, tcap_eager_Nt, tcap_llvm_Nt for N = 1, 2, 4;\n"
    "                  the export workloads' export, load_first_call, cpp_eager, cpp_tcap_llvm,\n"
    "                  loaded_eager, loaded_llvm, nativert)\n"
    "  --keep-archives DIR  export_cnn writes its PT2 archive there and keeps it (for\n"
    "                  bench/export_py_bench.py)\n"
    "  --json FILE     also write the records to FILE (a JSON list, one object per variant)\n"
    "  --repeats N     rounds per workload (default 15; 3 with --quick)\n"
    "  --quick         few rounds and iterations: a smoke test, not a measurement (no\n"
    "                  torch.compile peer unless --inductor)\n"
    "  --inductor      run the torch.compile peer (bench/inductor_bench.py: py_eager, inductor);\n"
    "                  default: when a python with LibTorch's torch is found, not with --quick\n"
    "  --no-inductor   do not run it\n"
    "  --python PATH   the peer's python (default: $TCAP_PYTHON, the venv of the linked torch,\n"
    "                  ~/.cache/tcap/venv, /opt/torch/.venv)\n"
    "  --device D      cpu (default) or cuda: the compile workloads, the peer and the\n"
    "                  bandwidth floors on that device (bench/README.md)\n";

// Every variant some workload has (--variants checks its names against these).
const char* const kVariants[] = {"eager",     "record",    "record_read",      "replay",   "tcap_eager",
                                 "tcap_eager_default",     "tcap_llvm", "tcap_llvm_relu_after", "tcap_cuda", "tcap_cuda_graphs",
                                 "ca_eager",  "ca_llvm",   "ca_cuda",     "gemm_floor", "gemm_floor_onednn", "py_eager", "inductor",
                                 "compile",   "compile_llvm", "step",     "step_llvm", "step_llvm_apart", "step_fused", "step_fused_llvm", "ca",
                                 "call",      "lookup",    "guard_check", "context_check", "lookup_8", "scan_8",
                                 "eager_1t",  "eager_2t",  "eager_4t",   "tcap_eager_1t", "tcap_eager_2t", "tcap_eager_4t",
                                 "tcap_llvm_1t", "tcap_llvm_2t", "tcap_llvm_4t",
                                 "export", "load_first_call", "cpp_eager", "cpp_tcap_llvm", "loaded_eager", "loaded_llvm",
                                 "nativert"};

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "tcap-bench: " << message << "\n" << kUsage;
  std::exit(2);
}

tcap::bench::Options parse(int argc, char** argv) {
  tcap::bench::Options o;
  int repeats = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--filter") {
      o.filter = value();
    } else if (arg == "--json") {
      o.json_path = value();
    } else if (arg == "--repeats") {
      const std::string v = value();
      repeats = std::atoi(v.c_str());
      if (repeats < 1) usage_error("--repeats needs a positive integer, got '" + v + "'");
    } else if (arg == "--variants") {
      std::stringstream ss(value());
      for (std::string v; std::getline(ss, v, ',');) {
        if (v.empty()) continue;
        if (std::find(std::begin(kVariants), std::end(kVariants), v) == std::end(kVariants)) {
          usage_error("unknown variant '" + v + "'");
        }
        o.variants.push_back(v);
      }
      if (o.variants.empty()) usage_error("--variants needs at least one name");
    } else if (arg == "--keep-archives") {
      o.archive_dir = value();
    } else if (arg == "--inductor") {
      o.inductor = 1;
    } else if (arg == "--no-inductor") {
      o.inductor = 0;
    } else if (arg == "--python") {
      o.python = value();
    } else if (arg == "--device") {
      o.device = value();
      if (o.device != "cpu" && o.device != "cuda") usage_error("--device is cpu or cuda, got '" + o.device + "'");
    } else if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else {
      usage_error("unknown argument '" + arg + "'");
    }
  }
  if (o.quick) {
    o.repeats = 3;
    o.round_ms = 2;
    o.warmup_ms = 2;
  }
  if (repeats > 0) o.repeats = repeats;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const tcap::bench::Options options = parse(argc, argv);
  tcap::bench::Registry registry;
  tcap::bench::add_capture_workloads(registry);
  tcap::bench::add_compile_workloads(registry);
  tcap::bench::add_program_workloads(registry);
  tcap::bench::add_update_workloads(registry);
  tcap::bench::add_overhead_workloads(registry);
  tcap::bench::add_serving_workloads(registry);
  tcap::bench::add_ir_workloads(registry);
  tcap::bench::add_export_workloads(registry);

  if (options.device == "cuda") {
    if (!torch::cuda::is_available()) {
      std::cerr << "tcap-bench: --device cuda, but LibTorch sees no CUDA device (torch::cuda::is_available() is "
                   "false: no GPU, no driver, or a LibTorch built without CUDA)\n";
      return 2;
    }
    tcap::bench::set_device_sync([] { torch::cuda::synchronize(); });
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  std::cout << "tcap-bench: LibTorch " << TORCH_VERSION << ", " << at::get_num_threads()
            << " intra-op threads, GLIBC_TUNABLES=" << (tunables ? tunables : "(unset: stock malloc)")
            << (options.quick ? ", --quick (not a measurement)" : "")
            << (options.device == "cpu" ? "" : ", device " + options.device + " (" +
                                                   std::to_string(torch::cuda::device_count()) + " visible)")
            << "\n";
  try {
    tcap::bench::install_cpu_byte_counter();  // peak_bytes, saved_bytes: see harness.h
    const auto records = tcap::bench::run_all(registry, options, std::cout);
    if (records.empty()) std::cerr << "tcap-bench: no workload matches '" << options.filter << "'\n";
    if (!options.json_path.empty()) tcap::bench::write_json(options.json_path, records);
    int failed = 0;
    for (const auto& r : records) {
      if (r.failed) {
        std::cerr << "tcap-bench: " << r.workload << "/" << r.variant << " FAILED: " << r.skipped << "\n";
        ++failed;
      }
    }
    return records.empty() || failed > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "tcap-bench: " << e.what() << "\n";
    return 1;
  }
}
