extern "C" int kiln_unrelated_symbol() { return 42; }
