// CUDA-graph replay of compiled graphs: Note [CUDA graphs of compiled regions] in
// cuda_graphs.h.
#include "runtime/cuda_graphs.h"

#include "ir/op_facts.h"

#include "support/logging.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>

#if TCAP_HAVE_CUDA_GRAPHS
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tcap {

namespace {

std::atomic<int64_t> g_captures{0}, g_replays{0};

#if TCAP_HAVE_CUDA_GRAPHS
bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.device() == b.device() && a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         a.strides() == b.strides();
}

// t narrowed to one element along every dimension it broadcasts (stride 0): the elements
// at distinct addresses. A static input is a buffer of this shape expanded back to t's
// sizes, so that copying into it never writes one location twice (an expanded gradient,
// the ones of a sum's backward, cannot be the destination of copy_).
at::Tensor distinct_elements(const at::Tensor& t) {
  at::Tensor c = t;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) == 0 && t.size(d) > 1) c = c.narrow(d, 0, 1);
  }
  return c;
}

class GraphRunner {
 public:
  // passthrough[k]: the input position output k is (it is returned as is), or -1.
  // first_of[k]: the first output position holding the same graph value as output k (the
  // same tensor is returned there, as the executable itself would).
  GraphRunner(Executable inner, std::string what, std::vector<int> passthrough, std::vector<size_t> first_of)
      : inner_(std::move(inner)),
        what_(std::move(what)),
        passthrough_(std::move(passthrough)),
        first_of_(std::move(first_of)) {}

  std::vector<at::Tensor> operator()(std::vector<at::Tensor> in) {
    std::lock_guard<std::mutex> lock(mu_);  // static buffers: one call at a time
    if (disabled_ || calls_++ == 0) return inner_(std::move(in));  // the first call warms up
    if (!graph_) return capture(std::move(in));
    for (size_t i = 0; i < in.size() || i < static_in_.size(); ++i) {
      if (in.size() != static_in_.size() || !same_layout(in[i], static_in_[i])) {
        if (!logged_mismatch_) {
          logged_mismatch_ = true;
          TCAP_LOG(GraphBreaks, what_ << ": input " << i << " differs from the one its CUDA graph was captured with; "
                                      << "running without the graph");
        }
        return inner_(std::move(in));
      }
    }
    {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < in.size(); ++i) {
        if (in[i].defined()) static_base_[i].copy_(distinct_elements(in[i]));
      }
    }
    graph_->replay();
    g_replays.fetch_add(1);
    return outputs(in);
  }

 private:
  // Clones of the static outputs; an output that is an input is that input.
  std::vector<at::Tensor> outputs(const std::vector<at::Tensor>& in) const {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> out;
    out.reserve(static_out_.size());
    for (size_t k = 0; k < static_out_.size(); ++k) {
      const int j = k < passthrough_.size() ? passthrough_[k] : -1;
      const size_t first = k < first_of_.size() ? first_of_[k] : k;
      const at::Tensor& t = static_out_[k];
      if (first < k) {
        out.push_back(out[first]);
      } else if (j >= 0) {
        out.push_back(in.at(static_cast<size_t>(j)));
      } else {
        out.push_back(t.defined() ? t.clone(at::MemoryFormat::Preserve) : t);
      }
    }
    return out;
  }

  std::vector<at::Tensor> capture(std::vector<at::Tensor> in) {
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<c10::Device> device;
    for (const auto& t : in) {
      if (t.defined() && t.is_cuda()) device = t.device();
    }
    if (!device) return disable(std::move(in), "no input is on a CUDA device");
    c10::cuda::CUDAGuard device_guard(*device);
    {
      at::NoGradGuard no_grad;
      static_in_.clear();
      static_base_.clear();
      for (const auto& t : in) {
        if (!t.defined()) {
          static_in_.push_back(t);
          static_base_.push_back(t);
          continue;
        }
        const at::Tensor d = distinct_elements(t);
        if (at::has_internal_overlap(d) != at::MemOverlap::No) {
          return disable(std::move(in), "an input's elements overlap in memory (not a plain broadcast)");
        }
        at::Tensor base = at::empty_strided(d.sizes(), d.strides(), d.options()).copy_(d);
        static_in_.push_back(base.expand(t.sizes()));
        static_base_.push_back(std::move(base));
      }
    }
    // The static inputs are written on the current stream; the capture runs on a side stream.
    c10::cuda::getCurrentCUDAStream(device->index()).synchronize();
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    try {
      c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device->index()));
      // Random ops draw from the device's default generator (the refusal check leaves no
      // other): registered, its seed and offset are read at each replay and it advances by
      // the graph's whole draw, so every replay draws what eager would have drawn. This
      // LibTorch's capture_begin registers the default generator itself; registering it
      // here too keeps that true if a release stops doing so (registration is idempotent).
      graph->register_generator_state(at::cuda::detail::getDefaultCUDAGenerator(device->index()));
      graph->capture_begin();
      try {
        static_out_ = inner_(static_in_);
      } catch (...) {
        try {
          graph->capture_end();
        } catch (...) {  // the capture is invalid anyway; report the first error
        }
        throw;
      }
      graph->capture_end();
    } catch (const std::exception& e) {
      static_out_.clear();
      std::string msg = e.what();
      if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) msg = ce->what_without_backtrace();
      return disable(std::move(in), "its capture failed: " + msg.substr(0, msg.find('\n')));
    }
    graph_ = std::move(graph);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    TCAP_LOG(Perf, what_ << ": captured as a CUDA graph in " << ms << " ms");
    g_captures.fetch_add(1);
    graph_->replay();  // this call's results (capturing ran nothing)
    g_replays.fetch_add(1);
    return outputs(in);
  }

  std::vector<at::Tensor> disable(std::vector<at::Tensor> in, const std::string& why) {
    disabled_ = true;
    static_in_.clear();
    static_base_.clear();
    TCAP_LOG(GraphBreaks, what_ << ": runs without a CUDA graph: " << why);
    return inner_(std::move(in));
  }

  Executable inner_;
  std::string what_;
  std::vector<int> passthrough_;
  std::vector<size_t> first_of_;
  std::mutex mu_;
  int64_t calls_ = 0;
  bool disabled_ = false;
  bool logged_mismatch_ = false;
  // static_in_[i]: static_base_[i] (the input's distinct elements) expanded to its sizes.
  std::vector<at::Tensor> static_in_, static_base_, static_out_;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;  // declared last: destroyed before the static tensors
};
#endif

}  // namespace

bool cuda_graphs_built() { return TCAP_HAVE_CUDA_GRAPHS != 0; }

CudaGraphStats cuda_graph_stats() { return {g_captures.load(), g_replays.load()}; }

std::string cuda_graph_refusal(const ir::Graph& g) {
  std::optional<c10::Device> device;
  for (const auto& v : g.values()) {
    if (!v.meta.device.is_cuda()) return "value %" + std::to_string(v.id) + " is on " + v.meta.device.str();
    if (device && *device != v.meta.device) return "its tensors are on more than one CUDA device";
    device = v.meta.device;
  }
  if (!device) return "it has no tensors";
  for (const auto& n : g.nodes()) {
    if (n.kind == ir::NodeKind::CallHook) return "it calls a hook";
    if (n.kind != ir::NodeKind::Call) continue;
    for (const auto& a : n.outputs) {
      if (ir::is_host_value(a)) return n.qualified_op() + " reads a value on the host";
    }
    if (ir::sizes_from_values(g, n)) return "the sizes of the results of " + n.qualified_op() + " come from values";
    if (n.draws_random_numbers()) {
      for (const auto& a : n.args) {
        if (a.kind == ir::ArgKind::Opaque) return n.qualified_op() + " draws from an explicit generator";
      }
    }
  }
  if (!g.written_inputs().empty()) return "it writes into an input in place";
  for (ir::ValueId v : g.output_values()) {
    const ir::Value& root = g.value(g.alias_root(v));
    if (root.id != v && root.producer >= 0 && g.node(root.producer).kind == ir::NodeKind::Input) {
      return "output %" + std::to_string(v) + " is a view of an input";
    }
  }
  return "";
}

Executable with_cuda_graphs(Executable inner, const ir::Graph& g, const std::string& what) {
  std::string why = cuda_graph_refusal(g);
  if (why.empty() && !cuda_graphs_built()) why = "tcap was built without LibTorch's CUDA headers";
  if (!why.empty()) {
    TCAP_LOG(GraphBreaks, what << ": runs without a CUDA graph: " << why);
    return inner;
  }
#if TCAP_HAVE_CUDA_GRAPHS
  // Outputs that are inputs (a saved primal, a gradient passed through) are returned as
  // the caller's tensor, not as a copy of the static one.
  std::vector<int> passthrough;
  std::vector<size_t> first_of;
  const auto inputs = g.input_nodes();
  const auto outs = g.output_values();
  for (size_t k = 0; k < outs.size(); ++k) {
    int j = -1;
    const ir::Value& val = g.value(outs[k]);
    for (size_t i = 0; i < inputs.size() && val.producer >= 0; ++i) {
      if (inputs[i] == val.producer) j = static_cast<int>(i);
    }
    passthrough.push_back(j);
    first_of.push_back(static_cast<size_t>(std::find(outs.begin(), outs.end(), outs[k]) - outs.begin()));
  }
  auto runner = std::make_shared<GraphRunner>(std::move(inner), what, std::move(passthrough), std::move(first_of));
  return [runner](std::vector<at::Tensor> in) { return (*runner)(std::move(in)); };
#else
  return inner;
#endif
}

}  // namespace tcap
