"""Hardware: resources (threads, cores, target, device), TVM targets and board presets, energy meters, the board side of RPC."""
