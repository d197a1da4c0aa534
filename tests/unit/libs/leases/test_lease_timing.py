"""The partition lease's timing: a renewal whose ack never comes leaves room for another
inside the trust (issue 17: with nats-py's own 5 s wait, one lost renewal of a 10 s lease
ran past its 7.5 s trust, 2.5 + 5 s, and the replica dropped every partition)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fracpilot_libs.leases.core import RETRY_S, TRUST, lease_io_timeout


@given(st.floats(min_value=4.0, max_value=86_400.0))
def test_a_lost_renewal_and_its_retry_fit_in_the_trust(lease_s: float) -> None:
    renew_s = lease_s / 4
    # Renewed at 0; the next, at renew_s, waits out its ack; the retry follows RETRY_S later
    # and must be sent before the trust of the renewal at 0 runs out.
    assert renew_s + lease_io_timeout(lease_s) + RETRY_S < TRUST * lease_s
