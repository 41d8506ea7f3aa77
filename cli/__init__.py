"""The ``tickwheel`` command, the product's entry point (``[project.scripts]``), on top of every
layer: the node's commands (`tickwheel.node`: serve, the client commands, the credentials
commands) and ``tickwheel cluster up``, which starts node processes through the harness
(`tickwheel.harness.LocalCluster`) and so cannot live in the node (`main`). It sits beside
`tickwheel.chaos`, above the harness; ``python -m tickwheel.node`` runs the node's commands
alone, ``python -m tickwheel.cli`` the whole command."""
