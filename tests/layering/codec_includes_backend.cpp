// Refused by the build: quantem_codec does not link quantem_backend.
#include "quantem/backend/backend.hpp"
