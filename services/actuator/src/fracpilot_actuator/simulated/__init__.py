"""The demo's simulated GPU cluster (a simulator, never a stand-in in a test that claims to test
a real scheduler): ``cluster`` keeps its state in NATS KV, ``backend`` acts on it."""
