"""Who sent a command, and what that identity may do (DESIGN §11; docs/security.md).

NATS authenticates each connection, but JetStream does not record which identity published a
stored message. So a client signs every command with its own nkey: the headers carry its public
key (`Gpuorch-Identity`) and an Ed25519 signature (`Gpuorch-Signature`, base64) over

    <subject> "\\n" <Nats-Msg-Id> "\\n" <body bytes>

(the middle line empty when the command has no `Nats-Msg-Id`: a submit may carry its idempotency
key in the body instead, which the signature covers with the rest of the body). The receiver
verifies it against `identities.json` (identity -> role, public key, owners it may submit as) and
decides with that, never with what the body says about itself: a submit's `metadata.owner` must
be one of the identity's owners (`*`: any), a cancel must come from an identity that may submit
as the workload's owner, from the admin, or from the router when the workload is a pipeline's
stage (`<pipeline>--<stage>`, which only the router's expansion makes). A replayed signed command
is the same command (same key, same body): idempotent, it changes nothing. Whatever key a command
has, header or body, is under the signature: one cannot be added, removed or changed without it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import nacl.exceptions
import nacl.signing
import nkeys

from gpuorch_proto import ContractError, decode_event
from gpuorch_proto.events import STAGE_SEP, Cancel, is_stage_id

IDENTITY_HEADER = "Gpuorch-Identity"
SIGNATURE_HEADER = "Gpuorch-Signature"
ANY = "*"


def signed_payload(subject: str, msg_id: str | None, body: bytes) -> bytes:
    return subject.encode() + b"\n" + (msg_id or "").encode() + b"\n" + body


def sign_headers(seed: str, subject: str, msg_id: str | None, body: bytes) -> dict[str, str]:
    """The two headers that make a command attributable to the identity of `seed`."""
    kp = nkeys.from_seed(bytearray(seed.strip().encode()))
    try:
        sig = kp.sign(signed_payload(subject, msg_id, body))
        return {IDENTITY_HEADER: kp.public_key.decode(), SIGNATURE_HEADER: base64.b64encode(sig).decode()}
    finally:
        kp.wipe()


def _verify_key(public_key: str) -> nacl.signing.VerifyKey:
    raw = base64.b32decode(public_key.encode() + b"=" * (-len(public_key) % 8))
    if len(raw) != 35 or raw[0] != nkeys.PREFIX_BYTE_USER:
        raise ValueError("not a user public key")
    if nkeys.crc16_checksum(raw[:-2]) != raw[-2:]:
        raise ValueError("bad checksum")
    return nacl.signing.VerifyKey(raw[1:33])


@dataclass(frozen=True)
class Caller:
    identity: str
    role: str
    owners: tuple[str, ...]

    def may_submit_as(self, owner: str) -> bool:
        return self.role == "admin" or ANY in self.owners or owner in self.owners

    def may_cancel(self, owner: str | None, workload_id: str) -> bool:
        """The admin: any workload. The router: only a pipeline's stage, `<pipeline>--<stage>`
        (`is_stage_id`): it cancels the stages of a pipeline it expanded (docs/pipelines.md), and
        only its expansion makes such ids. Anyone else: a workload of an owner it may submit as."""
        if self.role == "admin":
            return True
        if self.role == "router":
            return is_stage_id(workload_id)
        return owner is not None and self.may_submit_as(owner)


class Unauthenticated(Exception):
    """The command's sender is not known (no, a bad or an unknown signature)."""


class Verifier:
    def __init__(self, identities: Mapping[str, Mapping[str, Any]]) -> None:
        self._by_key: dict[str, Caller] = {}
        for name, ident in identities.items():
            owners: Sequence[str] = ident.get("owners") or ()
            self._by_key[str(ident["public_key"])] = Caller(name, str(ident["role"]), tuple(owners))

    def caller(self, subject: str, msg_id: str | None, headers: Mapping[str, str], body: bytes) -> Caller:
        key = headers.get(IDENTITY_HEADER)
        sig = headers.get(SIGNATURE_HEADER)
        if not key or not sig:
            raise Unauthenticated(f"unsigned command: {IDENTITY_HEADER} and {SIGNATURE_HEADER} headers are required")
        caller = self._by_key.get(key)
        if caller is None:
            raise Unauthenticated(f"unknown identity {key[:60]!r}")
        try:
            _verify_key(key).verify(signed_payload(subject, msg_id, body), base64.b64decode(sig, validate=True))
        except (ValueError, binascii.Error, nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError):
            raise Unauthenticated(f"the signature of {caller.identity!r} does not match this command") from None
        return caller


def cancel_refusal(
    verifier: Verifier | None, subject: str, msg_id: str | None, headers: Mapping[str, str], body: bytes, owner: str | None
) -> str | None:
    """Why this cancel may not be carried out (None: it may): it must be signed by the admin, by
    an identity that may submit as the workload's owner (`owner`), or by the router when the
    workload (the one the signed body names) is a pipeline's stage. No verifier (unit tests):
    allowed."""
    if verifier is None:
        return None
    try:
        caller = verifier.caller(subject, msg_id, headers, body)
    except Unauthenticated as exc:
        return str(exc)
    workload_id = _cancelled(body, headers)
    if not caller.may_cancel(owner, workload_id):
        if caller.role == "router":
            return (f"identity {caller.identity!r} may not cancel workload {workload_id[:80]!r}: the router cancels "
                    f"only the stages of a pipeline it expanded (<pipeline>{STAGE_SEP}<stage>)")  # fmt: skip
        return f"identity {caller.identity!r} may not cancel a workload of owner {str(owner)[:80]!r}"
    return None


def _cancelled(body: bytes, headers: Mapping[str, str]) -> str:
    """The workload a cancel's (signed) body names; "" when it names none."""
    try:
        cmd = decode_event(body, content_type=headers.get("Content-Type"))
    except ContractError:
        return ""
    return cmd.workload_id if isinstance(cmd, Cancel) else ""
