// SVG pictures of graphs through Graphviz's `dot` program (found in PATH).
#include <tcap/graph.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace tcap::ir {
namespace {


std::string find_in_path(const std::string& exe) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string full = (dir.empty() ? "." : dir) + "/" + exe;
    if (::access(full.c_str(), X_OK) == 0) return full;
  }
  return "";
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A temporary file removed on scope exit.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& contents) {
    std::string templ = (std::filesystem::temp_directory_path() / "tcap-svg-XXXXXX").string();
    const int fd = ::mkstemp(templ.data());
    if (fd < 0) throw std::runtime_error("cannot create a temporary file in " + templ);
    path = templ;
    size_t done = 0;
    while (done < contents.size()) {
      const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(fd);
    if (done != contents.size()) throw std::runtime_error("cannot write temporary file " + path);
  }
  ~TempFile() {
    if (!path.empty()) std::remove(path.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
};

std::string render(const std::string& dot) {
  const std::string exe = find_in_path("dot");
  if (exe.empty()) throw std::runtime_error("Graphviz 'dot' not found in PATH (install graphviz)");
  TempFile in(dot), err("");
  const std::string cmd =
      shell_quote(exe) + " -Tsvg " + shell_quote(in.path) + " 2>" + shell_quote(err.path);
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + exe);
  std::string svg;
  char buf[1 << 14];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) svg.append(buf, n);
  const int status = ::pclose(pipe);
  if (status != 0) {
    std::ifstream f(err.path);
    std::string msg;
    std::getline(f, msg);
    throw std::runtime_error("Graphviz 'dot -Tsvg' failed" + (msg.empty() ? "" : ": " + msg));
  }
  return svg;
}

}  // namespace

std::string to_svg(const Graph& g) { return render(to_dot(g)); }

}  // namespace tcap::ir
