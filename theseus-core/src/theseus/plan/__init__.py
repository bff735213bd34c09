"""Compiling a job for accelerators this machine does not have (``theseus plan``): targets, the
deviceless devices, the compiled step, what its HLO does per step, and a roofline estimate."""
