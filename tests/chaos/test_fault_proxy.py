"""The fault proxy itself, in front of the real kube-apiserver: it forwards faithfully and
injects exactly the faults it is told to, counting each."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from k8s_control_plane import ControlPlane
from support.fault_proxy import FaultProxy, Rule, upstream_context

pytestmark = pytest.mark.chaos


@pytest.fixture
def proxy(chaos_kube: ControlPlane) -> Iterator[FaultProxy]:
    host, port = chaos_kube.url.removeprefix("https://").split(":")
    context = upstream_context(
        str(chaos_kube.ca_path), str(chaos_kube.admin_cert_path), str(chaos_kube.admin_key_path)
    )
    with FaultProxy(host, int(port), context) as running:
        yield running


def core_via(proxy: FaultProxy) -> client.CoreV1Api:
    config = client.Configuration(host=proxy.url)
    config.retries = False  # urllib3 must not hide the faults from the test
    return client.CoreV1Api(client.ApiClient(config))


def test_forwards_and_injects_statuses_first_n_times(proxy: FaultProxy) -> None:
    core = core_via(proxy)
    name = f"p-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    assert core.read_namespace(name).metadata.name == name

    proxy.add(Rule("status", method="GET", path=f"/namespaces/{name}$", status=409, first=2))
    proxy.add(Rule("status", method="GET", path="/namespaces$", status=429, retry_after_s=1))
    for _ in range(2):
        with pytest.raises(ApiException) as refused:
            core.read_namespace(name)
        assert refused.value.status == 409
        assert "injected by the fault proxy" in (refused.value.body or "")
    assert core.read_namespace(name).metadata.name == name  # the third one passes
    with pytest.raises(ApiException) as busy:
        core.list_namespace()
    assert busy.value.status == 429
    assert busy.value.headers["Retry-After"] == "1"
    assert proxy.injected == {"status:409": 2, "status:429": 1}
    reads = proxy.requests("GET", f"/namespaces/{name}$")
    assert [(r.fault, r.status, r.forwarded) for r in reads] == [
        (None, 200, True),
        ("status:409", 409, False),
        ("status:409", 409, False),
        (None, 200, True),
    ]


def test_hang_times_out_and_a_lost_response_still_acts(proxy: FaultProxy) -> None:
    core = core_via(proxy)
    name = f"p-{uuid.uuid4().hex[:8]}"
    proxy.add(Rule("hang", method="GET", path="/namespaces$", delay_s=2.0, first=1))
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.list_namespace(_request_timeout=0.5)
    assert time.monotonic() - started < 1.5

    proxy.add(Rule("lose_response", method="POST", path="/namespaces$", first=1))
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # The apiserver created it all the same; the client could not know.
    assert core.read_namespace(name).metadata.name == name
    [lost] = proxy.requests("POST", "/namespaces$")
    assert (lost.fault, lost.status, lost.forwarded) == ("lose_response", None, True)


def test_down_refuses_connections_until_up(proxy: FaultProxy) -> None:
    core = core_via(proxy)
    core.list_namespace()
    proxy.down()
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.list_namespace(_request_timeout=1)
    proxy.up()
    assert core.list_namespace().items
