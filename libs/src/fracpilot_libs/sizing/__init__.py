"""The sizing domain, pure: the decision engine and its state, the outlook operators see, the
baselines it is measured against, trace replay and its accounting, and policy resolution.

No I/O, no clock, no NATS, Kubernetes or telemetry (an import-linter contract): the decision
service, ``fracpilot replay``, ``status`` and ``report`` and the benches all run this code.
Modules are imported one by one (nothing is re-exported here) so that a command loads only what
it uses.
"""
