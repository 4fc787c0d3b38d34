// The op registry: every op Kiln serves, in `kiln ops` order. The list is templates/ops.def, one
// line per op; CMake counts the op folders under templates/ and registry.cpp static_asserts that
// the list has one line per folder, so a new folder without its line does not build.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "templates/op_template.h"

namespace kiln {

/// Every op, in templates/ops.def order.
std::span<const OpTemplate* const> all_ops();
/// Looks an op up by name; the error (Errc::not_found) lists the known ops.
Result<const OpTemplate*> find_op(std::string_view name);
/// A spec as a person reads it: "op dtype[->out_dtype] name=value ...", the op's parameters in its
/// order and enumerated ones by the name of their value (granularity=block1x128), as -p takes them;
/// parameters the op does not declare (or an unknown op's) follow by number.
std::string spec_text(const KernelSpec& spec);

}  // namespace kiln
