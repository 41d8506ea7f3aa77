"""What a node watches and keeps of its machine, for its operators: the Prometheus metrics
(`metrics`), the free disk space of every member and the reserve that stops new messages
(`disk`), and the freed memory given back to the system (`allocator`). The lowest room with
`security`: every other room may report here, and this room imports none of them."""
