"""The Kubernetes backend: KAI Scheduler (annotations) and HAMi (limits) GPU shares.

Pure:
- :mod:`.object_values`: the names on Kubernetes objects and the parsing of their values;
- :mod:`.inventory`: Node and Pod objects -> the planner's ``ClusterState``, each pod's GPU
  share and owner, and the problems found on the way (a bad annotation names its pod);
- :mod:`.judge`: one decision and the cluster -> a plan or a skip (opt-out, validity, the
  guardrails, dry-run, resume), given a :mod:`.cluster_view`, answering a :mod:`.judgement`;
  :mod:`.card_plan`: its shared-isolation step (a card divided among its tenants);
  :mod:`.scale_up_plan`: a scale-up waiting for capacity, planned;
- :mod:`.kai`: KAI-Scheduler's shapes (reservation flags, multi-device fraction pods,
  BindRequests, the fractions its rounding keeps); :mod:`.queues`: KAI Queues and how far an
  in-place upsize may take them;
- :mod:`.placeholders`: the scale-up placeholder pods; :mod:`.errors`: API failures as types;
  :mod:`.settings`: the backend's settings (one value, built from
  :mod:`fracpilot_actuator.settings`).

I/O:
- :mod:`.api`: the few Kubernetes API calls the backend makes, each awaitable; client failures
  become :mod:`.errors` types here;
- :mod:`.cache`: nodes, pods, ReplicaSets and Jobs kept current by watches;
- :mod:`.reader`: the cluster as one decision sees it (cache or lists), with KAI's
  BindRequests and Queues from :mod:`.kai_objects`;
- :mod:`.executor`: the steps carried out (annotation patch, eviction, placeholder pod,
  template patch), each with a Kubernetes Event on the pod;
- :mod:`.backend`: read, judge, execute; the target, disruption and allocation stores
  (:mod:`fracpilot_actuator.stores.ports`); :mod:`.scale_ups`: scale-ups waiting for capacity.
"""
