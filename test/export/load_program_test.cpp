// load_program: models written only in Python (test/export/zoo.py: an MLP, a small ResNet
// with BatchNorm frozen, a Transformer encoder, an embedding + LSTM tagger) exported with
// torch.export (batch dim dynamic), loaded in C++ and trained with tcap: the forward equals Python's, then
// five optimizer steps (Adam for the MLP, SGD with or without momentum for the others) give Python's losses and weights, and the
// weights C++ trained load back into the Python model. Tolerances: forward rtol 1e-5
// atol 1e-5 with the eager backend (the same ATen kernels), 1e-4/1e-5 with llvm (fused
// kernels round differently); losses and weights after five steps rtol 1e-4 atol 1e-5. Both
// IR levels load: the training IR torch.export.export gives, and the core ATen IR of
// run_decompositions() (NAME_core; BatchNorm's running statistics are then buffer-mutation
// outputs).
// Bad archives get a clear error each.
#include "export/export_support.h"
#include "support/backends.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickle.h>

namespace tcap::export_test {
namespace {

struct Trained {
  at::Tensor x, y, out, losses;
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  std::vector<std::string> buffer_names;
  std::vector<at::Tensor> buffers;
};

Trained python_side(const std::string& dir, const std::string& name) {
  const PythonResult r = run_python_script("zoo.py", "make '" + dir + "' " + name);
  EXPECT_EQ(r.status, 0) << r.output;
  std::ifstream f(dir + "/" + name + ".train.pt", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto t = torch::jit::pickle_load(bytes).toTupleRef().elements();
  Trained out{t[0].toTensor(), t[1].toTensor(), t[2].toTensor(), t[3].toTensor(), {}, {}};
  for (const auto& n : t[4].toListRef()) out.names.push_back(n.toStringRef());
  for (const auto& p : t[5].toListRef()) out.params.push_back(p.toTensor());
  for (const auto& n : t[6].toListRef()) out.buffer_names.push_back(n.toStringRef());
  for (const auto& b : t[7].toListRef()) out.buffers.push_back(b.toTensor());
  return out;
}

struct Case {
  std::string model;
  std::string backend;
};

class LoadProgram : public ::testing::TestWithParam<Case> {};

TEST_P(LoadProgram, ForwardAndTrainingMatchPython) {
  TCAP_SKIP_WITHOUT_TORCH_PYTHON();
  const auto& [model, backend] = GetParam();
  TCAP_SKIP_WITHOUT_BACKEND(backend);
  const std::string dir = scratch("");
  const Trained py = python_side(dir, model);
  auto m = load_program(dir + "/" + model + ".pt2");
  m->compile_options().backend = backend;
  const double fw_rtol = backend == "eager" ? 1e-5 : 1e-4;

  // Parameters under Python's names, in Python's order.
  std::vector<std::string> names;
  for (const auto& p : m->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, py.names);

  {
    torch::NoGradGuard no_grad;
    const auto y = m->forward({py.x}).at(0);
    EXPECT_TRUE(torch::allclose(y, py.out, fw_rtol, 1e-5)) << (y - py.out).abs().max().item<double>();
  }
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (model == "mlp") opt = std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(1e-2));
  else {
    opt = std::make_unique<torch::optim::SGD>(
        m->parameters(), torch::optim::SGDOptions(model == "tagger" ? 0.1 : 0.05).momentum(model == "tagger" ? 0 : 0.9));
  }
  for (int64_t step = 0; step < py.losses.size(0); ++step) {
    opt->zero_grad();
    const auto out = m->forward({py.x}).at(0);
    const auto loss = model.rfind("resnet", 0) == 0 ? torch::nn::functional::cross_entropy(out, py.y)
                                                    : torch::mse_loss(out, py.y);
    loss.backward();
    opt->step();
    EXPECT_NEAR(loss.item<double>(), py.losses[step].item<double>(), 1e-4 * std::abs(py.losses[step].item<double>()) + 1e-6)
        << "step " << step;
  }
  const auto params = m->named_parameters();
  for (size_t k = 0; k < py.names.size(); ++k) {
    const auto& p = params[py.names[k]];
    EXPECT_TRUE(torch::allclose(p, py.params[k], 1e-4, 1e-5))
        << py.names[k] << " differs by " << (p - py.params[k]).abs().max().item<double>();
  }
  // Buffers too: the running statistics BatchNorm updates in training mode.
  const auto buffers = m->named_buffers();
  for (size_t k = 0; k < py.buffer_names.size(); ++k) {
    ASSERT_TRUE(buffers.contains(py.buffer_names[k])) << py.buffer_names[k];
    const auto& b = buffers[py.buffer_names[k]];
    EXPECT_TRUE(torch::allclose(b.to(torch::kDouble), py.buffers[k].to(torch::kDouble), 1e-4, 1e-5))
        << py.buffer_names[k] << " differs by " << (b.to(torch::kDouble) - py.buffers[k].to(torch::kDouble)).abs().max().item<double>();
  }
  // Other batch sizes: the program's batch dim is dynamic.
  {
    torch::NoGradGuard no_grad;
    for (int64_t batch : {3, 9}) {
      auto x = torch::cat(std::vector<at::Tensor>(5, py.x)).narrow(0, 0, batch);
      EXPECT_EQ(m->forward({x}).at(0).size(0), batch);
    }
  }
  EXPECT_GT(m->stats().replays, 0) << "the forward ran compiled";
  EXPECT_EQ(m->stats().eager_calls, 0);

  // The weights C++ trained, back in Python's model.
  std::vector<c10::IValue> tensors;
  c10::List<std::string> saved_names;
  for (const auto& p : m->named_parameters()) {
    saved_names.push_back(p.key());
    tensors.emplace_back(p.value().detach());
  }
  const std::string weights = dir + "/" + model + ".cpp_weights.pt";
  const std::vector<char> bytes = torch::jit::pickle_save(
      c10::ivalue::Tuple::create({saved_names, c10::ivalue::Tuple::create(std::move(tensors))}));
  std::ofstream(weights, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const PythonResult r = run_python_script("zoo.py", "check '" + dir + "' " + model + " '" + weights + "'");
  EXPECT_EQ(r.status, 0) << r.output;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.model + "_" + info.param.backend; }

INSTANTIATE_TEST_SUITE_P(Export, LoadProgram,
                         ::testing::Values(Case{"mlp", "eager"}, Case{"mlp", "llvm"}, Case{"resnet", "eager"},
                                           Case{"resnet_train", "eager"}, Case{"resnet_train", "llvm"},
                                           Case{"resnet_train_core", "eager"}, Case{"encoder_core", "eager"},
                                           Case{"encoder", "eager"}, Case{"encoder", "llvm"}, Case{"tagger", "eager"}),
                         case_name);

// A program tcap exported is loaded back by tcap: the same answers.
TEST(LoadProgram, RoundTripsExportProgram) {
  auto m = torch::nn::Sequential(torch::nn::Linear(5, 7), torch::nn::Tanh(), torch::nn::Linear(7, 2));
  const std::string path = scratch("tcap_roundtrip.pt2");
  export_program(m, {torch::randn({3, 5})}, path);
  auto loaded = load_program(path);
  const auto x = torch::randn({3, 5});
  torch::NoGradGuard no_grad;
  m->eval();
  EXPECT_TRUE(torch::allclose(loaded->forward({x})[0], m->forward(x), 1e-6, 1e-6));
  EXPECT_EQ(loaded->named_parameters().size(), m->named_parameters().size());
  EXPECT_TRUE(loaded->named_parameters().contains("0.weight"));
  // torch::save / torch::load of the loaded module: its parameters under their names.
  const std::string saved = scratch("loaded_module.pt");
  {
    torch::NoGradGuard no_grad_fill;
    for (auto& p : loaded->parameters()) p.add_(1);
  }
  torch::save(std::static_pointer_cast<torch::nn::Module>(loaded), saved);
  auto again = load_program(path);
  auto again_base = std::static_pointer_cast<torch::nn::Module>(again);
  torch::load(again_base, saved);
  const auto a = loaded->named_parameters(), b = again->named_parameters();
  for (const auto& p : a) EXPECT_TRUE(torch::equal(p.value(), b[p.key()])) << p.key();
}

// Bad archives: each a c10::Error that names the problem.
TEST(LoadProgram, BadArchivesGetClearErrors) {
  auto expect_error = [](const std::string& path, const std::string& what) {
    try {
      load_program(path);
      ADD_FAILURE() << "loaded " << path << "; expected an error about " << what;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find(what), std::string::npos) << e.what_without_backtrace();
    }
  };
  expect_error(scratch("missing.pt2"), "not a PT2 archive");
  auto m = torch::nn::Sequential(torch::nn::Linear(4, 3));
  const std::string good = scratch("good.pt2");
  export_program(m, {torch::randn({2, 4})}, good);
  // Truncated: the zip's directory is at its end.
  {
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(scratch("truncated.pt2"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  expect_error(scratch("truncated.pt2"), "not a PT2 archive");
  // The archive rewritten with one record changed.
  auto rewrite = [&](const std::string& out, const std::string& record,
                     const std::function<std::string(const std::string&)>& change) {
    caffe2::serialize::PyTorchStreamReader r(good);
    caffe2::serialize::PyTorchStreamWriter w(out);
    w.setMinVersion(6);
    for (const auto& name : r.getAllRecords()) {
      if (name == ".data/version" || name == "byteorder" || name == ".data/serialization_id") continue;
      auto [data, size] = r.getRecord(name);
      std::string bytes(static_cast<const char*>(data.get()), size);
      if (name == record) bytes = change(bytes);
      w.writeRecord(name, bytes.data(), bytes.size());
    }
    w.writeEndOfFile();
  };
  auto replace = [](std::string s, const std::string& from, const std::string& to) {
    const auto at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? s : s.replace(at, from.size(), to);
  };
  rewrite(scratch("newer.pt2"), "models/model.json",
          [&](const std::string& s) { return replace(s, "\"major\":8", "\"major\":9"); });
  expect_error(scratch("newer.pt2"), "schema 9.");
  rewrite(scratch("unknown_op.pt2"), "models/model.json",
          [&](const std::string& s) { return replace(s, "torch.ops.aten.addmm.default", "torch.ops.aten.addmm_v2.default"); });
  expect_error(scratch("unknown_op.pt2"), "aten.addmm_v2.default is not registered");
  rewrite(scratch("custom_op.pt2"), "models/model.json",
          [&](const std::string& s) { return replace(s, "torch.ops.aten.addmm.default", "torch.ops.mylib.fused.default"); });
  expect_error(scratch("custom_op.pt2"), "a custom op");
  rewrite(scratch("hop.pt2"), "models/model.json",
          [&](const std::string& s) { return replace(s, "torch.ops.aten.addmm.default", "torch.ops.higher_order.cond"); });
  expect_error(scratch("hop.pt2"), "higher-order op torch.ops.higher_order.cond");
  rewrite(scratch("shape.pt2"), "data/weights/model_weights_config.json",
          [&](const std::string& s) { return replace(s, "{\"as_int\":3},{\"as_int\":4}", "{\"as_int\":2},{\"as_int\":4}"); });
  expect_error(scratch("shape.pt2"), "the graph reads it as");
  rewrite(scratch("not_json.pt2"), "models/model.json", [](const std::string& s) { return s.substr(0, s.size() / 2); });
  expect_error(scratch("not_json.pt2"), "is not JSON");
}

}  // namespace
}  // namespace tcap::export_test
