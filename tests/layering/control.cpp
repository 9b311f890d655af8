// Builds: the probe links quantem_plan and quantem_catalog, whose headers it includes.
#include "quantem/catalog/acquisition.hpp"
#include "quantem/plan/plan.hpp"
