"""Helm hooks run from the actuator's image (entry points, named in docs/architecture.md):
``release_secrets`` (pre-install/upgrade: generated credentials and the webhook certificate,
kept across upgrades) and ``release_checks`` (``helm test``)."""
