"""A node's settings: every limit and address, named and grouped in one place
(`config_fields`), checked and read from flags, ``TICKWHEEL_*``, a TOML file and defaults
(`config`), and a node's addresses derived from its place in a Kubernetes StatefulSet
(`statefulset`). Above the rooms whose limits it gathers (each room declares its own, e.g.
`AdmissionLimits`, `CourierConfig`, `ConnectionLimits`), below the process that runs with them
(`tickwheel.node.serve`)."""
