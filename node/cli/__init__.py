"""The node's commands of the ``tickwheel`` command: the parser and the client commands
(`commands`: schedule, consume, cancel, reschedule, status), ``tickwheel serve`` (`serve`),
the credentials commands (`credentials`: certs, token, rocketmq-key), and the one console they
print to (`terminal`). The top room of the node; ``tickwheel cluster up`` is added from above
(`tickwheel.cli`), since it starts processes through the harness."""
