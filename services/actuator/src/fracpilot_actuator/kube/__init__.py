"""The Kubernetes backend: KAI Scheduler (annotations) and HAMi (limits) GPU shares.

- :mod:`.inventory` (pure): Node and Pod objects -> the planner's ``ClusterState``, each pod's
  GPU share and owner, and the problems found on the way (a bad annotation names its pod);
- :mod:`.api` (I/O): the few Kubernetes API calls the backend makes, each awaitable;
- :mod:`.backend` (I/O): reads the inventory, checks the guardrails, plans, and executes the
  plan: annotation patch (KAI in place), eviction (recreate), placeholder pod (scale-up),
  with a Kubernetes Event on the pod for each action and the workload's target in NATS KV.
"""
