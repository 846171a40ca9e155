"""Webhook signatures the real providers put on their callbacks (docs/PROVIDERS.md §1(d), §2(d)).

* Twilio: ``X-Twilio-Signature`` = base64(HMAC-SHA1(AuthToken, url + Σ name+value, names sorted)),
  the same string ``twilio.request_validator.RequestValidator(token).compute_signature(url, params)``
  gives (implemented here so the emulator does not import the SDK).
* SendGrid Event Webhook: ``X-Twilio-Email-Event-Webhook-Signature`` = base64 of a DER ECDSA P-256 /
  SHA-256 signature over ``timestamp + raw_body``; the public half is published as base64 DER
  SubjectPublicKeyInfo (what ``sendgrid.helpers.eventwebhook.EventWebhook(public_key)`` takes).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

TWILIO_SIGNATURE_HEADER = "X-Twilio-Signature"
SENDGRID_SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
SENDGRID_TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"


class SigningKeyError(ValueError):
    """The configured SendGrid signing key file holds no unencrypted P-256 private key."""


def twilio_signature(auth_token: str, url: str, params: Mapping[str, str]) -> str:
    """``X-Twilio-Signature`` of a form POST of ``params`` (one value per name) to exactly ``url``."""
    data = url + "".join(name + params[name] for name in sorted(params))
    digest = hmac.new(auth_token.encode("utf-8"), data.encode("utf-8"), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


class EventWebhookSigner:
    """The emulator's SendGrid Event Webhook key pair (ECDSA P-256)."""

    def __init__(self, private_key: ec.EllipticCurvePrivateKey) -> None:
        if not isinstance(private_key, ec.EllipticCurvePrivateKey) or not isinstance(
            private_key.curve, ec.SECP256R1,
        ):
            raise SigningKeyError("the SendGrid signing key must be an ECDSA P-256 (secp256r1) private key")
        self._key = private_key
        der = private_key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo,
        )
        #: base64 DER SubjectPublicKeyInfo, no PEM armour.
        self.public_key_b64 = base64.b64encode(der).decode("ascii")

    @classmethod
    def generate(cls) -> EventWebhookSigner:
        return cls(ec.generate_private_key(ec.SECP256R1()))

    @classmethod
    def from_pem_file(cls, path: str | Path) -> EventWebhookSigner:
        """Load an unencrypted PEM private key (PKCS#8 or SEC1 "EC PRIVATE KEY").

        Raises:
            OSError: the file cannot be read.
            SigningKeyError: not a PEM private key, encrypted, or not P-256.
        """
        data = Path(path).read_bytes()
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (TypeError, ValueError) as exc:
            raise SigningKeyError(f"{path}: not an unencrypted PEM private key ({exc})") from exc
        return cls(key)  # type: ignore[arg-type]

    def sign(self, timestamp: str, body: bytes) -> str:
        """base64 DER signature over ``timestamp + body``."""
        signature = self._key.sign(timestamp.encode("ascii") + body, ec.ECDSA(hashes.SHA256()))
        return base64.b64encode(signature).decode("ascii")
