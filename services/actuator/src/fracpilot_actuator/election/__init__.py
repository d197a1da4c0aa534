"""Leader election for the actuator: ``core`` decides (pure, time passed in), ``elector`` runs
rounds against a ``lease_stores`` store (a Kubernetes Lease, or memory for tests)."""
