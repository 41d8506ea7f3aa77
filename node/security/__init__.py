"""Who may call a node, and how it is known: principals, their tokens and grants, read from
the access file (`access`); a caller's identity from its bearer token or client certificate,
and the members' TLS certificates (`identity`); the development credentials (a CA, node and
client certificates, tokens) that a local cluster and ``tickwheel certs`` make
(`dev_credentials`). The lowest room of the node with `ops`: it imports neither the API nor
delivery, so both can ask it who calls (docs/security.md)."""
