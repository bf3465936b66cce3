"""Who may read a node's HTTP plane (PROTOCOL.md section 7b).

In an open run, anyone: every route answers every client, anonymous ones included. In a closed run only
`GET /health` answers anyone; every other request is answered 403, without calling its route, unless the
client's TLS certificate proved a peer id that is admitted: the founder, a member this node already verified
(in a hello or an update header), or one whose request carries its membership in `x-diloco-membership`
(hex of the wire bytes), verified here for the certificate's peer id. A node started with --insecure has no
client certificates to check, so a closed run's HTTP plane is not closed there (docs/threat-model.md).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from p2p.http import Request, Response
from protocol.admission import Admission
from protocol.errors import RemoteProtocolError

log = logging.getLogger("p2p.access")

MEMBERSHIP_HEADER = "x-diloco-membership"
HEALTH_PATH = "/health"
PUBLIC_PATHS = frozenset({HEALTH_PATH})


async def health(_request: Request) -> Response:
    return Response.text(200, "ok\n")


class ClosedRunGuard:
    """`HttpApp.guard` for a closed run; `refused` counts the answers it gave instead of a route, by why."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.refused: Counter[str] = Counter()

    def __call__(self, request: Request) -> Response | None:
        if request.path in PUBLIC_PATHS:
            return None
        why = self._refusal(request)
        if why is None:
            return None
        self.refused[why] += 1
        log.debug("HTTP %s %s from %s refused: %s", request.method, request.path, request.client, why)
        return Response.text(403, "this is a closed run: members only\n")

    def _refusal(self, request: Request) -> str | None:
        peer = request.peer
        if peer is None:
            return "anonymous"
        if self.admission.admitted(peer):
            return None
        shown = request.headers.get(MEMBERSHIP_HEADER, "")
        if not shown:
            return "not_admitted"
        try:
            self.admission.check_peer(peer, bytes.fromhex(shown))
        except (ValueError, RemoteProtocolError):
            return "bad_membership"
        return None


def guard_for(admission: Admission, *, tls: bool) -> Callable[[Request], Response | None] | None:
    """The guard a node's HTTP plane needs: none in an open run, or without TLS (nothing to check a peer by)."""
    return ClosedRunGuard(admission) if admission.closed and tls else None
