// How a dispatched call's IValues become graph arguments: what the recorder keeps of an
// operator's schema (OpInfo::from), the compact raw form arguments are recorded in while a
// call runs (Session::convert_raw, convert_full) and the ir::Arg each becomes when the
// graph is read (Session::materialize, Note [Deferred call nodes] in session.cpp).
#include "capture/session.h"

#include "capture/recorder.h"
#include "ir/op_facts.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <sstream>

namespace tcap::capture {
namespace {

OpInfo::IntHint hint_of(const c10::Argument& a) {
  c10::TypePtr t = a.real_type();
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  switch (t->kind()) {
    case c10::TypeKind::ScalarTypeType: return OpInfo::IntHint::ScalarType;
    case c10::TypeKind::LayoutType: return OpInfo::IntHint::Layout;
    case c10::TypeKind::MemoryFormatType: return OpInfo::IntHint::MemoryFormat;
    default: return OpInfo::IntHint::Int;
  }
}

// A Tensor(a)[] return (split, unbind) carries its alias set on the element type.
const c10::AliasInfo* element_alias(const c10::AliasInfo* a) {
  if (a && a->beforeSets().empty() && !a->containedTypes().empty()) return &a->containedTypes()[0];
  return a;
}

bool same_alias_set(const c10::AliasInfo* a, const c10::AliasInfo* b) {
  a = element_alias(a);
  b = element_alias(b);
  return a && b && !a->beforeSets().empty() && a->beforeSets() == b->beforeSets();
}

}  // namespace

OpInfo OpInfo::from(const c10::OperatorHandle& op) {
  OpInfo info;
  const c10::FunctionSchema& s = op.schema();
  info.op = s.name();
  info.overload = s.overload_name();
  info.qualified = info.overload.empty() ? info.op : info.op + "." + info.overload;
  std::ostringstream os;
  os << s;
  info.schema = os.str();
  info.num_arguments = s.arguments().size();
  info.num_returns = s.returns().size();
  info.composite_implicit = op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  for (const auto& a : s.arguments()) {
    info.int_hint.push_back(hint_of(a));
    info.arg_name.push_back(a.name());
    info.arg_is_write.push_back(a.alias_info() && a.alias_info()->isWrite());
  }
  for (const auto& r : s.returns()) {
    int alias = -1;
    for (size_t i = 0; i < s.arguments().size(); ++i) {
      if (same_alias_set(r.alias_info(), s.arguments()[i].alias_info())) {
        alias = static_cast<int>(i);
        break;
      }
    }
    info.return_alias_arg.push_back(alias);
    const c10::AliasInfo* ra = element_alias(r.alias_info());
    info.return_is_write.push_back(ra && ra->isWrite());
    if (r.type()->kind() == c10::TypeKind::TensorType || r.type()->isSubtypeOf(*c10::ListType::ofTensors())) {
      info.returns_tensors = true;
    }
  }
  info.dynamic_output_shape = ir::has_dynamic_output_shape_tag(info.op, info.overload);
  info.rerunnable = !s.is_mutable() && !op.hasTag(at::Tag::nondeterministic_seeded);
  return info;
}

void Session::convert_full(ir::Arg& a, const c10::IValue& iv) {
  if (iv.isSymInt()) {
    auto si = iv.toSymInt();
    if (auto c = si.maybe_as_int()) {
      a.kind = ir::ArgKind::Int;
      a.i = *c;
    } else {
      a.kind = ir::ArgKind::Opaque;
      a.s = "SymInt";
    }
  } else if (iv.isComplexDouble()) {
    a.kind = ir::ArgKind::Complex;
    auto c = iv.toComplexDouble();
    a.d = c.real();
    a.d_imag = c.imag();
  } else if (iv.isString()) {
    a.kind = ir::ArgKind::String;
    a.s = iv.toStringRef();
  } else if (iv.isDevice()) {
    a.kind = ir::ArgKind::Device;
    a.s = iv.toDevice().str();
  } else if (iv.isDoubleList()) {
    a.kind = ir::ArgKind::DoubleList;
    a.doubles = iv.toDoubleVector();
  } else if (iv.isBoolList()) {
    a.kind = ir::ArgKind::BoolList;
    for (bool b : iv.toBoolList()) a.ints.push_back(b);
  } else if (iv.isList()) {
    // SymInt[] (concrete in eager) and Tensor?[] arrive as generic lists.
    const auto elems = iv.toListRef();
    bool all_ints = true, all_tensors = true;
    for (const auto& e : elems) {
      all_ints = all_ints && (e.isInt() || (e.isSymInt() && e.toSymInt().maybe_as_int()));
      all_tensors = all_tensors && (e.isNone() || e.isTensor());
    }
    if (all_ints && !elems.empty()) {
      a.kind = ir::ArgKind::IntList;
      for (const auto& e : elems) a.ints.push_back(e.isInt() ? e.toInt() : *e.toSymInt().maybe_as_int());
    } else if (all_tensors) {
      a.kind = ir::ArgKind::OptValueList;
      for (const auto& e : elems) {
        a.values.push_back(e.isTensor() && e.toTensor().defined() ? value_for(e.toTensor())
                                                                  : ir::kNoValue);
      }
    } else {
      a.kind = ir::ArgKind::Opaque;
      a.s = iv.tagKind();
    }
  } else {
    a.kind = ir::ArgKind::Opaque;
    a.s = iv.tagKind();
  }
}

void Session::convert_raw(const c10::IValue& iv, OpInfo::IntHint hint, ir::ValueId* first_value) {
  RawArg& a = raw_args_.emplace_back();
  if (iv.isNone()) return;
  if (iv.isTensor()) {
    const at::Tensor& t = iv.toTensor();
    if (!t.defined()) {
      a.kind = ir::ArgKind::UndefinedTensor;
    } else if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      a.kind = ir::ArgKind::WrappedScalar;
      a.n = static_cast<int32_t>(t.scalar_type());
      // A CPU scalar; read it with the recording key off so item() is not itself recorded.
      c10::impl::ExcludeDispatchKeyGuard no_record(recording_key());
      const c10::Scalar sc = t.item();
      if (c10::isIntegralType(t.scalar_type(), /*includeBool=*/true)) {
        a.i = sc.toLong();
      } else {
        a.d = sc.toDouble();
      }
    } else {
      // value_for may add an Input node and value, never a raw arg: `a` stays valid.
      a.kind = ir::ArgKind::Value;
      a.i = value_for(t);
      if (first_value) *first_value = static_cast<ir::ValueId>(a.i);
    }
    return;
  }
  if (iv.isTensorList()) {
    a.kind = ir::ArgKind::ValueList;
    a.form = RawArg::Form::Values;
    a.i = static_cast<int64_t>(raw_values_.size());
    for (const at::Tensor& t : iv.toTensorList()) raw_values_.push_back(value_for(t));
    a.n = static_cast<int32_t>(raw_values_.size() - static_cast<size_t>(a.i));
    if (first_value && a.n > 0) *first_value = raw_values_[static_cast<size_t>(a.i)];
    return;
  }
  if (iv.isBool()) {
    a.kind = ir::ArgKind::Bool;
    a.i = iv.toBool();
    return;
  }
  if (iv.isInt()) {
    a.i = iv.toInt();
    switch (hint) {
      case OpInfo::IntHint::ScalarType: a.kind = ir::ArgKind::ScalarType; break;
      case OpInfo::IntHint::Layout: a.kind = ir::ArgKind::Layout; break;
      case OpInfo::IntHint::MemoryFormat: a.kind = ir::ArgKind::MemoryFormat; break;
      default: a.kind = ir::ArgKind::Int;
    }
    return;
  }
  if (iv.isDouble()) {
    a.kind = ir::ArgKind::Double;
    a.d = iv.toDouble();
    return;
  }
  if (iv.isIntList()) {
    a.kind = ir::ArgKind::IntList;
    a.form = RawArg::Form::Ints;
    a.i = static_cast<int64_t>(raw_ints_.size());
    for (int64_t x : iv.toIntList()) raw_ints_.push_back(x);
    a.n = static_cast<int32_t>(raw_ints_.size() - static_cast<size_t>(a.i));
    return;
  }
  // Everything else (SymInts, lists of SymInts or optional tensors, strings, devices,
  // complex numbers, opaque objects) is rarer: it takes the full form.
  ir::Arg& full = raw_full_.emplace_back();
  convert_full(full, iv);
  a.kind = full.kind;
  a.form = RawArg::Form::Full;
  a.i = static_cast<int64_t>(raw_full_.size() - 1);
}

void Session::materialize(const RawArg& raw, ir::Arg& a) const {
  if (raw.form == RawArg::Form::Full) {
    a = raw_full_[static_cast<size_t>(raw.i)];
    return;
  }
  a.kind = raw.kind;
  switch (raw.form) {
    case RawArg::Form::Values:
      a.values.assign(raw_values_.begin() + raw.i, raw_values_.begin() + raw.i + raw.n);
      break;
    case RawArg::Form::Ints:
      a.ints.assign(raw_ints_.begin() + raw.i, raw_ints_.begin() + raw.i + raw.n);
      break;
    default:
      if (raw.kind == ir::ArgKind::Value) {
        a.values.push_back(static_cast<ir::ValueId>(raw.i));
      } else {
        if (raw.kind == ir::ArgKind::WrappedScalar) a.i2 = raw.n;
        a.i = raw.i;
        a.d = raw.d;
      }
  }
}

}  // namespace tcap::capture
