// Reporting a run of tcap-bench (harness.h): the table per workload and the JSON file.
#include "harness.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <ostream>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

namespace tcap::bench {

// --- reporting ----------------------------------------------------------------------------

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string format_number(double v) {
  char buf[64];
  if (std::isnan(v)) return "-";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else if (std::fabs(v) >= 1000) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.4g", v);
  }
  return buf;
}

// The floors are the same in every row: the table says them once, above it.
bool is_floor(const std::string& key) { return key == "floor_fwd_us" || key == "floor_bwd_us"; }

// Column names: every metric in first-seen order; a timed metric's p10/p90 fold into one
// "[p10, p90]" column right after it.
std::vector<std::string> columns_of(const std::vector<Record>& records) {
  std::vector<std::string> cols;
  for (const auto& r : records) {
    for (const auto& [key, value] : r.metrics) {
      if ((ends_with(key, "_p10") || ends_with(key, "_p90")) &&
          r.is_timed(key.substr(0, key.size() - 4))) {
        continue;
      }
      if (is_floor(key)) continue;
      if (std::find(cols.begin(), cols.end(), key) == cols.end()) cols.push_back(key);
    }
  }
  return cols;
}

}  // namespace

void print_table(std::ostream& out, const Workload& w, const std::vector<Record>& records,
                 const Options& o) {
  if (records.empty()) return;
  int rounds = 0;
  for (const auto& r : records) rounds = std::max(rounds, r.rounds);
  out << "\n== " << w.name << ": " << w.description << "\n   (" << rounds
      << " rounds; timed metrics: median [p10, p90] over rounds, µs)\n";
  for (const auto& r : records) {  // Note [Bandwidth floors]: the same in every row
    const auto fwd = r.get("floor_fwd_us");
    const auto bwd = r.get("floor_bwd_us");
    if (!fwd && !bwd) continue;
    auto say = [&](const char* what, std::optional<double> us, double bytes) {
      if (us) out << " " << what << " " << format_number(*us) << " µs (" << format_number(bytes / (1 << 20)) << " MiB)";
    };
    const FloorBytes floor = w.floor_bytes ? w.floor_bytes(o) : FloorBytes{};
    out << "   bandwidth floor (bytes a perfect implementation moves / triad bandwidth):";
    say("fwd", fwd, floor.fwd);
    say("bwd", bwd, floor.bwd);
    out << "\n";
    break;
  }

  const auto cols = columns_of(records);
  std::vector<bool> has_spread;  // per column: a timed metric in some record
  std::vector<std::string> header{"variant", "iters"};
  for (const auto& c : cols) {
    header.push_back(c);
    has_spread.push_back(std::any_of(records.begin(), records.end(),
                                     [&](const Record& r) { return r.is_timed(c); }));
    if (has_spread.back()) header.push_back("[p10, p90]");
  }
  std::vector<std::vector<std::string>> rows{header};
  std::vector<std::string> skipped;  // per row: the reason, printed after the variant
  skipped.emplace_back();
  for (const auto& r : records) {
    if (!r.skipped.empty()) {
      rows.push_back({r.variant});
      skipped.push_back((r.failed ? "FAILED, not timed: " : "skipped: ") + r.skipped);
      continue;
    }
    skipped.emplace_back();
    std::vector<std::string> row{r.variant, std::to_string(r.iters_per_round)};
    for (size_t i = 0; i < cols.size(); ++i) {
      const auto v = r.get(cols[i]);
      row.push_back(v ? format_number(*v) : "-");
      if (!has_spread[i]) continue;
      row.push_back(r.is_timed(cols[i]) ? "[" + format_number(*r.get(cols[i] + "_p10")) + ", " +
                                              format_number(*r.get(cols[i] + "_p90")) + "]"
                                        : "");
    }
    rows.push_back(row);
  }

  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (size_t k = 0; k < rows.size(); ++k) {
    const auto& row = rows[k];
    out << "  ";
    if (!skipped[k].empty()) {
      out << row[0] << std::string(width[0] - row[0].size(), ' ') << "  " << skipped[k] << "\n";
      continue;
    }
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string pad(width[i] - row[i].size(), ' ');
      // Text columns left-aligned, numbers right-aligned.
      out << (i == 0 ? row[i] + pad : pad + row[i]) << (i + 1 < row.size() ? "  " : "");
    }
    out << "\n";
  }
  out.flush();
}

void write_json(const std::string& path, const std::vector<Record>& records) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& r : records) {
    nlohmann::ordered_json o;
    o["workload"] = r.workload;
    o["variant"] = r.variant;
    o["rounds"] = r.rounds;
    o["iters_per_round"] = r.iters_per_round;
    if (!r.skipped.empty()) {
      o["skipped"] = r.skipped;
      o["failed"] = r.failed;
    }
    for (const auto& [key, value] : r.metrics) o[key] = value;  // NaN is written as null
    list.push_back(std::move(o));
  }
  std::ofstream f(path);
  if (!f) throw std::runtime_error("tcap-bench: cannot write " + path);
  f << list.dump(2) << "\n";
}

}  // namespace tcap::bench
