// Shared by the export round-trip tests: a scratch folder, tensors handed to the wheel's
// Python (test/export/pt2_check.py) through torch.save's format, and its verdict.
#pragma once

#include <tcap/export.h>

#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tcap::export_test {

// A file in this process's scratch folder, removed with the folder when the process ends.
inline std::string scratch(const std::string& name) {
  struct Folder {
    std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("tcap_export_" + std::to_string(::getpid()));
    Folder() { std::filesystem::create_directories(dir); }
    // With the C library: at exit, std::filesystem may resolve to the copy libtorch.so
    // exports, whose state is gone by then (a crash in remove_all was seen).
    ~Folder() {
      if (DIR* d = ::opendir(dir.c_str())) {
        while (const dirent* e = ::readdir(d)) {
          const std::string name = e->d_name;
          if (name != "." && name != "..") ::unlink((dir.string() + "/" + name).c_str());
        }
        ::closedir(d);
      }
      ::rmdir(dir.c_str());
    }
  };
  static Folder folder;
  return (folder.dir / name).string();
}

inline void save_tensors(const std::vector<at::Tensor>& ts, const std::string& path) {
  std::vector<c10::IValue> items;
  for (const auto& t : ts) items.emplace_back(t.detach().contiguous());
  const std::vector<char> bytes = torch::jit::pickle_save(c10::ivalue::Tuple::create(std::move(items)));
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<at::Tensor> load_tensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const c10::IValue v = torch::jit::pickle_load(bytes);
  std::vector<at::Tensor> out;
  for (const auto& e : v.toTupleRef().elements()) out.push_back(e.toTensor());
  return out;
}

struct PythonResult {
  int status = -1;
  std::string output;  // stdout and stderr
};

// Runs the wheel's Python (the interpreter of the virtualenv LibTorch came from) on
// test/export/<script> with `args`.
inline PythonResult run_python_script(const std::string& script, const std::string& args) {
  const std::string log = scratch("python.log");
  const std::string cmd = std::string("OMP_NUM_THREADS=1 '") + TCAP_TORCH_PYTHON + "' '" + TCAP_EXPORT_TEST_DIR +
                          "/" + script + "' " + args + " > '" + log + "' 2>&1";
  PythonResult r;
  r.status = std::system(cmd.c_str());
  std::ifstream f(log);
  std::stringstream s;
  s << f.rdbuf();
  r.output = s.str();
  return r;
}

inline PythonResult run_python(const std::string& args) { return run_python_script("pt2_check.py", args); }

inline bool have_python() { return std::filesystem::exists(TCAP_TORCH_PYTHON); }

#define TCAP_SKIP_WITHOUT_TORCH_PYTHON()                                                        \
  do {                                                                                          \
    if (!::tcap::export_test::have_python()) GTEST_SKIP() << "no Python at " TCAP_TORCH_PYTHON; \
  } while (0)

// Exported programs must run in PyTorch and give `expected` for `inputs`.
inline ::testing::AssertionResult python_runs(const std::string& pt2, const std::vector<at::Tensor>& inputs,
                                              const std::vector<at::Tensor>& expected, const std::string& extra = "") {
  const std::string in = pt2 + ".inputs.pt", ex = pt2 + ".expected.pt";
  save_tensors(inputs, in);
  save_tensors(expected, ex);
  const PythonResult r = run_python("run '" + pt2 + "' '" + in + "' '" + ex + "' " + extra);
  if (r.status == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "Python could not run " << pt2 << ":\n" << r.output;
}

}  // namespace tcap::export_test
