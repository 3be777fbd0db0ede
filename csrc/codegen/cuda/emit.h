// The cuda renderer's code emitter: one Renderer per kernel writes the translation unit
// (prelude, kernel IR comment, signature, body) following the launch plan (plan.h). The
// class is shared by the files that emit the body of each strategy: render.cpp (the
// common parts and Pointwise), render_row.cpp (BlockRow and ThreadRow) and
// render_column.cpp (Column). Internal to codegen/cuda/.
// Preconditions: kir::check_renderable(k). Postconditions of run(): the same kernel IR
// gives the same source, byte for byte (the kernel caches and the emulator's key on it).
#pragma once

#include "codegen/cuda/numbers.h"
#include "codegen/cuda/ops.h"
#include "codegen/cuda/plan.h"
#include "codegen/cuda/render.h"
#include "kir/kir.h"

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace tcap::codegen::cuda {

class Renderer {
 public:
  Renderer(const kir::Kernel& k, const RenderOptions& o);

  // Note [CUDA sizes at launch]: the kernel's structure and numbers (as planned here), and
  // which numbers the code reads from the `tcap_n` parameter (empty: every one built in).
  std::string structure() const { return launch_structure(k_, c_, elem_, plan_); }
  const std::vector<int64_t>& numbers() const { return nums_; }
  void read_at_launch(std::vector<bool> at, std::string structure);

  CudaSource run();

 private:
  // Names.
  static std::string v(int32_t id) { return value_name(id); }
  std::string buf(int32_t b) const { return "b" + std::to_string(b); }
  // The vector type of `V` elements of buffer b: "tcap_vec<float, 4>".
  std::string vec_type(int32_t b, int V) const {
    return "tcap_vec<" + std::string(mem_type(k_.buffers[static_cast<size_t>(b)].dtype)) + ", " + std::to_string(V) + ">";
  }
  // A 16-byte (or narrower) store of vector `value` at element address `at` of buffer b.
  std::string vector_store(int32_t b, int V, const std::string& at, const std::string& value) const {
    return "*reinterpret_cast<" + vec_type(b, V) + "*>(" + at + ") = " + value + ";\n";
  }

  int num_passes() const { return cuda::num_passes(k_, elem_, level_); }
  // Number `slot` in the source: its value, or the launch's (Note [CUDA sizes at launch]).
  bool reads(int32_t slot) const { return !at_.empty() && at_[static_cast<size_t>(slot)]; }
  std::string num(int32_t slot) const;
  // The slot of an access's offset: `a` is one of c_.loads or c_.stores.
  int32_t access_slot(const kir::Access& a) const;
  void params(std::ostringstream& os) const;
  // Emits `const T vN = ...;` for every value in `ids` (topological order), with Loads read
  // by `load(id)` (an expression in memory type).
  template <typename LoadFn>
  void emit_values(std::ostringstream& os, const std::vector<int32_t>& ids, const std::string& indent,
                   LoadFn load) const;
  // Values (element-level ones only when `element_only`) that `roots` need, topologically.
  std::vector<int32_t> needed(const std::vector<int32_t>& roots, bool element_only) const;
  // "OFF + c0 * s0 + ..." over coalesced dims [lo, hi) with coordinate names c<d>; `a` is
  // one of c_.loads or c_.stores (its numbers' slots are found from its position).
  std::string offset_expr(const kir::Access& a, int lo, int hi, bool with_offset) const;
  void coords(std::ostringstream& os, const std::string& linear, int lo, int hi, const std::string& indent) const;

  // Split kernels (Note [Split column reductions]): the scratch pointers; this unit's
  // split and its reduce points [r_begin, r_end) (the loop variable is `u`); counting the
  // split in semaphore `sem` (tcap_last: this block is the last); and the combination of
  // Reduce r's partial results at column `col` into `acc`, in split order.
  void emit_split_scratch(std::ostringstream& os) const;
  void emit_split_range(std::ostringstream& os) const;
  void emit_count_split(std::ostringstream& os, const std::string& sem) const;
  void emit_combine_partials(std::ostringstream& os, const std::string& indent, int32_t r, const std::string& acc,
                             const std::string& col) const;

  // The kernel body of each strategy: render.cpp (Pointwise), render_row.cpp (BlockRow and
  // ThreadRow), render_column.cpp (Column).
  void pointwise(std::ostringstream& os);
  void reduction(std::ostringstream& os);
  void column(std::ostringstream& os);

  const kir::Kernel& k_;
  RenderOptions o_;
  kir::Coalesced c_;
  std::vector<bool> elem_;
  std::vector<int> level_;
  LaunchPlan plan_;
  std::string idx_;  // "int" or "long long"
  NumberLayout nl_;
  std::vector<int64_t> nums_;   // this kernel's numbers (NumberLayout order)
  std::vector<bool> at_;        // the numbers read at launch (empty: none)
  std::string structure_;       // structure(), when at_ is not empty
};

template <typename LoadFn>
void Renderer::emit_values(std::ostringstream& os, const std::vector<int32_t>& ids, const std::string& indent,
                           LoadFn load) const {
  for (int32_t id : ids) {
    const kir::Instr& in = k_.instrs[static_cast<size_t>(id)];
    os << indent << "const " << reg_type(in.dtype) << " " << v(id) << " = ";
    if (in.op == kir::OpCode::Load) {
      os << from_memory(in.dtype, load(id));
    } else if (in.op == kir::OpCode::Const && nl_.constant[static_cast<size_t>(id)] >= 0 &&
               reads(nl_.constant[static_cast<size_t>(id)])) {
      // A constant read at launch: its double's bits (Note [CUDA sizes at launch]), rounded
      // to float as the literal would be.
      const std::string d = "__longlong_as_double(tcap_n.n[" + std::to_string(nl_.constant[static_cast<size_t>(id)]) + "])";
      os << (in.dtype == kir::DType::F64 ? d : "(float)" + d);
    } else {
      os << op_expr(k_, id);
    }
    os << ";\n";
  }
}

}  // namespace tcap::codegen::cuda
