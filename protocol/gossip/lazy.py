"""(part of `Router`) Lazy pull, gossipsub's IHAVE / IWANT: at each heartbeat the router announces the ids it
holds to `d_lazy` peers outside its mesh that do not know them (`_gossip`); a peer announcing ids asks for
those it lacks, at its pace (`_want`); a peer asked answers within the asker's budget (`_on_iwant`). The
state (message cache, asked ids, pacer, budget) is the router's; `protocol.gossip.iwant` keeps the counts."""

from __future__ import annotations

from collections.abc import Sequence

from protocol.errors import Reason
from protocol.gossip.actions import Action, Send
from protocol.gossip.mesh import gossip_targets
from protocol.messages import IHave, IWant

__all__ = ["LazyPull"]


class LazyPull:
    def _on_ihave(self, peer: str, message: IHave, now: float) -> list[Action]:
        if self.scores.graylisted(peer) or message.topic != self.config.topic:
            return []
        return self._want(peer, message.ids, now)

    def _want(self, peer: str, ids: Sequence[bytes], now: float) -> list[Action]:
        """Ask `peer`, which holds `ids`, for those we lack: one IWANT of at most max_ihave_ids ids and within
        our pace for it (`WantPacer`); wanted ids past the pace wait for the next heartbeat."""
        out: list[Action] = []
        wanted: list[bytes] = []
        later: list[bytes] = []
        room = min(self.config.max_ihave_ids, self.wants.room(peer))
        for message_id in ids:
            entry = self.mcache.get(message_id)
            if entry is not None:
                entry.known_by.add(peer)
            elif self.validator.seen.contains(message_id, now):
                out += self.pending.holder_of_message(message_id, peer, self.peers)
            elif self.known is not None and self.known(message_id):
                continue  # the application holds it (`known`): not asked for
            elif self.asked.may_ask(message_id, now):
                if len(wanted) >= room:
                    later.append(message_id)  # one IWANT per IHAVE, within our pace: the rest next heartbeat
                    continue
                self.asked.ask(message_id, peer, now)
                wanted.append(message_id)
            else:
                self.asked.announced(message_id, peer)  # asked elsewhere: remember a second holder
        if wanted:
            self.wants.asked(peer, len(wanted))
            out.append(Send(peer, IWant(self.config.run_id, tuple(wanted))))
        if later:
            self.wants.wait(peer, later)
        return out

    def _on_iwant(self, peer: str, message: IWant, now: float) -> list[Action]:
        """Answer with the held messages asked for, each once per mcache window, within the peer's budget
        (`IWantBudget`); a peer past its budget is penalized (`flood`) once a heartbeat."""
        allowed, over = self.iwants.take(peer, len(message.ids), now)
        out: list[Action] = []
        for message_id in message.ids[:allowed]:
            entry = self.mcache.get(message_id)
            if entry is not None and not self.iwants.answered_recently(peer, message_id):
                self.iwants.answered(peer, message_id)
                entry.known_by.add(peer)
                out.append(Send(peer, entry.message))
        if over:
            out += self._refuse(peer, Reason.FLOOD, f"iwant: {len(message.ids) - allowed} ids past the budget", now)
        return out

    def _gossip(self) -> list[Action]:
        ids = self.mcache.gossip_ids()
        if not ids:
            return []
        out: list[Action] = []
        eligible = lambda p: not self.scores.graylisted(p)  # noqa: E731
        for peer in gossip_targets(self.peers, self.mesh, eligible, self.config.d_lazy, self.rng):
            unknown = [i for i in ids if peer not in self.mcache.get(i).known_by][: self.config.max_ihave_ids]
            if unknown:
                out.append(Send(peer, IHave(self.config.run_id, self.config.topic, tuple(unknown))))
        return out
