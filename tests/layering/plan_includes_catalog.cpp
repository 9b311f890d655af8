// Refused by the build: quantem_plan does not link quantem_catalog.
#include "quantem/catalog/acquisition.hpp"
