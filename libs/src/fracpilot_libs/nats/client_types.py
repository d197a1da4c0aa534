"""The nats-py types a service names in its signatures: a connection and a delivered message.

The services import no ``nats`` (an import-linter contract), yet hand a connection to the
adapters of this package and take the messages a
:class:`~fracpilot_libs.nats.pull_feed.PullFeed` delivers; they name those types from here.
Aliases, not wrappers: a message is read on the hot path, one per sample.
"""

from __future__ import annotations

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

__all__ = ["Msg", "NatsClient"]
