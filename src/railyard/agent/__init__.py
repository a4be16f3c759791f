"""The node agent: wiring only. It builds the kubelet device plugins, their admission, the
state store and (with `--cni-socket`) the CNI service from one config, and runs them
(docs/agent.md). Only the CLI imports it; the parts live in `railyard.kubelet`,
`railyard.cni` and `railyard.node`."""
