"""The host's blob downloads: the router's `Fetch` actions and `fetch_blob` (a joiner's state pieces), each a
download from one holder or, for a large blob, in byte ranges from several (`BlobClient.fetch_ranges`), with
the outcome reported to the router. A part of `p2p.host.Host` (a mixin: it works on the host's router, client,
store and counters), in a module of its own so that each file reads as one concern.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import trio

from p2p.blobfetch import LocalBackoff
from p2p.errors import BlobGone, LocalStoreError, TransportError
from protocol.errors import Reason, RemoteProtocolError
from protocol.gossip import Fetch

__all__ = ["BlobFetching"]

log = logging.getLogger("p2p.host")


class BlobFetching:
    """(part of `Host`) Blob downloads."""

    async def fetch_blob(self, name: str, size: int, peers: Sequence[str] | None = None) -> Path:
        """Download blob `name` (e.g. state listed in a manifest) from `peers` (default: every
        connected peer) in order until one serves the right bytes; it is then served onward.
        Raises TransportError if nobody could. The path stays readable only while the caller `keep`s the
        blob in the store (`BlobStore.keep`): anyone may remove it once this returns."""
        if self.store.has(name):
            return self.store.path(name)
        candidates = list(peers) if peers is not None else sorted(self.router.peers)
        for peer in candidates:
            if await self._fetch_from(peer, name, size):
                try:
                    return self.store.path(name)
                except KeyError:  # removed here while this task waited for the stored blob (not kept)
                    raise TransportError(f"blob {name[:12]}: removed here as soon as it was fetched") from None
        raise TransportError(f"blob {name[:12]}: no peer of {len(candidates)} served it")

    async def _fetch(self, action: Fetch) -> None:
        await trio.sleep_until(self._local_backoff.until)  # the local store failed a write: wait, not the holders
        async with self._fetch_slots:
            stored = await self._fetch_from(action.peer, action.blob, action.size)
        pending = self.router.pending.get(action.blob)
        if not stored and pending is not None:
            if pending.fetching == action.peer:  # _fetch_from could not even start (no address)
                self._execute(self.router.fetch_failed(action.blob, action.peer, None, "peer gone", self.now()))

    def _range_sources(self, peer: str, url: str, name: str) -> list[tuple[str, str]]:
        """`peer` (the holder the router chose) first, then the blob's other connected holders, at most
        `fetch_streams` in all."""
        sources = [(peer, url)]
        pending = self.router.pending.get(name)
        for holder in pending.holders if pending is not None else ():
            state = self.router.peers.get(holder)
            if holder != peer and state is not None and state.info.http_addr and \
                    len(sources) < self.config.fetch_streams:
                sources.append((holder, self.peer_url(state.info.http_addr)))
        return sources

    async def _download(self, peer: str, url: str, name: str, size: int) -> None:
        """Blob `name` into the store: in byte ranges from several holders when it is large (`fetch_ranges`),
        else whole from `peer`. A ranged blob that fails its hash is fetched again whole from `peer` alone, so
        that a wrong blob is always blamed on the holder that sent it."""
        cfg = self.config
        if cfg.fetch_streams < 2 or size < cfg.range_fetch_bytes:
            await self._client.fetch_once(peer, url, name, size)
            return
        sources = self._range_sources(peer, url, name)
        try:
            failed = await self._client.fetch_ranges(sources, name, size, cfg.fetch_streams)
        except RemoteProtocolError as exc:
            if exc.reason != Reason.HASH_MISMATCH or len(sources) == 1:
                raise
            log.warning("blob %s from %d holders failed its hash; fetching it whole from %s to find the holder "
                        "at fault", name[:12], len(sources), peer)
            await self._client.fetch_once(peer, url, name, size)
            return
        for other, exc in failed.items():
            log.info("blob %s: holder %s failed a range (%s); the others served it", name[:12], other, exc)

    async def _fetch_from(self, peer: str, name: str, size: int) -> bool:
        """One attempt; reports the outcome to the router. True if the blob is now stored."""
        state = self.router.peers.get(peer)
        if state is None or not state.info.http_addr:
            return False
        try:
            await self._download(peer, self.peer_url(state.info.http_addr), name, size)
        except RemoteProtocolError as exc:
            self.counters.blob_fetch_failures += 1
            self.counters.events[f"blob_fetch_failed:{exc.reason.value}"] += 1
            self._execute(self.router.fetch_failed(name, peer, exc.reason, exc.detail, self.now()))
            return False
        except LocalStoreError as exc:  # not the holder's fault: the same holder is asked again after a wait
            self.counters.blob_fetch_failures += 1
            self.counters.events["blob_fetch_failed:local_store"] += 1
            wait = self._local_backoff.failed(trio.current_time())
            log.log(logging.WARNING if wait <= LocalBackoff.FIRST else logging.DEBUG,
                    "blob %s not stored here (%s); fetches wait %.0f s", name[:12], exc, wait)
            self._execute(self.router.fetch_failed(name, peer, None, str(exc), self.now()))
            return False
        except TransportError as exc:
            self.counters.blob_fetch_failures += 1
            self.counters.events["blob_fetch_failed:transport"] += 1
            log.info("fetch of blob %s from %s failed (the next holder is tried): %s", name[:12], peer, exc)
            gone = isinstance(exc, BlobGone)  # not asked again for it
            self._execute(self.router.fetch_failed(name, peer, None, str(exc), self.now(), gone=gone))
            return False
        self._local_backoff.succeeded()
        log.info("fetched blob %s (%d bytes) from %s", name[:12], size, peer)
        self._execute(self.router.blob_stored(name, self.now(), source=peer))
        return True
