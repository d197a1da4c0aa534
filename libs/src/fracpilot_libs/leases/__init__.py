"""Sharing N numbered parts among replicas through leases in NATS KV: the balance (pure), the
lease core (pure) and the adapter that runs the rounds. The decision service shares its usage
partitions with it, the ingest its GPU shards."""
