// Entry points every kernel module exports besides its launchers: error text and identity.
#include "common.cuh"
#include "ditgate_config.h"

DITGATE_API const char* ditgate_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

// 0 = fp32, 1 = fp16, 2 = bf16: the binding checks that it loaded the variant it asked for.
DITGATE_API int ditgate_dtype_code(void) { return DITGATE_DTYPE_CODE; }
