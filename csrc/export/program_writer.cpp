// The JSON of a PT2 program's arguments (program_writer.h).
#include "export/program_writer.h"

#include <algorithm>
#include <sstream>

namespace tcap::pt2 {
namespace {

using ir::ValueId;

bool is_sym_int_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::SymIntType) return true;
  if (auto l = t->cast<c10::ListType>()) return l->getElementType()->kind() == c10::TypeKind::SymIntType;
  if (auto o = t->cast<c10::OptionalType>()) return is_sym_int_type(o->getElementType());
  return false;
}

Json scalar_arg(const ir::Arg& a) {
  // A wrapped number: ATen promoted a C++ scalar; Python passes the number itself.
  if (c10::isIntegralType(static_cast<c10::ScalarType>(a.i2), /*includeBool=*/true)) {
    if (static_cast<c10::ScalarType>(a.i2) == c10::kBool) return Json{{"as_bool", a.i != 0}};
    return Json{{"as_int", a.i}};
  }
  return Json{{"as_float", a.d}};
}

}  // namespace

Json arg_json(Writer& w, const ir::Node& n, size_t i, const c10::Argument& schema_arg) {
  const ir::Arg& a = n.args[i];
  const std::string slot = "n" + std::to_string(n.id) + ".a" + std::to_string(i) + ".";
  auto tensor = [&](ValueId v) { return Json{{"as_tensor", {{"name", w.value_name(v)}}}}; };
  const bool sym_type = is_sym_int_type(schema_arg.real_type());
  auto int_or_sym = [&](const std::string& s, int64_t v, bool& symbolic) -> Json {
    auto it = w.sym.slots.find(s);
    if (it == w.sym.slots.end()) return Json{{"as_int", v}};
    TORCH_CHECK(sym_type, "tcap export: argument '", schema_arg.name(), "' of ", n.qualified_op(),
                " depends on a dynamic size but the op takes a static int there: export with that size static");
    symbolic = true;
    return w.sym_int_arg(it->second, v);
  };
  switch (a.kind) {
    case ir::ArgKind::None:
    case ir::ArgKind::UndefinedTensor: return Json{{"as_none", true}};
    case ir::ArgKind::Value: return tensor(a.values.at(0));
    case ir::ArgKind::ValueList: {
      Json l = Json::array();
      for (ValueId v : a.values) l.push_back(Json{{"name", w.value_name(v)}});
      return Json{{"as_tensors", std::move(l)}};
    }
    case ir::ArgKind::OptValueList: {
      Json l = Json::array();
      for (ValueId v : a.values) {
        l.push_back(v == ir::kNoValue ? Json{{"as_none", true}} : Json{{"as_tensor", {{"name", w.value_name(v)}}}});
      }
      return Json{{"as_optional_tensors", std::move(l)}};
    }
    case ir::ArgKind::Bool: return Json{{"as_bool", a.i != 0}};
    case ir::ArgKind::Int: {
      bool symbolic = false;
      Json v = int_or_sym(slot + "0", a.i, symbolic);
      return symbolic ? Json{{"as_sym_int", std::move(v)}} : v;
    }
    case ir::ArgKind::Double: return Json{{"as_float", a.d}};
    case ir::ArgKind::Complex: return Json{{"as_complex", {{"real", a.d}, {"imag", a.d_imag}}}};
    case ir::ArgKind::String: return Json{{"as_string", a.s}};
    case ir::ArgKind::IntList: {
      bool symbolic = false;
      Json l = Json::array();
      for (size_t j = 0; j < a.ints.size(); ++j) l.push_back(int_or_sym(slot + std::to_string(j), a.ints[j], symbolic));
      if (!symbolic) {
        Json plain = Json::array();
        for (int64_t v : a.ints) plain.push_back(v);
        return Json{{"as_ints", std::move(plain)}};
      }
      return Json{{"as_sym_ints", std::move(l)}};
    }
    case ir::ArgKind::DoubleList: return Json{{"as_floats", a.doubles}};
    case ir::ArgKind::BoolList: {
      Json l = Json::array();
      for (int64_t v : a.ints) l.push_back(v != 0);
      return Json{{"as_bools", std::move(l)}};
    }
    case ir::ArgKind::ScalarType: return Json{{"as_scalar_type", pt2::dtype_code(static_cast<c10::ScalarType>(a.i))}};
    case ir::ArgKind::Layout: return Json{{"as_layout", pt2::layout_code(static_cast<c10::Layout>(a.i))}};
    case ir::ArgKind::MemoryFormat:
      return Json{{"as_memory_format", pt2::memory_format_code(static_cast<c10::MemoryFormat>(a.i))}};
    case ir::ArgKind::Device: return Json{{"as_device", pt2::device_json(c10::Device(a.s))}};
    case ir::ArgKind::WrappedScalar: return scalar_arg(a);
    case ir::ArgKind::Opaque: break;
  }
  TORCH_CHECK(false, "tcap export: argument '", schema_arg.name(), "' of ", n.qualified_op(), " is a ", a.s,
              ", which a program cannot hold");
}

c10::OperatorHandle handle_of(const std::string& op, const std::string& overload) {
  auto h = c10::Dispatcher::singleton().findSchema({op, overload});
  TORCH_CHECK(h.has_value(), "tcap export: operator ", op, overload.empty() ? "" : ".", overload,
              " is not registered");
  return *h;
}

std::string target_of(const std::string& op, const std::string& overload) {
  const auto colon = op.find("::");
  TORCH_CHECK(colon != std::string::npos, "tcap export: operator name '", op, "' has no namespace");
  return "torch.ops." + op.substr(0, colon) + "." + op.substr(colon + 2) + "." +
         (overload.empty() ? std::string("default") : overload);
}

int written_arg(const c10::FunctionSchema& s) {
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    const auto* info = s.arguments()[i].alias_info();
    if (info && info->isWrite()) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace tcap::pt2
