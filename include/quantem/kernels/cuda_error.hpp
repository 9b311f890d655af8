#pragma once
// Typed exceptions for CUDA failures (CUDA-free: includable by any component).
//
//  - CudaError: a CUDA runtime call or a kernel launch failed (ErrorKind::internal).
//    The message names the call, the CUDA error name and string, and file:line.
//  - OutOfDeviceMemory: a device allocation failed for lack of memory
//    (ErrorKind::payload_too_large, the kind admission reports for "does not fit").
//
// The check macros that throw these live in quantem/kernels/cuda_check.hpp.
#include <string>

#include "quantem/core/error.hpp"

namespace quantem::kernels {

class CudaError : public Error {
 public:
  explicit CudaError(const std::string& message) : Error(ErrorKind::internal, message) {}

 protected:
  CudaError(ErrorKind kind, const std::string& message) : Error(kind, message) {}
};

class OutOfDeviceMemory : public CudaError {
 public:
  explicit OutOfDeviceMemory(const std::string& message)
      : CudaError(ErrorKind::payload_too_large, message) {}
};

}  // namespace quantem::kernels
