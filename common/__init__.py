"""What every layer shares and none owns, below the wheel: `errors` (the one tree of errors
tickwheel raises on purpose, which the API edge maps to gRPC codes), `clock` (the injected
clock, so a simulation can drive time), `runheap` (the priority queue of the wheel's window
and the deadlines of consumers' leases) and `status_details` (what a refusal over a quota
carries in its trailer, written by nodes and read by the client library)."""
