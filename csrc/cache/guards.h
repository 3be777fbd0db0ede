// Guards of compiled entries (DESIGN.md D6, D11): what must hold for a call to be served
// by an entry captured earlier. One set of guard kinds for tcap::compile, compile_step and
// compiled autograd; each front door fills the ones that apply to it.
//
//   * global state (Note [Global state guards]): grad mode, the thread's dispatch keys
//     (inference mode, autocast per device, and every other mode key), autocast dtypes,
//     the settings of at::Context (deterministic algorithms and the rest), anomaly mode;
//   * tensors: per declared tensor (user inputs, module parameters and buffers, .grads,
//     optimizer state): defined, dtype, device, sizes (dynamic ones per class, Note
//     [Dynamic sizes]), strides, requires_grad, and optionally identity (the same
//     TensorImpl: module tensors);
//   * the modules given (Note [Module state guards]): tree, training flags, options;
//   * host scalars (optimizer options), by name;
//   * a structure key (compiled autograd: the autograd graph's shape) and plain sizes;
//   * which tensors share memory, and how (Note [Alias geometry guards]);
//   * held tensors: tensors the capture read that were not declared (Note [Held tensors]);
//   * host reads: values the function read on the host (item(), equal(), is_nonzero()),
//     re-computed from the call's tensors by a small guard graph and compared.
//
// check() returns a Miss: "" when every guard holds, else the first failure in words
// ("input 'x' changed shape: [4, 3] -> [8, 3]"), and whether only sizes changed (then the
// entry may be generalized over them).
#pragma once

#include "cache/context_settings.h"
#include "cache/dynamic_sizes.h"
#include "cache/module_state.h"

#include <tcap/graph.h>
#include <tcap/interpreter.h>

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/ArrayRef.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tcap::cache {

// Note [Global state guards]
// Thread and process state a graph's meaning depends on, all of it read on every call:
//   * grad mode (each recorded op carries its own; a graph captured with it off has no
//     backward);
//   * the thread's local dispatch key sets, whole: inference mode, autocast on each device
//     type (an excluded Autocast key is autocast off), functorch's and any other mode
//     key change which kernels run and which casts are recorded, so any difference
//     recaptures; the set is two words to compare;
//   * the autocast dtype of each device type whose autocast is on;
//   * every setting of at::Context (Note [Settings of at::Context]): deterministic
//     algorithms (composite ops decompose differently under them), the backends and
//     precisions kernels may pick, cuDNN's benchmark mode and the rest, read from the
//     list that a test compares with the pinned LibTorch's Context.h;
//   * anomaly mode (and its NaN check): the front doors run eagerly while it is on (the
//     engine's per-node checks are what a user turns it on for); kept here so that an
//     entry never serves a call made under another setting;
//   * the default dtype (torch::set_default_dtype): factory calls and type promotion of
//     Python-style scalars record it into the graph's dtypes.
// Note [One check, with or without words]
// Each guard is checked by one function, whether the caller needs to know why it failed
// (a miss, the recompile log) or only whether it held (every hit): the function compares,
// and on a difference returns why(wording), a callable that words the difference. A
// Why without a sink builds nothing and answers false; one with a sink stores the words
// first. A hit builds nothing, and a miss is worded by the comparison that found it, so
// the fast check and the worded one cannot drift apart.
class Why {
 public:
  explicit Why(std::string* words = nullptr) : words_(words) {}
  template <class Wording>
  bool operator()(Wording&& wording) const {
    if (words_) *words_ = wording();
    return false;
  }

 private:
  std::string* words_;
};

struct GlobalState {
  bool grad_mode = true;
  c10::ScalarType default_dtype = c10::kFloat;
  bool inference_mode = false;
  ContextValues context{};  // at::globalContext()'s settings (Note [Settings of at::Context])
  bool anomaly = false, anomaly_check_nan = false;
  uint64_t included_keys = 0, excluded_keys = 0;  // the thread's local dispatch key sets, raw
  // Per autocast device type that is on: (device type, dtype).
  c10::SmallVector<std::pair<c10::DeviceType, c10::ScalarType>, 2> autocast_dtypes;
  static GlobalState now();
  // Whether the calling thread's state is this one, read without building a GlobalState;
  // else `why` words what changed (Note [One check, with or without words]).
  bool check_now(const Why& why = Why()) const;
  bool autocast(c10::DeviceType t) const;
};

// What an entry remembers of one tensor.
struct TensorGuard {
  std::string name;
  bool defined = false;
  c10::ScalarType dtype = c10::kFloat;
  c10::Device device = c10::kCPU;
  std::vector<int64_t> sizes, strides;
  bool requires_grad = false;
  // An inference tensor (made under InferenceMode): eager refuses to save one for backward,
  // so an entry captured with grad mode on (outside InferenceMode) and normal tensors never
  // serves one (its capture runs eagerly and raises what eager raises), and the other way
  // round. Without grad mode nothing is saved: `check_inference` is off.
  bool inference = false;
  bool check_inference = true;
  const c10::TensorImpl* identity = nullptr;  // when set, the call must pass this very tensor
  static TensorGuard of(const at::Tensor& t, std::string name, bool guard_identity = false);
  // Whether t matches everything but sizes and strides; else `why` words what changed
  // (Note [One check, with or without words]).
  bool check_except_shape(const at::Tensor& t, const Why& why = Why()) const;
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
  const std::string& name(size_t k) const { return held_[k].meta.name; }
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
  bool empty() const { return what_.empty() && sizes_of_.empty(); }
  size_t size() const { return what_.size(); }  // values read on the host
  // Pre-check mode: runs the guard graph on the call's primals; "" if every value is as
  // recorded. Inline and no reads: "".
  std::string check(const std::vector<at::Tensor>& primals) const;
  const std::vector<std::string>& what() const { return what_; }
  // The ops whose results' sizes are guarded (Note [Sizes that come from values]).
  const std::vector<std::string>& sizes_of() const { return sizes_of_; }

 private:
  Mode mode_ = Mode::None;
  std::shared_ptr<Interpreter> graph_;
  std::vector<size_t> copied_;  // inputs graph_ writes without its schema saying so: run on copies
  std::vector<std::string> what_;
  std::vector<std::string> sizes_of_;
};

// Whether g reads any value on the host.
bool has_host_reads(const ir::Graph& g);

// One call as the guards see it.
struct CallView {
  c10::ArrayRef<at::Tensor> tensors;          // declared tensors, in guard order
  const ModuleView* modules = nullptr;        // the modules given (compile, compile_step)
  const std::vector<double>* scalars = nullptr;
  std::string_view structure;                 // compiled autograd's graph key
  const std::vector<int64_t>* sizes = nullptr;  // plain sizes (compiled autograd)
};

struct Miss {
  std::string reason;            // "" = the entry fits
  bool sizes_only = true;        // every failure was a changed size
  std::vector<size_t> changed;   // the flattened sizes that changed
  bool structure = false;        // the entry is for another structure (checked first)
  bool unchecked_sizes = false;  // a hit of a dynamic entry at class values not checked yet
  bool hit() const { return reason.empty(); }
};

// Note [Alias geometry guards]
// Which tensors of a call share memory, and exactly how. A graph records what it saw: one
// tensor passed twice (f(x, x)) is one value read twice; two views of one storage are
// two values whose writes may or may not reach each other. Three cases are three
// different guards, and a graph captured under one never serves another: the same
// tensor; views of one storage that overlap; views of one storage that do not. Each
// tensor that shares a storage with an earlier one records which (its alias class, as
// before), whether it is that very tensor, and where its data starts, in bytes, relative
// to the first tensor of its class. With sizes and strides guarded per tensor, equal
// offsets mean the same overlap. Tensors alone in their storage guard no offset (a
// view's position in a storage it does not share is nobody's business: a language model
// walking a long token tensor with narrow() passes a new offset every step).
struct AliasGeometry {
  static constexpr int64_t kSameTensor = INT64_MIN;
  std::vector<int> classes;        // per tensor: the first tensor sharing its storage
  std::vector<int64_t> relative;   // per tensor with classes[k] != k: kSameTensor or its byte offset from it
  static AliasGeometry of(c10::ArrayRef<at::Tensor> ts);
  // Whether ts alias exactly so; else `why` words how they differ (`name(k)` names tensor
  // k; Note [One check, with or without words]).
  bool check(c10::ArrayRef<at::Tensor> ts, const std::function<std::string(size_t)>& name, const Why& why) const;
};

struct Guards {
  bool check_global = true;
  GlobalState global;
  std::vector<TensorGuard> tensors;
  ModuleView modules;  // read with names; empty when the front door has no modules
  std::vector<double> scalars;
  std::vector<std::string> scalar_names;
  std::vector<bool> scalar_is_input;  // per scalar: an input of the graph, not a guard
  std::string structure;
  // Every size the entry was captured at, flattened: the dims of `tensors` in order, then
  // the plain sizes. Dynamic ones per `dyn`.
  std::vector<int64_t> sizes;
  std::vector<std::string> size_labels;  // plain sizes only (names for messages)
  DynamicSizes dyn;
  AliasGeometry aliases;  // of the primals (declared tensors, then held)
  HeldTensors held;
  HostReads host;

  // Note [The failing guard first]: kNone, kGlobalState, or the index of a tensor guard.
  static constexpr int kNone = -1;
  static constexpr int kGlobalState = -2;
  struct LastFailed {
    std::atomic<int> which{kNone};
    LastFailed() = default;
    LastFailed(const LastFailed& o) : which(o.which.load(std::memory_order_relaxed)) {}
    LastFailed& operator=(const LastFailed& o) {
      which.store(o.which.load(std::memory_order_relaxed), std::memory_order_relaxed);
      return *this;
    }
  };
  mutable LastFailed last_failed;

  // Fills global state, tensors and sizes from a call (before the capture runs).
  void capture_call(const CallView& call, const std::vector<std::string>& names,
                    const std::vector<bool>& guard_identity);
  // Checks everything but held tensors and host reads (they need the primals). With
  // `key` given, receives the specialization key of a dynamic entry.
  Miss check(const CallView& call, std::vector<int64_t>* key = nullptr) const;
  // Note [The failing guard first]
  // A miss on a guard that no change of sizes explains (the global state, or a tensor's
  // definedness, dtype, device or requires_grad) records which guard failed. A lookup that
  // already has the reason it reports for a recompile re-checks that guard alone, first,
  // for each later entry (fails_again): when it fails again the entry misses as the whole
  // check would (not on sizes alone, so no candidate to generalize from) and the rest is
  // not checked, as PyTorch's guard manager moves a failing guard to the front. A hint
  // shared by the entry's calls, read and written relaxed: a stale one costs one check.
  bool fails_again(const CallView& call) const;
  // After check() hit: alias classes and pre-checked host reads on the call's primals
  // (declared tensors then held ones, as returned by held.lock). "" if they hold;
  // `host_only` tells whether only a host value failed.
  std::string check_primals(const std::vector<at::Tensor>& primals, bool* host_only = nullptr) const;
  // Readable guards ("x: f32[s0, 3] contiguous cpu", "grad mode on", ...).
  std::vector<std::string> describe() const;
  // A dynamic entry's symbols and the relations guarded on them, for the recompile log:
  // "s0 = x.size(0) = y.size(0) (captured at 16); guarded: s0 >= 2, ..." ("" when static).
  std::string describe_dynamic() const;
};

// "[4, 3]": sizes or strides in guard messages.
std::string shape_str(c10::IntArrayRef s);

// Note [Host reads of a dynamic entry]: a value read on the host stays a guard beside the
// dynamic sizes when each replay checks it inline (its graph compares the value as it
// reads it, at whatever sizes it runs); the two captures must have read the same value
// (compared with the rest of the graphs), and every check capture reads it again. A
// pre-check guard graph is built at one size, so an entry that needs one stays static:
// returns why, or "".
std::string host_reads_keep_static(const Guards& a, const Guards& b);

// Alias classes: position of the first tensor sharing each tensor's storage.
std::vector<int> alias_classes(c10::ArrayRef<at::Tensor> ts);

}  // namespace tcap::cache
