#include "templates/op_template.h"

namespace kiln {

std::string_view device_type_name(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f16: return "kiln::f16";
    case DType::bf16: return "kiln::bf16";
    case DType::e4m3: return "kiln::fp8_e4m3";
    case DType::e5m2: return "kiln::fp8_e5m2";
    case DType::e4m3fnuz: return "kiln::fp8_e4m3fnuz";
    case DType::e5m2fnuz: return "kiln::fp8_e5m2fnuz";
    case DType::i32: return "int";
    case DType::i64: return "long long";
    case DType::e8m0: return "unsigned char";
  }
  return "float";
}

}  // namespace kiln
