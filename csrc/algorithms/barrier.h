#pragma once
#include "algorithms/exchange.h"

namespace pycollective {

// Returns once every rank of the exchange's group entered the barrier.
void runBarrier(Exchange& ex);

}  // namespace pycollective
