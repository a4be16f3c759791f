"""The node agent: its config, pod source, state store and the wiring that runs the kubelet
device plugins (docs/agent.md)."""
