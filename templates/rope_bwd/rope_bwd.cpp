#include "templates/rope_bwd/rope_bwd.h"

#include "support/embedded.h"

namespace kiln {
namespace {
constexpr auto kSignature = rope_params::signature("dq_out", "dk_out", "dq", "dk");
}  // namespace

std::span<const TensorDecl> RopeBwdOp::signature() const { return kSignature; }
std::string_view RopeBwdOp::device_template(const KernelConfig&) const {
  return embedded_file("templates/rope_bwd/rope_bwd.kernel");
}

}  // namespace kiln
