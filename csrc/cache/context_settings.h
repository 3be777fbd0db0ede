// The settings of at::Context (at::globalContext()) a compiled entry is guarded on.
//
// Note [Settings of at::Context]
// at::Context holds the process's switches for how ATen computes: which backends a
// kernel may pick (cuDNN, oneDNN, NNPACK, the attention backends and their order, the
// preferred BLAS and linear-algebra libraries, the quantized engine), the precision it
// may trade for speed (TF32 and BF16 for float32 matmuls and convolutions, reduced
// precision reductions in cuBLAS and on the CPU, fp16 accumulation), determinism
// (deterministic algorithms, cuDNN's and oneDNN's, filling uninitialized memory), cuDNN's
// benchmark mode, and invariant checks of sparse tensors. A graph recorded under one
// setting may hold other ops (composites decompose differently under deterministic
// algorithms), and a kernel that tcap replays as an ATen call reads the setting when it
// runs, but a fused kernel does not. So every setting is part of the global state each
// call compares with the entry's: a change recaptures, and the log names the setting.
//
// The list is not a choice: it is every setter of at::Context in the pinned LibTorch, each
// either read here or named in `context_setters_not_guarded()` with the reason it cannot
// change a result (warnings, memory, the calling thread's floating-point mode that
// replays run under as eager does). A test (test/compile/context_settings_test.cpp) reads the
// pinned LibTorch's ATen/Context.h and fails when a setter is in neither list, so a
// LibTorch with a new switch fails there instead of replaying under the old one.
#pragma once

#include <c10/util/ArrayRef.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tcap::cache {

// One guarded setting: its name in messages ("cuDNN benchmark"), the at::Context setters
// that change it ("setBenchmarkCuDNN"; several, space-separated, for the float32
// precision table), how it is read, as one integer, and how that integer reads in a
// message.
struct ContextSetting {
  enum class Kind : uint8_t { Flag, Precision, Number };  // "on"/"off", "tf32", "3"
  const char* name;
  const char* setters;
  int64_t (*read)();
  Kind kind;
};

constexpr size_t kContextSettings = 39;
using ContextValues = std::array<int64_t, kContextSettings>;

c10::ArrayRef<ContextSetting> context_settings();
// Every guarded setting, read now.
ContextValues read_context();
// Whether the settings now are `v`, without building a ContextValues (every hit's check).
bool context_matches(const ContextValues& v);
// "" when equal, else what changed ("cuDNN benchmark changed: off -> on").
std::string context_mismatch(const ContextValues& was, const ContextValues& now);
// The readable guards: deterministic algorithms where on, and the count of the settings.
std::vector<std::string> describe_context(const ContextValues& v);
// The setters of at::Context that are not guarded, each with why it cannot change what a
// graph computes (for docs and the coverage test).
const std::vector<std::pair<std::string, std::string>>& context_setters_not_guarded();

}  // namespace tcap::cache
