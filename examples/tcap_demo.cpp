// tcap-demo: captures the seed workloads in C++, checks each graph by replaying it on
// fresh inputs against eager LibTorch, and writes JSON dumps and SVG pictures.
//
//   build/examples/tcap-demo [--out DIR]      (default DIR: tcap-out)
//
// Workloads (from ../shared/seeds): the 2-layer MLP of the Dynamo/AOTAutograd tutorial
// (Linear(10,5), ReLU, Linear(5,2), Softmax, MSE loss; forward and backward) and the
// AOT Autograd tutorial's cos(cos(a+b+c+d)) (forward and backward). Then the same two
// compiled with tcap::compile (joint graph, min-cut partition, replay through autograd),
// and the MLP's whole Adam training step with tcap::compile_step, timed against eager in
// the same run (alternating, medians) and checked against eager.
#include <tcap/tcap.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
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

// Median of per-iteration times (ms) of a and b, alternating a, b, a, b.
std::pair<double, double> race(const std::function<void()>& a, const std::function<void()>& b, int iters) {
  for (int i = 0; i < 3; ++i) {
    a();
    b();
  }
  std::vector<double> ta, tb;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    a();
    auto t1 = std::chrono::steady_clock::now();
    b();
    auto t2 = std::chrono::steady_clock::now();
    ta.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    tb.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

struct CompileReport {
  std::string name;
  double eager_ms = 0, compiled_ms = 0, worst_diff = 0;
  std::string detail;
};

// tcap::compile of coscos and of the MLP module; compile_step of the MLP's Adam step.
std::vector<CompileReport> compiled(const std::filesystem::path& out) {
  std::vector<CompileReport> reports;
  const auto dumps = (out / "compile").string();
  {
    CompileReport r;
    r.name = "coscos 512x1024 fwd+bwd";
    auto fn = [](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{torch::cos(torch::cos(in[0] + in[1] + in[2] + in[3]))};
    };
    tcap::CompileOptions o;
    o.name = "coscos";
    o.backend = "auto";  // fused LLVM kernels when tcap was built with LLVM
    o.dump_dir = dumps;
    auto f = tcap::compile(fn, o);
    std::vector<at::Tensor> in;
    for (int i = 0; i < 4; ++i) in.push_back(torch::randn({512, 1024}, torch::requires_grad()));
    auto run = [&](bool use_compiled) {
      auto y = use_compiled ? (*f)(in)[0] : fn(in)[0];
      y.sum().backward();
    };
    run(true);  // capture + compile
    std::tie(r.eager_ms, r.compiled_ms) = race([&] { run(false); }, [&] { run(true); }, 20);
    for (auto& t : in) t.mutable_grad().reset();
    (*f)(in)[0].sum().backward();
    auto g = in[0].grad().clone();
    in[0].mutable_grad().reset();
    fn(in)[0].sum().backward();
    r.worst_diff = max_diff(g, in[0].grad());
    const auto& p = f->entries().at(0).partition;
    r.detail = "min_cut saves " + std::to_string(p.saved.size()) + " tensor(s), " +
               std::to_string(p.saved_bytes >> 20) + " MiB";
    reports.push_back(r);
  }
  {
    CompileReport r;
    r.name = "seed MLP module, batch 256";
    torch::manual_seed(0);
    auto model = std::make_shared<SeedMlp>();
    tcap::CompileOptions o;
    o.name = "mlp";
    o.backend = "auto";
    o.dump_dir = dumps;
    auto f = tcap::compile(model, [model](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{model->forward(in[0])};
    }, o);
    auto x = torch::randn({256, 10});
    auto y = torch::softmax(torch::randn({256, 2}), 1);
    auto run = [&](bool use_compiled) {
      auto out = use_compiled ? f->forward(x) : model->forward(x);
      torch::mse_loss(out, y).backward();
    };
    run(true);
    std::tie(r.eager_ms, r.compiled_ms) = race([&] { run(false); }, [&] { run(true); }, 50);
    r.worst_diff = max_diff(f->forward(x), model->forward(x));
    r.detail = std::to_string(f->stats().replays) + " replays";
    reports.push_back(r);
  }
  {
    CompileReport r;
    r.name = "seed MLP whole Adam step";
    torch::manual_seed(0);
    auto model = std::make_shared<SeedMlp>(), twin = std::make_shared<SeedMlp>();
    {
      torch::NoGradGuard ng;
      auto a = model->named_parameters(), b = twin->named_parameters();
      for (const auto& item : a) b[item.key()].copy_(item.value());
    }
    torch::optim::Adam opt(model->parameters(), 1e-3), opt_twin(twin->parameters(), 1e-3);
    auto body = [](std::shared_ptr<SeedMlp>& m, torch::optim::Adam& o, const at::Tensor& x, const at::Tensor& y) {
      o.zero_grad();
      auto loss = torch::mse_loss(m->forward(x), y);
      loss.backward();
      o.step();
      return loss;
    };
    tcap::CompileOptions o;
    o.name = "mlp_adam";
    o.dump_dir = dumps;
    auto step = tcap::compile_step(model, opt, [&](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{body(model, opt, in[0], in[1])};
    }, o);
    auto x = torch::randn({256, 10});
    auto y = torch::softmax(torch::randn({256, 2}), 1);
    std::tie(r.compiled_ms, r.eager_ms) = race([&] { (*step)({x, y}); }, [&] { body(twin, opt_twin, x, y); }, 50);
    r.worst_diff = max_diff(model->fc1->weight, twin->fc1->weight);
    r.detail = step->eager_reason().empty() ? std::to_string(step->stats().replays) + " replays"
                                            : "eager: " + step->eager_reason();
    reports.push_back(r);
  }
  return reports;
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
  std::cout << "\nCompiled (tcap::compile with backend \"auto\" = fused LLVM kernels when built with LLVM; compile_step with\n"
            << "the eager backend), timed side by side in this run (kernels: <out>/compile/kernels/*.ll):\n"
            << std::setw(32) << "workload" << std::setw(12) << "eager ms" << std::setw(14) << "compiled ms"
            << std::setw(10) << "speedup" << std::setw(12) << "max diff" << "notes\n";
  for (const auto& r : compiled(out)) {
    std::cout << std::setw(32) << r.name << std::fixed << std::setprecision(3) << std::setw(12) << r.eager_ms
              << std::setw(14) << r.compiled_ms << std::setprecision(2) << std::setw(10)
              << r.eager_ms / r.compiled_ms << std::scientific << std::setw(12) << r.worst_diff << std::defaultfloat
              << r.detail << "\n";
    ok = ok && r.worst_diff < 1e-4;
  }
  std::cout << std::defaultfloat << "\nGraph dumps (JSON, readable text, SVG) written to "
            << std::filesystem::absolute(out).string() << "\n"
            << "Inspect them with: build/tools/tcap-inspect code|table|summary|svg "
            << (out / "mlp_step.json").string() << "\n"
            << "Joint / forward / backward graphs of the compiled functions: " << (out / "compile").string() << "\n"
            << "Fused kernels of the compiled functions (kernel IR, LLVM IR): " << (out / "compile" / "kernels").string()
            << "\n";
  if (!ok) {
    std::cerr << "tcap-demo: a replay disagreed with eager\n";
    return 1;
  }
  return 0;
}
