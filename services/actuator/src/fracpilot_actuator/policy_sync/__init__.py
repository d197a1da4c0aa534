"""Policies as Kubernetes objects: FractionPolicy / ClusterFractionPolicy synced into the
policy KV bucket.

- :mod:`.objects` (pure): an object as the API returns it -> its scope and its ``Policy``;
- :mod:`.plan` (pure): every object + the bucket -> the KV writes and each object's status;
- :mod:`.controller`: the adapter (informers, the bucket, status patches, metrics), run by
  the leader actuator only.

The CRDs are generated from ``Policy`` by :mod:`fracpilot_libs.kube.policy_crd`.
"""
