"""The node agent: its config, pod source, state store and the wiring that runs the kubelet
device plugins (docs/agent.md)."""

# Here, not in state.py, so the CLI can show it without importing the store (~45 ms).
DEFAULT_STATE_DIR = "/var/lib/railyard"  # the node state store, unless --state-dir says else
