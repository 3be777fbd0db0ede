// tcap-demo: captures the seed workloads in C++, checks each graph by replaying it on
// fresh inputs against eager LibTorch, and writes JSON dumps and SVG pictures.
//
//   build/examples/tcap-demo [--out DIR]      (default DIR: tcap-out)
//
// Workloads (from ../shared/seeds): the 2-layer MLP of the Dynamo/AOTAutograd tutorial
// (Linear(10,5), ReLU, Linear(5,2), Softmax, MSE loss; forward and backward) and the
// AOT Autograd tutorial's cos(cos(a+b+c+d)) (forward and backward).
#include <tcap/tcap.h>

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>

namespace {

struct SeedMlp : torch::nn::Module {
  SeedMlp() {
    fc1 = register_module("fc1", torch::nn::Linear(10, 5));
    fc2 = register_module("fc2", torch::nn::Linear(5, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::softmax(fc2->forward(torch::relu(fc1->forward(x))), /*dim=*/1);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

struct Report {
  std::string name;
  size_t fw = 0, bw = 0, hooks = 0;
  double capture_ms = 0, worst_diff = 0;
};

// Counts the graph's phases into r, writes its dumps and prints it.
void publish(const tcap::ir::Graph& g, const std::filesystem::path& dir, const std::string& stem,
             const std::string& what, Report& r) {
  for (const auto& n : g.nodes()) {
    if (n.kind == tcap::ir::NodeKind::Call || n.kind == tcap::ir::NodeKind::CallHook) {
      (n.phase == tcap::ir::Phase::Forward ? r.fw : r.bw)++;
    }
  }
  r.hooks = g.hooks().size();
  tcap::ir::save_json(g, (dir / (stem + ".json")).string());
  std::ofstream(dir / (stem + ".txt")) << tcap::ir::to_string(g);
  try {
    std::ofstream(dir / (stem + ".svg")) << tcap::ir::to_svg(g);
  } catch (const std::exception& e) {
    std::cerr << "note: no SVG for " << stem << ": " << e.what() << "\n";
  }
  std::cout << "\n== " << r.name << ": " << what << " ==\n" << tcap::ir::to_string(g);
}

Report mlp(const std::filesystem::path& out) {
  Report r{"mlp (seed 000)"};
  torch::manual_seed(0);
  auto model = std::make_shared<SeedMlp>();
  auto x = torch::randn({1, 10});
  auto target = torch::randn({1, 2});
  tcap::ir::Graph g;
  {
    const auto t0 = std::chrono::steady_clock::now();
    tcap::CaptureGuard cap;
    cap.register_module(*model);
    cap.input(x, "x");
    cap.input(target, "target");
    auto loss = torch::mse_loss(model->forward(x), target);
    cap.output(loss, "loss");
    loss.backward();
    cap.stop();
    g = cap.graph();
    r.capture_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  publish(g, out, "mlp_step", "forward + MSE loss + backward", r);

  // Replay on fresh inputs and compare with eager (loss and every parameter gradient).
  auto x2 = torch::randn({1, 10}), t2 = torch::randn({1, 2});
  std::vector<at::Tensor> inputs;
  for (auto id : g.input_nodes()) {
    const auto& n = g.node(id);
    if (n.name == "x") inputs.push_back(x2);
    else if (n.name == "target") inputs.push_back(t2);
    else inputs.push_back(model->named_parameters()[n.name].detach().clone());
  }
  auto res = tcap::interpret(g, inputs);
  model->zero_grad();
  auto loss = torch::mse_loss(model->forward(x2), t2);
  loss.backward();
  const auto* out_node = g.output_node();
  r.worst_diff = max_diff(res[0], loss);
  for (size_t k = 1; k < res.size(); ++k) {
    r.worst_diff = std::max(r.worst_diff, max_diff(res[k], model->named_parameters()[out_node->output_names[k]].grad()));
  }
  return r;
}

Report coscos(const std::filesystem::path& out) {
  Report r{"cos(cos(a+b+c+d)) (seed 001)"};
  torch::manual_seed(1);
  std::vector<at::Tensor> abcd;
  for (int i = 0; i < 4; ++i) abcd.push_back(torch::randn({2, 4}, torch::requires_grad()));
  tcap::ir::Graph g;
  {
    const auto t0 = std::chrono::steady_clock::now();
    tcap::CaptureGuard cap;
    const char* names[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; ++i) cap.input(abcd[i], names[i]);
    auto y = (abcd[0] + abcd[1] + abcd[2] + abcd[3]).cos().cos();
    cap.output(y, "y");
    y.sum().backward();
    cap.stop();
    g = cap.graph();
    r.capture_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  publish(g, out, "coscos", "forward + backward", r);
  std::vector<at::Tensor> fresh;
  for (int i = 0; i < 4; ++i) fresh.push_back(torch::randn({2, 4}));
  auto res = tcap::interpret(g, fresh);
  std::vector<at::Tensor> eager;
  for (auto& t : fresh) eager.push_back(t.clone().requires_grad_());
  auto y = (eager[0] + eager[1] + eager[2] + eager[3]).cos().cos();
  y.sum().backward();
  r.worst_diff = max_diff(res[0], y);
  for (size_t k = 1; k < res.size(); ++k) r.worst_diff = std::max(r.worst_diff, max_diff(res[k], eager[k - 1].grad()));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path out = "tcap-out";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--help" || a == "-h") {
      std::cout << "usage: tcap-demo [--out DIR]\n";
      return 0;
    } else {
      std::cerr << "tcap-demo: unknown argument '" << a << "' (usage: tcap-demo [--out DIR])\n";
      return 2;
    }
  }
  std::filesystem::create_directories(out);
  std::cout << "tcap " << TCAP_VERSION_STRING << " on LibTorch " << TORCH_VERSION
            << ", recording on dispatch key " << tcap::capture_dispatch_key() << "\n";
  std::vector<Report> reports = {mlp(out), coscos(out)};
  std::cout << "\n" << std::left << std::setw(32) << "workload" << std::setw(8) << "fw ops" << std::setw(8)
            << "bw ops" << std::setw(8) << "hooks" << std::setw(13) << "capture ms"
            << "replay vs eager (max abs diff)\n";
  bool ok = true;
  for (const auto& r : reports) {
    std::cout << std::setw(32) << r.name << std::setw(8) << r.fw << std::setw(8) << r.bw << std::setw(8)
              << r.hooks << std::setw(13) << std::fixed << std::setprecision(2) << r.capture_ms
              << std::scientific << std::setprecision(2) << r.worst_diff << "\n";
    ok = ok && r.worst_diff < 1e-5;
  }
  std::cout << std::defaultfloat << "\nGraph dumps (JSON, readable text, SVG) written to "
            << std::filesystem::absolute(out).string() << "\n"
            << "Inspect them with: build/tools/tcap-inspect code|table|summary|svg "
            << (out / "mlp_step.json").string() << "\n"
            << "Compiled replay (tcap::compile) and fused kernels arrive with the compile and LLVM issues.\n";
  if (!ok) {
    std::cerr << "tcap-demo: a replay disagreed with eager\n";
    return 1;
  }
  return 0;
}
