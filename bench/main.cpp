// tcap-bench [--filter WORKLOAD_SUBSTRING] [--json FILE] [--repeats N] [--quick]
//
// Runs the registered workloads (see workloads.h), prints one table per workload and,
// with --json, writes one object per (workload, variant). See bench/README.md.
#include "harness.h"
#include "workloads.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

namespace {

constexpr const char* kUsage =
    "usage: tcap-bench [--filter WORKLOAD_SUBSTRING] [--json FILE] [--repeats N] [--quick]\n"
    "  --filter S   run only the workloads whose name contains S\n"
    "  --json FILE  also write the records to FILE (a JSON list, one object per variant)\n"
    "  --repeats N  rounds per workload (default 15; 3 with --quick)\n"
    "  --quick      few rounds and iterations: a smoke test, not a measurement\n";

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

  const char* tunables = std::getenv("GLIBC_TUNABLES");
  std::cout << "tcap-bench: LibTorch " << TORCH_VERSION << ", " << at::get_num_threads()
            << " intra-op threads, GLIBC_TUNABLES=" << (tunables ? tunables : "(unset: stock malloc)")
            << (options.quick ? ", --quick (not a measurement)" : "") << "\n";
  try {
    tcap::bench::install_cpu_byte_counter();  // peak_bytes, saved_bytes: see harness.h
    const auto records = tcap::bench::run_all(registry, options, std::cout);
    if (records.empty()) std::cerr << "tcap-bench: no workload matches '" << options.filter << "'\n";
    if (!options.json_path.empty()) tcap::bench::write_json(options.json_path, records);
    return records.empty() ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "tcap-bench: " << e.what() << "\n";
    return 1;
  }
}
