// kiln conformance: wired to the core conformance library once it exists.
#include <iostream>

#include "commands.hpp"
#include "kiln/error.hpp"

namespace kiln::app {

int cmd_conformance(const Options& o) {
  (void)o;
  throw Error("kiln conformance: the conformance suite is not built into this kiln yet");
}

}  // namespace kiln::app
