"""What a node refuses about its gRPC security settings, before it binds anything (no
processes): each refusal names the setting and says how to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tickwheel.node.security import dev_credentials
from tickwheel.node.security.dev_credentials import DevCredentials
from tickwheel.node.settings.config import NodeSettings

TLS_VARIABLES = ("TICKWHEEL_TLS_CERT_FILE", "TICKWHEEL_TLS_KEY_FILE", "TICKWHEEL_TLS_CA_FILE",
                 "TICKWHEEL_ACCESS_FILE", "TICKWHEEL_TLS_CLIENT_CERTS",
                 "TICKWHEEL_INSECURE_GRPC")


@pytest.fixture(autouse=True)
def no_security_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TLS_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def secure(security: DevCredentials, **overrides: object) -> dict[str, object]:
    return {"tls_cert_file": security.cert_file, "tls_key_file": security.key_file,
            "tls_ca_file": security.ca_file, "access_file": security.access_file,
            **overrides}


def test_a_node_without_tls_and_an_access_file_is_refused_and_told_how_to_fix_it() -> None:
    with pytest.raises(ValidationError) as refused:
        NodeSettings()
    for named in ("tls_cert_file", "tls_key_file", "access_file", "--tls-cert-file",
                  "tickwheel certs", "--insecure-grpc"):
        assert named in str(refused.value)


def test_plaintext_is_served_only_when_asked_for_and_never_half_secured(
        dev_security: DevCredentials) -> None:
    assert NodeSettings(insecure_grpc=True).access() is None
    with pytest.raises(ValidationError, match="insecure_grpc with tls_cert_file"):
        NodeSettings(insecure_grpc=True, tls_cert_file=dev_security.cert_file)
    with pytest.raises(ValidationError, match="insecure_grpc with tls_client_certs"):
        NodeSettings(insecure_grpc=True, tls_client_certs=True)


def test_mutual_tls_needs_the_ca_of_the_client_certificates(
        dev_security: DevCredentials) -> None:
    with pytest.raises(ValidationError, match="tls_client_certs needs tls_ca_file"):
        NodeSettings(**secure(dev_security, tls_ca_file=None, tls_client_certs=True))


def test_a_missing_file_is_named(dev_security: DevCredentials, tmp_path: Path) -> None:
    gone = tmp_path / "gone.toml"
    with pytest.raises(ValidationError, match=f"access_file {gone}: no such file"):
        NodeSettings(**secure(dev_security, access_file=gone))


def test_a_key_that_is_not_the_certificates_is_refused_naming_both(
        dev_security: DevCredentials, tmp_path: Path) -> None:
    other = dev_credentials.make(tmp_path / "other")
    with pytest.raises(ValidationError) as refused:
        NodeSettings(**secure(dev_security, tls_key_file=other.key_file))
    assert f"{other.key_file} is not the key of {dev_security.cert_file}" in str(refused.value)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(ValidationError, match="not a PEM certificate"):
        NodeSettings(**secure(dev_security, tls_cert_file=garbage))


def test_secured_settings_read_the_access_file_once_checked(
        dev_security: DevCredentials) -> None:
    access = NodeSettings(**secure(dev_security)).access()
    assert access is not None and access.current.by_name("admin") is not None
