"""The webhook's serving bundle, made and judged as pure functions (time is an argument)."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509

from fracpilot_actuator.admission.certificates import issue_serving_bundle, renewal_reason

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
DNS = ["hook.ns.svc", "hook.ns.svc.cluster.local"]
YEAR = dt.timedelta(days=365)
MONTH = dt.timedelta(days=30)


def test_a_fresh_bundle_is_good_and_covers_every_name() -> None:
    bundle = issue_serving_bundle("hook-ca", DNS, NOW, YEAR)
    data = bundle.as_secret_data()
    assert renewal_reason(data, DNS, NOW, MONTH) is None
    cert = x509.load_pem_x509_certificate(bundle.tls_crt)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == DNS
    ca = x509.load_pem_x509_certificate(bundle.ca_crt)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_each_fault_is_named() -> None:
    good = issue_serving_bundle("hook-ca", DNS, NOW, YEAR).as_secret_data()
    other = issue_serving_bundle("other-ca", DNS, NOW, YEAR).as_secret_data()
    assert renewal_reason({}, DNS, NOW, MONTH) == "missing ca.crt, tls.crt, tls.key"
    assert renewal_reason({**good, "tls.key": b""}, DNS, NOW, MONTH) == "missing tls.key"
    assert "unreadable" in (renewal_reason({**good, "ca.crt": b"junk"}, DNS, NOW, MONTH) or "")
    assert "not signed by ca.crt" in (
        renewal_reason({**good, "ca.crt": other["ca.crt"]}, DNS, NOW, MONTH) or ""
    )
    assert renewal_reason({**good, "tls.key": other["tls.key"]}, DNS, NOW, MONTH) == (
        "tls.key does not match tls.crt"
    )
    assert renewal_reason(good, [*DNS, "new.ns.svc"], NOW, MONTH) == "does not cover new.ns.svc"


@pytest.mark.parametrize(
    ("age_days", "renew"), [(0, False), (334, False), (336, True), (400, True)]
)
def test_renewal_starts_renew_before_the_expiry(age_days: int, renew: bool) -> None:
    data = issue_serving_bundle("hook-ca", DNS, NOW, YEAR).as_secret_data()
    reason = renewal_reason(data, DNS, NOW + dt.timedelta(days=age_days), MONTH)
    assert (reason is not None) is renew
    if renew:
        assert "expires" in (reason or "")


def test_no_name_no_certificate() -> None:
    with pytest.raises(ValueError, match="at least one DNS name"):
        issue_serving_bundle("hook-ca", [], NOW, YEAR)
