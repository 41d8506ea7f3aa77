"""The ``tickwheel`` command, the product's entry point (``[project.scripts]``), on top of every
layer: the node's commands (`tickwheel.node`: serve, the client commands, the credentials
commands) and ``tickwheel cluster up`` and ``cluster grow`` (`cluster`, with the layout it
records in its data folder, `cluster_state`, and the socket the two talk over,
`cluster_control`), which start node processes through the harness
(`tickwheel.harness.LocalCluster`) and so cannot live in the node (`main`). It sits beside
`tickwheel.chaos`, above the harness; ``python -m tickwheel.node`` runs the node's commands
alone, ``python -m tickwheel.cli`` the whole command."""
