"""The node's gRPC API: `TickwheelService` (`server`) and what each call does on the leader
(`calls`, `unary` for consumers that poll), the cluster's description (`info`), forwarding a
follower's calls to the leader (`forward`), the gate that authenticates and admits a call
before its request is read (`admission`), the checks of input at the edge (`validation`),
waiting for a command to commit (`commits`), and what the services share (`context`). Above
delivery, ops and security; the RocketMQ protocol (`tickwheel.node.rocketmq`) is served
through it, and the listeners (`tickwheel.node.listeners`) bind it to ports."""
