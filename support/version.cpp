#include "kiln/version.h"

namespace kiln {
const char* version() noexcept { return KILN_VERSION_STRING; }
}  // namespace kiln
