// Refused by the build: no component sees another's sources (src/), only the
// public headers of the components it links; quantem_products links
// quantem_backend but not src/backend/.
#include "backend/cpu/host_buffer.hpp"
