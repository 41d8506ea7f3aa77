"""The process: gRPC server, dispatcher and consumer delivery, config, CLI, metrics (issue 4)."""
