// Guards of compiled entries (DESIGN.md D6, D11): what must hold for a call to be served
// by an entry captured earlier. One set of guard kinds for tcap::compile, compile_step and
// compiled autograd; each front door fills the ones that apply to it.
//
//   * global state: grad mode, inference mode, autocast (CPU and CUDA, with dtypes);
//   * tensors: per declared tensor (user inputs, module parameters and buffers, .grads,
//     optimizer state): defined, dtype, device, sizes (dynamic ones per class, Note
//     [Dynamic sizes]), strides, requires_grad, and optionally identity (the same
//     TensorImpl: module tensors);
//   * flags (submodules' training flags) and host scalars (optimizer options), by name;
//   * a structure key (compiled autograd: the autograd graph's shape) and plain sizes;
//   * which tensors share memory (alias classes);
//   * held tensors: tensors the capture read that were not declared (Note [Held tensors]);
//   * host reads: values the function read on the host (item(), equal(), is_nonzero()),
//     re-computed from the call's tensors by a small guard graph and compared.
//
// check() returns a Miss: "" when every guard holds, else the first failure in words
// ("input 'x' changed shape: [4, 3] -> [8, 3]"), and whether only sizes changed (then the
// entry may be generalized over them).
#pragma once

#include "cache/dynamic_sizes.h"

#include <tcap/graph.h>
#include <tcap/interpreter.h>

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/ArrayRef.h>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tcap::cache {

// Thread state a graph's meaning depends on.
struct GlobalState {
  bool grad_mode = true;
  bool inference_mode = false;
  bool autocast_cpu = false, autocast_cuda = false;
  c10::ScalarType autocast_cpu_dtype = c10::kBFloat16, autocast_cuda_dtype = c10::kHalf;
  static GlobalState now();
  // "" if `now` matches, else what changed.
  std::string mismatch(const GlobalState& now) const;
};

// What an entry remembers of one tensor.
struct TensorGuard {
  std::string name;
  bool defined = false;
  c10::ScalarType dtype = c10::kFloat;
  c10::Device device = c10::kCPU;
  std::vector<int64_t> sizes, strides;
  bool requires_grad = false;
  const c10::TensorImpl* identity = nullptr;  // when set, the call must pass this very tensor
  static TensorGuard of(const at::Tensor& t, std::string name, bool guard_identity = false);
  // "" if t matches everything but sizes and strides; else what changed.
  std::string mismatch_except_shape(const at::Tensor& t) const;
  std::string str(const DynamicSizes* dyn = nullptr, size_t first_size = 0) const;
};

// Note [Held tensors]
// A compiled function may read tensors it was not given: a lambda's captures (by value or
// by reference), globals, module members that are not registered parameters or buffers.
// The capture records them as inputs of the graph, and an entry holds them so that each
// replay passes them again, so their current contents are read by every replay (an
// in-place change is seen; a SavedVariable-style version check still refuses a change
// between a forward and its backward). What a replay must never do is use a tensor the
// program has replaced: `scale = torch::rand(...)` rebinds the program's variable, and
// eager would read the new tensor. tcap cannot see the lambda's variables, so it watches
// the old tensor instead: the entry holds it weakly, and counts the references tcap itself
// keeps (the saved state of compiled regions awaiting their backward). If the tensor is
// gone, or only tcap still refers to it, the program has let go of it: the guard fails and
// the call recaptures, reading whatever the program now refers to. Its metadata is guarded
// too. What this cannot see: a program that replaces the tensor but keeps the old one
// alive elsewhere (in a container, in an autograd graph it has not run backward through
// yet); docs/limitations.md says so.
class HeldTensors {
 public:
  // A handle on the references tcap keeps to one held tensor (see add_own_refs).
  using OwnRefs = std::shared_ptr<std::atomic<int>>;

  void hold(const std::vector<at::Tensor>& tensors, const std::vector<std::string>& names);
  size_t size() const { return held_.size(); }
  // Appends the held tensors to `out` when every one is alive, still referred to by the
  // program and of the same metadata; else returns why not (nothing appended).
  std::string lock(std::vector<at::Tensor>& out) const;
  // The counter of references tcap keeps to held tensor k.
  const OwnRefs& own_refs(size_t k) const { return held_[k].own; }
  const c10::TensorImpl* impl(size_t k) const { return held_[k].impl; }
  std::vector<std::string> describe() const;

 private:
  struct Held {
    c10::weak_intrusive_ptr<c10::TensorImpl> weak{c10::intrusive_ptr<c10::TensorImpl>()};
    const c10::TensorImpl* impl = nullptr;
    TensorGuard meta;
    OwnRefs own = std::make_shared<std::atomic<int>>(0);
  };
  std::vector<Held> held_;
};

// References tcap itself keeps to held tensors for a while (a compiled region's saved
// state): counted while alive, so that HeldTensors can tell the program's references
// from tcap's. Movable, not copyable.
class OwnRefsLease {
 public:
  OwnRefsLease() = default;
  // Counts, for each held tensor, how many of `tensors` are it.
  OwnRefsLease(const HeldTensors& held, c10::ArrayRef<at::Tensor> tensors);
  OwnRefsLease(OwnRefsLease&& o) noexcept : counts_(std::move(o.counts_)) {}
  OwnRefsLease& operator=(OwnRefsLease&& o) noexcept;
  ~OwnRefsLease() { release(); }
  void release();

 private:
  std::vector<std::pair<HeldTensors::OwnRefs, int>> counts_;
};

// The values a function read on the host (item(), equal(), is_nonzero()): guards on the
// values recorded. Checked one of two ways:
//   * inline: the compiled graph itself compares each value as it reads it and stops at
//     the first that changed (Interpreter::check_host_values, HostValueChanged), which is
//     free (the replay computes the value anyway) and safe when no read comes after a
//     write into the graph's inputs (passes::host_reads_precede_input_writes);
//   * pre-check: before the replay, a guard graph of the reads' ancestors recomputes them
//     from the call's inputs (passes::host_read_graph), when they cannot be inline.
class HostReads {
 public:
  enum class Mode { None, Inline, PreCheck };
  // Inline checks of the reads of g (the graph whose executable checks them).
  void set_inline(const ir::Graph& g);
  // A pre-check guard graph for the reads of g; throws c10::Error naming the op when a
  // read depends on an in-place write or a random op.
  void build_precheck(const ir::Graph& g);
  Mode mode() const { return mode_; }
  bool empty() const { return what_.empty(); }
  size_t size() const { return what_.size(); }
  // Pre-check mode: runs the guard graph on the call's primals; "" if every value is as
  // recorded. Inline and no reads: "".
  std::string check(const std::vector<at::Tensor>& primals) const;
  const std::vector<std::string>& what() const { return what_; }

 private:
  Mode mode_ = Mode::None;
  std::shared_ptr<Interpreter> graph_;
  std::vector<ir::Arg> expected_;
  std::vector<std::string> what_;
};

// Whether g reads any value on the host.
bool has_host_reads(const ir::Graph& g);

// One call as the guards see it.
struct CallView {
  c10::ArrayRef<at::Tensor> tensors;          // declared tensors, in guard order
  const std::vector<bool>* flags = nullptr;   // e.g. submodules' training flags
  const std::vector<double>* scalars = nullptr;
  std::string_view structure;                 // compiled autograd's graph key
  const std::vector<int64_t>* sizes = nullptr;  // plain sizes (compiled autograd)
};

struct Miss {
  std::string reason;            // "" = the entry fits
  bool sizes_only = true;        // every failure was a changed size
  std::vector<size_t> changed;   // the flattened sizes that changed
  bool structure = false;        // the entry is for another structure (checked first)
  bool hit() const { return reason.empty(); }
};

struct Guards {
  bool check_global = true;
  GlobalState global;
  std::vector<TensorGuard> tensors;
  std::vector<bool> flags;
  std::vector<std::string> flag_names;
  std::vector<double> scalars;
  std::vector<std::string> scalar_names;
  std::vector<bool> scalar_is_input;  // per scalar: an input of the graph, not a guard
  std::string structure;
  // Every size the entry was captured at, flattened: the dims of `tensors` in order, then
  // the plain sizes. Dynamic ones per `dyn`.
  std::vector<int64_t> sizes;
  std::vector<std::string> size_labels;  // plain sizes only (names for messages)
  DynamicSizes dyn;
  std::vector<int> aliases;  // alias classes of the primals (declared tensors, then held)
  HeldTensors held;
  HostReads host;

  // Fills global state, tensors and sizes from a call (before the capture runs).
  void capture_call(const CallView& call, const std::vector<std::string>& names,
                    const std::vector<bool>& guard_identity);
  // Checks everything but held tensors and host reads (they need the primals). With
  // `key` given, receives the specialization key of a dynamic entry.
  Miss check(const CallView& call, std::vector<int64_t>* key = nullptr) const;
  // After check() hit: alias classes and pre-checked host reads on the call's primals
  // (declared tensors then held ones, as returned by held.lock). "" if they hold;
  // `host_only` tells whether only a host value failed.
  std::string check_primals(const std::vector<at::Tensor>& primals, bool* host_only = nullptr) const;
  // Readable guards ("x: f32[s0, 3] contiguous cpu", "grad mode on", ...).
  std::vector<std::string> describe() const;
};

// Alias classes: position of the first tensor sharing each tensor's storage.
std::vector<int> alias_classes(c10::ArrayRef<at::Tensor> ts);

}  // namespace tcap::cache
