"""Railyard's side of kubelet: device plugins (v1beta1), pod resolution, Allocate grants,
PodResources checks and device health. `railyard.agent` wires them into a running node."""
