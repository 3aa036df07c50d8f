"""Where and how the code runs: device and precision, data-parallel ranks, CUDA graphs, safe file writes."""
