// See Note [Module state guards] (module_state.h).
#include "cache/module_state.h"

#include "cache/module_tables.h"

#include <c10/util/Exception.h>
#include <torch/nn/modules.h>

#include <cstring>
#include <mutex>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <variant>

namespace tcap::cache {
namespace {

namespace nn = torch::nn;

// Appends the values of an options struct's fields, for the options that are not
// trivially copyable (a vector, a string, a tensor or a function inside).
struct Digest {
  std::string& out;

  template <class... A>
  void operator()(const A&... a) {
    (put(a), ...);
  }

  template <class T>
  std::enable_if_t<std::is_arithmetic_v<T> || std::is_enum_v<T>> put(const T& v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <class T>
  std::enable_if_t<std::is_empty_v<T>> put(const T&) {}  // torch::enumtype::kMean and its kind
  template <size_t D, class T>
  void put(const torch::ExpandingArray<D, T>& a) {
    for (const auto& v : *a) put(v);
  }
  template <class T>
  void put(const std::optional<T>& o) {
    put(o.has_value());
    if (o) put(*o);
  }
  template <class T>
  void put(const std::vector<T>& v) {
    put(static_cast<int64_t>(v.size()));
    for (const auto& x : v) put(x);
  }
  template <class A, class B>
  void put(const std::pair<A, B>& t) {
    put(t.first);
    put(t.second);
  }
  template <class M>
  void put(const nn::ModuleHolder<M>& m) {  // a layer the options hold (a transformer's): by identity
    put(reinterpret_cast<uintptr_t>(m.is_empty() ? nullptr : m.ptr().get()));
  }
  template <class A, class B>
  void put(const std::tuple<A, B>& t) {
    put(std::get<0>(t));
    put(std::get<1>(t));
  }
  void put(const std::string& s) {
    put(static_cast<int64_t>(s.size()));
    out += s;
  }
  // A tensor in options (a loss's class weights, an embedding's initial weight): by
  // identity, as module parameters are.
  void put(const at::Tensor& t) { put(reinterpret_cast<uintptr_t>(t.defined() ? t.unsafeGetTensorImpl() : nullptr)); }
  // A function (a transformer layer's custom activation): which object, as far as C++
  // says; two lambdas of one type holding different captures look the same (the contract
  // of closures, docs/compile.md).
  template <class R, class... A>
  void put(const std::function<R(A...)>& f) {
    put(static_cast<bool>(f));
    if (!f) return;
    put(reinterpret_cast<uintptr_t>(&f.target_type()));
    if (auto* const* fp = f.template target<R (*)(A...)>()) put(reinterpret_cast<uintptr_t>(*fp));
  }
  void put(const nn::AnyModule& m) { put(reinterpret_cast<uintptr_t>(m.is_empty() ? nullptr : m.ptr().get())); }
  template <class... T>
  void put(const std::variant<T...>& v) {
    put(static_cast<int64_t>(v.index()));
    std::visit([this](const auto& x) { put(x); }, v);
  }
  void put(const nn::TransformerEncoderLayerOptions& o) {
    (*this)(o.d_model(), o.nhead(), o.dim_feedforward(), o.dropout(), o.activation());
  }
  void put(const nn::TransformerDecoderLayerOptions& o) {
    (*this)(o.d_model(), o.nhead(), o.dim_feedforward(), o.dropout(), o.activation());
  }
};

// Field readers of the options structs that are not trivially copyable (module_state.cpp's
// static_assert names any other such type in this list).
template <class M>
struct Fields {
  static constexpr bool kDefined = false;
  static constexpr const char* kRead = "";
};
#define TCAP_OPTION_FIELDS(Impl, ...)                   \
  template <>                                           \
  struct Fields<nn::Impl> {                             \
    static constexpr bool kDefined = true;              \
    static constexpr const char* kRead = #__VA_ARGS__;  \
    static void read(const nn::Impl& m, Digest& d) {    \
      const auto& o = m.options;                        \
      d(__VA_ARGS__);                                   \
    }                                                   \
  }
TCAP_OPTION_FIELDS(GELUImpl, o.approximate());
TCAP_OPTION_FIELDS(LayerNormImpl, o.normalized_shape(), o.eps(), o.elementwise_affine());
TCAP_OPTION_FIELDS(EmbeddingImpl, o.num_embeddings(), o.embedding_dim(), o.padding_idx(), o.max_norm(), o.norm_type(),
                   o.scale_grad_by_freq(), o.sparse(), o._weight());
TCAP_OPTION_FIELDS(EmbeddingBagImpl, o.num_embeddings(), o.embedding_dim(), o.max_norm(), o.norm_type(),
                   o.scale_grad_by_freq(), o.mode(), o.sparse(), o._weight(), o.include_last_offset(), o.padding_idx());
TCAP_OPTION_FIELDS(UnflattenImpl, o.dim(), o.dimname(), o.sizes(), o.namedshape());
TCAP_OPTION_FIELDS(AdaptiveLogSoftmaxWithLossImpl, o.in_features(), o.n_classes(), o.cutoffs(), o.div_value(),
                   o.head_bias());
TCAP_OPTION_FIELDS(UpsampleImpl, o.size(), o.scale_factor(), o.mode(), o.align_corners());
TCAP_OPTION_FIELDS(FractionalMaxPool2dImpl, o.kernel_size(), o.output_size(), o.output_ratio(), o._random_samples());
TCAP_OPTION_FIELDS(FractionalMaxPool3dImpl, o.kernel_size(), o.output_size(), o.output_ratio(), o._random_samples());
TCAP_OPTION_FIELDS(BCELossImpl, o.weight(), o.reduction());
TCAP_OPTION_FIELDS(MultiMarginLossImpl, o.p(), o.margin(), o.weight(), o.reduction());
TCAP_OPTION_FIELDS(MultiLabelSoftMarginLossImpl, o.weight(), o.reduction());
TCAP_OPTION_FIELDS(TripletMarginWithDistanceLossImpl, o.distance_function(), o.margin(), o.swap(), o.reduction());
TCAP_OPTION_FIELDS(NLLLossImpl, o.weight(), o.ignore_index(), o.reduction());
TCAP_OPTION_FIELDS(CrossEntropyLossImpl, o.weight(), o.ignore_index(), o.reduction(), o.label_smoothing());
TCAP_OPTION_FIELDS(BCEWithLogitsLossImpl, o.weight(), o.reduction(), o.pos_weight());
TCAP_OPTION_FIELDS(TransformerEncoderLayerImpl, o);
TCAP_OPTION_FIELDS(TransformerDecoderLayerImpl, o);
TCAP_OPTION_FIELDS(TransformerEncoderImpl, o.encoder_layer(), o.num_layers(), o.norm());
TCAP_OPTION_FIELDS(TransformerDecoderImpl, o.decoder_layer(), o.num_layers(), o.norm());
TCAP_OPTION_FIELDS(TransformerImpl, o.d_model(), o.nhead(), o.num_encoder_layers(), o.num_decoder_layers(),
                   o.dim_feedforward(), o.dropout(), o.activation(), o.custom_encoder(), o.custom_decoder());
#undef TCAP_OPTION_FIELDS

template <class M, class = void>
struct HasOptions : std::false_type {};
template <class M>
struct HasOptions<M, std::void_t<decltype(std::declval<const M&>().options)>> : std::true_type {};

using Reader = void (*)(const nn::Module&, std::string&);

template <class M>
void read_options(const nn::Module& m, std::string& out) {
  const M& mm = static_cast<const M&>(m);
  if constexpr (Fields<M>::kDefined) {
    Digest d{out};
    Fields<M>::read(mm, d);
  } else {
    using O = std::decay_t<decltype(mm.options)>;
    static_assert(std::is_trivially_copyable_v<O>,
                  "an options struct that is not trivially copyable needs a field reader (TCAP_OPTION_FIELDS)");
    // Copied out whole, padding included: a copy-assigned struct may differ in its padding
    // only, which costs one recapture, never a missed change.
    out.append(reinterpret_cast<const char*>(&mm.options), sizeof(O));
  }
}

// LibTorch's module types with options, by type.
#define TCAP_MODULE_TYPES(_)                                                                                        \
  _(AdaptiveAvgPool1d) _(AdaptiveAvgPool2d) _(AdaptiveAvgPool3d) _(AdaptiveLogSoftmaxWithLoss) _(AdaptiveMaxPool1d)  \
  _(AdaptiveMaxPool2d) _(AdaptiveMaxPool3d) _(AlphaDropout) _(AvgPool1d) _(AvgPool2d) _(AvgPool3d) _(BCELoss)       \
  _(BCEWithLogitsLoss) _(BatchNorm1d) _(BatchNorm2d) _(BatchNorm3d) _(Bilinear) _(CELU) _(CTCLoss) _(ConstantPad1d) \
  _(ConstantPad2d) _(ConstantPad3d) _(Conv1d) _(Conv2d) _(Conv3d) _(ConvTranspose1d) _(ConvTranspose2d)              \
  _(ConvTranspose3d) _(CosineEmbeddingLoss) _(CosineSimilarity) _(CrossEntropyLoss) _(CrossMapLRN2d) _(Dropout)     \
  _(Dropout2d) _(Dropout3d) _(ELU) _(FeatureAlphaDropout) _(Flatten) _(Fold) _(FractionalMaxPool2d)                \
  _(FractionalMaxPool3d) _(GELU) _(GLU) _(GRU) _(GRUCell) _(GroupNorm) _(Hardshrink) _(Hardtanh)                    \
  _(HingeEmbeddingLoss) _(HuberLoss) _(InstanceNorm1d) _(InstanceNorm2d) _(InstanceNorm3d) _(KLDivLoss) _(L1Loss)   \
  _(LPPool1d) _(LPPool2d) _(LPPool3d) _(LSTM) _(LSTMCell) _(LayerNorm) _(LeakyReLU) _(Linear) _(LocalResponseNorm)  \
  _(LogSoftmax) _(MSELoss) _(MarginRankingLoss) _(MaxPool1d) _(MaxPool2d) _(MaxPool3d) _(MaxUnpool1d)               \
  _(MaxUnpool2d) _(MaxUnpool3d) _(Embedding) _(EmbeddingBag) _(MultiLabelMarginLoss) _(MultiLabelSoftMarginLoss)   \
  _(MultiMarginLoss) _(MultiheadAttention) _(NLLLoss) _(PReLU) _(PairwiseDistance) _(PixelShuffle)                 \
  _(PixelUnshuffle) _(PoissonNLLLoss) _(RNN) _(RNNCell) _(RReLU) _(ReLU) _(ReLU6) _(ReflectionPad1d) _(ReflectionPad2d) _(ReflectionPad3d)              \
  _(ReplicationPad1d) _(ReplicationPad2d) _(ReplicationPad3d) _(SELU) _(SmoothL1Loss) _(SoftMarginLoss) _(Softmax)  \
  _(Softmin) _(Softplus) _(Softshrink) _(Threshold) _(Transformer) _(TransformerDecoder)                            \
  _(TransformerDecoderLayer) _(TransformerEncoder) _(TransformerEncoderLayer) _(TripletMarginLoss)                  \
  _(TripletMarginWithDistanceLoss) _(Unflatten) _(Unfold) _(Upsample) _(ZeroPad1d) _(ZeroPad2d) _(ZeroPad3d)

const std::unordered_map<const std::type_info*, Reader>& readers() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<const std::type_info*, Reader>();
#define TCAP_ADD_READER(Name)                                            \
  if constexpr (HasOptions<nn::Name##Impl>::value) {                     \
    t->emplace(&typeid(nn::Name##Impl), &read_options<nn::Name##Impl>);  \
  }
    TCAP_MODULE_TYPES(TCAP_ADD_READER)
#undef TCAP_ADD_READER
    return t;
  }();
  return *table;
}

Reader reader_of(const std::type_info& t) {
  const auto& table = readers();
  auto it = table.find(&t);
  return it == table.end() ? nullptr : it->second;
}

void walk(const std::shared_ptr<nn::Module>& m, const std::string* path, ModuleView& v, bool with_names) {
  const nn::Module& mod = *m;
  const std::type_info& type = typeid(mod);
  v.modules.push_back(&mod);
  v.types.push_back(&type);
  v.training.push_back(mod.is_training() ? 1 : 0);
  if (Reader r = reader_of(type)) r(mod, v.options);
  v.options_end.push_back(static_cast<uint32_t>(v.options.size()));
  if (with_names) v.paths.push_back(*path);
  for (const auto& child : children_of(mod)) {
    if (with_names) {
      const std::string p = path->empty() ? child.key() : *path + "." + child.key();
      walk(child.value(), &p, v, true);
    } else {
      walk(child.value(), nullptr, v, false);
    }
  }
}

std::string type_name(const nn::Module& m) { return m.name(); }

}  // namespace

void ModuleView::clear() {
  modules.clear();
  types.clear();
  training.clear();
  options.clear();
  options_end.clear();
  paths.clear();
}

void read_modules(const std::vector<std::shared_ptr<nn::Module>>& roots, ModuleView& v, bool with_names) {
  v.clear();
  for (size_t r = 0; r < roots.size(); ++r) {
    const std::string root = roots.size() > 1 ? "m" + std::to_string(r) : "";
    walk(roots[r], with_names ? &root : nullptr, v, with_names);
  }
}

void ModuleView::append_tensors(bool buffers, std::vector<at::Tensor>& out) const {
  for (const nn::Module* m : modules) append_own_tensors(*m, buffers, out);
}

void ModuleView::append_named_tensors(bool buffers, std::vector<at::Tensor>& out, std::vector<std::string>& names) const {
  TORCH_INTERNAL_ASSERT(paths.size() == modules.size(), "tcap: a module view read without names");
  for (size_t i = 0; i < modules.size(); ++i) {
    for (const auto& item : own_tensor_table(*modules[i], buffers)) {
      if (!item.value().defined()) continue;
      out.push_back(item.value());
      names.push_back(paths[i].empty() ? item.key() : paths[i] + "." + item.key());
    }
  }
}

std::string ModuleView::mismatch(const ModuleView& now) const {
  auto name = [&](size_t i) {
    const std::string p = i < paths.size() ? paths[i] : std::to_string(i);
    return "'" + (p.empty() ? std::string("<root>") : p) + "' (" + type_name(*now.modules[i]) + ")";
  };
  const size_t n = std::min(modules.size(), now.modules.size());
  for (size_t i = 0; i < n; ++i) {
    if (modules[i] != now.modules[i] || types[i] != now.types[i]) {
      const std::string p = i < paths.size() ? paths[i] : std::to_string(i);
      return "the module tree changed: submodule '" + (p.empty() ? std::string("<root>") : p) +
             "' is another module object now (" + type_name(*now.modules[i]) + ")";
    }
  }
  if (modules.size() != now.modules.size()) {
    return "the module tree changed: " + std::to_string(modules.size()) + " modules -> " +
           std::to_string(now.modules.size());
  }
  for (size_t i = 0; i < n; ++i) {
    if (training[i] != now.training[i]) {
      return "training mode of submodule " + name(i) + " changed: " + (training[i] ? "true -> false" : "false -> true");
    }
  }
  if (options != now.options) {
    for (size_t i = 0; i < n; ++i) {
      const uint32_t b0 = i ? options_end[i - 1] : 0, b1 = i ? now.options_end[i - 1] : 0;
      if (options_end[i] - b0 != now.options_end[i] - b1 ||
          std::memcmp(options.data() + b0, now.options.data() + b1, options_end[i] - b0) != 0) {
        std::ostringstream s;
        now.modules[i]->pretty_print(s);
        return "the options of submodule " + name(i) + " changed (now " + s.str() + ")";
      }
    }
  }
  return "";
}

std::vector<std::string> ModuleView::describe() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::string p = i < paths.size() ? paths[i] : std::to_string(i);
    const bool opts = options_end[i] != (i ? options_end[i - 1] : 0);
    out.push_back("module '" + (p.empty() ? std::string("<root>") : p) + "': this very " + type_name(*modules[i]) +
                  (training[i] ? ", training" : ", eval") + (opts ? ", its options as captured" : ""));
  }
  return out;
}

std::vector<std::string> module_types_read() {
  std::vector<std::string> out;
#define TCAP_NAME_OF(Name) \
  if constexpr (HasOptions<nn::Name##Impl>::value) out.emplace_back(#Name);
  TCAP_MODULE_TYPES(TCAP_NAME_OF)
#undef TCAP_NAME_OF
  return out;
}

std::vector<std::pair<std::string, std::vector<std::string>>> option_fields_read() {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  // "o.eps(), o.elementwise_affine()" -> {"eps", "elementwise_affine"}; a struct read
  // whole ("o") by a put() of its own gives no names.
  auto names = [](std::string_view read) {
    std::vector<std::string> v;
    size_t at = 0;
    while ((at = read.find("o.", at)) != std::string_view::npos) {
      const size_t end = read.find('(', at);
      v.emplace_back(read.substr(at + 2, end - at - 2));
      at = end;
    }
    return v;
  };
#define TCAP_FIELDS_OF(Name)                                                 \
  if constexpr (Fields<nn::Name##Impl>::kDefined) {                          \
    out.emplace_back(#Name, names(Fields<nn::Name##Impl>::kRead));           \
  }
  TCAP_MODULE_TYPES(TCAP_FIELDS_OF)
#undef TCAP_FIELDS_OF
  return out;
}

std::string options_digest(const nn::Module& m) {
  std::string out;
  if (Reader r = reader_of(typeid(m))) r(m, out);
  return out;
}

}  // namespace tcap::cache
