"""What the actuator keeps outside the cluster: the ``ports`` (protocols), their NATS KV
adapters (``nats_kv``), in-memory stores for running without NATS (``memory``), and the
watch-fed cache of workload targets the webhook reads (``targets``)."""
