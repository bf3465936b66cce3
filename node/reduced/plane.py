"""What a node of a reduced run serves over HTTP, and how it fetches the same from its peers (PROTOCOL.md §15a).

    GET /reduced/pieces/<update id>/<first>/<last>   pieces first..last of this node's own update: u32be(k), the
                                                     k hashes of their Merkle range proof, then the pieces' bytes
    GET /reduced/reductions/<record id>              the bytes of a reduction this node signed or fetched
    GET /reduced/partials/<set key>                  the screen partials records this node signed for that set:
                                                     a msgpack array of [kind, fields, author, signature]

Ids and keys in lowercase hex. The bodies served and fetched are counted in the host's ``blob`` traffic. Every answer is pinned by a signature (a commitment's Merkle root, a reduction's
signed digest, a partials record's own), so a node may fetch from anyone that holds the bytes; this version
asks the author. What is kept here is bounded: the last ``KEEP_SLOTS`` slots' own payloads, reductions and
partials (:meth:`ReducedPlane.forget_before`).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence

import httpx
import msgpack

import p2p
from p2p.counters import UNKNOWN_PEER, Kind
from p2p.http import Request, Response
from protocol.errors import Reason, RemoteProtocolError
from protocol.reduced.participant import ReducedNode
from protocol.reduced.plan import ModelPiece
from protocol.reduced.records import PARTIALS, Record, carried_record

__all__ = ["FetchFailed", "KEEP_SLOTS", "ReducedPlane"]

log = logging.getLogger("node.reduced")

PIECES, REDUCTIONS, PARTIALS_PATH = "/reduced/pieces/", "/reduced/reductions/", "/reduced/partials/"
KEEP_SLOTS = 3
MAX_PARTIALS_RECORDS = 4096  # records in one partials answer


class FetchFailed(Exception):
    """A peer could not be asked, or did not have what was asked (yet): the driver asks again later."""


class ReducedPlane:
    """The HTTP side of ``node``'s part in a reduced run over ``host``."""

    def __init__(self, host: p2p.Host, node: ReducedNode) -> None:
        self.host, self.node = host, node
        self.reductions: dict[bytes, tuple[int, bytes]] = {}  # record id -> (slot, bytes)
        self.partials: dict[bytes, list[Record]] = {}  # set key -> this node's partials records
        self._own_slots: dict[bytes, int] = {}  # own update id -> the slot it was published after
        host.http.route("GET", PIECES, self._serve_pieces, per_client="400/second")
        host.http.route("GET", REDUCTIONS, self._serve_reduction, per_client="400/second")
        host.http.route("GET", PARTIALS_PATH, self._serve_partials, per_client="400/second")

    # -- what is kept --------------------------------------------------------------------------------
    def own(self, update_id: bytes, slot: int) -> None:
        self._own_slots[update_id] = slot

    def keep_reduction(self, record: Record, data: bytes) -> None:
        self.reductions[record.id] = (record.fields[0], data)

    def keep_partials(self, record: Record) -> None:
        self.partials.setdefault(record.fields[2], []).append(record)

    def forget_before(self, slot: int) -> None:
        """Drop what belongs to slots before ``slot`` (the node's own payloads published before it)."""
        for i, s in list(self._own_slots.items()):
            if s < slot:
                del self._own_slots[i]
                self.node.own.pop(i, None)
        self.reductions = {i: v for i, v in self.reductions.items() if v[0] >= slot}
        self.partials = {k: v for k, v in self.partials.items() if v and v[0].fields[0] >= slot}

    # -- serving -------------------------------------------------------------------------------------
    async def _serve_pieces(self, request: Request) -> Response:
        try:
            update, first, last = request.path[len(PIECES):].split("/")
            update_id, first_i, last_i = bytes.fromhex(update), int(first), int(last)
        except ValueError:
            return Response.text(400, "want /reduced/pieces/<update id hex>/<first>/<last>")
        pieces = self.node.plan.pieces
        if update_id not in self.node.own or not 0 <= first_i <= last_i < len(pieces):
            return Response.text(404, "no such update or pieces here")
        data, proof = self.node.serve(update_id, pieces[first_i:last_i + 1])
        return self._answer(request, struct.pack(">I", len(proof)) + b"".join(proof) + data)

    async def _serve_reduction(self, request: Request) -> Response:
        try:
            held = self.reductions.get(bytes.fromhex(request.path[len(REDUCTIONS):]))
        except ValueError:
            return Response.text(400, "want /reduced/reductions/<record id hex>")
        if held is None:
            return Response.text(404, "no such reduction here")
        return self._answer(request, held[1])

    async def _serve_partials(self, request: Request) -> Response:
        try:
            records = self.partials.get(bytes.fromhex(request.path[len(PARTIALS_PATH):]), [])
        except ValueError:
            return Response.text(400, "want /reduced/partials/<set key hex>")
        body = msgpack.packb([[r.kind.decode(), r.body, r.author, r.signature] for r in records], use_bin_type=True)
        return self._answer(request, body, "application/msgpack")

    def _answer(self, request: Request, body: bytes, content_type: str = "application/octet-stream") -> Response:
        self.host.counters.sent(request.peer or UNKNOWN_PEER, Kind.BLOB, len(body))  # beside the blob plane's
        return Response(200, body, {"content-type": content_type})

    # -- fetching ------------------------------------------------------------------------------------
    def _url(self, peer: str) -> str | None:
        """``peer``'s HTTP plane: as it said on connecting, else as peer exchange told (a run larger than a
        peer table has authors this node is not connected to; what they serve is pinned by signatures)."""
        addr = self.host.known_http_addr(peer)
        return self.host.peer_url(addr) if addr else None

    async def _get(self, client: httpx.AsyncClient, peer: str, path: str, limit: int) -> bytes:
        url = self._url(peer)
        if url is None:
            raise FetchFailed(f"no HTTP address of {peer[:12]}")
        try:
            response = await client.get(url + path)
        except httpx.HTTPError as e:
            raise FetchFailed(f"{peer[:12]}: {type(e).__name__}") from None
        if response.status_code != 200:
            raise FetchFailed(f"{peer[:12]} answered {response.status_code} for {path[:60]}")
        if len(response.content) > limit:
            raise RemoteProtocolError(Reason.OVERSIZED, f"{len(response.content)} bytes from {peer[:12]}")
        self.host.counters.received(peer, Kind.BLOB, len(response.content))
        return response.content

    async def fetch_pieces(self, client: httpx.AsyncClient, origin: str, update_id: bytes,
                           pieces: Sequence[ModelPiece]) -> tuple[bytes, list[bytes]]:
        """Pieces of ``origin``'s update and their proof (checked by the participant against the commitment)."""
        size = sum(n for _, n in self.node.plan.byte_ranges(pieces, self.node.codec))
        body = await self._get(client, origin, f"{PIECES}{update_id.hex()}/{pieces[0].index}/{pieces[-1].index}",
                               4 + 32 * 128 + size)
        if len(body) < 4 or len(body) < 4 + 32 * (k := struct.unpack(">I", body[:4])[0]):
            raise RemoteProtocolError(Reason.TRUNCATED, f"a pieces answer of {len(body)} bytes")
        proof = [body[4 + 32 * j:4 + 32 * (j + 1)] for j in range(k)]
        return body[4 + 32 * k:], proof

    async def fetch_reduction(self, client: httpx.AsyncClient, record: Record, limit: int) -> bytes:
        return await self._get(client, record.author, REDUCTIONS + record.id.hex(), limit)

    async def fetch_partials(self, client: httpx.AsyncClient, author: str, key: bytes) -> list[Record]:
        body = await self._get(client, author, PARTIALS_PATH + key.hex(), 64 << 20)
        try:
            items = msgpack.unpackb(body, raw=False)
            if not isinstance(items, list) or len(items) > MAX_PARTIALS_RECORDS:
                raise ValueError("not a list of records")
            records = [carried_record(kind, fields, who, signature) for kind, fields, who, signature in items]
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            raise RemoteProtocolError(Reason.BAD_SCHEMA, f"partials from {author[:12]}: {e}") from None
        return [r for r in records if r.kind == PARTIALS and r.author == author]
