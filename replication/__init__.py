"""The Raft state machine over the wheel: group commit, cursor sync, lease, hand-over (issue 3)."""
