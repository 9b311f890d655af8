#include "quantem/hdf5/library_lock.hpp"

namespace quantem::hdf5 {

std::recursive_mutex& library_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

}  // namespace quantem::hdf5
