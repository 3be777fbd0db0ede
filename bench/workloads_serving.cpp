// serving_*: one model served from a pool of request threads, as C++ serves PyTorch models
// (Note [What a serving workload measures]).
//
// Note [What a serving workload measures]
// A model in inference (torch::InferenceMode, weights shared by every thread) is called by
// 1, 2 or 4 request threads at once, each with one intra-op thread (at::set_num_threads(1)
// in the thread: requests run side by side, not inside each other). One iteration releases
// every thread of a persistent pool to make kRequests calls each on its own input, and
// waits for the last one; `req_us` is that wall time divided by all the requests made, so
// requests per second = 1e6 / req_us (`req_per_s`). Workloads:
//   serving_mlp_b1, serving_mlp_b8      Linear(256, 512) ReLU Linear(512, 512) ReLU
//                                       Linear(512, 16), batch 1 and 8;
//   serving_block_b1, serving_block_b8  nn::TransformerEncoderLayer(128, 4 heads, ff 512,
//                                       dropout 0), 16 tokens, batch 1 and 8.
// Variants, one per (mode, threads): eager_<n>t (plain LibTorch), tcap_eager_<n>t and
// tcap_llvm_<n>t (tcap::compile(model) with backend "eager" / "llvm", compiled once at
// setup under InferenceMode and then only replayed: every timed call is checked to be a
// replay). Derived: `scaling` (req_per_s over the same mode's one-thread row) and
// `x_eager` (req_per_s over eager's at the same thread count). Setup checks each compiled
// model against eager on the workload's inputs (kTol). A machine with fewer cores than
// threads cannot scale past its cores: read `scaling` against the core count.
// torch.compile has no peer row here: Python threads serving one compiled module meet at
// the interpreter lock in the Python code around every call, which is another question.
#include "workloads.h"

#include <tcap/compile.h>

#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tcap::bench {

namespace {

namespace nn = torch::nn;

constexpr int kRequests = 16;       // calls per thread per iteration
constexpr int kThreadCounts[] = {1, 2, 4};
constexpr double kRtol = 1e-4, kAtol = 1e-5;  // a fused backend may sum in another order

// Threads that wait for work, run it, and report back: started once per variant, so an
// iteration times requests, not thread creation.
class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    // at::set_num_threads also sets a process-wide default, which the caller's later work
    // must not inherit: each thread sets its own count first, then the caller's is put back.
    const int caller = at::get_num_threads();
    for (int t = 0; t < n; ++t) threads_.emplace_back([this, t] { loop(t); });
    {
      std::unique_lock<std::mutex> l(m_);
      done_.wait(l, [&] { return started_ == n_; });
    }
    at::set_num_threads(caller);
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  // Runs work(thread) on every thread once; returns when all are done. The first error
  // of any thread is rethrown here.
  void run(const std::function<void(int)>& work) {
    {
      std::lock_guard<std::mutex> l(m_);
      work_ = &work;
      pending_ = n_;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> l(m_);
    done_.wait(l, [&] { return pending_ == 0; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop(int t) {
    at::set_num_threads(1);  // one intra-op thread per request thread
    c10::InferenceMode inference;
    {
      std::lock_guard<std::mutex> l(m_);
      if (++started_ == n_) done_.notify_one();
    }
    int seen = 0;
    for (;;) {
      const std::function<void(int)>* work = nullptr;
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
        work = work_;
      }
      std::exception_ptr error;
      try {
        (*work)(t);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> l(m_);
      if (error && !error_) error_ = error;
      if (--pending_ == 0) done_.notify_one();
    }
  }

  const int n_;
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable cv_, done_;
  const std::function<void(int)>* work_ = nullptr;
  int generation_ = 0, pending_ = 0, started_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

using Forward = std::function<at::Tensor(const at::Tensor&)>;

struct Model {
  std::shared_ptr<nn::Module> module;
  Forward forward;     // module's forward
  at::Tensor example;  // [batch, ...]
};

Model make_mlp(int64_t batch) {
  nn::Sequential m(nn::Linear(256, 512), nn::ReLU(), nn::Linear(512, 512), nn::ReLU(), nn::Linear(512, 16));
  m->eval();
  return Model{m.ptr(), [m](const at::Tensor& x) mutable { return m->forward(x); }, torch::randn({batch, 256})};
}

Model make_block(int64_t batch) {
  nn::TransformerEncoderLayer layer(nn::TransformerEncoderLayerOptions(128, 4).dim_feedforward(512).dropout(0.0));
  layer->eval();
  // [tokens, batch, d_model], LibTorch's layout for the layer.
  return Model{layer.ptr(), [layer](const at::Tensor& x) mutable { return layer->forward(x); }, torch::randn({16, batch, 128})};
}

bool close(const at::Tensor& got, const at::Tensor& want) {
  return got.sizes() == want.sizes() && at::allclose(got, want, kRtol, kAtol);
}

std::vector<Variant> make_serving(const Options& opts, Model (*make)(int64_t), int64_t batch, const std::string& name) {
  torch::manual_seed(0);
  const int quick_threads = opts.quick ? 2 : 4;
  auto model = std::make_shared<Model>(make(batch));
  // Each thread's inputs: its own tensors, made once.
  auto inputs = std::make_shared<std::vector<at::Tensor>>();
  for (int t = 0; t < 4; ++t) inputs->push_back(torch::randn_like(model->example));
  std::vector<at::Tensor> want;
  {
    c10::InferenceMode inference;
    for (const auto& x : *inputs) want.push_back(model->forward(x));
  }

  std::vector<Variant> variants;
  auto add = [&](const std::string& mode, const Forward& forward, std::function<int()> replays) {
    for (int n : kThreadCounts) {
      if (n > quick_threads) continue;
      const std::string vname = mode + "_" + std::to_string(n) + "t";
      if (!opts.wants(mode) && !opts.wants(vname)) continue;
      auto pool = std::make_shared<Pool>(n);
      // Every thread's answer checked once, through the pool, before timing.
      std::vector<at::Tensor> got(n);
      try {
        pool->run([&](int t) { got[t] = forward((*inputs)[t]); });
      } catch (const std::exception& e) {
        variants.push_back(Variant::skip(vname, std::string("a request failed: ") + e.what(), /*failed=*/true));
        continue;
      }
      bool ok = true;
      for (int t = 0; t < n; ++t) ok = ok && close(got[t], want[t]);
      if (!ok) {
        variants.push_back(Variant::skip(vname, "a threaded call differs from eager", /*failed=*/true));
        continue;
      }
      auto work = std::make_shared<std::function<void(int)>>([forward, inputs](int t) {
        for (int i = 0; i < kRequests; ++i) forward((*inputs)[t]);
      });
      variants.emplace_back(
          vname,
          [pool, work, replays, n](Sample& s) {
            const int before = replays ? replays() : 0;
            s.start();
            pool->run(*work);
            s.stop("req_us");
            if (replays && replays() != before + n * kRequests) {
              throw std::runtime_error("a timed request was not a compiled replay");
            }
          },
          n * kRequests);
    }
  };

  if (opts.wants("eager") || opts.wants("eager_1t") || opts.wants("eager_2t") || opts.wants("eager_4t")) {
    add("eager", model->forward, nullptr);
  }
  for (const std::string backend : {"eager", "llvm"}) {
    const std::string mode = "tcap_" + backend;
    bool wanted = opts.wants(mode);
    for (int n : kThreadCounts) wanted = wanted || opts.wants(mode + "_" + std::to_string(n) + "t");
    if (!wanted) continue;
    CompileOptions o;
    o.name = name + "/" + mode;
    o.backend = backend;
    std::shared_ptr<CompiledFunction> f;
    try {
      f = tcap::compile(
          model->module, [fwd = model->forward](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fwd(in.at(0))}; },
          o);
    } catch (const std::exception& e) {
      const std::string why = e.what();
      const bool missing = why.find("unknown backend") != std::string::npos;
      variants.push_back(Variant::skip(mode, why, /*failed=*/!missing));
      continue;
    }
    {
      c10::InferenceMode inference;
      const at::Tensor first = f->forward(model->example);  // captures and compiles
      const at::Tensor second = f->forward(model->example);
      if (f->stats().replays != 1 || !f->eager_reason().empty()) {
        variants.push_back(Variant::skip(mode, "the second call was not a compiled replay (" + f->eager_reason() + ")",
                                         /*failed=*/true));
        continue;
      }
    }
    add(mode, [f](const at::Tensor& x) { return f->forward(x); }, [f] { return f->stats().replays; });
  }
  return variants;
}

// req_per_s, scaling over the one-thread row of the same mode, x_eager at the same count.
void derive_serving(std::vector<Record>& records) {
  auto find = [&](const std::string& v) -> const Record* {
    for (const auto& r : records) {
      if (r.variant == v && r.skipped.empty()) return &r;
    }
    return nullptr;
  };
  for (auto& r : records) {
    if (auto us = r.get("req_us")) r.set("req_per_s", 1e6 / *us);
  }
  for (auto& r : records) {
    auto rps = r.get("req_per_s");
    if (!rps) continue;
    const std::string v = r.variant;
    const size_t cut = v.rfind('_');
    const std::string mode = v.substr(0, cut), threads = v.substr(cut + 1);
    if (const Record* one = find(mode + "_1t")) r.set("scaling", *rps / *one->get("req_per_s"));
    if (const Record* eager = find("eager_" + threads)) r.set("x_eager", *rps / *eager->get("req_per_s"));
  }
}

}  // namespace

void add_serving_workloads(Registry& registry) {
  struct Spec {
    const char* name;
    Model (*make)(int64_t);
    int64_t batch;
    const char* what;
  };
  const Spec specs[] = {
      {"serving_mlp_b1", make_mlp, 1, "MLP 256-512-512-16, batch 1"},
      {"serving_mlp_b8", make_mlp, 8, "MLP 256-512-512-16, batch 8"},
      {"serving_block_b1", make_block, 1, "nn::TransformerEncoderLayer(128, 4 heads, ff 512), 16 tokens, batch 1"},
      {"serving_block_b8", make_block, 8, "nn::TransformerEncoderLayer(128, 4 heads, ff 512), 16 tokens, batch 8"},
  };
  for (const Spec& s : specs) {
    const std::string name = s.name;
    registry.add(Workload{name,
                          std::string(s.what) +
                              ", inference, one model served by 1/2/4 request threads (one intra-op thread each); "
                              "µs per request over all threads",
                          [make = s.make, batch = s.batch, name](const Options& o) {
                            return make_serving(o, make, batch, name);
                          },
                          derive_serving});
  }
}

}  // namespace tcap::bench
