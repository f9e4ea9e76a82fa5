"""The Kubernetes side of the workers: the kind table and a raw-JSON list/watch client (kubernetes-asyncio)."""
