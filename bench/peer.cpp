// The torch.compile peer: runs bench/inductor_bench.py --serve with the Python of the same
// torch, round by round, and reads its rows back. See Note [The torch.compile peer] in harness.h.
#include "harness.h"

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

std::unique_ptr<Peer> Peer::start(const Options& o, std::ostream& log) {
  std::unique_ptr<Peer> peer(new Peer());
  for (const char* v : kPeerVariants) {
    if (o.wants(v)) peer->variants_.emplace_back(v);
  }
  auto failed = [&](std::string why) {
    peer->error_ = std::move(why);
    return std::move(peer);
  };
  const fs::path script = fs::path(TCAP_BENCH_SOURCE_DIR) / "inductor_bench.py";
  std::error_code ec;
  if (!fs::exists(script, ec)) return failed("the peer script " + script.string() + " is not there");
  std::string why;
  const std::string python = find_peer_python(o, why);
  if (python.empty()) return failed(why);
  std::string joined;
  for (const auto& v : peer->variants_) joined += (joined.empty() ? "" : ",") + v;
  std::vector<std::string> args{python,
                                script.string(),
                                "--serve",
                                "--variants",
                                joined,
                                "--threads",
                                std::to_string(at::get_num_threads()),
                                "--round-ms",
                                std::to_string(o.round_ms),
                                "--warmup-ms",
                                std::to_string(o.warmup_ms)};
  if (o.quick) args.emplace_back("--quick");
  if (o.device != "cpu") {
    args.emplace_back("--device");
    args.push_back(o.device);
  }

  const fs::path dir = fs::temp_directory_path() / ("tcap-bench-peer-" + std::to_string(getpid()));
  fs::create_directories(dir, ec);
  peer->log_path_ = (dir / "log.txt").string();
  std::string shown;
  for (const auto& a : args) shown += (shown.empty() ? "" : " ") + shell_quote(a);
  log << "torch.compile peer (its rounds interleaved with these; log: " << peer->log_path_ << "):\n  " << shown
      << "\n";
  log.flush();

  int to_child[2], from_child[2];
  if (pipe(to_child) != 0) return failed(std::string("pipe() failed: ") + std::strerror(errno));
  if (pipe(from_child) != 0) {
    const int err = errno;
    close(to_child[0]);
    close(to_child[1]);
    return failed(std::string("pipe() failed: ") + std::strerror(err));
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int log_fd = open(peer->log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t pid = fork();
  if (pid == 0) {  // the child: stdin, stdout are the pipes; stderr the log
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    if (log_fd >= 0) dup2(log_fd, 2);
    close(to_child[0]);
    close(to_child[1]);
    close(from_child[0]);
    close(from_child[1]);
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (log_fd >= 0) close(log_fd);
  close(to_child[0]);
  close(from_child[1]);
  if (pid < 0) {
    const int err = errno;
    close(to_child[1]);
    close(from_child[0]);
    return failed(std::string("fork() failed: ") + std::strerror(err));
  }
  // The peer must not inherit later pipes' ends; ours are closed on exec of anything else.
  fcntl(to_child[1], F_SETFD, FD_CLOEXEC);
  fcntl(from_child[0], F_SETFD, FD_CLOEXEC);
  peer->pid_ = pid;
  peer->to_ = fdopen(to_child[1], "w");
  peer->from_ = fdopen(from_child[0], "r");
  return peer;
}

Peer::~Peer() {
  if (to_) std::fclose(to_);  // end of input: the peer exits
  if (from_) std::fclose(from_);
  if (pid_ > 0) waitpid(pid_, nullptr, 0);
}

std::string Peer::request(const std::string& line) {
  if (!error_.empty() || !to_ || !from_) return "";
  // A dead peer must not kill this process with SIGPIPE.
  struct sigaction ignore{}, old{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &old);
  const bool sent = std::fputs((line + "\n").c_str(), to_) >= 0 && std::fflush(to_) == 0;
  sigaction(SIGPIPE, &old, nullptr);
  std::string reply;
  if (sent) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, from_)) {
      reply += buf;
      if (!reply.empty() && reply.back() == '\n') break;
    }
  }
  if (reply.empty() || reply.back() != '\n') {
    error_ = "inductor_bench.py stopped answering: " + last_line_of(log_path_) + " (log: " + log_path_ + ")";
    std::fclose(to_);
    std::fclose(from_);
    to_ = from_ = nullptr;
    return "";
  }
  return reply;
}

void Peer::setup(const std::string& workload) {
  workload_ = workload;
  if (!to_) return;  // failed before: error_ stays
  error_.clear();
  const std::string reply = request(nlohmann::json{{"op", "setup"}, {"workload", workload}}.dump());
  if (reply.empty()) return;
  try {
    const auto j = nlohmann::json::parse(reply);
    if (!j.value("ok", false)) error_ = j.value("error", std::string("the peer's setup failed"));
  } catch (const std::exception& e) {
    error_ = std::string("cannot read the peer's reply: ") + e.what();
  }
}

void Peer::round() {
  if (error_.empty()) request(R"({"op": "round"})");
}

std::vector<Record> Peer::finish() {
  std::vector<Record> records;
  auto skip_all = [&](const std::string& why) {
    std::vector<Record> rs;
    for (const auto& v : variants_) rs.push_back(skipped_record(workload_, v, why));
    return rs;
  };
  if (!error_.empty() && !to_) return skip_all(error_);
  const std::string reply = request(R"({"op": "finish"})");
  if (reply.empty()) return skip_all(error_);
  try {
    const auto j = nlohmann::ordered_json::parse(reply);
    for (const auto& row : j.at("rows")) records.push_back(record_of(row));
  } catch (const std::exception& e) {
    return skip_all(std::string("cannot read inductor_bench.py's rows: ") + e.what());
  }
  for (const auto& v : variants_) {  // every variant asked for gets a row
    const bool there =
        std::any_of(records.begin(), records.end(), [&](const Record& r) { return r.workload == workload_ && r.variant == v; });
    if (!there) records.push_back(skipped_record(workload_, v, error_.empty() ? "inductor_bench.py gave no row" : error_));
  }
  error_.clear();
  return records;
}

}  // namespace tcap::bench
