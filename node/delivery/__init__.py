"""Consumer delivery on the asyncio loop: the `Courier` (`courier`), which sends the messages
granted by a handout on their consumers' streams, with credits, visibility timeouts and the
stream's byte budget; a consumer's stream (`sessions`), a message on its way to it (`sent`),
responses cut to size (`batches`), acknowledgements by receipt (`receipts`), nacks and
timeouts retried on the ladder of delay levels (`retries`, `levels`); each batch sent is told
to the node's ledger (`tickwheel.node.ledger`). Below the API: it knows consumers, never a
gRPC call."""
