// A mutation fuzzer for builds without libFuzzer (fuzz.h): runs every seed file, then
// `runs` mutants of them, deterministically for a given seed, and prints what became of
// the inputs. Seeds are files or folders of files; a mutant that loads as a graph joins
// the pool, so mutations stack up (there is no coverage feedback: see docs/reliability.md
// for the libFuzzer build, which has it).
//
//   tcap_fuzz_json [-runs=N] [-seed=S] [-max_len=BYTES] [-max_total_time=SECONDS] SEED...
//
// The flags are spelled as libFuzzer's, so one command line serves both builds; other
// -flags are ignored. A failing input (the target aborts, or the process crashes) is
// written to fuzz-crash-<pid>.json in the current folder before the process dies.
#include "fuzz/fuzz.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

// The input being run, for the crash handler.
const uint8_t* g_current = nullptr;
size_t g_current_size = 0;

extern "C" void on_crash(int sig) {
  char path[64];
  std::snprintf(path, sizeof path, "fuzz-crash-%d.json", static_cast<int>(::getpid()));
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0 && g_current != nullptr) {
    ssize_t ignored = ::write(fd, g_current, g_current_size);
    (void)ignored;
    ::close(fd);
    const char msg[] = "tcap fuzz: the failing input is in ";
    ignored = ::write(2, msg, sizeof msg - 1);
    ignored = ::write(2, path, std::strlen(path));
    ignored = ::write(2, "\n", 1);
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

bool flag(const std::string& arg, const char* name, long long& value) {
  const std::string prefix = std::string("-") + name + "=";
  const std::string dashed = "-" + prefix;
  for (const std::string& p : {prefix, dashed}) {
    if (arg.rfind(p, 0) == 0) {
      value = std::stoll(arg.substr(p.size()));
      return true;
    }
  }
  return false;
}

void read_seeds(const std::filesystem::path& p, size_t max_len, std::vector<std::string>& out) {
  if (std::filesystem::is_directory(p)) {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(p)) files.push_back(e.path());
    std::sort(files.begin(), files.end());  // a fixed order: runs are reproducible
    for (const auto& f : files) read_seeds(f, max_len, out);
    return;
  }
  if (!std::filesystem::is_regular_file(p)) return;
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  std::string text = os.str();
  if (text.size() > max_len) text.resize(max_len);
  out.push_back(std::move(text));
}

void run_one(const std::string& input) {
  g_current = reinterpret_cast<const uint8_t*>(input.data());
  g_current_size = input.size();
  LLVMFuzzerTestOneInput(g_current, g_current_size);
  g_current = nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  long long runs = 10000, seed = 1, max_len = 65536, max_seconds = 0;
  std::vector<std::string> seeds;
  for (int k = 1; k < argc; ++k) {
    const std::string arg = argv[k];
    if (flag(arg, "runs", runs) || flag(arg, "seed", seed) || flag(arg, "max_len", max_len) ||
        flag(arg, "max_total_time", max_seconds)) {
      continue;
    }
    if (arg.rfind("-", 0) == 0) continue;  // a libFuzzer flag this driver does not have
    read_seeds(arg, static_cast<size_t>(max_len), seeds);
  }
  if (seeds.empty()) {
    std::cerr << "tcap fuzz: no seed inputs (give files or folders)\n";
    return 2;
  }
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, on_crash);

  const auto start = std::chrono::steady_clock::now();
  for (const std::string& s : seeds) run_one(s);
  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  std::vector<std::string> pool = seeds;
  constexpr size_t kMaxPool = 2000;
  std::vector<uint8_t> buf;
  long long done = 0;
  for (; done < runs; ++done) {
    if (max_seconds > 0 && done % 256 == 0 &&
        std::chrono::steady_clock::now() - start > std::chrono::seconds(max_seconds)) {
      break;
    }
    const std::string& base = pool[rng() % pool.size()];
    buf.assign(base.begin(), base.end());
    size_t size = buf.size();
    buf.resize(static_cast<size_t>(max_len));
    for (unsigned m = 0, n = 1 + static_cast<unsigned>(rng() % 4); m < n; ++m) {
      size = tcap::fuzz::mutate(buf.data(), size, buf.size(), rng, nullptr);
    }
    const std::string input(reinterpret_cast<const char*>(buf.data()), size);
    const uint64_t loaded_before = tcap::fuzz::counters().loaded;
    run_one(input);
    if (tcap::fuzz::counters().loaded > loaded_before) {  // a graph: worth mutating further
      if (pool.size() < kMaxPool) {
        pool.push_back(input);
      } else {
        pool[seeds.size() + rng() % (kMaxPool - seeds.size())] = input;
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "tcap fuzz: " << seeds.size() << " seeds and " << done << " mutants in " << seconds << " s (seed "
            << seed << "); " << tcap::fuzz::summary() << std::endl;
  return 0;
}
