#pragma once
// Immutable bytes shared by the image cache and the responses that send them,
// whoever owns the memory: a recycled string of the body pool, or an image's
// own value vector when its values are already the wire's bytes (a narrowed
// uint32 or float32 image in the raw format: no copy at all).
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace quantem::protocol {

struct SharedBytes {
  std::shared_ptr<const void> owner;  // keeps data alive
  const char* data = nullptr;
  std::size_t size = 0;

  explicit operator bool() const { return owner != nullptr; }
  std::string_view view() const { return {data, size}; }

  static SharedBytes of(std::shared_ptr<const std::string> text) {
    SharedBytes bytes;
    bytes.data = text->data();
    bytes.size = text->size();
    bytes.owner = std::move(text);
    return bytes;
  }
  // The vector's elements, as bytes (moved into the owner: no copy).
  template <class T>
  static SharedBytes of(std::vector<T> values) {
    auto owned = std::make_shared<const std::vector<T>>(std::move(values));
    SharedBytes bytes;
    bytes.data = reinterpret_cast<const char*>(owned->data());
    bytes.size = owned->size() * sizeof(T);
    bytes.owner = std::move(owned);
    return bytes;
  }
};

}  // namespace quantem::protocol
