#pragma once
// Typed errors for the whole daemon. Every component throws one of these; the
// server maps ErrorKind to an HTTP status in exactly one place
// (src/server/error_mapping.cpp). Bad data is reported per item by throwing
// from the item's own operation; nothing in the daemon aborts the process.
#include <stdexcept>
#include <string>

namespace quantem {

enum class ErrorKind {
  bad_request,        // a parameter is malformed or out of range          -> 400
  forbidden,          // Host header / token checks                          -> 403
  not_found,          // unknown session, master, route                      -> 404
  conflict,           // not resident, not ready, uint32 overflow            -> 409
  payload_too_large,  // admission refused: the load does not fit a device   -> 413
  unprocessable,      // the source has no usable 4-D shape, query coercion  -> 422
  unavailable,        // backend or catalog not ready, bounded wait expired  -> 503
  corrupt_data,       // a chunk or file fails to decode                     -> 422
  io,                 // file system or HDF5 failure                          -> 500
  internal,           // a broken invariant                                   -> 500
};

const char* error_kind_name(ErrorKind kind) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

// A compressed chunk or stream that does not decode: always a per-item failure.
class CorruptChunk : public Error {
 public:
  explicit CorruptChunk(const std::string& message) : Error(ErrorKind::corrupt_data, message) {}
};

// An HDF5 library failure, carrying HDF5's own error stack in the message.
class HdfError : public Error {
 public:
  explicit HdfError(const std::string& message) : Error(ErrorKind::io, message) {}
};

// A system call failure (open, pread, stat, ...).
class IoError : public Error {
 public:
  explicit IoError(const std::string& message) : Error(ErrorKind::io, message) {}
};

// Convenience constructors for the protocol-level kinds.
inline Error bad_request(const std::string& m) { return Error(ErrorKind::bad_request, m); }
inline Error not_found(const std::string& m) { return Error(ErrorKind::not_found, m); }
inline Error conflict(const std::string& m) { return Error(ErrorKind::conflict, m); }
inline Error payload_too_large(const std::string& m) { return Error(ErrorKind::payload_too_large, m); }
inline Error unprocessable(const std::string& m) { return Error(ErrorKind::unprocessable, m); }
inline Error unavailable(const std::string& m) { return Error(ErrorKind::unavailable, m); }
inline Error internal_error(const std::string& m) { return Error(ErrorKind::internal, m); }

}  // namespace quantem
