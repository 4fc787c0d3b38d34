// Text files compiled into the library (device templates, preludes), keyed by their path relative
// to the repository root. Generated at build time by cmake/embed.cmake.
#pragma once

#include <string_view>

namespace kiln {
/// The embedded file's text; empty if no such file was embedded (a build error, caught by tests).
std::string_view embedded_file(std::string_view path);
}  // namespace kiln
