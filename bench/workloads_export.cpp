// Note [What the export workloads measure]
// export_cnn: a CNN written in C++ (conv 3->16, BatchNorm in eval, ReLU, conv 16->32, ReLU,
// global average pool, Linear 32->10; a batch of 32 images of 32x32), exported once to a
// PT2 archive in a temporary folder. Variants:
//   export            tcap::export_program of the model (µs per archive written: capture,
//                     lowering, writing the weights);
//   load_first_call   tcap::load_program of the archive and its first forward (the capture
//                     and compile of tcap::compile with the eager backend), per load;
//   cpp_eager         the C++ model's forward, eval mode, grad off: the baseline;
//   loaded_eager      the loaded program's forward through tcap (backend eager), steady;
//   loaded_llvm       the same with backend llvm (fused kernels);
//   nativert          LibTorch's own runner of the archive (torch::nativert::ModelRunnerHandle).
// Python's torch.export.load + eager on the same archive: bench/export_py_bench.py, on the
// archive `--keep-archives DIR` keeps.
// import_train_mlp: an MLP 256 -> 512 -> 512 -> 10 (GELU) exported from C++ and loaded back
// as an imported model would be; one SGD step on a batch of 64 (forward, MSE loss,
// backward, optimizer step). Variants: cpp_eager (the model written in C++, eager),
// cpp_tcap_llvm (tcap::compile of it, llvm), loaded_eager and loaded_llvm (the imported
// program's forward served by tcap::compile, eager and llvm backends).
#include "workloads.h"

#include <tcap/compile.h>
#include <tcap/export.h>

#include <torch/nativert/ModelRunnerHandle.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace tcap::bench {

namespace {

namespace nn = torch::nn;

struct CnnImpl : nn::Module {
  CnnImpl() {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1)));
    bn = register_module("bn", nn::BatchNorm2d(16));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(16, 32, 3).padding(1)));
    fc = register_module("fc", nn::Linear(32, 10));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = torch::relu(conv2(torch::relu(bn(conv1(x)))));
    return fc(h.mean({2, 3}));
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(Cnn);

// A file in the temporary folder, removed when the process ends (with the C library: at
// exit, std::filesystem may resolve to libtorch.so's copy, whose state is gone by then).
std::string temp_path(const std::string& name) {
  struct Files {
    std::vector<std::string> paths;
    ~Files() {
      for (const auto& p : paths) ::unlink(p.c_str());
    }
  };
  static Files files;
  const std::string p =
      (std::filesystem::temp_directory_path() / ("tcap_bench_" + std::to_string(::getpid()) + "_" + name)).string();
  files.paths.push_back(p);
  return p;
}

// The archive at `path` loaded, its forward to be compiled with `backend`.
std::shared_ptr<ExportedProgramModule> loaded(const std::string& path, const char* backend, const std::string& name) {
  auto m = load_program(path);
  m->compile_options().backend = backend;
  m->compile_options().name = name;
  return m;
}

void check_close(const at::Tensor& a, const at::Tensor& b, const char* what) {
  if (!torch::allclose(a, b, 1e-4, 1e-5)) {
    throw std::runtime_error(std::string(what) + " differs from the C++ model by " +
                             std::to_string((a - b).abs().max().item<double>()));
  }
}

std::vector<Variant> make_export_cnn(const Options& opts) {
  Cnn model;
  model->eval();
  const at::Tensor x = torch::randn({32, 3, 32, 32});
  const std::string path = opts.archive_dir.empty() ? temp_path("cnn.pt2") : opts.archive_dir + "/export_cnn.pt2";
  export_program(model, {x}, path);
  at::Tensor expected;
  {
    torch::NoGradGuard no_grad;
    expected = model->forward(x);
  }
  std::vector<Variant> v;
  if (opts.wants("export")) {
    v.emplace_back("export", [model, x](Sample& s) mutable {
      const std::string p = temp_path("cnn_timed.pt2");
      s.start();
      export_program(model, {x}, p);
      s.stop("us");
    });
  }
  if (opts.wants("load_first_call")) {
    v.emplace_back("load_first_call", [path, x](Sample& s) {
      torch::NoGradGuard no_grad;
      s.start();
      auto m = load_program(path);
      auto y = m->forward({x});
      s.stop("us");
    });
  }
  if (opts.wants("cpp_eager")) {
    v.emplace_back("cpp_eager", [model, x](Sample& s) mutable {
      torch::NoGradGuard no_grad;
      s.start();
      auto y = model->forward(x);
      s.stop("us");
    });
  }
  for (const char* backend : {"eager", "llvm"}) {
    const std::string name = std::string("loaded_") + backend;
    if (!opts.wants(name)) continue;
    auto m = loaded(path, backend, name);
    try {
      torch::NoGradGuard no_grad;
      for (int i = 0; i < 3; ++i) check_close(m->forward({x})[0], expected, name.c_str());
    } catch (const std::exception& e) {
      v.push_back(Variant::skip(name, e.what(), std::string(backend) != "llvm"));
      continue;
    }
    v.emplace_back(name, [m, x](Sample& s) {
      torch::NoGradGuard no_grad;
      s.start();
      auto y = m->forward({x});
      s.stop("us");
    });
  }
  if (opts.wants("nativert")) {
    auto runner = std::make_shared<torch::nativert::ModelRunnerHandle>(path, "model");
    const c10::IValue out = runner->run({x}, {});
    check_close(out.isTensor() ? out.toTensor() : out.toTupleRef().elements().at(0).toTensor(), expected, "nativert");
    v.emplace_back("nativert", [runner, x](Sample& s) {
      s.start();
      auto y = runner->run({x}, {});
      s.stop("us");
    });
  }
  return v;
}

nn::Sequential make_mlp() {
  return nn::Sequential(nn::Linear(256, 512), nn::GELU(), nn::Linear(512, 512), nn::GELU(), nn::Linear(512, 10));
}

std::vector<Variant> make_import_train(const Options& opts) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({64, 256}), y = torch::randn({64, 10});
  const std::string path = temp_path("mlp.pt2");
  export_program(make_mlp(), {x}, path);
  std::vector<Variant> v;
  auto step_variant = [&](const std::string& name, std::shared_ptr<nn::Module> owner,
                          std::function<at::Tensor(const at::Tensor&)> fwd) {
    auto opt = std::make_shared<torch::optim::SGD>(owner->parameters(), 1e-3);
    return Variant(name, [owner, opt, fwd, x, y](Sample& s) {
      s.start();
      opt->zero_grad();
      auto loss = torch::mse_loss(fwd(x), y);
      loss.backward();
      opt->step();
      s.stop("step_us");
    });
  };
  if (opts.wants("cpp_eager")) {
    auto m = make_mlp();
    v.push_back(step_variant("cpp_eager", m.ptr(), [m](const at::Tensor& in) mutable { return m->forward(in); }));
  }
  if (opts.wants("cpp_tcap_llvm")) {
    auto m = make_mlp();
    CompileOptions o;
    o.backend = "llvm";
    o.name = "cpp_tcap_llvm";
    auto f = compile(m, o);
    v.push_back(step_variant("cpp_tcap_llvm", m.ptr(), [f](const at::Tensor& in) { return (*f)({in})[0]; }));
  }
  for (const char* backend : {"eager", "llvm"}) {
    const std::string name = std::string("loaded_") + backend;
    if (!opts.wants(name)) continue;
    auto m = loaded(path, backend, name);
    v.push_back(step_variant(name, m, [raw = m.get()](const at::Tensor& in) { return raw->forward({in})[0]; }));
  }
  return v;
}

}  // namespace

void add_export_workloads(Registry& registry) {
  registry.add(Workload{"export_cnn",
                        "a C++ CNN exported to a PT2 archive: export, load + first call, and the steady forward "
                        "of the C++ model, the loaded program through tcap and nativert; µs per call",
                        make_export_cnn, nullptr});
  registry.add(Workload{"import_train_mlp",
                        "SGD steps of an MLP 256-512-512-10 written in C++ against the same model exported and "
                        "loaded back (an imported model) under tcap; µs per step",
                        make_import_train, nullptr});
}

}  // namespace tcap::bench
