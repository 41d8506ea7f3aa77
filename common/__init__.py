"""What every layer shares and none owns, below the wheel: `errors` (the one tree of errors
tickwheel raises on purpose, which the API edge maps to gRPC codes) and `clock` (the injected
clock, so a simulation can drive time)."""
