"""A placeholder refused because the apiserver's Priority admission has not seen the new
PriorityClass yet (its informer lags the create) is created again, for a while; any other
refusal is not retried. Found by a full CI run: the real stack's scale-up failed with 403 "no
PriorityClass with name fracpilot-capacity was found" right after the class was created."""

from __future__ import annotations

from typing import Any

import pytest

from fracpilot_actuator.kube import executor as executor_module
from fracpilot_actuator.kube.errors import PermanentKubeError
from fracpilot_actuator.kube.executor import StepExecutor
from fracpilot_actuator.kube.settings import KubeBackendSettings

LAG = 'pods "p" is forbidden: no PriorityClass with name fracpilot-capacity was found'


class RefusingApi:
    """Refuses the first ``refusals`` pod creations with ``message``, then accepts."""

    def __init__(self, refusals: int, message: str) -> None:
        self.refusals, self.message, self.calls = refusals, message, 0

    async def create_pod(self, namespace: str, body: Any) -> int:
        self.calls += 1
        if self.calls <= self.refusals:
            raise PermanentKubeError("Forbidden", status=403, message=self.message)
        return 7


def executor(api: RefusingApi) -> StepExecutor:
    return StepExecutor(api, KubeBackendSettings(), "test", lambda _fence: None, caching=False)  # type: ignore[arg-type]


async def test_a_priority_class_admission_has_not_seen_yet_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(executor_module.asyncio, "sleep", _no_wait)
    api = RefusingApi(3, LAG)
    assert await executor(api)._create_placeholder("ns", {}) == 7
    assert api.calls == 4


async def test_the_wait_is_bounded_and_other_refusals_are_not_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(executor_module.asyncio, "sleep", _no_wait)
    forever = RefusingApi(10_000, LAG)
    with pytest.raises(PermanentKubeError):
        await executor(forever)._create_placeholder("ns", {})
    assert forever.calls == int(executor_module.PRIORITY_CLASS_WAIT_S / 0.25) + 1
    other = RefusingApi(1, 'pods "p" is forbidden: exceeded quota: gpu')
    with pytest.raises(PermanentKubeError):
        await executor(other)._create_placeholder("ns", {})
    assert other.calls == 1


async def _no_wait(_seconds: float) -> None:
    return None
