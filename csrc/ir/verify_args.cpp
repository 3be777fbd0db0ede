// Note [Arguments against the schema]
// A graph that passes verify() must not crash the interpreter. The interpreter turns each
// Arg into the IValue its operator's boxed kernel unpacks; a kernel trusts the types its
// schema declares (an int where a ScalarType is declared is cast to the enum unchecked,
// and an out-of-range ScalarType indexes past c10's type table: a segfault, not an
// error). So verify() checks every argument of a call to an operator this LibTorch
// knows against that operator's schema:
//   - the Arg kind fits the declared type (table in arg_mismatch below); None only
//     where the type is optional; Opaque anywhere (the interpreter refuses it by name);
//   - ScalarType, Layout and MemoryFormat values lie inside their enum (ScalarType
//     excludes Undefined); a Device parses as a c10 device;
//   - a fixed-length bool list (`bool[3] output_mask`) has exactly that many entries;
//     int lists keep any length (`int[2] stride=[]` and one-entry lists are expanded
//     by the kernels, which check what they read);
//   - results: a Tensor return is a Value (or an undefined tensor, or None where
//     optional), a Tensor[] return a value list, any other return a host value; results
//     past the schema's returns are the new versions of mutated arguments (Value with
//     version_of), which the interpreter aliases to the version they replace.
// The schema is the one this LibTorch registers (the one the interpreter calls), not the
// string the graph carries. A call to an operator this LibTorch does not know, or one
// recorded with another number of arguments (another LibTorch version), is not checked
// here: the interpreter refuses it, naming the node, and the graph still loads, prints
// and diffs.
#include "ir/verify_args.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/jit_type.h>
#include <c10/core/Device.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <sstream>

namespace tcap::ir {
namespace {

bool is_one_of(ArgKind k, std::initializer_list<ArgKind> kinds) {
  for (ArgKind x : kinds) {
    if (k == x) return true;
  }
  return false;
}

bool has_holes(const Arg& a) {
  for (ValueId v : a.values) {
    if (v == kNoValue) return true;
  }
  return false;
}

// An enum argument, as its own kind or as a plain int: `raw` must be in [0, end).
std::string enum_mismatch(const Arg& a, ArgKind own, int64_t end, const char* what) {
  if (a.kind != own && a.kind != ArgKind::Int) return "";  // the caller reports the kind
  if (a.i < 0 || a.i >= end) {
    return "is " + std::to_string(a.i) + ", not a valid " + what + " (0 to " + std::to_string(end - 1) + ")";
  }
  return "";
}

std::string kind_mismatch(const Arg& a, const c10::TypePtr& declared) {
  return "is " + to_string(a.kind) + ", which cannot be passed as " + declared->str();
}

// A list argument with element type `elem`.
std::string list_mismatch(const Arg& a, const c10::TypePtr& declared, const c10::TypePtr& elem,
                          const std::optional<int32_t>& fixed) {
  // Capture records an empty generic list ([] for a SymInt[]) as an empty value list:
  // an empty list of any kind fits any list type (the interpreter types it by the schema).
  if (is_one_of(a.kind, {ArgKind::ValueList, ArgKind::OptValueList}) && a.values.empty()) return "";
  switch (elem->kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      // One int for an int[N] list is expanded by the interpreter, as the JIT does.
      if (is_one_of(a.kind, {ArgKind::IntList, ArgKind::Int})) return "";
      break;
    case c10::TypeKind::FloatType:
      if (a.kind == ArgKind::DoubleList) return "";
      break;
    case c10::TypeKind::BoolType:
      if (a.kind == ArgKind::BoolList) {
        if (fixed && a.ints.size() != static_cast<size_t>(*fixed)) {
          return "has " + std::to_string(a.ints.size()) + " entries, but bool[" + std::to_string(*fixed) +
                 "] needs " + std::to_string(*fixed);
        }
        return "";
      }
      break;
    case c10::TypeKind::TensorType:
      if (a.kind == ArgKind::ValueList || (a.kind == ArgKind::OptValueList && !has_holes(a))) return "";
      if (a.kind == ArgKind::OptValueList) return "has a None entry, but " + declared->str() + " holds tensors";
      break;
    case c10::TypeKind::OptionalType:
      if (elem->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType &&
          is_one_of(a.kind, {ArgKind::ValueList, ArgKind::OptValueList})) {
        return "";
      }
      break;
    default: break;
  }
  return kind_mismatch(a, declared);
}

// A result against the schema's return `r`.
std::string result_mismatch(const Arg& out, const c10::Argument& r) {
  c10::TypePtr t = r.real_type();
  const bool optional = t->kind() == c10::TypeKind::OptionalType;
  if (optional) t = t->castRaw<c10::OptionalType>()->getElementType();
  if (out.kind == ArgKind::None && optional) return "";
  if (t->kind() == c10::TypeKind::TensorType) {
    return is_one_of(out.kind, {ArgKind::Value, ArgKind::UndefinedTensor}) ? "" : kind_mismatch(out, r.real_type());
  }
  const auto* list = t->castRaw<c10::ListType>();
  if (list && list->getElementType()->kind() == c10::TypeKind::TensorType) {
    return is_one_of(out.kind, {ArgKind::ValueList, ArgKind::OptValueList}) ? "" : kind_mismatch(out, r.real_type());
  }
  return out.refers_to_values() ? kind_mismatch(out, r.real_type()) : "";
}

}  // namespace

const c10::FunctionSchema* find_schema(const Node& n) {
  const auto op = c10::Dispatcher::singleton().findSchema({n.op, n.overload});
  return op ? &op->schema() : nullptr;
}

std::string schema_string(const std::string& op, const std::string& overload) {
  const auto h = c10::Dispatcher::singleton().findSchema({op, overload});
  if (!h) return "";
  std::ostringstream os;
  os << h->schema();
  return os.str();
}

std::string known_schema_string(const std::string& op, const std::string& overload) {
  std::string s = schema_string(op, overload);
  TORCH_INTERNAL_ASSERT(!s.empty(), "tcap: this LibTorch has no operator ", op, ".", overload);
  return s;
}

std::string arg_mismatch(const Arg& a, const c10::Argument& s) {
  const c10::TypePtr& declared = s.real_type();
  c10::TypePtr t = declared;
  const bool optional = t->kind() == c10::TypeKind::OptionalType;
  if (optional) t = t->castRaw<c10::OptionalType>()->getElementType();
  if (a.kind == ArgKind::None) return optional ? "" : "is None, but " + declared->str() + " is not optional";
  if (a.kind == ArgKind::Opaque) return "";
  bool fits = false;
  switch (t->kind()) {
    case c10::TypeKind::TensorType:
      fits = is_one_of(a.kind, {ArgKind::Value, ArgKind::UndefinedTensor, ArgKind::WrappedScalar});
      break;
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType: fits = a.kind == ArgKind::Int; break;
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType: fits = a.kind == ArgKind::Double; break;
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType: fits = a.kind == ArgKind::Bool; break;
    case c10::TypeKind::NumberType:  // Scalar
      fits = is_one_of(a.kind, {ArgKind::Int, ArgKind::Double, ArgKind::Bool, ArgKind::Complex});
      break;
    case c10::TypeKind::ComplexType: fits = a.kind == ArgKind::Complex; break;
    case c10::TypeKind::StringType: fits = a.kind == ArgKind::String; break;
    case c10::TypeKind::ScalarTypeType:
      fits = is_one_of(a.kind, {ArgKind::ScalarType, ArgKind::Int});
      if (fits) return enum_mismatch(a, ArgKind::ScalarType, static_cast<int64_t>(c10::ScalarType::Undefined), "dtype");
      break;
    case c10::TypeKind::LayoutType:
      fits = is_one_of(a.kind, {ArgKind::Layout, ArgKind::Int});
      if (fits) return enum_mismatch(a, ArgKind::Layout, static_cast<int64_t>(c10::Layout::NumOptions), "layout");
      break;
    case c10::TypeKind::MemoryFormatType:
      fits = is_one_of(a.kind, {ArgKind::MemoryFormat, ArgKind::Int});
      if (fits) {
        return enum_mismatch(a, ArgKind::MemoryFormat, static_cast<int64_t>(c10::MemoryFormat::NumOptions),
                             "memory format");
      }
      break;
    case c10::TypeKind::DeviceObjType:
      fits = a.kind == ArgKind::Device;
      if (fits) {
        try {
          c10::Device device(a.s);
          (void)device;
        } catch (const c10::Error&) {
          return "is not a valid device";
        }
      }
      break;
    case c10::TypeKind::ListType:
      return list_mismatch(a, declared, t->castRaw<c10::ListType>()->getElementType(), s.N());
    default: break;  // Generator, Dimname, Stream, ...: only an opaque argument
  }
  return fits ? "" : kind_mismatch(a, declared);
}

// Note [Host scalars as graph inputs]: a value of a HostScalar input fits where a number
// (Scalar, float, int) or a Tensor goes.
static bool reads_host_scalar_where_a_number_goes(const Graph& g, const Arg& a, const c10::Argument& s) {
  if (a.kind != ArgKind::Value || a.values.empty() || !is_host_scalar(g, a.values[0])) return false;
  c10::TypePtr t = s.real_type();
  if (t->kind() == c10::TypeKind::OptionalType) t = t->castRaw<c10::OptionalType>()->getElementType();
  switch (t->kind()) {
    case c10::TypeKind::TensorType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
    case c10::TypeKind::NumberType:
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType: return true;
    default: return false;
  }
}

std::string call_mismatch(const Graph& g, const Node& n, const c10::FunctionSchema& schema) {
  const auto& params = schema.arguments();
  if (params.size() != n.args.size()) return "";  // another LibTorch's schema
  for (size_t i = 0; i < params.size(); ++i) {
    if (reads_host_scalar_where_a_number_goes(g, n.args[i], params[i])) continue;
    const std::string why = arg_mismatch(n.args[i], params[i]);
    if (!why.empty()) return "arg " + std::to_string(i) + " (" + params[i].name() + ") " + why;
  }
  const auto& returns = schema.returns();
  for (size_t r = 0; r < n.outputs.size(); ++r) {
    const Arg& out = n.outputs[r];
    std::string why;
    if (r < returns.size()) {
      why = result_mismatch(out, returns[r]);
    } else if (out.kind != ArgKind::Value || g.value(out.values[0]).version_of == kNoValue) {
      why = "is past the schema's " + std::to_string(returns.size()) +
            " results but is not the new version of a mutated argument (a value with version_of)";
    }
    if (!why.empty()) return "output " + std::to_string(r) + " " + why;
  }
  return "";
}

}  // namespace tcap::ir
