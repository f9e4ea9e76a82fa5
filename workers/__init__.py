"""Watch workers (kubernetes-asyncio) and scheduled jobs (APScheduler).

``dra-ledger watch`` lists then watches ResourceSlice, ResourceClaim, DeviceClass, Pod and Namespace
and hands every event to ``ledger.services`` — the same path a recorded-file replay takes — under a
``coordination.k8s.io/v1`` Lease so that one replica writes. ``dra-ledger record`` writes the same
streams to a file, and ``dra-ledger fake-apiserver`` serves a recorded history to such clients.
"""
