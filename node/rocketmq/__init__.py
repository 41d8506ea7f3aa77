"""RocketMQ 5's client protocol on a node's RocketMQ listener (``rocketmq_listen``), so that
existing RocketMQ producers and consumers send and receive timer messages unchanged
(docs/rocketmq.md): `service` answers the calls through the native API (`calls`: waiting
for a leader, long polls, settling by receipt), `binding` binds it to a server, `convert` maps
the messages and statuses, `signature` checks ``MQv2-HMAC-SHA1`` against the access file, and
`renewals` keeps a PushConsumer's leases alive while it is."""
