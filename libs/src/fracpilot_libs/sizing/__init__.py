"""The live sizing domain, pure: the decision engine and its state, the headroom and grid rules,
the outlook operators see, and policy resolution. Replay, accounting, baselines and packing
analysis are in :mod:`fracpilot_libs.analysis`.

No I/O, no clock, no NATS, Kubernetes or telemetry (an import-linter contract): the decision
service, ``fracpilot replay``, ``status`` and ``report`` and the benches all run this code.
Modules are imported one by one (nothing is re-exported here) so that a command loads only what
it uses.
"""
