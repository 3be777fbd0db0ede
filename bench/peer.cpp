// The torch.compile peer: runs bench/inductor_bench.py with the Python of the same torch
// and reads its rows back. See Note [The torch.compile peer] in harness.h.
#include "harness.h"

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <ostream>
#include <sstream>

#ifndef TCAP_BENCH_SOURCE_DIR
#define TCAP_BENCH_SOURCE_DIR ""
#endif
#ifndef TCAP_BENCH_TORCH_LIB_DIR
#define TCAP_BENCH_TORCH_LIB_DIR ""
#endif

namespace tcap::bench {

namespace {

namespace fs = std::filesystem;

const char* const kPeerVariants[] = {"py_eager", "inductor"};

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// The command's stdout (stderr discarded), trailing whitespace removed; "" if it failed.
std::string output_of(const std::string& command) {
  FILE* p = popen((command + " 2>/dev/null").c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[256];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) return "";
  while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) out.pop_back();
  return out;
}

std::string version_core(const std::string& v) { return v.substr(0, v.find('+')); }

// The python beside a torch installed in a venv or a prefix:
// <prefix>/lib/pythonX.Y/site-packages/torch/lib -> <prefix>/bin/python3.
std::string python_beside_torch(const std::string& torch_lib_dir) {
  const auto at = torch_lib_dir.find("/lib/python");
  if (at == std::string::npos) return "";
  return torch_lib_dir.substr(0, at) + "/bin/python3";
}

std::string last_line_of(const fs::path& file) {
  std::ifstream f(file);
  std::string line, last;
  while (std::getline(f, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  return last;
}

Record skipped_record(const std::string& workload, const std::string& variant, const std::string& why) {
  Record r;
  r.workload = workload;
  r.variant = variant;
  r.skipped = why;
  return r;
}

Record record_of(const nlohmann::ordered_json& row) {
  Record r;
  r.workload = row.at("workload").get<std::string>();
  r.variant = row.at("variant").get<std::string>();
  r.rounds = row.value("rounds", 0);
  r.iters_per_round = row.value("iters_per_round", int64_t{0});
  r.skipped = row.value("skipped", std::string());
  r.failed = row.value("failed", false);
  for (const auto& [key, value] : row.items()) {
    if (value.is_number()) {
      if (key != "rounds" && key != "iters_per_round") r.set(key, value.get<double>());
    } else if (value.is_null()) {
      r.set(key, std::numeric_limits<double>::quiet_NaN());
    }
  }
  if (row.contains("per_round")) {
    for (const auto& [key, xs] : row.at("per_round").items()) r.per_round.emplace_back(key, xs.get<std::vector<double>>());
  }
  return r;
}

}  // namespace

std::string find_peer_python(const Options& o, std::string& why) {
  std::vector<std::string> candidates;
  if (!o.python.empty()) {
    candidates.push_back(o.python);
  } else {
    if (const char* p = std::getenv("TCAP_PYTHON"); p && *p) candidates.emplace_back(p);
    candidates.push_back(python_beside_torch(TCAP_BENCH_TORCH_LIB_DIR));
    const char* cache = std::getenv("TCAP_CACHE_DIR");
    const char* home = std::getenv("HOME");
    if (cache && *cache) {
      candidates.push_back(std::string(cache) + "/venv/bin/python3");
    } else if (home && *home) {
      candidates.push_back(std::string(home) + "/.cache/tcap/venv/bin/python3");
    }
    candidates.emplace_back("/opt/torch/.venv/bin/python3");
  }
  const std::string want = version_core(TORCH_VERSION);
  std::string tried;
  std::vector<std::string> seen;
  for (const auto& py : candidates) {
    if (py.empty() || std::find(seen.begin(), seen.end(), py) != seen.end()) continue;
    seen.push_back(py);
    std::error_code ec;
    if (!fs::exists(py, ec)) {
      tried += (tried.empty() ? "" : "; ") + py + ": not found";
      continue;
    }
    const std::string v = output_of(shell_quote(py) + " -c 'import torch; print(torch.__version__)'");
    if (version_core(v) == want) return py;
    tried += (tried.empty() ? "" : "; ") + py + ": " + (v.empty() ? "cannot import torch" : "torch " + v);
  }
  why = "no python with torch " + want + " (LibTorch's version) found (" + tried +
        "); set TCAP_PYTHON or --python";
  return "";
}

std::vector<Record> run_peer(const Options& o, const std::vector<std::string>& workloads, std::ostream& log) {
  std::vector<std::string> variants;
  for (const char* v : kPeerVariants) {
    if (o.wants(v)) variants.emplace_back(v);
  }
  auto all_skipped = [&](const std::string& why) {
    std::vector<Record> rs;
    for (const auto& w : workloads) {
      for (const auto& v : variants) rs.push_back(skipped_record(w, v, why));
    }
    return rs;
  };
  auto join = [](const std::vector<std::string>& xs) {
    std::string s;
    for (const auto& x : xs) s += (s.empty() ? "" : ",") + x;
    return s;
  };

  const fs::path script = fs::path(TCAP_BENCH_SOURCE_DIR) / "inductor_bench.py";
  std::error_code ec;
  if (!fs::exists(script, ec)) return all_skipped("the peer script " + script.string() + " is not there");
  std::string why;
  const std::string python = find_peer_python(o, why);
  if (python.empty()) return all_skipped(why);

  const fs::path dir = fs::temp_directory_path() / ("tcap-bench-peer-" + std::to_string(getpid()));
  fs::create_directories(dir, ec);
  const fs::path out = dir / "rows.json";
  const fs::path err = dir / "log.txt";
  fs::remove(out, ec);
  std::ostringstream cmd;
  cmd << shell_quote(python) << " " << shell_quote(script.string()) << " --workloads " << join(workloads)
      << " --variants " << join(variants) << " --threads " << at::get_num_threads() << " --rounds " << o.repeats
      << " --round-ms " << o.round_ms << " --warmup-ms " << o.warmup_ms << (o.quick ? " --quick" : "")
      << " --out " << shell_quote(out.string());
  log << "torch.compile peer (runs first, alone; log: " << err.string() << "):\n  " << cmd.str() << "\n";
  log.flush();
  const int rc = std::system((cmd.str() + " > " + shell_quote(err.string()) + " 2>&1").c_str());
  if (rc != 0 || !fs::exists(out, ec)) {
    return all_skipped("inductor_bench.py failed (status " + std::to_string(rc) + "): " + last_line_of(err) +
                       " (log: " + err.string() + ")");
  }
  std::vector<Record> records;
  try {
    std::ifstream f(out);
    const auto rows = nlohmann::ordered_json::parse(f);
    for (const auto& row : rows) records.push_back(record_of(row));
  } catch (const std::exception& e) {
    return all_skipped(std::string("cannot read inductor_bench.py's rows: ") + e.what());
  }
  for (const auto& w : workloads) {  // every (workload, variant) asked for gets a row
    for (const auto& v : variants) {
      const bool there = std::any_of(records.begin(), records.end(),
                                     [&](const Record& r) { return r.workload == w && r.variant == v; });
      if (!there) records.push_back(skipped_record(w, v, "inductor_bench.py gave no row"));
    }
  }
  return records;
}

}  // namespace tcap::bench
