#include "templates/rope/rope.h"

#include "support/embedded.h"

namespace kiln {
namespace {
constexpr auto kSignature = rope_params::signature("q", "k", "q_out", "k_out");
}  // namespace

std::span<const TensorDecl> RopeOp::signature() const { return kSignature; }
std::string_view RopeOp::device_template(const KernelConfig&) const {
  return embedded_file("templates/rope/rope.kernel");
}

}  // namespace kiln
