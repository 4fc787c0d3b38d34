// Kiln: JIT kernel generation for GPU training operators. The umbrella header.
#pragma once

#include "kiln/check.h"
#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/ops.h"
#include "kiln/result.h"
#include "kiln/runtime.h"
#include "kiln/spec.h"
#include "kiln/target.h"
#include "kiln/tune.h"
#include "kiln/version.h"
