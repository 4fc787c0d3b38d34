// OpTemplate: how an op describes itself to Kiln (op contract v3). One subclass per op, in its own
// folder templates/<op>/, next to its device templates (*.kernel) and its CPU reference, plus one
// line in templates/ops.def. Everything the rest of the pipeline knows about an op comes through
// this interface: codegen, the cache, launch, check, `kiln ops`, `kiln run`, `kiln inspect`, the
// tests and the benchmarks. Nothing outside an op's folder compares op names or includes its
// headers; device code and host helpers that several ops share live in templates/lib/.
// docs/adding-an-op.md walks through a new op.
//
// The contract is read in three parts, each a class the next one derives from:
//   - templates/op_interface.h (OpInterface): name, parameters, scalars, dtypes, signature,
//     validation;
//   - templates/op_codegen.h (OpCodegen): variants, the heuristic, device templates and their
//     library parts, baked constants, plans, base alignment (launch types: templates/plan.h);
//   - templates/op_testing.h (OpTestHooks): inputs, CPU reference, gates, FLOPs and bytes, test
//     specs, modelled throughput.
// An op must override: name, summary, params, dtypes, signature, variants, device_template,
// specialize, kernel_name, plan, reference, test_specs. Everything else has a default.
#pragma once

#include <cstdint>
#include <string_view>

#include "templates/op_testing.h"

namespace kiln {

/// The op contract: an op derives from this class (see the parts above).
class OpTemplate : public OpTestHooks {};

/// Rounds `value` up to a multiple of `to`.
constexpr int64_t round_up(int64_t value, int64_t to) { return (value + to - 1) / to * to; }
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The C++ spelling of a dtype in device code ("float", "kiln::bf16", "kiln::fp8_e4m3", "int").
std::string_view device_type_name(DType t);

}  // namespace kiln
