// Refused by the build: a component's own sources see their own folder and
// the public headers of what they link, never another component's sources.
// The probe compiles with quantem_products' include directories, private ones
// included, and reaches for a source header of quantem_backend.
#include "backend/cpu/host_buffer.hpp"
