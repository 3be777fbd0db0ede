#include "aot/module_tables.h"

namespace tcap::aot {

namespace {

using Table = torch::OrderedDict<std::string, at::Tensor>;
using TablePtr = Table torch::nn::Module::*;

// A template argument of an explicit instantiation may name a member its scope cannot
// access ([temp.spec]/6); the friend function carries the member pointer out.
struct ParametersTag {
  friend TablePtr member(ParametersTag);
};
struct BuffersTag {
  friend TablePtr member(BuffersTag);
};
template <typename Tag, TablePtr M>
struct Expose {
  friend TablePtr member(Tag) { return M; }
};
template struct Expose<ParametersTag, &torch::nn::Module::parameters_>;
template struct Expose<BuffersTag, &torch::nn::Module::buffers_>;

}  // namespace

void append_own_tensors(const torch::nn::Module& m, bool buffers, std::vector<at::Tensor>& out) {
  const Table& table = m.*(buffers ? member(BuffersTag{}) : member(ParametersTag{}));
  for (const auto& item : table) {
    if (item.value().defined()) out.push_back(item.value());
  }
}

}  // namespace tcap::aot
