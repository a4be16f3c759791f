"""The CNI plugin: a thin shim (`railyard-cni`) and a warm service that moves exactly a pod's
granted NICs into its network namespace, named and ordered by GPU pair. See docs/cni.md."""
