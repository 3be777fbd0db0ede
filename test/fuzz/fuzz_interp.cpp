// Fuzz target: load, verify and interpret. An input the reader accepts is run by the
// interpreter on random tensors of its declared input shapes; the interpreter must run it
// or throw a c10::Error naming the node ("tcap interpreter: node %N (op): ..."). Anything
// else (a crash, another exception, an unnamed error) is a failure.
//
// The target bounds what a graph may cost: inputs of at most 2^14 elements (2^16 in
// all), CPU only, and a CPU allocator that refuses a block over 16 MiB or more than
// 256 MiB live, with the c10::OutOfMemoryError LibTorch raises when memory runs out. A
// graph can still ask an op for a huge tensor; that is a refused allocation here, not a
// crash.
#include "fuzz/fuzz.h"

#include <tcap/graph.h>
#include <tcap/graph_json.h>
#include <tcap/interpreter.h>

#include "interp/hook_runner.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <exception>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

namespace {

using namespace tcap::ir;

constexpr size_t kMaxBlock = size_t{16} << 20;
constexpr size_t kMaxLive = size_t{256} << 20;
constexpr int64_t kMaxInputElements = int64_t{1} << 14;
constexpr int64_t kMaxTotalElements = int64_t{1} << 16;

class CappedAllocator final : public c10::Allocator {
 public:
  explicit CappedAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) override {
    if (n > kMaxBlock || live_.load() + n > kMaxLive) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "fuzz harness: refused to allocate ", n, " bytes (",
                       live_.load(), " live)");
    }
    auto* block = new Block{base_->allocate(n), n, this};
    live_ += n;
    void* p = block->inner.get();
    const c10::Device device = block->inner.device();
    return c10::DataPtr(p, block, &CappedAllocator::release, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

 private:
  struct Block {
    c10::DataPtr inner;
    size_t bytes;
    CappedAllocator* owner;
  };
  static void release(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    block->owner->live_ -= block->bytes;
    delete block;
  }
  c10::Allocator* base_;
  std::atomic<size_t> live_{0};
};

void set_up_once() {
  static const bool done = [] {
    tcap::fuzz::set_up_once();
    static CappedAllocator capped(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&capped, /*priority=*/100);
    return true;
  }();
  (void)done;
}

bool can_make(c10::ScalarType t) {
  return at::isFloatingType(t) || at::isIntegralType(t, /*includeBool=*/true) || t == c10::kComplexFloat ||
         t == c10::kComplexDouble;
}

// Random tensors of the declared input dtypes and shapes, or nothing when the target
// will not make them (see the bounds above).
std::optional<std::vector<at::Tensor>> make_inputs(const Graph& g) {
  std::vector<at::Tensor> inputs;
  int64_t total = 0;
  for (NodeId id : g.input_nodes()) {
    const TensorMeta& m = g.value(g.node(id).outputs.at(0).values.at(0)).meta;
    if (m.device.type() != c10::DeviceType::CPU || !can_make(m.dtype)) return std::nullopt;
    const int64_t n = m.numel();  // fits in int64_t (verify() checks), so may be near its limit
    if (n > kMaxInputElements) return std::nullopt;
    total += n;
    if (total > kMaxTotalElements) return std::nullopt;
    const auto options = at::TensorOptions().dtype(m.dtype);
    const c10::IntArrayRef sizes(m.sizes);
    if (at::isFloatingType(m.dtype) || at::isComplexType(m.dtype)) {
      inputs.push_back(at::randn(sizes, options));
    } else if (m.dtype == c10::kBool) {
      inputs.push_back(at::randint(0, 2, sizes, at::TensorOptions().dtype(c10::kLong)).to(c10::kBool));
    } else {
      inputs.push_back(at::randint(0, 4, sizes, options));
    }
  }
  return inputs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  set_up_once();
  auto& c = tcap::fuzz::counters();
  ++c.inputs;
  const std::string text(reinterpret_cast<const char*>(data), size);
  Graph g;
  try {
    g = from_json_string(text);
  } catch (const GraphFormatError&) {
    ++c.rejected;
    return 0;
  } catch (const std::exception& e) {
    tcap::fuzz::fail(std::string("the reader threw ") + typeid(e).name() + ": " + e.what(), data, size);
  }
  ++c.loaded;
  at::manual_seed(0);
  std::optional<std::vector<at::Tensor>> inputs;
  try {
    inputs = make_inputs(g);
  } catch (const c10::Error&) {  // a dtype randn does not support
  }
  if (!inputs) {
    ++c.not_run;
    return 0;
  }
  // Hooks called by slot get their gradients back unchanged.
  const tcap::interp::HookRunner identity = [](int, const std::vector<at::Tensor>& in,
                                               const std::vector<at::Tensor>&) { return in; };
  tcap::interp::HookRunnerScope hooks(&identity);
  try {
    tcap::Interpreter(g).run(std::move(*inputs));
    ++c.run_ok;
  } catch (const c10::Error& e) {
    ++c.run_error;
    const std::string msg = e.what_without_backtrace();
    if (msg.rfind("tcap interpreter: node %", 0) != 0) {
      tcap::fuzz::fail("an interpreter error that names no node: " + msg, data, size);
    }
  } catch (const std::exception& e) {
    tcap::fuzz::fail(std::string("the interpreter threw ") + typeid(e).name() + ": " + e.what(), data, size);
  } catch (...) {
    tcap::fuzz::fail("the interpreter threw an exception that is not a std::exception", data, size);
  }
  return 0;
}
