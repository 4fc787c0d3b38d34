// The op registry: every op Kiln serves, in `kiln ops` order. The list is templates/ops.def, one
// line per op; CMake counts the op folders under templates/ and registry.cpp static_asserts that
// the list has one line per folder, so a new folder without its line does not build.
#pragma once

#include <span>
#include <string_view>

#include "templates/op_template.h"

namespace kiln {

/// Every op, in templates/ops.def order.
std::span<const OpTemplate* const> all_ops();
/// Looks an op up by name; the error (Errc::not_found) lists the known ops.
Result<const OpTemplate*> find_op(std::string_view name);

}  // namespace kiln
